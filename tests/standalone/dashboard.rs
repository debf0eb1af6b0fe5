//! The chart's Grafana dashboard (charts/aether-edge/dashboards/aether-edge.json) graphs
//! only what the edge exports: every metric named in a panel's `expr` or a variable's
//! `label_values` query is on `/metrics` of a running edge after ordinary traffic.

use std::collections::BTreeSet;

use http::StatusCode;
use serde_json::Value;

use crate::common::*;

const DASHBOARD: &str = "charts/aether-edge/dashboards/aether-edge.json";

/// PromQL words that are not metric names where they stand outside a call (an
/// aggregation's `by (…)` may come between it and its parenthesis).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// The PromQL queries of a dashboard: panels' (and rows') `targets[].expr`, and the
/// query of each templating variable.
fn queries(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let query = var["query"]["query"].as_str().or(var["query"].as_str());
        if var["type"] == "query"
            && let Some(q) = query
        {
            // label_values(metric{...}, label): only its first argument is a series.
            let series = q
                .strip_prefix("label_values(")
                .and_then(|rest| rest.rsplit_once(',').map(|(series, _)| series));
            if let Some(series) = series {
                out.push(series.to_owned());
            }
        }
    }
    out
}

/// The metric names a PromQL expression selects: identifiers outside strings, label
/// matchers (`{…}`), ranges (`[…]`) and grouping lists (`by (…)`), that are not
/// function calls, keywords or Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut after_grouping = false;
    while let Some(&c) = chars.get(i) {
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while let Some(&d) = chars.get(i) {
                    i += if d == '\\' { 2 } else { 1 };
                    if d == c {
                        break;
                    }
                }
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while chars.get(i).is_some_and(|&d| d != close) {
                    i += 1;
                }
                i += 1;
            }
            '(' if after_grouping => {
                while chars.get(i).is_some_and(|&d| d != ')') {
                    i += 1;
                }
                i += 1;
                after_grouping = false;
            }
            '$' => {
                i += 1;
                while chars
                    .get(i)
                    .is_some_and(|d| d.is_alphanumeric() || *d == '_')
                {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while chars
                    .get(i)
                    .is_some_and(|d| d.is_ascii_alphanumeric() || *d == '_' || *d == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while chars.get(j).is_some_and(|d| d.is_whitespace()) {
                    j += 1;
                }
                let lower = word.to_ascii_lowercase();
                // A label list may follow these (optional after group_left/right).
                after_grouping = [
                    "by",
                    "without",
                    "on",
                    "ignoring",
                    "group_left",
                    "group_right",
                ]
                .contains(&lower.as_str());
                if !after_grouping
                    && chars.get(j) != Some(&'(')
                    && !KEYWORDS.contains(&lower.as_str())
                {
                    names.insert(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // A number or a duration (5m, 1h30m): digits, then unit letters.
                while chars
                    .get(i)
                    .is_some_and(|d| d.is_ascii_alphanumeric() || *d == '.')
                {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Sample names in Prometheus text (a histogram's are `_bucket`, `_sum`, `_count`).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_owned())
        .collect()
}

/// Every (query, metric) of `dashboard` whose metric `/metrics` text lacks.
fn missing(dashboard: &Value, metrics: &str) -> Vec<String> {
    let have = sample_names(metrics);
    queries(dashboard)
        .iter()
        .flat_map(|q| {
            metric_names(q)
                .into_iter()
                .filter(|m| !have.contains(m))
                .map(move |m| format!("{m} (in {q})"))
        })
        .collect()
}

fn dashboard() -> Result<Value, BoxError> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

#[test]
fn metric_names_are_read_from_promql() {
    let q = r#"histogram_quantile(0.99, sum by (gateway, le) (rate(aether_request_duration_seconds_bucket{job=~"$job",code="5xx"}[$__rate_interval]))) / on (gateway) group_left max(up offset 5m) > bool 0.5"#;
    let want: BTreeSet<String> = ["aether_request_duration_seconds_bucket", "up"]
        .map(str::to_owned)
        .into();
    assert_eq!(metric_names(q), want);
    let fake = serde_json::json!({
        "panels": [{"targets": [{"expr": "sum(rate(aether_requests_total[5m])) + aether_no_such_metric"}]}],
        "templating": {"list": [{"type": "query", "query": {"query": "label_values(aether_other_missing{job=~\"$job\"}, gateway)"}}]}
    });
    let text = "# TYPE aether_requests_total counter\naether_requests_total{code=\"2xx\"} 1\n";
    let gaps = missing(&fake, text);
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    assert!(gaps[0].starts_with("aether_no_such_metric"), "{gaps:?}");
    assert!(gaps[1].starts_with("aether_other_missing"), "{gaps:?}");
}

/// A real edge, with a 200, a 404, a 5xx from a backend whose endpoint refuses, and a
/// retry of a refused connect on a backend's other endpoint; every metric the
/// dashboard's queries name is then on `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_metric_is_exported() -> TestResult {
    let dash = dashboard()?;
    let all: BTreeSet<String> = queries(&dash)
        .iter()
        .flat_map(|q| metric_names(q))
        .collect();
    ensure!(
        all.len() >= 12,
        "the dashboard names only {} metrics: {all:?}",
        all.len()
    );
    for panel in dash["panels"].as_array().into_iter().flatten() {
        let targets = panel["targets"].as_array().map_or(0, Vec::len);
        ensure!(
            panel["type"] == "row" || targets > 0,
            "panel {} has no query",
            panel["title"]
        );
    }

    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    // Nothing listens on .252 and .253 of the test network: connections there are refused.
    let refused = net.echo_b();
    let also_refused = net.addr(253, refused.port());
    let mut m = serving_infra(net);
    for (name, host, svc) in [
        ("web", "web.example.com", "svc"),
        ("down", "down.example.com", "svc-down"),
        ("retry", "retry.example.com", "svc-retry"),
    ] {
        m.push_str(&route(
            "default",
            name,
            "edge",
            &[host],
            &[("PathPrefix", "/", svc)],
        ));
    }
    m.push_str(&backend("default", "svc-down", refused, true));
    m.push_str(
        &Backend::test("svc-retry")
            .endpoint(also_refused, true)
            .endpoint(net.echo_a(), true)
            .yaml(),
    );
    env.write_manifest("dashboard.yaml", &m)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    // A budget far above the edge's size: the overload gauge and shed counters exist.
    let manifests = [env.manifests()];
    let _edge = env
        .spawn_edge_args("edge", &manifests, &["--memory-budget", "8589934592"])
        .await?;
    env.wait_listener(gw).await?;

    let r = env.h1(gw, "web.example.com", "/dash").await?;
    ensure!(r.status == StatusCode::OK, "web answered {}", r.status);
    let r = env.h1(gw, "nothing.example.com", "/dash").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "no route answered {}",
        r.status
    );
    let r = env.h1(gw, "down.example.com", "/dash").await?;
    ensure!(r.status.is_server_error(), "down answered {}", r.status);
    // Round robin over two endpoints: one of two requests tries the refusing one first.
    for _ in 0..2 {
        let r = env.h1(gw, "retry.example.com", "/dash").await?;
        ensure!(r.status == StatusCode::OK, "retry answered {}", r.status);
    }

    let dash = &dash;
    eventually(
        "every dashboard metric is on /metrics",
        EVENTUALLY,
        || async move {
            let text = metrics_text(net).await?;
            let gaps = missing(dash, &text);
            ensure!(
                gaps.is_empty(),
                "dashboard queries name metrics /metrics does not have:\n{}",
                gaps.join("\n")
            );
            Ok(())
        },
    )
    .await?;
    env.pass()
}
