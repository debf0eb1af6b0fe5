//! The standing check that the case corpus covers the upstream conformance suite:
//! `tests/cases/upstream-coverage.yaml` lists every upstream ConformanceTest of
//! `tests/cases/upstream-shortnames.txt` (the snapshot `tests/cases/upstream-shortnames.sh`
//! regenerates from the Go module) with its cases or why it has none, and
//! docs/conformance.md states the per-profile counts derived from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use super::*;

/// The five Gateway conformance profiles, in docs/conformance.md's order.
const PROFILES: &[&str] = &[
    "GATEWAY-HTTP",
    "GATEWAY-GRPC",
    "GATEWAY-TLS",
    "GATEWAY-TCP",
    "GATEWAY-UDP",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Coverage {
    tests: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    short_name: String,
    profiles: Vec<String>,
    features: Vec<String>,
    #[serde(default)]
    provisional: bool,
    /// Case directories of tests/cases/ that re-express the test.
    #[serde(default)]
    cases: Vec<String>,
    /// Tests outside the case corpus that re-express it, for what only Kubernetes mode
    /// has (generated Services): `tests/<file>.rs::<test function>`.
    #[serde(default)]
    tests: Vec<String>,
    /// Why the test cannot run here (an unsupported feature, a test that does not apply).
    #[serde(default)]
    cannot_run: Option<String>,
    /// Why it has no case yet although it could have one.
    #[serde(default)]
    missing: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    note: Option<String>,
}

/// How an entry is accounted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Covered,
    CannotRun,
    Missing,
}

/// One line of the snapshot: `(profiles, features, provisional)` by ShortName.
type Snapshot = BTreeMap<String, (Vec<String>, Vec<String>, bool)>;

fn parse_snapshot(text: &str) -> Result<Snapshot, BoxError> {
    let mut out = Snapshot::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        ensure!(
            cols.len() == 4,
            "upstream-shortnames.txt:{}: want 4 columns",
            i + 1
        );
        let list = |s: &str| -> Vec<String> {
            if s == "-" {
                Vec::new()
            } else {
                s.split(',').map(str::to_owned).collect()
            }
        };
        let prev = out.insert(
            cols[0].to_owned(),
            (list(cols[1]), list(cols[2]), cols[3] == "provisional"),
        );
        ensure!(prev.is_none(), "upstream-shortnames.txt: {} twice", cols[0]);
    }
    ensure!(!out.is_empty(), "upstream-shortnames.txt lists no test");
    Ok(out)
}

/// The rows of docs/conformance.md's coverage table:
/// profile -> (upstream tests, covered, cannot run, missing).
fn table_counts(doc: &str) -> Result<BTreeMap<String, [usize; 4]>, BoxError> {
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in doc.lines() {
        let line = line.trim();
        if !in_table {
            in_table = line
                .to_ascii_lowercase()
                .starts_with("| profile | upstream tests");
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 5 || cells[0].starts_with("---") {
            continue;
        }
        let mut n = [0; 4];
        for (k, cell) in cells[1..5].iter().enumerate() {
            n[k] = cell
                .parse()
                .map_err(|_| err(format!("docs/conformance.md: {:?} is not a count", cell)))?;
        }
        rows.insert(cells[0].trim_matches('`').to_owned(), n);
    }
    ensure!(
        !rows.is_empty(),
        "docs/conformance.md has no coverage table (a `| Profile | Upstream tests | ...` table)"
    );
    Ok(rows)
}

/// Every problem of the coverage list, given its inputs (empty: all is well).
fn coverage_problems(
    coverage: &Coverage,
    snapshot: &Snapshot,
    cases: &[LoadedCase],
    doc: &str,
) -> Result<Vec<String>, BoxError> {
    let mut problems = Vec::new();
    let case_names: BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    let mut seen: BTreeMap<&str, &Entry> = BTreeMap::new();
    let mut counts: BTreeMap<&str, [usize; 4]> = PROFILES.iter().map(|p| (*p, [0; 4])).collect();
    for e in &coverage.tests {
        let name = e.short_name.as_str();
        if seen.insert(name, e).is_some() {
            problems.push(format!("{name}: listed twice"));
        }
        match snapshot.get(name) {
            None => problems.push(format!(
                "{name}: not an upstream test (not in upstream-shortnames.txt)"
            )),
            Some((profiles, features, provisional)) => {
                if &e.profiles != profiles {
                    problems.push(format!(
                        "{name}: profiles {:?}, upstream {profiles:?}",
                        e.profiles
                    ));
                }
                if &e.features != features {
                    problems.push(format!(
                        "{name}: features {:?}, upstream {features:?}",
                        e.features
                    ));
                }
                if e.provisional != *provisional {
                    problems.push(format!(
                        "{name}: provisional {}, upstream {provisional}",
                        e.provisional
                    ));
                }
            }
        }
        let reason = |r: &Option<String>| r.as_deref().is_some_and(|r| !r.trim().is_empty());
        let status = match (
            !e.cases.is_empty() || !e.tests.is_empty(),
            reason(&e.cannot_run),
            reason(&e.missing),
        ) {
            (true, false, false) => Status::Covered,
            (false, true, false) => Status::CannotRun,
            (false, false, true) => Status::Missing,
            (false, false, false) => {
                problems.push(format!(
                    "{name}: has neither a case nor a reason (cannotRun or missing)"
                ));
                continue;
            }
            _ => {
                problems.push(format!(
                    "{name}: give exactly one of cases, cannotRun, missing"
                ));
                continue;
            }
        };
        for c in &e.cases {
            if !case_names.contains(c.as_str()) {
                problems.push(format!("{name}: case {c} does not exist in tests/cases/"));
            }
        }
        for t in &e.tests {
            if let Some(why) = missing_test(t) {
                problems.push(format!("{name}: test {t}: {why}"));
            }
        }
        for p in &e.profiles {
            if let Some(n) = counts.get_mut(p.as_str()) {
                n[0] += 1;
                n[match status {
                    Status::Covered => 1,
                    Status::CannotRun => 2,
                    Status::Missing => 3,
                }] += 1;
            }
        }
    }
    for name in snapshot.keys() {
        if !seen.contains_key(name.as_str()) {
            problems.push(format!("{name}: upstream test missing from the list"));
        }
    }
    // A case that names the upstream test it re-expresses must be listed for it.
    for lc in cases {
        let Some(test) = &lc.case.conformance_test else {
            continue;
        };
        match seen.get(test.as_str()) {
            None => problems.push(format!(
                "{}: conformanceTest {test} is not an upstream test in the list",
                lc.name
            )),
            Some(e) if !e.cases.contains(&lc.name) => problems.push(format!(
                "{}: conformanceTest {test}, but the list does not name this case for it",
                lc.name
            )),
            Some(_) => {}
        }
    }
    // docs/conformance.md's counts are the list's.
    let table = table_counts(doc)?;
    for (profile, n) in &counts {
        match table.get(*profile) {
            None => problems.push(format!(
                "docs/conformance.md: no coverage row for {profile}"
            )),
            Some(t) if t != n => problems.push(format!(
                "docs/conformance.md: {profile} says {t:?} (upstream tests, covered, cannot \
                 run, no case yet); the list gives {n:?}"
            )),
            Some(_) => {}
        }
    }
    for profile in table.keys() {
        if !PROFILES.contains(&profile.as_str()) {
            problems.push(format!("docs/conformance.md: unknown profile {profile}"));
        }
    }
    Ok(problems)
}

fn repo_file(rel: &str) -> Result<String, BoxError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// The features of upstream tests that a test outside the case corpus re-expresses
/// (`tests` in the list): supported, though no case can show it.
pub(super) fn features_tested_outside_cases() -> Result<BTreeSet<String>, BoxError> {
    let coverage = load_coverage(&repo_file("tests/cases/upstream-coverage.yaml")?)?;
    Ok(coverage
        .tests
        .into_iter()
        .filter(|e| !e.tests.is_empty())
        .flat_map(|e| e.features)
        .collect())
}

fn load_coverage(text: &str) -> Result<Coverage, BoxError> {
    serde_saphyr::from_str(text).map_err(|e| err(format!("upstream-coverage.yaml: {e}")))
}

#[test]
fn upstream_coverage_list_matches_the_suite_the_cases_and_the_docs() -> TestResult {
    let coverage = load_coverage(&repo_file("tests/cases/upstream-coverage.yaml")?)?;
    let snapshot = parse_snapshot(&repo_file("tests/cases/upstream-shortnames.txt")?)?;
    let cases = load_cases()?;
    let doc = repo_file("docs/conformance.md")?;
    let problems = coverage_problems(&coverage, &snapshot, &cases, &doc)?;
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// A deliberate breakage of the list or of the cases.
type Breakage = Box<dyn Fn(&mut Coverage, &mut Vec<LoadedCase>)>;

/// Each check fails on a list broken in its way (so the test above can fail).
#[test]
fn upstream_coverage_checks_fail_on_broken_lists() -> TestResult {
    let text = repo_file("tests/cases/upstream-coverage.yaml")?;
    let snapshot = parse_snapshot(&repo_file("tests/cases/upstream-shortnames.txt")?)?;
    let cases = load_cases()?;
    let doc = repo_file("docs/conformance.md")?;
    let ok = load_coverage(&text)?;
    ensure!(
        coverage_problems(&ok, &snapshot, &cases, &doc)?.is_empty(),
        "the list itself is broken"
    );
    let covered = ok
        .tests
        .iter()
        .position(|e| !e.cases.is_empty())
        .ok_or("no covered entry")?;
    let breakages: Vec<(&str, Breakage)> = vec![
        (
            "does not exist",
            Box::new(move |c, _| c.tests[covered].cases[0] = "no-such-case".into()),
        ),
        (
            "neither a case nor a reason",
            Box::new(move |c, _| c.tests[covered].cases.clear()),
        ),
        (
            "upstream test missing from the list",
            Box::new(move |c, _| {
                c.tests.remove(covered);
            }),
        ),
        (
            "is not an upstream test in the list",
            Box::new(|_, cs| cs[0].case.conformance_test = Some("HTTPRouteNoSuchTest".into())),
        ),
        (
            "features",
            Box::new(move |c, _| c.tests[covered].features.push("TLSRoute".into())),
        ),
        (
            "docs/conformance.md",
            Box::new(move |c, _| {
                c.tests[covered].cases.clear();
                c.tests[covered].missing = Some("broken on purpose".into());
            }),
        ),
        (
            "has no function",
            Box::new(move |c, _| {
                c.tests[covered]
                    .tests
                    .push("tests/kubernetes/infrastructure.rs::no_such_test".into());
            }),
        ),
    ];
    for (want, breakage) in &breakages {
        let mut broken = load_coverage(&text)?;
        let mut cs = load_cases()?;
        breakage(&mut broken, &mut cs);
        let problems = coverage_problems(&broken, &snapshot, &cs, &doc)?;
        ensure!(
            problems.iter().any(|p| p.contains(*want)),
            "a list broken for {want:?} gave {problems:?}"
        );
    }
    Ok(())
}

/// Why `tests/<file>.rs::<function>` names no test of this repository, if it does not.
fn missing_test(spec: &str) -> Option<String> {
    let Some((file, function)) = spec.split_once("::") else {
        return Some("write it as tests/<file>.rs::<test function>".to_owned());
    };
    if !file.starts_with("tests/") || file.contains("..") {
        return Some("the file must be under tests/".to_owned());
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    match std::fs::read_to_string(&path) {
        Ok(text)
            if text.contains(&format!("async fn {function}("))
                || text.contains(&format!(" fn {function}(")) =>
        {
            None
        }
        Ok(_) => Some(format!("{file} has no function {function}")),
        Err(e) => Some(format!("{}: {e}", path.display())),
    }
}
