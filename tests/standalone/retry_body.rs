//! Which request bodies a rule's `retry` replays: one of known length up to 64 KiB
//! (buffered, then sent whole on every attempt); a larger or chunked one goes upstream
//! once, as a stream; a POST is never replayed after the backend answered.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

const HOST: &str = "body.example";

fn manifests(net: Net) -> String {
    // single_route's setup, its route `r` with a retry on 503.
    let mut m = serving_infra(net);
    m.push_str(
        &http_route(
            "default",
            "r",
            "edge",
            &[HOST],
            &[("PathPrefix", "/", "svc")],
        )
        .rule_field(
            "retry",
            serde_json::json!({"codes": [503], "attempts": 2, "backoff": "10ms"}),
        )
        .yaml(),
    );
    m
}

/// The sim's query: the first request of this uuid gets 503, later ones the echo.
fn path(uuid: &str) -> String {
    format!("/?responseCode=503&succeedAfter=1&uuid={uuid}")
}

/// Sends `method` with a Content-Length body of `len` bytes; returns (status,
/// x-echo-attempt, the Content-Length the backend saw).
async fn send_sized(
    net: Net,
    method: &str,
    uuid: &str,
    len: usize,
) -> Result<(u16, String, Option<String>), BoxError> {
    let stream = connect_from(net.client_ip(), net.gw()).await?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path(uuid))
        .header("host", HOST)
        .body(Full::new(Bytes::from(vec![b'x'; len])))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let attempt = header(resp.headers(), "x-echo-attempt");
    let body = resp.into_body().collect().await?.to_bytes();
    let seen = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["headers"]["content-length"].as_str().map(str::to_owned));
    Ok((status, attempt, seen))
}

fn header(h: &http::HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_replays_only_bounded_bodies_of_idempotent_requests() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &manifests(net))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(net.gw()).await?;

    // Replayed: the second attempt carries the whole body again.
    let (status, attempt, seen) = send_sized(net, "PUT", "small", 1000).await?;
    ensure!(
        (status, attempt.as_str(), seen.as_deref()) == (200, "2", Some("1000")),
        "PUT 1000 B: {status}, attempt {attempt}, backend saw content-length {seen:?}"
    );
    // Over 64 KiB: streamed once, the 503 goes to the client.
    let (status, attempt, _) = send_sized(net, "PUT", "large", 70 * 1024).await?;
    ensure!(
        (status, attempt.as_str()) == (503, "1"),
        "PUT 70 KiB: {status}, attempt {attempt}"
    );
    // Not idempotent: the backend may have acted, so no replay on a status.
    let (status, attempt, _) = send_sized(net, "POST", "post", 1000).await?;
    ensure!(
        (status, attempt.as_str()) == (503, "1"),
        "POST: {status}, attempt {attempt}"
    );
    // Chunked (no length known up front): streamed once.
    let mut s = connect_from(net.client_ip(), net.gw()).await?;
    let head = format!(
        "PUT {} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3e8\r\n",
        path("chunked")
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(&[b'x'; 1000]).await?;
    s.write_all(b"\r\n0\r\n\r\n").await?;
    let mut raw = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut raw)).await??;
    let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    ensure!(
        text.starts_with("http/1.1 503") && text.contains("x-echo-attempt: 1\r\n"),
        "chunked PUT: {}",
        text.lines().take(6).collect::<Vec<_>>().join(" | ")
    );
    env.pass()
}
