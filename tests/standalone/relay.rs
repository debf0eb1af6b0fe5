//! `--http1-relay`: what a raw HTTP/1.1 client and real backends see when the relay
//! answers (keep-alive, pipelining, `HEAD`, hop-by-hop and forged forwarding headers,
//! chunked, length- and close-delimited bodies, a pooled connection the backend
//! closed), and that a request it does not take is served by the full path on the same
//! connection; and HTTP/2 requests whose HTTP/1.1 upstream exchange goes as bytes on
//! the relay's pool. The whole suite also runs with the relay off
//! (`AETHER_TEST_EDGE_ARGS=--http1-relay=false`, docs/testing.md).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// One answer as the client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// Reads one answer from `conn` (`head`: to a HEAD request), leaving what follows in
/// `buf`.
async fn read_answer(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: bool,
) -> Result<Answer, BoxError> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        read_more(conn, buf).await?;
    };
    let text = String::from_utf8(buf[..end].to_vec())?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().ok_or("no status line")?;
    let status: u16 = status_line.split(' ').nth(1).ok_or("no status")?.parse()?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    buf.drain(..end);
    let mut body = Vec::new();
    if head || status == 204 || status == 304 {
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|t| t == "chunked")
    {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                read_more(conn, buf).await?;
            };
            let size_text = String::from_utf8(buf[..line_end].to_vec())?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
            buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers, then the empty line.
                loop {
                    let i = loop {
                        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                            break i;
                        }
                        read_more(conn, buf).await?;
                    };
                    buf.drain(..i + 2);
                    if i == 0 {
                        break;
                    }
                }
                break;
            }
            while buf.len() < size + 2 {
                read_more(conn, buf).await?;
            }
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
        }
    } else if let Some(n) = headers.get("content-length") {
        let n: usize = n.parse()?;
        while buf.len() < n {
            read_more(conn, buf).await?;
        }
        body = buf.drain(..n).collect();
    } else {
        // Until the edge closes.
        while read_more(conn, buf).await.is_ok() {}
        body = std::mem::take(buf);
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

async fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>) -> TestResult {
    let mut chunk = [0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk)).await??;
    ensure!(n > 0, "connection closed");
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// The connection is closed by the edge (nothing more to read).
async fn closed(conn: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), conn.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

async fn relayed(env: &TestEnv) -> Result<f64, BoxError> {
    metric(env.net, "aether_http1_relayed_requests_total").await
}

/// Requests relayed since the count was `before`, once at least `n`: the relay counts
/// a request after writing its response, so a client that has read the answer can
/// scrape before the count moves (seen on a loaded machine).
async fn relayed_since(env: &TestEnv, before: f64, n: f64) -> Result<f64, BoxError> {
    eventually("the relayed-requests count", EVENTUALLY, || async {
        let since = relayed(env).await? - before;
        if since >= n {
            Ok(since)
        } else {
            Err(format!("{since} relayed so far").into())
        }
    })
    .await
}

/// One route for `host` to an echo backend on an edge with the relay on (given here:
/// the suite's second run turns the relay off on every other edge).
async fn echo_edge(env: &TestEnv, host: &str) -> Result<(Proc, Proc), BoxError> {
    let net = env.net;
    env.write_manifest("infra.yaml", &standard_infra(net))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "r",
            "edge",
            &[host],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    let echo = env.spawn_echo(net.echo_a(), "a").await?;
    let edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--http1-relay"])
        .await?;
    env.wait_listener(net.gw()).await?;
    Ok((echo, edge))
}

#[tokio::test]
async fn relayed_requests_look_like_the_full_paths_to_client_and_backend() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (_echo, _edge) = echo_edge(&env, "relay.example.com").await?;
    let before = relayed(&env).await?;
    // The listener probe (`/aether/readyz`) is the full path's.
    let handoffs = metric(net, "aether_http1_relay_handoffs_total").await?;

    let mut conn = connect_from(net.client_ip(), gw).await?;
    let mut buf = Vec::new();
    // Forged forwarding headers, hop-by-hop headers, a kept request ID.
    conn.write_all(
        b"GET /one?x=1 HTTP/1.1\r\nHost: relay.example.com\r\nConnection: keep-alive\r\n\
Keep-Alive: timeout=5\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n\
X-Custom: kept\r\nX-Request-Id: client-id-1\r\n\r\n",
    )
    .await?;
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.headers.get("x-request-id").map(String::as_str),
        Some("client-id-1")
    );
    let echo: serde_json::Value = serde_json::from_slice(&a.body)?;
    let echo = Echo(echo);
    assert_eq!(echo.path(), "/one?x=1");
    assert_eq!(
        echo.header("x-forwarded-for"),
        Some(net.client_ip().to_string().as_str())
    );
    assert_eq!(echo.header("x-forwarded-proto"), Some("http"));
    assert_eq!(echo.header("x-custom"), Some("kept"));
    assert_eq!(echo.header("x-request-id"), Some("client-id-1"));
    assert_eq!(echo.header("keep-alive"), None);

    // Two requests in one write, then a HEAD: answered in order on the same connection;
    // a generated request ID reaches the backend and the client alike.
    conn.write_all(
        b"GET /two HTTP/1.1\r\nHost: relay.example.com\r\n\r\n\
GET /three HTTP/1.1\r\nHost: relay.example.com\r\n\r\n\
HEAD /four HTTP/1.1\r\nHost: relay.example.com\r\n\r\n",
    )
    .await?;
    for path in ["/two", "/three"] {
        let a = read_answer(&mut conn, &mut buf, false).await?;
        assert_eq!(a.status, 200);
        let echo = Echo(serde_json::from_slice(&a.body)?);
        assert_eq!(echo.path(), path);
        let id = a.headers.get("x-request-id").ok_or("no request ID")?;
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(echo.header("x-request-id"), Some(id.as_str()));
    }
    let a = read_answer(&mut conn, &mut buf, true).await?;
    assert_eq!((a.status, a.body.len()), (200, 0));
    ensure!(a.headers.contains_key("content-length"), "{a:?}");
    assert_eq!(relayed_since(&env, before, 4.0).await?, 4.0);

    // A request with a body is the full path's, on the same connection, and so is
    // every request after it.
    conn.write_all(
        b"POST /five HTTP/1.1\r\nHost: relay.example.com\r\nContent-Length: 5\r\n\r\nhello\
GET /six HTTP/1.1\r\nHost: relay.example.com\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!(a.status, 200);
    let echo = Echo(serde_json::from_slice(&a.body)?);
    assert_eq!((echo.method(), echo.path()), ("POST", "/five"));
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!(Echo(serde_json::from_slice(&a.body)?).path(), "/six");
    ensure!(
        closed(&mut conn).await,
        "the edge kept the connection after Connection: close"
    );
    assert_eq!(relayed_since(&env, before, 4.0).await?, 4.0);
    assert_eq!(
        metric(net, "aether_http1_relay_handoffs_total").await? - handoffs,
        1.0
    );
    // Every relayed request counts like any other.
    let text = metrics_text(net).await?;
    ensure!(
        metric_sum_where(&text, "aether_requests_total", "route=\"default/r\"") >= 6.0,
        "{text}"
    );
    env.pass()
}

/// A connection that waits past the relay's buffer release (500 ms) gives its buffers
/// back: its next requests must still be relayed whole, a head larger than the first
/// read included, and a head cut in two across the wait keeps its first half.
#[tokio::test]
async fn requests_after_an_idle_wait_and_a_head_split_across_it_are_relayed_whole() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (_echo, _edge) = echo_edge(&env, "idle.example.com").await?;
    let before = relayed(&env).await?;
    let wait = Duration::from_millis(800);

    let mut conn = connect_from(net.client_ip(), gw).await?;
    let mut buf = Vec::new();
    conn.write_all(b"GET /one HTTP/1.1\r\nHost: idle.example.com\r\n\r\n")
        .await?;
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!(Echo(serde_json::from_slice(&a.body)?).path(), "/one");

    tokio::time::sleep(wait).await;
    let big = "b".repeat(6000);
    conn.write_all(
        format!("GET /two HTTP/1.1\r\nHost: idle.example.com\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await?;
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!(a.status, 200, "{a:?}");
    let echo = Echo(serde_json::from_slice(&a.body)?);
    assert_eq!(echo.path(), "/two");
    assert_eq!(echo.header("x-big"), Some(big.as_str()));

    tokio::time::sleep(wait).await;
    conn.write_all(b"GET /three HTTP/1.1\r\nHost: idle.exa")
        .await?;
    tokio::time::sleep(wait).await;
    conn.write_all(b"mple.com\r\nX-Half: second\r\n\r\n")
        .await?;
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!(a.status, 200, "{a:?}");
    let echo = Echo(serde_json::from_slice(&a.body)?);
    assert_eq!(echo.path(), "/three");
    assert_eq!(echo.header("x-half"), Some("second"));
    assert_eq!(relayed_since(&env, before, 3.0).await?, 3.0);
    env.pass()
}

/// A backend answering by path with the framings the relay passes through, closing
/// its connection after every answer without saying so (as a backend whose idle
/// timeout races the edge's reuse does) when `/drop` asked it to.
async fn framing_backend(addr: SocketAddr) -> Result<tokio::task::JoinHandle<()>, BoxError> {
    let listener = TcpListener::bind(addr).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match conn.read(&mut chunk).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                    let (answer, close): (&[u8], bool) = match path.as_str() {
                        "/chunked" => (
                            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: t\r\n\r\n",
                            false,
                        ),
                        "/close" => (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true),
                        "/not-modified" => (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n", false),
                        "/hints" => (
                            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                            false,
                        ),
                        "/drop" => (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndrop", true),
                        _ => (b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nlength", false),
                    };
                    if conn.write_all(answer).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    }))
}

/// One route to [`framing_backend`] on an edge with the relay on (given here: the
/// suite's second run turns the relay off on every other edge).
async fn framing_edge(env: &TestEnv) -> Result<(tokio::task::JoinHandle<()>, Proc), BoxError> {
    let net = env.net;
    env.write_manifest("infra.yaml", &standard_infra(net))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "r",
            "edge",
            &["framing.example.com"],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    let backend = framing_backend(net.echo_a()).await?;
    let edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--http1-relay"])
        .await?;
    env.wait_listener(net.gw()).await?;
    Ok((backend, edge))
}

#[tokio::test]
async fn relayed_bodies_keep_their_framing_and_a_closed_pooled_connection_is_redialled()
-> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (backend, _edge) = framing_edge(&env).await?;
    let before = relayed(&env).await?;

    let mut conn = connect_from(net.client_ip(), gw).await?;
    let mut buf = Vec::new();
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: framing.example.com\r\n\r\n");
    for (path, status, body) in [
        ("/length", 200, &b"length"[..]),
        ("/chunked", 200, b"hello, world"),
        ("/not-modified", 304, b""),
        ("/hints", 200, b"ok"),
        // The backend closes after this answer; the edge pooled the connection and
        // must dial a new one for the next request rather than fail it.
        ("/drop", 200, b"drop"),
        ("/length", 200, b"length"),
        ("/drop", 200, b"drop"),
        ("/chunked", 200, b"hello, world"),
    ] {
        conn.write_all(get(path).as_bytes()).await?;
        let a = read_answer(&mut conn, &mut buf, false).await?;
        assert_eq!(
            (a.status, a.body.as_slice()),
            (status, body),
            "{path}: {a:?}"
        );
        if path == "/chunked" {
            assert_eq!(
                a.headers.get("transfer-encoding").map(String::as_str),
                Some("chunked")
            );
        }
        ensure!(!a.headers.contains_key("connection"), "{path}: {a:?}");
        // Between requests, so a pooled connection the backend closed is seen closed.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A close-delimited body ends the client's connection too.
    conn.write_all(get("/close").as_bytes()).await?;
    let a = read_answer(&mut conn, &mut buf, false).await?;
    assert_eq!((a.status, a.body.as_slice()), (200, &b"until the end"[..]));
    assert_eq!(
        a.headers.get("connection").map(String::as_str),
        Some("close")
    );
    assert_eq!(relayed_since(&env, before, 9.0).await?, 9.0);
    backend.abort();
    env.pass()
}

/// HTTP/2 requests take the full request path, and their plain HTTP/1.1 upstream
/// exchange goes as bytes on the relay's pool: every framing comes back as the same
/// body (chunks decoded), without HTTP/1.1's connection-specific headers, which HTTP/2
/// forbids; a pooled connection the backend closed is dialled again.
#[tokio::test]
async fn http2_requests_exchange_bytes_with_http1_upstreams() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let (backend, _edge) = framing_edge(&env).await?;
    let exchanges = || metric(env.net, "aether_http1_byte_exchanges_total");
    let before = exchanges().await?;

    let mut h2 = H2Conn::connect(net.client_ip(), gw).await?;
    let cases: [(&str, &str, u16, &[u8]); 10] = [
        ("GET", "/length", 200, b"length"),
        ("GET", "/chunked", 200, b"hello, world"),
        ("GET", "/not-modified", 304, b""),
        ("GET", "/hints", 200, b"ok"),
        ("HEAD", "/length", 200, b""),
        ("GET", "/drop", 200, b"drop"),
        ("GET", "/length", 200, b"length"),
        ("GET", "/close", 200, b"until the end"),
        ("GET", "/drop", 200, b"drop"),
        ("GET", "/chunked", 200, b"hello, world"),
    ];
    for (method, path, status, body) in cases {
        let r = h2.send(method, "framing.example.com", path, &[]).await?;
        ensure!(
            r.status.as_u16() == status && r.body.as_ref() == body,
            "{method} {path}: {} {:?}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        for name in ["transfer-encoding", "connection"] {
            ensure!(
                !r.headers.contains_key(name),
                "{path}: {name} in {:?}",
                r.headers
            );
        }
        ensure!(
            r.headers.contains_key("x-request-id"),
            "{path}: {:?}",
            r.headers
        );
        // Between requests, so a pooled connection the backend closed is seen closed.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = exchanges().await? - before;
    ensure!(
        n == cases.len() as f64,
        "{n} byte exchanges for {} requests",
        cases.len()
    );
    backend.abort();
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn https_requests_are_relayed_after_the_handshake_and_a_misdirected_one_is_421() -> TestResult
{
    let env = TestEnv::new()?;
    let net = env.net;
    let tls_addr = net.addr(5, 8443);
    let ca = TestCa::new("aether relay CA")?;
    let wild = ca.leaf(&["*.example.com"])?;
    let other = ca.leaf(&["other.org"])?;
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .address(&net.ip_str(5))
            .https_host("wild", 8443, "*.example.com", "wild")
            .https_host("other", 8443, "other.org", "other")
            .http("http", LISTENER_PORT)
            .yaml(),
    );
    m.push_str(&backend("default", "svc", net.echo_a(), true));
    m.push_str(&route(
        "default",
        "web",
        "edge",
        &[],
        &[("PathPrefix", "/", "svc")],
    ));
    env.write_manifest("gateway.yaml", &m)?;
    env.write_manifest("secret-wild.yaml", &tls_secret("default", "wild", &wild))?;
    env.write_manifest("secret-other.yaml", &tls_secret("default", "other", &other))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--http1-relay"])
        .await?;
    env.wait_listener(net.addr(5, LISTENER_PORT)).await?;
    let before = relayed(&env).await?;

    let (tls, _) = tls_connect(
        net.client_ip(),
        tls_addr,
        "a.example.com",
        &ca,
        &[b"http/1.1"],
    )
    .await?;
    let mut conn = H1Conn::over(tls).await?;
    for path in ["/secure", "/again"] {
        let r = conn.get("b.example.com", path).await?;
        ensure!(r.status == http::StatusCode::OK, "{path}: {}", r.status);
        let e = r.echo()?;
        ensure!(
            e.path() == path && e.header("x-forwarded-proto") == Some("https"),
            "backend saw {}",
            e.0
        );
    }
    assert_eq!(relayed_since(&env, before, 2.0).await?, 2.0);
    // other.org is served with another certificate: not on this connection.
    let r = conn.get("other.org", "/misdirected").await?;
    assert_eq!(r.status, http::StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(relayed_since(&env, before, 2.0).await?, 2.0);
    env.pass()
}
