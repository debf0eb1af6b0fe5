//! The table-driven Gateway API conformance cases of `tests/cases/` (format:
//! `tests/cases/README.md`). Every case runs against the real binary on its own loopback
//! network 127.78.(index+1).0/24, a few at a time; every mismatch of every case is
//! collected and the test fails once, at the end, listing them all.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use crate::common::*;

/// Second octet of every case network: 127.78.k.0/24.
const CASE_NET: u8 = 78;
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
    "HTTPRouteBackendURLRewrite",
    "HTTPRouteBackendRequestRedirect",
    "ListenerSet",
    "GRPCRoute",
    "TLSRoute",
];

// ---------------------------------------------------------------------------------------
// The case format
// ---------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Case {
    /// Conformance feature names this case covers.
    features: Vec<String>,
    /// The conformance test (ShortName) this case re-expresses, if any.
    #[serde(default)]
    conformance_test: Option<String>,
    #[serde(default)]
    description: String,
    /// Load `tests/cases/base.yaml` (namespaces and the three base Gateways).
    #[serde(default = "yes")]
    base: bool,
    /// Echo backends to start, `namespace/name`; each gets a Service (port 8080) and an
    /// EndpointSlice pointing at its echo, whose `name` is the Service name.
    #[serde(default)]
    backends: Vec<String>,
    /// Default Gateway for requests (`namespace/name`).
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    requests: Vec<RequestCase>,
    #[serde(default)]
    distributions: Vec<Distribution>,
    #[serde(default)]
    status: Vec<StatusExpect>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Request {
    /// `namespace/name` of the Gateway to send to (default: the case's `gateway`).
    #[serde(default)]
    gateway: Option<String>,
    /// Listener port (default: the Gateway's first listener's port).
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    method: Option<String>,
    /// Host header (default: the Gateway's `address:port`).
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RequestCase {
    #[serde(flatten)]
    request: Request,
    expect: Expect,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Expect {
    /// Response status (default 200).
    #[serde(default)]
    status: Option<u16>,
    /// The echo `name` that must answer; with it, the backend must have seen the
    /// request's method, path and host unless `backendRequest` says otherwise.
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    backend_request: Option<BackendRequest>,
    /// Response headers (comma-separated values compare element-wise).
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    absent_headers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BackendRequest {
    #[serde(default)]
    method: Option<String>,
    /// Path with query.
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    absent_headers: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Distribution {
    #[serde(flatten)]
    request: Request,
    /// Requests sent (on one keep-alive connection).
    count: u32,
    /// Expected share of each backend (weights are normalised).
    backends: BTreeMap<String, f64>,
    /// Allowed absolute difference of each share.
    tolerance: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StatusExpect {
    kind: String,
    #[serde(default)]
    namespace: String,
    name: String,
    #[serde(default)]
    conditions: Vec<CondExpect>,
    /// Gateway listeners.
    #[serde(default)]
    listeners: Vec<ListenerExpect>,
    /// HTTPRoute parents.
    #[serde(default)]
    parents: Vec<ParentExpect>,
    /// HTTPRoute: Gateways (`namespace/name`) that must have no parent status.
    #[serde(default)]
    no_parents: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CondExpect {
    #[serde(rename = "type")]
    ctype: String,
    status: CondStatus,
    #[serde(default)]
    reason: Option<String>,
}

/// "True"/"False", also written unquoted.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CondStatus {
    Bool(bool),
    Str(String),
}

impl CondStatus {
    fn as_str(&self) -> &str {
        match self {
            CondStatus::Bool(true) => "True",
            CondStatus::Bool(false) => "False",
            CondStatus::Str(s) => s,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListenerExpect {
    name: String,
    #[serde(default)]
    attached_routes: Option<u64>,
    /// Kinds of `supportedKinds`, in any order.
    #[serde(default)]
    supported_kinds: Option<Vec<String>>,
    #[serde(default)]
    conditions: Vec<CondExpect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ParentExpect {
    /// `namespace/name` of the parent Gateway.
    gateway: String,
    #[serde(default)]
    section_name: Option<String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    conditions: Vec<CondExpect>,
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases")
}

struct LoadedCase {
    name: String,
    case: Case,
    manifests: String,
}

fn load_cases() -> Result<Vec<LoadedCase>, BoxError> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cases_dir())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_owned();
        let case_text = std::fs::read_to_string(dir.join("case.yaml"))
            .map_err(|e| err(format!("{name}/case.yaml: {e}")))?;
        let case: Case = serde_saphyr::from_str(&case_text)
            .map_err(|e| err(format!("{name}/case.yaml: {e}")))?;
        let manifests = std::fs::read_to_string(dir.join("manifests.yaml"))
            .map_err(|e| err(format!("{name}/manifests.yaml: {e}")))?;
        out.push(LoadedCase {
            name,
            case,
            manifests,
        });
    }
    Ok(out)
}

/// The documents of a multi-document YAML text, as JSON values (empty ones skipped).
fn yaml_docs(text: &str) -> Result<Vec<Value>, BoxError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn split_ref(r: &str) -> (&str, &str) {
    r.split_once('/').unwrap_or(("", r))
}

// ---------------------------------------------------------------------------------------
// Running one case
// ---------------------------------------------------------------------------------------

/// A Gateway of the case's manifests: its listeners' `(name, port)`.
#[derive(Debug, Clone)]
struct GatewayInfo {
    listeners: Vec<(String, u16)>,
}

fn gateways_of(docs: &[Value]) -> BTreeMap<String, GatewayInfo> {
    let mut out = BTreeMap::new();
    for d in docs.iter().filter(|d| d["kind"] == "Gateway") {
        let key = format!(
            "{}/{}",
            d["metadata"]["namespace"].as_str().unwrap_or("default"),
            d["metadata"]["name"].as_str().unwrap_or("")
        );
        let listeners = d["spec"]["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                (
                    l["name"].as_str().unwrap_or("").to_owned(),
                    l["port"]
                        .as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .unwrap_or(0),
                )
            })
            .collect();
        out.insert(key, GatewayInfo { listeners });
    }
    out
}

fn backend_ip(net: Net, i: usize) -> Result<IpAddr, BoxError> {
    let host = u8::try_from(200 + i).map_err(|_| err("too many backends"))?;
    Ok(IpAddr::V4(net.ip(host)))
}

/// The runner-made objects: the GatewayClass and a Service + EndpointSlice per backend.
fn generated_manifests(net: Net, backends: &[String]) -> Result<String, BoxError> {
    let mut s = format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: {GATEWAY_CLASS}
spec:
  controllerName: {CONTROLLER}
"
    );
    for (i, b) in backends.iter().enumerate() {
        let (ns, name) = split_ref(b);
        ensure!(!ns.is_empty(), "backend {b:?} is not namespace/name");
        let ip = backend_ip(net, i)?;
        let _ = write!(
            s,
            "---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {ns}
spec:
  ports:
  - name: first-port
    protocol: TCP
    port: {SERVICE_PORT}
    targetPort: 3000
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-conf1
  namespace: {ns}
  labels:
    kubernetes.io/service-name: {name}
addressType: IPv4
ports:
- name: first-port
  port: {ECHO_PORT}
endpoints:
- addresses: [\"{ip}\"]
  conditions:
    ready: true
"
        );
    }
    Ok(s)
}

/// Runs one case; returns its mismatches (empty: passed).
async fn run_case(index: usize, lc: Arc<LoadedCase>) -> Vec<String> {
    let started = Instant::now();
    let k = match u8::try_from(index + 1) {
        Ok(k) if k < 255 => k,
        _ => return vec!["too many cases for 127.78.k.0/24 networks".to_owned()],
    };
    let net = Net { b: CASE_NET, k };
    let mut failures = Vec::new();
    if let Err(e) = run_case_inner(net, &lc, &mut failures).await {
        failures.push(format!("setup: {e}"));
    }
    eprintln!(
        "case {} on 127.78.{k}.0/24: {} after {:?}",
        lc.name,
        if failures.is_empty() {
            "passed".to_owned()
        } else {
            format!("{} failure(s)", failures.len())
        },
        started.elapsed()
    );
    failures
}

async fn run_case_inner(net: Net, lc: &LoadedCase, failures: &mut Vec<String>) -> TestResult {
    let case = &lc.case;
    let env = TestEnv::on(net)?;
    let base = if case.base {
        std::fs::read_to_string(cases_dir().join("base.yaml"))?
    } else {
        String::new()
    };
    let mut docs = yaml_docs(&base)?;
    docs.extend(yaml_docs(&lc.manifests)?);
    let gateways = gateways_of(&docs);
    env.write_manifest(
        "00-generated.yaml",
        &generated_manifests(net, &case.backends)?,
    )?;
    if case.base {
        env.write_manifest("01-base.yaml", &base)?;
    }
    env.write_manifest("10-case.yaml", &lc.manifests)?;

    let mut procs = Vec::new();
    for (i, b) in case.backends.iter().enumerate() {
        let (_, name) = split_ref(b);
        let listen = SocketAddr::new(backend_ip(net, i)?, ECHO_PORT);
        procs.push(env.spawn_echo(listen, name).await?);
    }
    let edge = env.spawn_edge("edge").await?;

    // Status first: it also tells the Gateway addresses.
    if !case.status.is_empty() {
        let last = eventually_quiet(STATUS_SETTLE, || async {
            let status = env.status().await?;
            let diffs = status_diffs(&status, &case.status);
            if diffs.is_empty() {
                Ok(())
            } else {
                Err(err(diffs.join("\n    ")))
            }
        })
        .await;
        if let Err(e) = last {
            failures.push(format!("status:\n    {e}"));
        }
    }

    let default_gw = case.gateway.as_deref().unwrap_or(DEFAULT_GATEWAY);
    let needs_gateway = |r: &Request| r.gateway.clone().unwrap_or_else(|| default_gw.to_owned());
    let mut used: BTreeSet<String> = case
        .requests
        .iter()
        .map(|r| needs_gateway(&r.request))
        .collect();
    used.extend(case.distributions.iter().map(|d| needs_gateway(&d.request)));
    let mut addrs: BTreeMap<String, IpAddr> = BTreeMap::new();
    for g in &used {
        let (ns, name) = split_ref(g);
        let ip = eventually(
            &format!("Gateway {g} has an address"),
            EVENTUALLY,
            || async {
                let status = env.status().await?;
                let item = status_item(&status, "Gateway", ns, name)?;
                let a = gateway_addresses(item);
                let first = a
                    .first()
                    .ok_or_else(|| err(format!("no address in {}", item["status"])))?;
                Ok(first.parse::<IpAddr>()?)
            },
        )
        .await?;
        let info = gateways
            .get(g)
            .ok_or_else(|| err(format!("no Gateway {g} in the case's manifests")))?;
        for (_, port) in &info.listeners {
            let addr = SocketAddr::new(ip, *port);
            // Listeners that fail to program are a status matter; don't stop here.
            if let Err(e) = env.wait_listener(addr).await {
                failures.push(format!("listener {g} {addr}: {e}"));
            }
        }
        addrs.insert(g.clone(), ip);
    }

    let target = |r: &Request| -> Result<(SocketAddr, String), BoxError> {
        let g = needs_gateway(r);
        let ip = addrs
            .get(&g)
            .ok_or_else(|| err(format!("Gateway {g} has no address")))?;
        let port = match r.port {
            Some(p) => p,
            None => gateways
                .get(&g)
                .and_then(|i| i.listeners.first())
                .map(|l| l.1)
                .ok_or_else(|| err(format!("Gateway {g} has no listener")))?,
        };
        let addr = SocketAddr::new(*ip, port);
        let host = r.host.clone().unwrap_or_else(|| addr.to_string());
        Ok((addr, host))
    };

    for (i, rc) in case.requests.iter().enumerate() {
        let (addr, host) = target(&rc.request)?;
        let label = describe(i, &rc.request, &host);
        let deadline = Instant::now() + REQUEST_SETTLE;
        loop {
            let diffs = match send(net, addr, &host, &rc.request).await {
                Ok(resp) => response_diffs(&resp, &rc.request, &host, &rc.expect),
                Err(e) => vec![format!("request failed: {e}")],
            };
            if diffs.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                failures.push(format!("{label}:\n    {}", diffs.join("\n    ")));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    for (i, d) in case.distributions.iter().enumerate() {
        let (addr, host) = target(&d.request)?;
        let label = format!("distribution {}", describe(i, &d.request, &host));
        if let Err(e) = check_distribution(net, addr, &host, d).await {
            failures.push(format!("{label}:\n    {e}"));
        }
    }

    if !failures.is_empty() {
        let log = edge.log();
        let tail: Vec<&str> = log.lines().rev().take(8).collect();
        let mut lines = tail.into_iter().rev().collect::<Vec<_>>().join("\n      ");
        if lines.is_empty() {
            lines = "(empty)".to_owned();
        }
        failures.push(format!("edge log (last lines):\n      {lines}"));
    }
    // Mismatches are reported by the runner; child logs are not needed on drop.
    env.pass()?;
    drop(procs);
    Ok(())
}

/// Like `eventually`, without the prefix: the last error as is.
async fn eventually_quiet<F, Fut>(timeout: Duration, mut f: F) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = TestResult>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn describe(i: usize, r: &Request, host: &str) -> String {
    let mut s = format!(
        "request #{} {} http://{host}{}",
        i + 1,
        r.method.as_deref().unwrap_or("GET"),
        r.path.as_deref().unwrap_or("/")
    );
    if let Some(g) = &r.gateway {
        let _ = write!(s, " (gateway {g}");
        if let Some(p) = r.port {
            let _ = write!(s, ", port {p}");
        }
        s.push(')');
    } else if let Some(p) = r.port {
        let _ = write!(s, " (port {p})");
    }
    if !r.headers.is_empty() {
        let _ = write!(s, " headers {:?}", r.headers);
    }
    s
}

async fn send(net: Net, addr: SocketAddr, host: &str, r: &Request) -> Result<Resp, BoxError> {
    let headers: Vec<(&str, &str)> = r
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut conn = H1Conn::connect(net.client_ip(), addr).await?;
    conn.send(
        r.method.as_deref().unwrap_or("GET"),
        host,
        r.path.as_deref().unwrap_or("/"),
        &headers,
    )
    .await
}

/// Header values as a list: comma-separated elements, trimmed.
fn value_list(v: &str) -> Vec<String> {
    v.split(',').map(|s| s.trim().to_owned()).collect()
}

fn response_diffs(resp: &Resp, req: &Request, host: &str, exp: &Expect) -> Vec<String> {
    let mut d = Vec::new();
    let want_status = exp.status.unwrap_or(200);
    if resp.status.as_u16() != want_status {
        let mut body = resp.text();
        body.truncate(300);
        d.push(format!(
            "status: expected {want_status}, got {} (body {body:?})",
            resp.status.as_u16()
        ));
    }
    for (k, want) in &exp.headers {
        let got: Vec<&str> = resp
            .headers
            .get_all(k.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if got.is_empty() {
            d.push(format!("response header {k}: expected {want:?}, absent"));
        } else if value_list(&got.join(",")) != value_list(want) {
            d.push(format!(
                "response header {k}: expected {want:?}, got {:?}",
                got.join(", ")
            ));
        }
    }
    for k in &exp.absent_headers {
        if let Some(v) = resp.headers.get(k.as_str()) {
            d.push(format!("response header {k}: expected absent, got {v:?}"));
        }
    }
    if exp.backend.is_none() && exp.backend_request.is_none() {
        return d;
    }
    let echo = match resp.json() {
        Ok(v) if resp.status.is_success() => Echo(v),
        _ => {
            if d.is_empty() {
                d.push(format!(
                    "expected an echo backend answer, got {}: {:?}",
                    resp.status,
                    resp.text()
                ));
            }
            return d;
        }
    };
    if let Some(b) = &exp.backend
        && echo.name() != b
    {
        d.push(format!("backend: expected {b}, got {}", echo.name()));
    }
    let empty = BackendRequest::default();
    let br = exp.backend_request.as_ref().unwrap_or(&empty);
    let want_method = br
        .method
        .as_deref()
        .or(req.method.as_deref())
        .unwrap_or("GET");
    if echo.method() != want_method {
        d.push(format!(
            "backend saw method {:?}, expected {want_method:?}",
            echo.method()
        ));
    }
    let want_path = br.path.as_deref().or(req.path.as_deref()).unwrap_or("/");
    if echo.path() != want_path {
        d.push(format!(
            "backend saw path {:?}, expected {want_path:?}",
            echo.path()
        ));
    }
    let want_host = br.host.as_deref().unwrap_or(host);
    if !echo.host().eq_ignore_ascii_case(want_host) {
        d.push(format!(
            "backend saw host {:?}, expected {want_host:?}",
            echo.host()
        ));
    }
    for (k, want) in &br.headers {
        match echo.header(&k.to_ascii_lowercase()) {
            None => d.push(format!(
                "backend saw no header {k}, expected {want:?} (saw headers {})",
                echo.0["headers"]
            )),
            Some(got) if value_list(got) != value_list(want) => d.push(format!(
                "backend saw header {k}: {got:?}, expected {want:?}"
            )),
            Some(_) => {}
        }
    }
    for k in &br.absent_headers {
        if let Some(got) = echo.header(&k.to_ascii_lowercase()) {
            d.push(format!(
                "backend saw header {k}: {got:?}, expected it absent"
            ));
        }
    }
    d
}

async fn check_distribution(
    net: Net,
    addr: SocketAddr,
    host: &str,
    dist: &Distribution,
) -> TestResult {
    let headers: Vec<(&str, &str)> = dist
        .request
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let method = dist.request.method.as_deref().unwrap_or("GET");
    let path = dist.request.path.as_deref().unwrap_or("/");
    let mut conn = H1Conn::connect(net.client_ip(), addr).await?;
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..dist.count {
        let r = conn.send(method, host, path, &headers).await?;
        let name = match r.echo() {
            Ok(e) => e.name().to_owned(),
            Err(_) => format!("<status {}>", r.status.as_u16()),
        };
        *seen.entry(name).or_default() += 1;
    }
    let total_weight: f64 = dist.backends.values().sum();
    ensure!(total_weight > 0.0, "distribution weights sum to 0");
    let mut diffs = Vec::new();
    let names: BTreeSet<&String> = dist.backends.keys().chain(seen.keys()).collect();
    for name in names {
        let want = dist.backends.get(name).copied().unwrap_or(0.0) / total_weight;
        let got = f64::from(seen.get(name).copied().unwrap_or(0)) / f64::from(dist.count);
        let off = if want == 0.0 {
            got > 0.0
        } else {
            (got - want).abs() > dist.tolerance
        };
        if off {
            diffs.push(format!(
                "{name}: expected share {want:.3} (±{}), got {got:.3}",
                dist.tolerance
            ));
        }
    }
    ensure!(
        diffs.is_empty(),
        "{} (counts of {} requests: {seen:?})",
        diffs.join("; "),
        dist.count
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------

fn conditions_diffs(what: &str, conditions: &Value, want: &[CondExpect], out: &mut Vec<String>) {
    for c in want {
        let got = conditions
            .as_array()
            .and_then(|cs| cs.iter().find(|x| x["type"] == c.ctype.as_str()));
        let Some(got) = got else {
            out.push(format!(
                "{what}: expected condition {} {}{}, absent (conditions: {conditions})",
                c.ctype,
                c.status.as_str(),
                c.reason
                    .as_deref()
                    .map(|r| format!(" {r}"))
                    .unwrap_or_default()
            ));
            continue;
        };
        let status_ok = got["status"] == c.status.as_str();
        let reason_ok = c.reason.as_deref().is_none_or(|r| got["reason"] == r);
        if !status_ok || !reason_ok {
            out.push(format!(
                "{what}: condition {}: expected {}{}, got {} {} ({:?})",
                c.ctype,
                c.status.as_str(),
                c.reason
                    .as_deref()
                    .map(|r| format!(" {r}"))
                    .unwrap_or_default(),
                got["status"].as_str().unwrap_or("?"),
                got["reason"].as_str().unwrap_or("?"),
                got["message"].as_str().unwrap_or("")
            ));
        }
    }
}

/// Whether a route's `status.parents[]` entry is for Gateway `ns/name`.
fn parent_is(p: &Value, route_ns: &str, gw: &str) -> bool {
    let (ns, name) = split_ref(gw);
    let pr = &p["parentRef"];
    pr["name"] == name && pr["namespace"].as_str().unwrap_or(route_ns) == ns
}

fn status_diffs(status: &Value, want: &[StatusExpect]) -> Vec<String> {
    let mut out = Vec::new();
    for w in want {
        let what = format!("{} {}/{}", w.kind, w.namespace, w.name);
        let item = match status_item(status, &w.kind, &w.namespace, &w.name) {
            Ok(i) => i,
            Err(e) => {
                out.push(format!("{what}: {e}"));
                continue;
            }
        };
        conditions_diffs(
            &what,
            &item["status"]["conditions"],
            &w.conditions,
            &mut out,
        );
        for l in &w.listeners {
            let lwhat = format!("{what} listener {}", l.name);
            let Ok(got) = gateway_listener(item, &l.name) else {
                out.push(format!("{lwhat}: no listener status in {}", item["status"]));
                continue;
            };
            if let Some(n) = l.attached_routes
                && got["attachedRoutes"] != n
            {
                out.push(format!(
                    "{lwhat}: expected attachedRoutes {n}, got {}",
                    got["attachedRoutes"]
                ));
            }
            if let Some(kinds) = &l.supported_kinds {
                let mut want_k: Vec<&str> = kinds.iter().map(String::as_str).collect();
                let mut got_k: Vec<&str> = got["supportedKinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|k| k["kind"].as_str())
                    .collect();
                want_k.sort_unstable();
                got_k.sort_unstable();
                if want_k != got_k {
                    out.push(format!(
                        "{lwhat}: expected supportedKinds {want_k:?}, got {got_k:?}"
                    ));
                }
            }
            conditions_diffs(&lwhat, &got["conditions"], &l.conditions, &mut out);
        }
        let parents = item["status"]["parents"].as_array();
        for p in &w.parents {
            let pwhat = format!(
                "{what} parent {}{}{}",
                p.gateway,
                p.section_name
                    .as_deref()
                    .map(|s| format!(" section {s}"))
                    .unwrap_or_default(),
                p.port.map(|s| format!(" port {s}")).unwrap_or_default()
            );
            let found = parents.into_iter().flatten().find(|x| {
                parent_is(x, &w.namespace, &p.gateway)
                    && x["parentRef"]["sectionName"].as_str() == p.section_name.as_deref()
                    && x["parentRef"]["port"].as_u64() == p.port.map(u64::from)
            });
            let Some(found) = found else {
                out.push(format!(
                    "{pwhat}: no such parent status; parents: {}",
                    item["status"]["parents"]
                ));
                continue;
            };
            conditions_diffs(&pwhat, &found["conditions"], &p.conditions, &mut out);
        }
        for g in &w.no_parents {
            if let Some(found) = parents
                .into_iter()
                .flatten()
                .find(|x| parent_is(x, &w.namespace, g))
            {
                out.push(format!(
                    "{what}: expected no parent status for {g}, got {found}"
                ));
            }
        }
    }
    out
}

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
    for (i, lc) in cases.into_iter().enumerate() {
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
            (name, run_case(i, lc).await)
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

/// The rows of README.md's feature table: `(feature, supported)`.
fn readme_features(readme: &str) -> Result<Vec<(String, bool)>, BoxError> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in readme.lines() {
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
        "README.md has no feature table (a `| Feature | Supported | Case |` table)"
    );
    Ok(rows)
}

#[test]
fn conformance_case_features_are_known_and_cover_the_readme() -> TestResult {
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
    }
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))?;
    for (feature, supported) in readme_features(&readme)? {
        if !KNOWN_FEATURES.contains(&feature.as_str()) {
            problems.push(format!("README.md lists unknown feature {feature:?}"));
        }
        if supported && !covered.contains(feature.as_str()) {
            problems.push(format!(
                "README.md lists {feature} as supported, but no case covers it"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}
