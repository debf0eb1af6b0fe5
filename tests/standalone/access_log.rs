//! Access logs on the edge's stdout, as a real client's requests and a real L4
//! connection produce them: a 200 from a backend (over HTTP/1.1 and HTTP/2), a 502 (the backend closes without
//! answering), a 503 (nothing listens at the endpoint), a 504 (the backend is slower
//! than the route's timeout) and a 404 (no route), in JSON and in text, and one line
//! each for a TCP connection and a UDP flow; none with `--access-log off`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use http::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

const TCP_PORT: u16 = 7000;
const UDP_PORT: u16 = 7001;
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Nothing listens at this endpoint: connects are refused.
fn refused_endpoint(net: Net) -> SocketAddr {
    net.addr(253, ECHO_PORT)
}

fn tcp_backend_addr(net: Net) -> SocketAddr {
    net.addr(251, 7100)
}

fn udp_backend_addr(net: Net) -> SocketAddr {
    net.addr(251, 7101)
}

/// Gateway `default/edge` (HTTP on .5) with routes for ok., down., refused. and
/// slow.example.com, and Gateway `default/l4` (TCP on .6) with a TCPRoute.
fn manifests(net: Net) -> String {
    let mut m = standard_infra(net);
    m.push_str(&backend("default", "svc-none", refused_endpoint(net), true));
    m.push_str(&backend("default", "tcp-a", tcp_backend_addr(net), true));
    m.push_str(&backend("default", "udp-a", udp_backend_addr(net), true));
    for (name, host, svc) in [
        ("ok", "ok.example.com", "svc-a"),
        ("down", "down.example.com", "svc-b"),
        ("refused", "refused.example.com", "svc-none"),
    ] {
        m.push_str(&route(
            "default",
            name,
            "edge",
            &[host],
            &[("PathPrefix", "/", svc)],
        ));
    }
    m.push_str(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: slow, namespace: default}
spec:
  parentRefs: [{name: edge}]
  hostnames: [slow.example.com]
  rules:
  - name: slow-rule
    timeouts: {request: 200ms}
    backendRefs: [{name: svc-a, port: 80}]
",
    );
    m.push_str(&l4_gateway(
        "default",
        "l4",
        &net.ip_str(6),
        &[("tcp", TCP_PORT, "TCP"), ("udp", UDP_PORT, "UDP")],
    ));
    m.push_str(&l4_route(
        "TCPRoute",
        "tcp",
        "l4",
        Some("tcp"),
        &[],
        &[("tcp-a", 1)],
    ));
    m.push_str(&l4_route(
        "UDPRoute",
        "udp",
        "l4",
        Some("udp"),
        &[],
        &[("udp-a", 1)],
    ));
    m
}

/// What the client saw of the traffic sent by [`traffic`].
struct Seen {
    ok_body_len: usize,
    tcp_received: usize,
}

/// Backends, an edge with `flags`, and the traffic: 200 (with a request ID, a trace
/// context and an x-forwarded-for from a trusted hop), a POST with a 5-byte body,
/// 502, 503, 504, 404 and one TCP connection.
async fn traffic(
    env: &TestEnv,
    flags: &[&str],
) -> Result<(Proc, Seen, Vec<Box<dyn std::any::Any + Send>>), BoxError> {
    let net = env.net;
    env.write_manifest("all.yaml", &manifests(net))?;
    let echo = env.spawn_echo(net.echo_a(), "a").await?;
    // echo "b"'s address accepts and closes without an answer: a 502.
    let mute = tokio::net::TcpListener::bind(net.echo_b()).await?;
    let mute = tokio::spawn(async move {
        while let Ok((conn, _)) = mute.accept().await {
            drop(conn);
        }
    });
    let tcp = tcp_backend(tcp_backend_addr(net), "a").await?;
    let udp = udp_backend(udp_backend_addr(net), "a").await?;
    // A UDP flow is logged when it ends: after a second without datagrams.
    let mut args = vec!["--xff-trusted-hops", "1", "--udp-idle-timeout", "1s"];
    args.extend_from_slice(flags);
    let edge = env
        .spawn_edge_args("edge", &[env.manifests()], &args)
        .await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;

    let mut c = H1Conn::connect(net.client_ip(), gw).await?;
    let ok = c
        .send(
            "GET",
            "ok.example.com",
            "/ok?token=secret",
            &[
                ("x-request-id", "rid-1"),
                ("traceparent", &format!("00-{TRACE_ID}-00f067aa0ba902b7-01")),
                ("user-agent", "access-log-test/1"),
                ("x-forwarded-for", "203.0.113.7"),
            ],
        )
        .await?;
    ensure!(ok.status == StatusCode::OK, "ok answered {}", ok.status);
    let post = raw_post(net, gw).await?;
    ensure!(post.starts_with("HTTP/1.1 200"), "POST answered {post:?}");
    // HTTP/2 names the host in `:authority`, not in a Host header.
    let h2 = H2Conn::connect(net.client_ip(), gw)
        .await?
        .send(
            "GET",
            "ok.example.com",
            "/h2?token=secret",
            &[
                ("x-request-id", "rid-h2"),
                ("user-agent", "access-log-test/2"),
            ],
        )
        .await?;
    ensure!(h2.status == StatusCode::OK, "h2c answered {}", h2.status);
    for (host, headers, want) in [
        ("down.example.com", &[][..], StatusCode::BAD_GATEWAY),
        (
            "refused.example.com",
            &[][..],
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "slow.example.com",
            &[("x-echo-delay-ms", "3000")][..],
            StatusCode::GATEWAY_TIMEOUT,
        ),
        ("nothing.example.com", &[][..], StatusCode::NOT_FOUND),
    ] {
        let mut c = H1Conn::connect(net.client_ip(), gw).await?;
        let r = c.send("GET", host, "/x", headers).await?;
        ensure!(
            r.status == want,
            "{host} answered {}, want {want}",
            r.status
        );
    }

    let mut s = connect_from(net.client_ip(), net.addr(6, TCP_PORT)).await?;
    s.write_all(b"ping").await?;
    s.shutdown().await?;
    let mut got = Vec::new();
    tokio::time::timeout(REQUEST_TIMEOUT, s.read_to_end(&mut got))
        .await
        .map_err(|_| err("TCP read timed out"))??;
    let got = String::from_utf8_lossy(&got).into_owned();
    ensure!(
        got == "hello from a\npingbye 4\n",
        "the TCP backend said {got:?}"
    );
    // One datagram each way; the flow's line comes when it idles out.
    let sock = tokio::net::UdpSocket::bind((net.client_ip(), 0)).await?;
    sock.connect(net.addr(6, UDP_PORT)).await?;
    let reply = eventually("a UDP answer", EVENTUALLY, || {
        let sock = &sock;
        async move {
            sock.send(b"hi").await?;
            let mut buf = [0u8; 64];
            let n =
                tokio::time::timeout(std::time::Duration::from_millis(300), sock.recv(&mut buf))
                    .await
                    .map_err(|_| err("no UDP answer yet"))??;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        }
    })
    .await?;
    ensure!(reply == "a:hi", "the UDP backend said {reply:?}");
    let seen = Seen {
        ok_body_len: ok.body.len(),
        tcp_received: got.len(),
    };
    let keep: Vec<Box<dyn std::any::Any + Send>> = vec![
        Box::new(echo),
        Box::new(Abort(mute)),
        Box::new(Abort(tcp)),
        Box::new(Abort(udp)),
    ];
    Ok((edge, seen, keep))
}

/// Aborts a test task when dropped.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A POST with a 5-byte body, written by hand so the bytes on the wire are known.
async fn raw_post(net: Net, gw: SocketAddr) -> Result<String, BoxError> {
    let mut s = connect_from(net.client_ip(), gw).await?;
    s.write_all(
        b"POST /post HTTP/1.1\r\nHost: ok.example.com\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(REQUEST_TIMEOUT, s.read_to_end(&mut out))
        .await
        .map_err(|_| err("POST timed out"))??;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Waits until the edge's stdout holds `n` lines, and returns them.
async fn lines(edge: &Proc, n: usize) -> Result<Vec<String>, BoxError> {
    eventually(
        &format!("{n} access-log lines"),
        EVENTUALLY,
        || async move {
            let out = edge.stdout();
            let lines: Vec<String> = out.lines().map(str::to_owned).collect();
            ensure!(lines.len() >= n, "{} lines so far:\n{out}", lines.len());
            Ok(lines)
        },
    )
    .await
}

/// The one line whose `key` is `value`.
fn one<'a, T>(lines: &'a [T], what: &str, pick: impl Fn(&T) -> bool) -> Result<&'a T, BoxError> {
    let mut found = lines.iter().filter(|l| pick(l));
    let first = found
        .next()
        .ok_or_else(|| err(format!("no line for {what}")))?;
    ensure!(found.next().is_none(), "more than one line for {what}");
    Ok(first)
}

#[tokio::test(flavor = "multi_thread")]
async fn json_access_log_says_why_the_edge_answered() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    // --log-format json alone makes the access log JSON too.
    let (edge, seen, _keep) = traffic(&env, &["--log-format", "json"]).await?;
    let raw = lines(&edge, 9).await?;
    let lines: Vec<Value> = raw
        .iter()
        .map(|l| serde_json::from_str(l).map_err(|e| err(format!("not JSON ({e}): {l}"))))
        .collect::<Result<_, _>>()?;
    ensure!(lines.len() == 9, "want 9 lines, got:\n{}", raw.join("\n"));
    let http = |host: &'static str, path: &'static str| {
        move |v: &Value| v["authority"] == host && v["path"] == path
    };
    let echo_a = net.echo_a().to_string();

    let ok = one(&lines, "the 200", http("ok.example.com", "/ok"))?;
    let want = [
        ("kind", Value::from("http")),
        ("gateway", "default/edge".into()),
        ("listener", "http".into()),
        ("route_kind", "HTTPRoute".into()),
        ("route", "default/ok".into()),
        ("method", "GET".into()),
        ("protocol", "HTTP/1.1".into()),
        ("status", 200.into()),
        ("reason", Value::Null),
        ("client", "203.0.113.7".into()),
        ("upstream", echo_a.clone().into()),
        ("retries", 0.into()),
        ("request_id", "rid-1".into()),
        ("trace_id", TRACE_ID.into()),
        ("user_agent", "access-log-test/1".into()),
        ("request_bytes", 0.into()),
        ("response_bytes", seen.ok_body_len.into()),
        ("complete", true.into()),
    ];
    for (k, v) in want {
        ensure!(ok[k] == v, "200 line: {k} is {}, want {v}: {ok}", ok[k]);
    }
    ensure!(
        ok["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{ok}"
    );
    ensure!(
        ok["duration_ms"].is_f64() && ok["upstream_ms"].is_f64(),
        "{ok}"
    );

    let h2 = one(&lines, "the HTTP/2 200", http("ok.example.com", "/h2"))?;
    let want = [
        ("protocol", Value::from("HTTP/2")),
        ("status", 200.into()),
        ("route", "default/ok".into()),
        ("request_id", "rid-h2".into()),
        ("user_agent", "access-log-test/2".into()),
        ("client", net.client_ip().to_string().into()),
        ("complete", true.into()),
    ];
    for (k, v) in want {
        ensure!(h2[k] == v, "HTTP/2 line: {k} is {}, want {v}: {h2}", h2[k]);
    }

    let post = one(&lines, "the POST", http("ok.example.com", "/post"))?;
    ensure!(
        post["request_bytes"] == 5 && post["method"] == "POST",
        "{post}"
    );
    ensure!(
        post["client"] == net.client_ip().to_string(),
        "no XFF: the peer: {post}"
    );

    let bad = one(&lines, "the 502", http("down.example.com", "/x"))?;
    ensure!(
        bad["status"] == 502 && bad["reason"] == "upstream_failed",
        "{bad}"
    );
    ensure!(bad["upstream"] == net.echo_b().to_string(), "{bad}");

    let refused = one(&lines, "the 503", http("refused.example.com", "/x"))?;
    ensure!(
        refused["status"] == 503 && refused["reason"] == "upstream_connect_failed",
        "{refused}"
    );

    let slow = one(&lines, "the 504", http("slow.example.com", "/x"))?;
    ensure!(
        slow["status"] == 504 && slow["reason"] == "route_timeout",
        "{slow}"
    );
    ensure!(
        slow["route"] == "default/slow" && slow["rule"] == "slow-rule",
        "{slow}"
    );
    ensure!(slow["upstream"] == echo_a, "{slow}");
    let ms = slow["duration_ms"].as_f64().unwrap_or_default();
    ensure!((200.0..3000.0).contains(&ms), "504 after {ms} ms: {slow}");

    let none = one(&lines, "the 404", http("nothing.example.com", "/x"))?;
    ensure!(
        none["status"] == 404 && none["reason"] == "no_route",
        "{none}"
    );
    ensure!(
        none["route"].is_null() && none["gateway"] == "default/edge",
        "{none}"
    );

    let tcp = one(&lines, "the TCP connection", |v| v["protocol"] == "tcp")?;
    let want = [
        ("gateway", Value::from("default/l4")),
        ("listener", "tcp".into()),
        ("route_kind", "TCPRoute".into()),
        ("route", "default/tcp".into()),
        ("protocol", "tcp".into()),
        ("reason", Value::Null),
        ("client", net.client_ip().to_string().into()),
        ("upstream", tcp_backend_addr(net).to_string().into()),
        ("request_bytes", 4.into()),
        ("response_bytes", seen.tcp_received.into()),
    ];
    for (k, v) in want {
        ensure!(tcp[k] == v, "TCP line: {k} is {}, want {v}: {tcp}", tcp[k]);
    }
    let udp = one(&lines, "the UDP flow", |v| v["protocol"] == "udp")?;
    let want = [
        ("kind", Value::from("l4")),
        ("listener", "udp".into()),
        ("route_kind", "UDPRoute".into()),
        ("route", "default/udp".into()),
        ("client", net.client_ip().to_string().into()),
        ("upstream", udp_backend_addr(net).to_string().into()),
    ];
    for (k, v) in want {
        ensure!(udp[k] == v, "UDP line: {k} is {}, want {v}: {udp}", udp[k]);
    }
    // At least the one answered datagram each way ("hi" was sent until answered).
    let (sent, got) = (
        udp["request_bytes"].as_u64(),
        udp["response_bytes"].as_u64(),
    );
    ensure!(
        sent.is_some_and(|n| n >= 2 && n % 2 == 0) && got.is_some_and(|n| n >= 4 && n % 4 == 0),
        "UDP bytes: {udp}"
    );
    // Process logs stay on stderr, and stay JSON.
    for line in edge.log().lines() {
        let v: Value = serde_json::from_str(line)?;
        ensure!(v["level"].is_string(), "not a process log line: {line}");
    }
    env.pass()
}

/// `key=value` pairs of a logfmt line; quoted values unescaped.
fn logfmt(line: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if_eq(&' ').is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() || chars.next() != Some('=') {
            return out;
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some('t') => value.push('\t'),
                        Some(c) => value.push(c),
                        None => {}
                    },
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ' ')).collect();
        }
        out.insert(key, value);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn text_access_log_says_why_the_edge_answered() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    // Text by default; only errors: the 200s are left out.
    let (edge, _seen, _keep) = traffic(&env, &["--access-log-status", "4xx,5xx"]).await?;
    // 502, 503, 504, 404, the TCP connection and the UDP flow.
    let raw = lines(&edge, 6).await?;
    let lines: Vec<BTreeMap<String, String>> = raw.iter().map(|l| logfmt(l)).collect();
    ensure!(lines.len() == 6, "want 6 lines, got:\n{}", raw.join("\n"));
    let get = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    for (host, status, reason, route) in [
        ("down.example.com", "502", "upstream_failed", "default/down"),
        (
            "refused.example.com",
            "503",
            "upstream_connect_failed",
            "default/refused",
        ),
        ("slow.example.com", "504", "route_timeout", "default/slow"),
        ("nothing.example.com", "404", "no_route", "-"),
    ] {
        let l = one(&lines, host, |m| get(m, "authority") == host)?;
        for (k, v) in [
            ("kind", "http"),
            ("status", status),
            ("reason", reason),
            ("route", route),
            ("gateway", "default/edge"),
            ("method", "GET"),
            ("path", "/x"),
            ("protocol", "HTTP/1.1"),
        ] {
            ensure!(
                get(l, k) == v,
                "{host}: {k} is {:?}, want {v:?}: {l:?}",
                get(l, k)
            );
        }
        ensure!(get(l, "client") == net.client_ip().to_string(), "{l:?}");
    }
    let tcp = one(&lines, "the TCP connection", |m| {
        get(m, "protocol") == "tcp"
    })?;
    ensure!(
        get(tcp, "route") == "default/tcp" && get(tcp, "request_bytes") == "4",
        "{tcp:?}"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn access_log_off_writes_nothing() -> TestResult {
    let env = TestEnv::new()?;
    let (mut edge, _seen, _keep) = traffic(&env, &["--access-log", "off"]).await?;
    // A drain flushes what was logged: after exit, stdout is final.
    edge.signal("TERM")?;
    let status = edge.wait_exit(EVENTUALLY).await?;
    ensure!(status.success(), "the edge exited with {status}");
    let out = edge.stdout();
    ensure!(out.is_empty(), "--access-log off wrote:\n{out}");
    env.pass()
}
