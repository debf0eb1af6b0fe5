//! A backend that dies with a request on a pooled keep-alive connection: the edge has
//! written the request to a connection whose peer is gone (the race of a backend that
//! closes, or is killed, before the edge's worker has seen its FIN). Idempotent
//! requests are sent again once, on a new connection; others get the 502, unreplayed.
//!
//! The backend here is deterministic about it: on every connection it answers the
//! first request and, at the second, reads it whole and closes without a byte of
//! answer, which is what the edge sees when a backend dies with the request in flight.
//! Two workers, the default on this machine, and the configuration that lost requests
//! before the fix.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// What the backend saw: (connection number, method, path, answered).
type Seen = Arc<Mutex<Vec<(usize, String, String, bool)>>>;

/// Answers the first request of each connection with its path; reads the second whole
/// (body included, so the close is a FIN, not a reset) and closes the connection.
async fn dying_backend(addr: SocketAddr) -> Result<(Seen, tokio::task::JoinHandle<()>), BoxError> {
    let listener = TcpListener::bind(addr).await?;
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut n = 0;
        while let Ok((stream, _)) = listener.accept().await {
            n += 1;
            tokio::spawn(serve(stream, n, Arc::clone(&log)));
        }
    });
    Ok((seen, task))
}

async fn serve(mut stream: TcpStream, conn: usize, seen: Seen) {
    let mut buf = Vec::new();
    for nth in 0..2 {
        let Some((method, path)) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let answered = nth == 0;
        if let Ok(mut s) = seen.lock() {
            s.push((conn, method, path.clone(), answered));
        }
        if !answered {
            return;
        }
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
            path.len()
        );
        if stream.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// One request head and its Content-Length body, drained; (method, path).
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, String)> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut words = head.split_whitespace();
    let method = words.next()?.to_owned();
    let path = words.next()?.to_owned();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..end + length);
    Some((method, path))
}

/// One keep-alive client connection that can send a body.
async fn client(net: Net) -> Result<http1::SendRequest<Full<Bytes>>, BoxError> {
    let stream = connect_from(net.client_ip(), net.gw()).await?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn send(
    sender: &mut http1::SendRequest<Full<Bytes>>,
    method: &str,
    path: &str,
    body: &'static str,
) -> Result<(StatusCode, String), BoxError> {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "stale.example")
        .body(Full::new(Bytes::from_static(body.as_bytes())))?;
    let fut = async {
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, BoxError>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| err(format!("{method} {path} timed out")))?
}

fn retries_closed(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("aether_upstream_retries_total{")
                && l.contains("reason=\"connection_closed\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_get_on_a_pooled_connection_the_backend_dropped_is_sent_again() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &single_route(net, &["stale.example"]))?;
    let (seen, _backend) = dying_backend(net.echo_a()).await?;
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--workers", "2"])
        .await?;
    env.wait_listener(net.gw()).await?;

    // One client connection: its requests stay on one worker, so each after the first
    // goes out on the connection its predecessor left in that worker's pool.
    const N: usize = 8;
    let mut c = client(net).await?;
    for i in 1..=N {
        let path = format!("/get/{i}");
        let (status, body) = send(&mut c, "GET", &path, "").await?;
        ensure!(
            status == StatusCode::OK && body == path,
            "GET {path}: the client got {status} {body:?}"
        );
    }
    let seen = seen.lock().map_err(|_| err("poisoned"))?.clone();
    for i in 2..=N {
        let path = format!("/get/{i}");
        let tries: Vec<_> = seen.iter().filter(|s| s.2 == path).collect();
        ensure!(
            tries.len() == 2 && !tries[0].3 && tries[1].3 && tries[0].0 < tries[1].0,
            "{path}: the backend saw {tries:?}; expected it dropped on a pooled connection, then answered on a new one"
        );
    }
    let n = retries_closed(&metrics_text(net).await?);
    ensure!(
        n == (N - 1) as u64,
        "aether_upstream_retries_total{{reason=connection_closed}} is {n}"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_post_on_a_pooled_connection_the_backend_dropped_is_not_replayed() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &single_route(net, &["stale.example"]))?;
    let (seen, _backend) = dying_backend(net.echo_a()).await?;
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--workers", "2"])
        .await?;
    env.wait_listener(net.gw()).await?;

    let mut c = client(net).await?;
    // A POST, so the pooled connection is the full request path's also with
    // `--http1-relay` (which takes only GET and HEAD, with a pool of its own).
    let (status, body) = send(&mut c, "POST", "/first", "").await?;
    ensure!(status == StatusCode::OK, "POST /first: {status} {body:?}");
    // The backend may have acted on it: the client gets the error, not a second copy.
    let (status, body) = send(&mut c, "POST", "/order", "one order").await?;
    ensure!(
        status == StatusCode::BAD_GATEWAY,
        "POST /order: the client got {status} {body:?}"
    );
    let seen = seen.lock().map_err(|_| err("poisoned"))?.clone();
    let posts = seen.iter().filter(|s| s.2 == "/order").count();
    ensure!(
        posts == 1,
        "the backend saw POST /order {posts} times: {seen:?}"
    );
    // The next request is served: a failed exchange does not poison the pool.
    let (status, body) = send(&mut c, "GET", "/after", "").await?;
    ensure!(
        status == StatusCode::OK && body == "/after",
        "GET /after: {status} {body:?}"
    );
    env.pass()
}
