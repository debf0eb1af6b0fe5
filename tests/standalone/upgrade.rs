//! HTTP/1.1 `Upgrade` (WebSocket) through the proxy: the 101 answer and then raw bytes
//! in both directions, end to end to the echo backend.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_requests_are_tunnelled_end_to_end() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let m = single_route(net, &["ws.example.com"]);
    env.write_manifest("m.yaml", &m)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let mut s = connect_from(net.client_ip(), gw).await?;
    s.write_all(
        b"GET /chat HTTP/1.1\r\nHost: ws.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut buf)).await??;
        ensure!(
            n > 0,
            "connection closed before the 101: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    ensure!(
        head.starts_with("http/1.1 101"),
        "expected 101, got {head:?}"
    );
    ensure!(
        head.contains("upgrade: websocket"),
        "101 lacks the Upgrade header: {head:?}"
    );

    // After the switch the proxy is a byte pipe: the echo backend returns what it gets.
    for msg in [&b"first frame"[..], &b"second, longer frame of bytes"[..]] {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(REQUEST_TIMEOUT, s.read_exact(&mut got)).await??;
        ensure!(got == msg, "echoed {:?}", String::from_utf8_lossy(&got));
    }
    // A plain request on the same listener still routes normally.
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        env.h1(gw, "ws.example.com", "/plain"),
    )
    .await??;
    ensure!(
        r.echo()?.path() == "/plain",
        "plain request reached {}",
        r.text()
    );
    env.pass()
}
