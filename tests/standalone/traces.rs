//! Request IDs and traces, end to end: a real client, the edge, the echo backend
//! (which reports the headers it received) and, for traces, a real OpenTelemetry
//! receiver: Jaeger v2 (the OTel collector with its OTLP gRPC receiver, an in-memory
//! store and a query API), built by tests/jaeger/install.sh.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

use crate::common::*;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// Spans are exported once a second; Jaeger stores what it receives at once.
const SPAN_WAIT: Duration = Duration::from_secs(30);

/// The access log's JSON lines so far.
fn access_lines(edge: &Proc) -> Vec<Value> {
    edge.stdout()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The access-log line of the request to `path`, once written.
async fn access_line(edge: &Proc, path: &str) -> Result<Value, BoxError> {
    eventually(
        &format!("the access log line of {path}"),
        EVENTUALLY,
        || async move {
            access_lines(edge)
                .into_iter()
                .find(|l| l["path"] == path)
                .ok_or_else(|| err(format!("no line for {path} yet:\n{}", edge.stdout())))
        },
    )
    .await
}

/// `00-<trace>-<span>-<flags>`, split.
fn traceparent_fields(v: &str) -> Result<[&str; 4], BoxError> {
    let parts: Vec<&str> = v.split('-').collect();
    match parts[..] {
        [a, b, c, d] if a == "00" && b.len() == 32 && c.len() == 16 && d.len() == 2 => {
            Ok([a, b, c, d])
        }
        _ => Err(err(format!("not a version-00 traceparent: {v:?}"))),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_round_trip_and_traceparent_passes_when_tracing_is_off() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("all.yaml", &single_route(net, &["ids.example.com"]))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--access-log", "json"])
        .await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;
    let mut c = H1Conn::connect(net.client_ip(), gw).await?;

    // No ID from the client: the edge makes one, and the backend, the client and the
    // access log all see that one.
    let made = c.get("ids.example.com", "/made").await?;
    let backend_saw = made.echo()?.header("x-request-id").map(str::to_owned);
    let id = made
        .header("x-request-id")
        .ok_or_else(|| err("no x-request-id in the response"))?
        .to_owned();
    ensure!(
        backend_saw.as_deref() == Some(&id),
        "backend saw {backend_saw:?}, client got {id:?}"
    );
    let hex = id.bytes().filter(u8::is_ascii_hexdigit).count();
    ensure!(
        id.len() == 36 && hex == 32 && id.as_bytes()[14] == b'4',
        "not a UUID v4: {id:?}"
    );
    let line = access_line(&edge, "/made").await?;
    ensure!(line["request_id"] == id.as_str(), "{line}");
    // Every request gets its own.
    let again = c.get("ids.example.com", "/again").await?;
    ensure!(
        again.header("x-request-id").is_some_and(|v| v != id),
        "the same ID twice: {:?}",
        again.header("x-request-id")
    );

    // The client's ID is kept, and so is its traceparent: tracing is off.
    let tp = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let kept = c
        .send(
            "GET",
            "ids.example.com",
            "/kept",
            &[("x-request-id", "client-id-7"), ("traceparent", &tp)],
        )
        .await?;
    let echo = kept.echo()?;
    ensure!(
        echo.header("x-request-id") == Some("client-id-7"),
        "{:?}",
        echo.0
    );
    ensure!(
        echo.header("traceparent") == Some(tp.as_str()),
        "{:?}",
        echo.0
    );
    ensure!(
        kept.header("x-request-id") == Some("client-id-7"),
        "{:?}",
        kept.headers
    );
    let line = access_line(&edge, "/kept").await?;
    ensure!(
        line["request_id"] == "client-id-7" && line["trace_id"] == CLIENT_TRACE,
        "{line}"
    );

    // The same over HTTP/2 (h2c).
    let mut h2 = H2Conn::connect(net.client_ip(), gw).await?;
    let r = h2.get("ids.example.com", "/h2").await?;
    let sent = r.echo()?.header("x-request-id").map(str::to_owned);
    ensure!(
        sent.as_deref().is_some_and(|s| s.len() == 36)
            && sent.as_deref() == r.header("x-request-id"),
        "h2: backend {sent:?}, client {:?}",
        r.header("x-request-id")
    );

    // One the edge will not pass on (too long): replaced.
    let long = "x".repeat(200);
    let replaced = c
        .send(
            "GET",
            "ids.example.com",
            "/long",
            &[("x-request-id", &long)],
        )
        .await?;
    let sent = replaced.echo()?.header("x-request-id").map(str::to_owned);
    ensure!(
        sent.as_deref().is_some_and(|s| s.len() == 36)
            && sent.as_deref() == replaced.header("x-request-id"),
        "backend {sent:?}, client {:?}",
        replaced.header("x-request-id")
    );

    // The edge's own answers carry one too: a 404 for a host no route serves.
    let no_route = c
        .send(
            "GET",
            "nothing.example.com",
            "/x",
            &[("x-request-id", "rid-404")],
        )
        .await?;
    ensure!(
        no_route.status == StatusCode::NOT_FOUND
            && no_route.header("x-request-id") == Some("rid-404"),
        "{} {:?}",
        no_route.status,
        no_route.headers
    );
    env.pass()
}

/// Jaeger's config: OTLP/gRPC in, memory store, query API; every socket on `net`.
/// With `tls` (certificate and key files), the OTLP receiver speaks TLS only.
fn jaeger_config(
    otlp: SocketAddr,
    query: SocketAddr,
    query_grpc: SocketAddr,
    tls: Option<(&std::path::Path, &std::path::Path)>,
) -> String {
    let tls = tls.map_or_else(String::new, |(cert, key)| {
        format!(
            "
        tls:
          cert_file: {}
          key_file: {}",
            cert.display(),
            key.display()
        )
    });
    format!(
        "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: {query}
    grpc:
      endpoint: {query_grpc}
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 1000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {otlp}{tls}
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"
    )
}

/// A running Jaeger: where to send OTLP and where to ask for traces.
struct Jaeger {
    _proc: Proc,
    otlp: SocketAddr,
    query: SocketAddr,
}

async fn spawn_jaeger(
    env: &TestEnv,
    bin: &std::path::Path,
    tls: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<Jaeger, BoxError> {
    let net = env.net;
    let (otlp, query, query_grpc) = (
        net.addr(240, 4317),
        net.addr(240, 16686),
        net.addr(240, 16685),
    );
    let config = env.dir.path().join("jaeger.yaml");
    std::fs::write(&config, jaeger_config(otlp, query, query_grpc, tls))?;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config").arg(&config);
    let mut proc = env.spawn_cmd(cmd, "jaeger")?;
    let client = net.client_ip();
    // Jaeger builds its pipelines after the query server: wait for the OTLP port too.
    eventually("Jaeger answers", Duration::from_secs(60), || {
        let alive = proc.check_alive();
        async move {
            alive?;
            let r = h1_get_from(client, query, "jaeger", "/api/services").await?;
            ensure!(r.status == StatusCode::OK, "query API: {}", r.status);
            connect_from(client, otlp).await?;
            Ok(())
        }
    })
    .await?;
    Ok(Jaeger {
        _proc: proc,
        otlp,
        query,
    })
}

/// The spans Jaeger holds for `trace` (OTLP JSON from its v3 API), once there are
/// `n`.
async fn spans(jaeger: &Jaeger, net: Net, trace: &str, n: usize) -> Result<Vec<Value>, BoxError> {
    let query = jaeger.query;
    eventually(
        &format!("{n} span(s) of trace {trace} in Jaeger"),
        SPAN_WAIT,
        || async move {
            let r = h1_get_from(
                net.client_ip(),
                query,
                "jaeger",
                &format!("/api/v3/traces/{trace}"),
            )
            .await?;
            ensure!(r.status == StatusCode::OK, "{}: {}", r.status, r.text());
            let body = r.json()?;
            let spans: Vec<Value> = body["result"]["resourceSpans"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|rs| {
                    let service = rs["resource"]["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|a| a["key"] == "service.name")
                        .map(|a| a["value"]["stringValue"].clone())
                        .unwrap_or(Value::Null);
                    rs["scopeSpans"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|ss| ss["spans"].as_array().into_iter().flatten())
                        .map(move |s| {
                            let mut s = s.clone();
                            s["service"] = service.clone();
                            s
                        })
                })
                .collect();
            ensure!(spans.len() >= n, "{} spans so far: {body}", spans.len());
            Ok(spans)
        },
    )
    .await
}

/// A span attribute's value, whatever its OTLP JSON type.
fn attr(span: &Value, key: &str) -> Value {
    span["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"].as_object())
        .and_then(|v| v.values().next().cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_with_the_right_parent_reach_a_real_otlp_receiver() -> TestResult {
    let Some(jaeger_bin) = test_tool(
        "tests/jaeger/install.sh",
        "no Go toolchain, so no Jaeger to receive spans",
    )?
    else {
        return Ok(());
    };
    let env = TestEnv::new()?;
    let net = env.net;
    let jaeger = spawn_jaeger(&env, &jaeger_bin, None).await?;
    // Everything to echo "a"; down.example.com to an endpoint where nothing listens.
    let mut m = single_route(net, &[]);
    m.push_str(&backend(
        "default",
        "svc-down",
        net.addr(253, ECHO_PORT),
        true,
    ));
    m.push_str(&route(
        "default",
        "down",
        "edge",
        &["down.example.com"],
        &[("PathPrefix", "/", "svc-down")],
    ));
    env.write_manifest("all.yaml", &m)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let endpoint = format!("http://{}", jaeger.otlp);
    let edge = env
        .spawn_edge_args(
            "edge",
            &[env.manifests()],
            &[
                "--access-log",
                "json",
                "--otlp-endpoint",
                &endpoint,
                "--trace-sample",
                "1",
            ],
        )
        .await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;
    let mut c = H1Conn::connect(net.client_ip(), gw).await?;

    // 1. The client's trace, not sampled: continued (same trace, the edge's span as
    // the backend's parent, still not sampled) but no span is exported.
    const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    let r = c
        .send(
            "GET",
            "traced.example.com",
            "/unsampled",
            &[(
                "traceparent",
                &format!("00-{UNSAMPLED_TRACE}-b7ad6b7169203331-00"),
            )],
        )
        .await?;
    let up = r.echo()?.header("traceparent").map(str::to_owned);
    let up = up.ok_or_else(|| err("the backend got no traceparent"))?;
    let [_, trace, span, flags] = traceparent_fields(&up)?;
    ensure!(
        trace == UNSAMPLED_TRACE && span != "b7ad6b7169203331" && flags == "00",
        "backend saw {up}"
    );

    // 2. The client's sampled trace: continued, and the edge's span, child of the
    // client's, reaches Jaeger with the ID the backend was given as its parent.
    let r = c
        .send(
            "GET",
            "traced.example.com",
            "/continued?q=1",
            &[
                (
                    "traceparent",
                    &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
                ),
                ("tracestate", "vendor=opaque"),
                ("x-request-id", "rid-traced"),
            ],
        )
        .await?;
    let echo = r.echo()?;
    let up = echo
        .header("traceparent")
        .ok_or_else(|| err("the backend got no traceparent"))?
        .to_owned();
    let [_, trace, edge_span, flags] = traceparent_fields(&up)?;
    ensure!(
        trace == CLIENT_TRACE && edge_span != CLIENT_SPAN && flags == "01",
        "backend saw {up}"
    );
    ensure!(
        echo.header("tracestate") == Some("vendor=opaque"),
        "{:?}",
        echo.0
    );
    ensure!(
        r.header("x-request-id") == Some("rid-traced"),
        "{:?}",
        r.headers
    );
    let edge_span = edge_span.to_owned();

    // 3. No trace context: the edge starts a trace; its span is the root.
    let r = c.get("traced.example.com", "/started").await?;
    let up = r
        .echo()?
        .header("traceparent")
        .ok_or_else(|| err("the backend got no traceparent"))?
        .to_owned();
    let [_, started_trace, root_span, flags] = traceparent_fields(&up)?;
    ensure!(flags == "01", "sampled at ratio 1: {up}");
    let (started_trace, root_span) = (started_trace.to_owned(), root_span.to_owned());

    let got = spans(&jaeger, net, CLIENT_TRACE, 1).await?;
    ensure!(got.len() == 1, "one span for the request: {got:?}");
    let s = &got[0];
    let want = [
        ("traceId", Value::from(CLIENT_TRACE)),
        ("spanId", edge_span.clone().into()),
        ("parentSpanId", CLIENT_SPAN.into()),
        ("name", "GET default/r".into()),
        ("service", "aether-edge".into()),
    ];
    for (k, v) in want {
        ensure!(s[k] == v, "span {k} is {}, want {v}: {s}", s[k]);
    }
    // SPAN_KIND_SERVER, as a number or its name.
    ensure!(
        s["kind"] == 2 || s["kind"] == "SPAN_KIND_SERVER",
        "kind: {s}"
    );
    let echo_a = net.echo_a();
    let int = |v: i64| move |x: &Value| x == &Value::from(v) || x == &Value::from(v.to_string());
    for (k, ok) in [
        (
            "http.request.method",
            Box::new(|v: &Value| v == "GET") as Box<dyn Fn(&Value) -> bool>,
        ),
        ("http.route", Box::new(|v: &Value| v == "default/r")),
        ("http.response.status_code", Box::new(int(200))),
        ("url.path", Box::new(|v: &Value| v == "/continued")),
        ("url.scheme", Box::new(|v: &Value| v == "http")),
        (
            "server.address",
            Box::new(|v: &Value| v == "traced.example.com"),
        ),
        ("server.port", Box::new(int(i64::from(LISTENER_PORT)))),
        (
            "client.address",
            Box::new(move |v: &Value| v == &Value::from(net.client_ip().to_string())),
        ),
        (
            "aether.upstream.address",
            Box::new(move |v: &Value| v == &Value::from(echo_a.ip().to_string())),
        ),
        (
            "aether.upstream.port",
            Box::new(int(i64::from(echo_a.port()))),
        ),
        ("network.protocol.version", Box::new(|v: &Value| v == "1.1")),
    ] {
        let v = attr(s, k);
        ensure!(ok(&v), "attribute {k} is {v}: {s}");
    }

    let got = spans(&jaeger, net, &started_trace, 1).await?;
    ensure!(got.len() == 1, "one span: {got:?}");
    ensure!(
        got[0]["spanId"] == root_span.as_str()
            && got[0]["parentSpanId"]
                .as_str()
                .unwrap_or_default()
                .is_empty(),
        "a root span, the backend's parent: {}",
        got[0]
    );

    // 4. An answer the edge made itself, 503: the span is an error and says why.
    const FAILED_TRACE: &str = "5b8efff798038103d269b633813fc60c";
    let r = c
        .send(
            "GET",
            "down.example.com",
            "/down",
            &[(
                "traceparent",
                &format!("00-{FAILED_TRACE}-{CLIENT_SPAN}-01"),
            )],
        )
        .await?;
    ensure!(r.status == StatusCode::SERVICE_UNAVAILABLE, "{}", r.status);
    let got = spans(&jaeger, net, FAILED_TRACE, 1).await?;
    let s = &got[0];
    let code = &s["status"]["code"];
    ensure!(
        code == 2 || code == "STATUS_CODE_ERROR",
        "an error status: {s}"
    );
    for (k, v) in [
        ("http.route", Value::from("default/down")),
        ("error.type", "upstream_connect_failed".into()),
        ("aether.reason", "upstream_connect_failed".into()),
    ] {
        ensure!(attr(s, k) == v, "attribute {k} is {}: {s}", attr(s, k));
    }
    let status = attr(s, "http.response.status_code");
    ensure!(status == 503 || status == "503", "{s}");
    ensure!(s["parentSpanId"] == CLIENT_SPAN, "{s}");

    // The access log names the trace each request belonged to.
    let line = access_line(&edge, "/continued").await?;
    ensure!(
        line["trace_id"] == CLIENT_TRACE && line["request_id"] == "rid-traced",
        "{line}"
    );
    let line = access_line(&edge, "/started").await?;
    ensure!(line["trace_id"] == started_trace.as_str(), "{line}");
    let line = access_line(&edge, "/unsampled").await?;
    ensure!(line["trace_id"] == UNSAMPLED_TRACE, "{line}");

    // Exactly the three sampled requests were exported (counted once the collector
    // answered); nothing was dropped.
    eventually("3 spans counted as exported", EVENTUALLY, || async move {
        let text = metrics_text(net).await?;
        ensure!(
            metric_sum(&text, "aether_trace_spans_exported_total") == 3.0
                && metric_sum(&text, "aether_trace_spans_dropped_total") == 0.0,
            "{text}"
        );
        Ok(())
    })
    .await?;
    let r = h1_get_from(
        net.client_ip(),
        jaeger.query,
        "jaeger",
        &format!("/api/v3/traces/{UNSAMPLED_TRACE}"),
    )
    .await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "the unsampled trace is in Jaeger: {} {}",
        r.status,
        r.text()
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_collector_never_holds_a_request() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    // A "collector" that accepts connections and never says a word: every export
    // waits for its 5 s bound.
    let stuck = tokio::net::TcpListener::bind(net.addr(240, 4317)).await?;
    let stuck_addr = stuck.local_addr()?;
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((conn, _)) = stuck.accept().await {
            conns.push(conn);
        }
    });
    env.write_manifest("all.yaml", &single_route(net, &[]))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let endpoint = format!("http://{stuck_addr}");
    let _edge = env
        .spawn_edge_args(
            "edge",
            &[env.manifests()],
            &["--otlp-endpoint", &endpoint, "--access-log", "off"],
        )
        .await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;
    let mut c = H1Conn::connect(net.client_ip(), gw).await?;
    // Spread over more than a batch delay, so exports are under way (and stuck)
    // while requests keep coming.
    let mut slowest = Duration::ZERO;
    for i in 0..60 {
        let t = std::time::Instant::now();
        let r = c.get("stuck.example.com", &format!("/{i}")).await?;
        ensure!(r.status == StatusCode::OK, "request {i}: {}", r.status);
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Held by an export, a request would wait out its 5 s bound.
    ensure!(
        slowest < Duration::from_secs(2),
        "a request took {slowest:?} while the collector was stuck"
    );
    // The stuck export gives up at its bound and counts what it carried as lost.
    eventually("spans counted as export_failed", SPAN_WAIT, || async move {
        let text = metrics_text(net).await?;
        let failed = metric_sum_where(
            &text,
            "aether_trace_spans_dropped_total",
            "reason=\"export_failed\"",
        );
        ensure!(failed >= 1.0, "{text}");
        ensure!(
            metric_sum(&text, "aether_trace_spans_exported_total") == 0.0,
            "{text}"
        );
        Ok(())
    })
    .await?;
    held.abort();
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_reach_a_collector_over_tls() -> TestResult {
    let Some(jaeger_bin) = test_tool(
        "tests/jaeger/install.sh",
        "no Go toolchain, so no Jaeger to receive spans",
    )?
    else {
        return Ok(());
    };
    let env = TestEnv::new()?;
    let net = env.net;
    // The collector's certificate, from a CA the edge is told to trust the way an
    // operator would: SSL_CERT_FILE, read with the system's roots.
    let ca = TestCa::new("collector-ca")?;
    let leaf = ca.leaf(&[&net.ip_str(240)])?;
    let dir = env.dir.path();
    let (ca_file, cert, key) = (
        dir.join("ca.pem"),
        dir.join("otlp.pem"),
        dir.join("otlp.key"),
    );
    std::fs::write(&ca_file, &ca.cert_pem)?;
    std::fs::write(&cert, &leaf.cert_pem)?;
    std::fs::write(&key, &leaf.key_pem)?;
    let jaeger = spawn_jaeger(&env, &jaeger_bin, Some((&cert, &key))).await?;
    env.write_manifest("all.yaml", &single_route(net, &[]))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_aether-edge"));
    cmd.args(["run", "--manifests"])
        .arg(env.manifests())
        .args(["--admin", &net.admin().to_string()])
        .args(["--address-pool", &net.pool()])
        .args(["--otlp-endpoint", &format!("https://{}", jaeger.otlp)])
        .env("SSL_CERT_FILE", &ca_file)
        .env("RUST_LOG", "info");
    let mut edge = env.spawn_cmd(cmd, "edge")?;
    env.wait_ready(&mut edge).await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;
    let mut c = H1Conn::connect(net.client_ip(), gw).await?;
    let r = c
        .send(
            "GET",
            "tls.example.com",
            "/over-tls",
            &[(
                "traceparent",
                &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
            )],
        )
        .await?;
    let up = r
        .echo()?
        .header("traceparent")
        .ok_or_else(|| err("the backend got no traceparent"))?
        .to_owned();
    let [_, _, edge_span, _] = traceparent_fields(&up)?;
    let got = spans(&jaeger, net, CLIENT_TRACE, 1).await?;
    ensure!(
        got.len() == 1 && got[0]["spanId"] == edge_span && got[0]["parentSpanId"] == CLIENT_SPAN,
        "the span over TLS: {got:?}"
    );
    env.pass()
}
