//! `/metrics` as a scraper reads it, after traffic (a routed 200, a 404, a 502): every
//! metric family has `# HELP` and `# TYPE`, and Prometheus' own linter, `promtool check
//! metrics` (Debian's `prometheus` package, `tests/promtool/install.sh`), finds nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use http::StatusCode;

use crate::common::*;

/// Starts an edge on network `k`, sends a request a route answers (200), one no route
/// matches (404) and one whose backend closes every connection without answering (502),
/// and returns `/metrics` once the three are counted.
async fn scrape_after_traffic(env: &TestEnv) -> Result<String, BoxError> {
    let net = env.net;
    let gw = net.gw();
    env.write_manifest("infra.yaml", &standard_infra(net))?;
    let mut routes = route(
        "default",
        "ok",
        "edge",
        &["ok.example.com"],
        &[("PathPrefix", "/", "svc-a")],
    );
    // svc-b's endpoint (echo "b"'s address) accepts and closes without an answer.
    routes.push_str(&route(
        "default",
        "down",
        "edge",
        &["down.example.com"],
        &[("PathPrefix", "/", "svc-b")],
    ));
    env.write_manifest("routes.yaml", &routes)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mute = tokio::net::TcpListener::bind(net.echo_b()).await?;
    let mute = tokio::spawn(async move {
        while let Ok((conn, _)) = mute.accept().await {
            drop(conn);
        }
    });
    let edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    for (host, want) in [
        ("ok.example.com", StatusCode::OK),
        ("nothing.example.com", StatusCode::NOT_FOUND),
        ("down.example.com", StatusCode::BAD_GATEWAY),
    ] {
        let r = env.h1(gw, host, "/lint").await?;
        ensure!(
            r.status == want,
            "{host} answered {}, want {want}",
            r.status
        );
    }
    let text = eventually(
        "the 2xx, 4xx and 5xx are counted",
        EVENTUALLY,
        || async move {
            let text = metrics_text(net).await?;
            for code in ["2xx", "4xx", "5xx"] {
                ensure!(
                    text.lines().any(|l| l.starts_with("aether_requests_total{")
                        && l.contains(&format!("code=\"{code}\""))),
                    "no aether_requests_total{{code=\"{code}\"}} yet"
                );
            }
            Ok(text)
        },
    )
    .await?;
    drop(edge);
    mute.abort();
    Ok(text)
}

/// Metric families by name: (has a `# HELP`, its `# TYPE`).
type Families = BTreeMap<String, (bool, Option<String>)>;

/// The families in Prometheus text, and the names of its samples.
fn families(text: &str) -> (Families, BTreeSet<String>) {
    let mut fams = Families::new();
    let mut samples = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split_whitespace().next().unwrap_or_default();
            fams.entry(name.to_owned()).or_default().0 = true;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let name = it.next().unwrap_or_default();
            fams.entry(name.to_owned()).or_default().1 = it.next().map(str::to_owned);
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_owned());
        }
    }
    (fams, samples)
}

/// The family a sample belongs to: itself, or a histogram's or summary's base name.
fn family_of<'a>(sample: &'a str, fams: &Families) -> Option<&'a str> {
    if fams.contains_key(sample) {
        return Some(sample);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = sample.strip_suffix(suffix)?;
        let kind = fams.get(base)?.1.as_deref()?;
        matches!(kind, "histogram" | "summary").then_some(base)
    })
}

/// Problems with `text`: a sample whose family has no `# HELP` or no `# TYPE`.
pub fn missing_help_or_type(text: &str) -> Vec<String> {
    let (fams, samples) = families(text);
    let mut problems = Vec::new();
    for s in &samples {
        match family_of(s, &fams).and_then(|f| fams.get(f).map(|v| (f, v))) {
            None => problems.push(format!("{s}: no # TYPE (nor # HELP)")),
            Some((f, (help, kind))) => {
                if !help {
                    problems.push(format!("{f}: no # HELP"));
                }
                if kind.is_none() {
                    problems.push(format!("{f}: no # TYPE"));
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_has_help_and_type() -> TestResult {
    let env = TestEnv::new()?;
    let text = scrape_after_traffic(&env).await?;
    let problems = missing_help_or_type(&text);
    ensure!(
        problems.is_empty(),
        "/metrics families without HELP or TYPE:\n{}\n--- /metrics:\n{text}",
        problems.join("\n")
    );
    // Listeners are labelled by Gateway and listener name, not by socket address.
    let connections = text
        .lines()
        .filter(|l| l.starts_with("aether_downstream_connections_"))
        .collect::<Vec<_>>();
    ensure!(
        connections.iter().any(|l| l.starts_with(
            "aether_downstream_connections_total{gateway=\"default/edge\",listener=\"http\"}"
        )),
        "no aether_downstream_connections_total{{gateway=\"default/edge\",listener=\"http\"}}: {connections:?}"
    );
    ensure!(
        !connections
            .iter()
            .any(|l| l.contains(&env.net.gw().to_string())),
        "a connection metric is labelled by socket address: {connections:?}"
    );
    // The per-route histogram is opt-in (--route-latency-histogram).
    ensure!(
        !text.contains("aether_route_request_duration_seconds"),
        "a per-route histogram without the flag:\n{text}"
    );
    let version = env!("CARGO_PKG_VERSION");
    ensure!(
        text.lines().any(|l| l.starts_with("aether_build_info{")
            && l.contains(&format!("version=\"{version}\""))
            && l.ends_with(" 1")),
        "no aether_build_info{{version=\"{version}\"}} 1:\n{text}"
    );
    for name in PROCESS_METRICS {
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok());
        ensure!(
            value.is_some_and(|v| v > 0.0 || name == "process_cpu_seconds_total"),
            "{name} is {value:?}:\n{text}"
        );
    }
    env.pass()
}

/// The standard process metrics (as the Prometheus client libraries name them).
const PROCESS_METRICS: [&str; 6] = [
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// promtool's path; None (with the reason printed) when it is missing and cannot be
/// installed, unless CI's AETHER_REQUIRE_K8S=1 (the test tools are required there).
pub fn promtool() -> Result<Option<PathBuf>, BoxError> {
    test_tool(
        "tests/promtool/install.sh",
        "promtool is missing (Debian's prometheus package; tests/promtool/install.sh installs it as root)",
    )
}

/// Runs `promtool check metrics` on `text`: its exit status and everything it printed.
pub fn promtool_check(promtool: &Path, text: &str) -> Result<(bool, String), BoxError> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| err("promtool has no stdin"))?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), said))
}

#[tokio::test(flavor = "multi_thread")]
async fn promtool_check_metrics_passes() -> TestResult {
    let Some(promtool) = promtool()? else {
        return Ok(());
    };
    let env = TestEnv::new()?;
    let text = scrape_after_traffic(&env).await?;
    let (ok, said) = promtool_check(&promtool, &text)?;
    ensure!(
        ok && said.trim().is_empty(),
        "promtool check metrics (exit ok: {ok}) says:\n{said}\n--- /metrics:\n{text}"
    );
    // The check is not vacuous: promtool does flag a family without HELP.
    let (ok, said) = promtool_check(
        &promtool,
        "# TYPE aether_lint_probe_total counter\naether_lint_probe_total 1\n",
    )?;
    ensure!(
        !ok && said.contains("no help text"),
        "promtool accepted a counter without HELP (exit ok: {ok}): {said}"
    );
    env.pass()
}

/// A Gateway `edge` on the test's address whose HTTP listeners `(name, hostname)` all
/// share port LISTENER_PORT.
fn edge_with_listeners(net: Net, listeners: &[(&str, Option<&str>)]) -> String {
    let mut s = gateway_class("aether", CONTROLLER);
    let mut gw = Gateway::test("edge").address(&net.ip_str(5));
    for (name, hostname) in listeners {
        gw = match hostname {
            Some(h) => gw.http_host(name, LISTENER_PORT, h),
            None => gw.http(name, LISTENER_PORT),
        };
    }
    s.push_str(&gw.yaml());
    s.push_str(&backend("default", "svc-a", net.echo_a(), true));
    s
}

/// The `listener` labels of `aether_downstream_connections_total` series of Gateway
/// default/edge that counted at least one connection.
fn connection_listeners(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(
                "aether_downstream_connections_total{gateway=\"default/edge\",listener=\"",
            )?;
            let (listener, value) = rest.split_once("\"} ")?;
            (value.trim().parse::<f64>().ok()? >= 1.0).then(|| listener.to_owned())
        })
        .collect()
}

/// A reload that folds a second listener into a bound socket relabels the connections
/// accepted after it; the socket stays, and the series of what it served before
/// leaves `/metrics` once no connection accepted under that name is open.
#[tokio::test(flavor = "multi_thread")]
async fn listener_labels_follow_a_reload() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    env.write_manifest("infra.yaml", &edge_with_listeners(net, &[("http", None)]))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "web",
            "edge",
            &[],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;
    let r = env.h1(gw, "any.example.com", "/one").await?;
    ensure!(
        r.status == StatusCode::OK,
        "first request answered {}",
        r.status
    );
    let text = metrics_text(net).await?;
    ensure!(
        connection_listeners(&text) == ["http"],
        "before the reload: {:?}",
        connection_listeners(&text)
    );

    env.write_manifest(
        "infra.yaml",
        &edge_with_listeners(net, &[("http", None), ("extra", Some("extra.example.com"))]),
    )?;
    eventually(
        "the second listener is folded into the socket",
        EVENTUALLY,
        || async move {
            let r = h1_get_from(net.client_ip(), net.gw(), "extra.example.com", "/two").await?;
            ensure!(r.status == StatusCode::OK, "request answered {}", r.status);
            let text = metrics_text(net).await?;
            let listeners = connection_listeners(&text);
            ensure!(
                listeners.iter().any(|l| {
                    let mut names: Vec<&str> = l.split(',').collect();
                    names.sort_unstable();
                    names == ["extra", "http"]
                }),
                "no series for both listeners yet: {listeners:?}"
            );
            let before =
                "aether_downstream_connections_total{gateway=\"default/edge\",listener=\"http\"}";
            ensure!(
                !text.contains(before),
                "the series of the socket's former listener is still there: {before}"
            );
            Ok(())
        },
    )
    .await?;
    env.pass()
}

/// promtool on one sample of every metric the edge describes, including those the
/// traffic above does not reach (L4, mesh, Kubernetes mode, the per-route histogram):
/// names, types and help text all lint clean. Counters and gauges are rendered by the
/// same exporter the edge uses, with a local recorder; histograms and the series of
/// Gateways, listeners, routes and backends by `aether_proxy::series`, as the edge
/// appends them.
#[test]
fn promtool_accepts_every_described_metric() -> TestResult {
    use std::sync::Arc;
    use std::time::Duration;

    use aether_proxy::series;
    use aether_proxy::telemetry::{self, DESCRIPTIONS, Kind, RouteStats};
    use metrics_exporter_prometheus::PrometheusBuilder;

    let Some(promtool) = promtool()? else {
        return Ok(());
    };
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        telemetry::describe();
        for d in DESCRIPTIONS {
            if series::FAMILIES.contains(&d.name) {
                continue;
            }
            match d.kind {
                Kind::Counter => metrics::counter!(d.name).increment(1),
                Kind::Gauge => metrics::gauge!(d.name).set(1.0),
                Kind::Histogram => metrics::histogram!(d.name).record(0.1),
            }
        }
    });
    let mut text = handle.render();
    // This test process serves nothing: the switch and cells are its own.
    series::enable_route_latency(true);
    let gateway: Arc<str> = Arc::from("default/lint");
    let route = RouteStats::new(Arc::clone(&gateway), "HTTPRoute", "default/lint");
    series::enable_route_latency(false);
    route.record(200, Duration::from_millis(7));
    let tcp = series::listener(&gateway, &[Arc::from("http")], false);
    let udp = series::listener(&gateway, &[Arc::from("dns")], true);
    let _open = (tcp.accepted(), udp.flow());
    let backend = series::backend(&Arc::from("default/lint:80"));
    backend.connect_error();
    backend.tls_error();
    backend.retried("status");
    backend.mirrored("ok");
    let _l4 = series::l4_route(&gateway, &Arc::from("default/lint-tcp"));
    series::render(&mut text);
    for d in DESCRIPTIONS {
        ensure!(
            text.contains(&format!("# HELP {} ", d.name)),
            "{} has no HELP line:\n{text}",
            d.name
        );
    }
    for name in [
        telemetry::REQUEST_DURATION_SECONDS,
        telemetry::ROUTE_REQUEST_DURATION_SECONDS,
    ] {
        ensure!(
            text.matches(&format!("# TYPE {name} histogram\n")).count() == 1,
            "{name}: not one histogram TYPE line:\n{text}"
        );
    }
    let (ok, said) = promtool_check(&promtool, &text)?;
    ensure!(
        ok && said.trim().is_empty(),
        "promtool check metrics (exit ok: {ok}) says:\n{said}\n--- rendered:\n{text}"
    );
    Ok(())
}
