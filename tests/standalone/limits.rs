//! Hostile clients against the limits: slowloris, oversized and too many headers,
//! connection floods, request smuggling, HTTP/2 rapid reset. Each gets a clean answer
//! or a closed connection, the edge survives, and a well-behaved client on the same
//! listener is served throughout.

use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// Reads until the peer closes or `limit` passes; returns what arrived and whether
/// the peer closed.
async fn read_until_close(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (out, closed)
}

async fn read_all(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    read_until_close(s, limit).await.0
}

/// Sends `raw` on fresh connections until the answer carries `code` (three tries).
/// The edge answers and closes while part of an oversized request is still unread,
/// so the kernel may reset the connection and lose the answer; a retry shows the code.
/// A success status at any try fails the test.
async fn expect_refusal(net: Net, raw: &[u8], code: &str) -> TestResult {
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from(net.client_ip(), net.gw()).await?;
        let _ = s.write_all(raw).await;
        let line = status_line(&read_all(&mut s, Duration::from_secs(5)).await);
        ensure!(
            !line.contains(" 2"),
            "an over-limit request was served: {line:?}"
        );
        if line.contains(code) {
            return Ok(());
        }
        lines.push(line);
    }
    Err(err(format!("expected {code}, got {lines:?}")))
}

fn status_line(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

async fn setup(env: &TestEnv, extra: &[&str]) -> Result<(Proc, Proc), BoxError> {
    let net = env.net;
    let m = single_route(net, &[]);
    env.write_manifest("m.yaml", &m)?;
    let echo = env.spawn_echo(net.echo_a(), "a").await?;
    let edge = env
        .spawn_edge_args("edge", &[env.manifests()], extra)
        .await?;
    env.wait_listener(net.gw()).await?;
    Ok((echo, edge))
}

#[tokio::test(flavor = "multi_thread")]
async fn slowloris_and_oversized_requests_are_cut_while_good_clients_are_served() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (_echo, mut edge) = setup(
        &env,
        &[
            "--header-read-timeout",
            "1s",
            "--max-header-bytes",
            "16384",
            "--max-headers",
            "20",
        ],
    )
    .await?;

    // Slowloris: a request line and then silence. The edge closes the connection
    // (hyper answers 408 first) instead of holding it open.
    let mut slow = connect_from(net.client_ip(), gw).await?;
    slow.write_all(b"GET / HTTP/1.1\r\nHost: slow.example.com\r\nX-Partial: ")
        .await?;
    let mut good = H1Conn::connect(net.client_ip(), gw).await?;
    let r = good.get("good.example.com", "/while-slowloris").await?;
    ensure!(
        r.status == StatusCode::OK,
        "good client got {} next to a slowloris",
        r.status
    );
    let (got, closed) = read_until_close(&mut slow, Duration::from_secs(10)).await;
    let line = status_line(&got);
    ensure!(closed, "the slowloris connection was still open after 10 s");
    ensure!(
        got.is_empty() || line.contains("408"),
        "slowloris got {line:?}"
    );

    // A head larger than the limit: 431.
    let filler = "a".repeat(20_000);
    let big = format!("GET / HTTP/1.1\r\nHost: big.example.com\r\nX-Big: {filler}\r\n\r\n");
    expect_refusal(net, big.as_bytes(), "431").await?;

    // Too many headers: 431.
    let headers: String = (0..40).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\nHost: many.example.com\r\n{headers}\r\n");
    expect_refusal(net, many.as_bytes(), "431").await?;

    // Smuggling: Content-Length with chunked Transfer-Encoding. The edge frames by
    // Transfer-Encoding, answers, and closes the connection (RFC 9112 §6.3), so the
    // bytes after the chunked body are never taken as a request; and the backend,
    // which gets the edge's own framing, never sees Content-Length next to chunked.
    let mut smuggle = connect_from(net.client_ip(), gw).await?;
    smuggle
        .write_all(b"POST /cl-te HTTP/1.1\r\nHost: s.example.com\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /pipelined HTTP/1.1\r\nHost: s.example.com\r\nConnection: close\r\n\r\n")
        .await?;
    let raw = read_all(&mut smuggle, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&raw);
    ensure!(
        text.matches("HTTP/1.1 ").count() == 1
            && text.to_ascii_lowercase().contains("connection: close"),
        "expected one answer and a close, got {text}"
    );
    let seen = env.echo_requests("a")?;
    let post = seen
        .iter()
        .find(|e| e.path() == "/cl-te")
        .ok_or_else(|| err("the POST never reached the backend"))?;
    ensure!(
        post.header("content-length").is_none() || post.header("transfer-encoding").is_none(),
        "the backend got both framings: {}",
        post.0
    );
    ensure!(
        !seen.iter().any(|e| e.path() == "/pipelined"),
        "bytes after a CL+TE body were served as a request"
    );
    // An absolute-form target naming another host than Host is refused outright.
    let mut lying = connect_from(net.client_ip(), gw).await?;
    lying
        .write_all(b"GET http://internal.example.com/admin HTTP/1.1\r\nHost: public.example.com\r\nConnection: close\r\n\r\n")
        .await?;
    let line = status_line(&read_all(&mut lying, Duration::from_secs(5)).await);
    ensure!(line.contains("400"), "target/Host mismatch got {line:?}");

    // Good clients are still served, and the edge is alive. (The earlier keep-alive
    // connection has been idle longer than the 1 s header timeout, so it is closed:
    // that timeout is also the keep-alive idle timeout.)
    let r = h1_get_from(net.client_ip(), gw, "good.example.com", "/after").await?;
    ensure!(
        r.status == StatusCode::OK,
        "good client got {} after the attacks",
        r.status
    );
    edge.check_alive()?;
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_beyond_the_limit_are_refused_and_counted() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (_echo, mut edge) = setup(&env, &["--max-connections-per-listener", "8"]).await?;

    // Eight idle connections fill the listener.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut c = H1Conn::connect(net.client_ip(), gw).await?;
        let r = c.get("x.example.com", "/hold").await?;
        ensure!(r.status == StatusCode::OK, "holder got {}", r.status);
        held.push(c);
    }
    // The ninth is accepted by the kernel and then closed by the edge without an answer.
    let refused = h1_get_from(net.client_ip(), gw, "x.example.com", "/ninth").await;
    ensure!(
        refused.is_err(),
        "a connection beyond the limit was served: {:?}",
        refused.map(|r| r.status)
    );
    let metrics = metrics_text(net).await?;
    ensure!(
        metrics.contains("aether_connections_refused_total{reason=\"listener_full\"}"),
        "the refusal is not counted"
    );
    // Freeing one slot lets a new client in.
    held.pop();
    eventually("a freed slot admits a new client", EVENTUALLY, || async {
        let r = h1_get_from(net.client_ip(), gw, "x.example.com", "/after").await?;
        ensure!(r.status == StatusCode::OK, "got {}", r.status);
        Ok(())
    })
    .await?;
    edge.check_alive()?;
    env.pass()
}

/// One HTTP/2 frame: 9-byte header and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(0);
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_rapid_reset_floods_are_cut_off() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (_echo, mut edge) = setup(&env, &[]).await?;

    // CVE-2023-44487: open streams and reset them at once, many times, without ever
    // reading. GET / for host "a" in HPACK: indexed :method GET, :scheme http, :path /,
    // and :authority as a literal with an indexed name.
    let headers = [0x82, 0x86, 0x84, 0x41, 0x01, b'a'];
    let mut attack = Vec::from(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..]);
    attack.extend(h2_frame(0x4, 0, 0, &[])); // SETTINGS
    for i in 0..2_000u32 {
        let stream = 2 * i + 1;
        attack.extend(h2_frame(0x1, 0x4 | 0x1, stream, &headers)); // HEADERS, END_HEADERS|END_STREAM
        attack.extend(h2_frame(0x3, 0, stream, &8u32.to_be_bytes())); // RST_STREAM CANCEL
    }
    let mut s = connect_from(net.client_ip(), gw).await?;
    // The edge may close mid-write; that is the point.
    let _ = s.write_all(&attack).await;
    let (got, closed) = read_until_close(&mut s, Duration::from_secs(10)).await;
    ensure!(
        closed,
        "the connection flooding resets was still open after 10 s"
    );
    // Walk the frames the edge sent: a GOAWAY (type 0x7) must be among them.
    let mut kinds = Vec::new();
    let mut rest = got.as_slice();
    while rest.len() >= 9 {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        kinds.push(rest[3]);
        rest = rest.get(9 + len..).unwrap_or_default();
    }
    ensure!(
        kinds.contains(&0x7),
        "no GOAWAY before the close; frame types {kinds:?}"
    );
    edge.check_alive()?;
    let r = env.h2(gw, "good.example.com", "/after-flood").await?;
    ensure!(
        r.status == StatusCode::OK,
        "a good h2c client got {}",
        r.status
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn over_the_memory_budget_new_connections_are_refused_and_counted() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let m = single_route(net, &[]);
    env.write_manifest("m.yaml", &m)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    // A budget far below any real process: the edge is over it from its first sample,
    // so new connections are closed unanswered (requests on connections that already
    // existed would get 503 with Retry-After).
    let mut edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--memory-budget", "1048576"])
        .await?;
    eventually("the overload gauge is set", EVENTUALLY, || async {
        let metrics = metrics_text(net).await?;
        ensure!(
            metrics.contains("aether_overload_active 1"),
            "gauge not set yet"
        );
        Ok(())
    })
    .await?;
    // The gauge can be set before the listener is bound (a busy machine): until then
    // a connect is refused by the kernel, not shed by the edge, and not counted. So
    // try until a refusal is counted; no attempt may ever be served.
    let deadline = std::time::Instant::now() + EVENTUALLY;
    loop {
        let refused = h1_get_from(net.client_ip(), gw, "x.example.com", "/shed").await;
        ensure!(
            refused.is_err(),
            "a new connection was served while over budget: {:?}",
            refused.map(|r| r.status)
        );
        let metrics = metrics_text(net).await?;
        if metrics.contains("aether_overload_shed_total{what=\"connection\"}") {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "refused connections are not counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The admin side stays up, so operators can see why.
    edge.check_alive()?;
    env.pass()
}
