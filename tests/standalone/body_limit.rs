//! `--max-request-body-bytes`: a body announced larger than the limit gets 413 before
//! anything reaches a backend, and is counted; bodies within it are forwarded whole.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

/// Sends one HTTP/1.1 POST with a `len`-byte body (Content-Length framing) on a fresh
/// connection and returns the answer's status line.
async fn post(net: Net, path: &str, len: usize) -> Result<String, BoxError> {
    let mut s = connect_from(net.client_ip(), net.gw()).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: body.example.com\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await?;
    // A refused body may be left unread: the edge answers first, so a failed write
    // of the rest is not an error here.
    let _ = s.write_all(&vec![b'x'; len]).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_over_the_limit_get_413_and_never_reach_the_backend() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &single_route(net, &[]))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env
        .spawn_edge_args(
            "edge",
            &[env.manifests()],
            &["--max-request-body-bytes", "1024"],
        )
        .await?;
    env.wait_listener(net.gw()).await?;

    let line = post(net, "/small", 1024).await?;
    ensure!(line.contains(" 200"), "a body at the limit got {line:?}");
    let line = post(net, "/big", 1025).await?;
    ensure!(line.contains(" 413"), "a body over the limit got {line:?}");

    let seen = env.echo_requests("a")?;
    ensure!(
        seen.iter().any(|e| e.path() == "/small"),
        "the body within the limit never reached the backend"
    );
    ensure!(
        !seen.iter().any(|e| e.path() == "/big"),
        "the refused body reached the backend"
    );
    let metrics = metrics_text(net).await?;
    ensure!(
        metric_sum_where(
            &metrics,
            "aether_requests_refused_total",
            "reason=\"body_too_large\""
        ) > 0.0,
        "the refusal was not counted"
    );
    // A well-behaved client on the same listener is unaffected.
    let r = env.h1(net.gw(), "body.example.com", "/after").await?;
    ensure!(r.status == 200, "after the refusal: {}", r.status);
    env.pass()
}
