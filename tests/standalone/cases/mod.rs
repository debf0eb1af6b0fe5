//! The table-driven Gateway API conformance cases of `tests/cases/` (format:
//! `tests/cases/README.md`). Every case runs against the real binary on its own loopback
//! network (`Net::allocate`, like every other test), a few at a time; every mismatch of every case is
//! collected and the test fails once, at the end, listing them all.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

mod coverage;
mod distribution;
mod format;
mod pki;
mod raw;
mod run;
mod setup;
mod status;

use distribution::*;
use format::*;
use pki::*;
use raw::*;
use run::*;
use setup::*;
use status::*;

/// Cases running at once.
const PARALLEL_CASES: usize = 4;
/// The GatewayClass every case Gateway names (the runner writes it).
const GATEWAY_CLASS: &str = "gateway-conformance";
/// The port of every Service the runner generates for a backend.
const SERVICE_PORT: u16 = 8080;
/// The default Gateway of requests.
const DEFAULT_GATEWAY: &str = "gateway-conformance-infra/same-namespace";
/// How long a request may keep answering differently before the mismatch is reported
/// (the conformance suite's "eventually consistent" request, bounded).
const REQUEST_SETTLE: Duration = Duration::from_secs(3);
/// How long `/status` may take to show the expected conditions.
const STATUS_SETTLE: Duration = Duration::from_secs(10);

/// The conformance suite's feature names (`pkg/features`) that a case may claim.
pub const KNOWN_FEATURES: &[&str] = &[
    "Gateway",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "GatewayHTTPListenerIsolation",
    "GatewayInfrastructurePropagation",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "ReferenceGrant",
    "HTTPRoute",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteMethodMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRoutePortRedirect",
    "HTTPRouteSchemeRedirect",
    "HTTPRoutePathRedirect",
    "HTTPRouteHostRewrite",
    "HTTPRoutePathRewrite",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteBackendTimeout",
    "HTTPRouteParentRefPort",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteCORS",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteBackendURLRewrite",
    "HTTPRouteBackendRequestRedirect",
    "ListenerSet",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "TLSRoute",
    "TLSRouteModeTerminate",
    "TLSRouteModeMixed",
    "TCPRoute",
    "UDPRoute",
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
];

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn conformance_cases() -> TestResult {
    let started = Instant::now();
    let cases = load_cases()?;
    ensure!(!cases.is_empty(), "no cases in {}", cases_dir().display());
    // AETHER_CASES=a,b runs only the named cases.
    let only = std::env::var("AETHER_CASES")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let sem = Arc::new(tokio::sync::Semaphore::new(PARALLEL_CASES));
    let mut set = tokio::task::JoinSet::new();
    for lc in cases {
        if let Some(only) = &only
            && !only.split(',').any(|o| o == lc.name)
        {
            continue;
        }
        let sem = Arc::clone(&sem);
        let lc = Arc::new(lc);
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            let name = lc.name.clone();
            (name, run_case(lc).await)
        });
    }
    let mut failed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ran = 0;
    while let Some(res) = set.join_next().await {
        ran += 1;
        match res {
            Ok((name, failures)) if !failures.is_empty() => {
                failed.insert(name, failures);
            }
            Ok(_) => {}
            Err(e) => {
                failed.insert(format!("<panicked case {ran}>"), vec![e.to_string()]);
            }
        }
    }
    eprintln!("{ran} conformance case(s) ran in {:?}", started.elapsed());
    ensure!(ran > 0, "AETHER_CASES={only:?} names no case");
    if failed.is_empty() {
        return Ok(());
    }
    let mut report = format!("{} of {ran} conformance case(s) failed:\n", failed.len());
    for (name, fs) in &failed {
        let _ = writeln!(report, "\n=== {name}");
        for f in fs {
            let _ = writeln!(report, "  - {f}");
        }
    }
    eprintln!("{report}");
    Err(err(format!(
        "{} of {ran} conformance case(s) failed (details above): {}",
        failed.len(),
        failed.keys().cloned().collect::<Vec<_>>().join(", ")
    )))
}

/// The rows of docs/conformance.md's feature table: `(feature, supported)`.
fn table_features(table: &str) -> Result<Vec<(String, bool)>, BoxError> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in table.lines() {
        let line = line.trim();
        if !in_table {
            let l = line.to_ascii_lowercase();
            in_table = l.starts_with("| feature") && l.contains("supported");
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 2 || cells[0].starts_with("---") {
            continue;
        }
        let feature = cells[0].trim_matches('`').to_owned();
        let supported = cells[1].eq_ignore_ascii_case("yes");
        rows.push((feature, supported));
    }
    ensure!(
        !rows.is_empty(),
        "docs/conformance.md has no feature table (a `| Feature | Supported | Case |` table)"
    );
    Ok(rows)
}

#[test]
fn conformance_case_features_are_known_and_cover_the_feature_table() -> TestResult {
    let cases = load_cases()?;
    let mut problems = Vec::new();
    let mut covered: BTreeSet<&str> = BTreeSet::new();
    for lc in &cases {
        if lc.case.features.is_empty() {
            problems.push(format!("{}: lists no features", lc.name));
        }
        for f in &lc.case.features {
            if KNOWN_FEATURES.contains(&f.as_str()) {
                covered.insert(f);
            } else {
                problems.push(format!("{}: unknown feature {f:?}", lc.name));
            }
        }
        if lc.case.requests.is_empty()
            && lc.case.distributions.is_empty()
            && lc.case.status.is_empty()
        {
            problems.push(format!("{}: expects nothing", lc.name));
        }
        let _ = (&lc.case.description, &lc.case.conformance_test);
        // Listeners below 1024 need `wellKnownPorts` (so a process that may not bind
        // them skips the case, saying why), and only those.
        match yaml_docs(&lc.manifests) {
            Ok(docs) => {
                let privileged = gateways_of(&docs)
                    .values()
                    .flat_map(|g| &g.listeners)
                    .any(|(_, port)| *port < 1024);
                if privileged != lc.case.well_known_ports {
                    problems.push(format!(
                        "{}: wellKnownPorts is {}, but its listeners {} on a port below 1024",
                        lc.name,
                        lc.case.well_known_ports,
                        if privileged { "are" } else { "are not" }
                    ));
                }
            }
            Err(e) => problems.push(format!("{}: manifests.yaml: {e}", lc.name)),
        }
    }
    let elsewhere = coverage::features_tested_outside_cases()?;
    let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/conformance.md");
    let features = table_features(&std::fs::read_to_string(table)?)?;
    // The README's summary states the count; it must be this table's.
    let supported = features.iter().filter(|(_, yes)| *yes).count();
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))?;
    let summary = format!("| Gateway API features supported, each with a case | {supported} ");
    if !readme.contains(&summary) {
        problems.push(format!(
            "README.md's conformance summary should say {supported}"
        ));
    }
    for (feature, supported) in features {
        if !KNOWN_FEATURES.contains(&feature.as_str()) {
            problems.push(format!(
                "docs/conformance.md lists unknown feature {feature:?}"
            ));
        }
        if supported && !covered.contains(feature.as_str()) && !elsewhere.contains(&feature) {
            problems.push(format!(
                "docs/conformance.md lists {feature} as supported, but no case covers it"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}
