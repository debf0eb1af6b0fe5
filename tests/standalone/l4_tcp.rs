//! TCPRoute: bytes both ways through a TCP listener, half-close passed on, connect
//! failures closing the client, status and metrics.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

const TCP_PORT: u16 = 7000;
const DEAD_PORT: u16 = 7001;

fn manifests(net: Net) -> String {
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&l4_gateway(
        "default",
        "edge",
        &net.ip_str(5),
        &[
            ("tcp", TCP_PORT, "TCP"),
            ("dead", DEAD_PORT, "TCP"),
            // Same port, other transport: no conflict.
            ("udp", TCP_PORT, "UDP"),
            // Same port and transport, other protocol: conflicted.
            ("http", TCP_PORT, "HTTP"),
        ],
    ));
    m.push_str(&backend("default", "tcp-a", net.addr(251, 7100), true));
    // Nothing listens there: every connect is refused.
    m.push_str(&backend("default", "nothing", net.addr(253, 7100), true));
    m.push_str(&l4_route(
        "TCPRoute",
        "echo",
        "edge",
        Some("tcp"),
        &[],
        &[("tcp-a", 1)],
    ));
    m.push_str(&l4_route(
        "TCPRoute",
        "dead",
        "edge",
        Some("dead"),
        &[],
        &[("nothing", 1)],
    ));
    m
}

/// Reads until EOF (bounded by the request timeout).
async fn read_to_end(s: &mut tokio::net::TcpStream) -> Result<String, BoxError> {
    let mut out = Vec::new();
    tokio::time::timeout(REQUEST_TIMEOUT, s.read_to_end(&mut out))
        .await
        .map_err(|_| err("reading until EOF timed out"))??;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn tcp_route_forwards_bytes_with_half_close_and_closes_on_connect_failure() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let _backend = tcp_backend(net.addr(251, 7100), "a").await?;
    env.write_manifest("l4.yaml", &manifests(net))?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.addr(5, TCP_PORT);

    // Bytes go through and come back; after our half-close the backend still answers,
    // and its close reaches us as EOF.
    let mut s = eventually("TCP listener forwards", EVENTUALLY, || async move {
        let mut s = connect_from(net.client_ip(), gw).await?;
        let mut hello = [0u8; 13];
        tokio::time::timeout(REQUEST_TIMEOUT, s.read_exact(&mut hello))
            .await
            .map_err(|_| err("no greeting"))??;
        ensure!(
            &hello == b"hello from a\n",
            "greeting {:?}",
            String::from_utf8_lossy(&hello)
        );
        Ok(s)
    })
    .await?;
    let payload = vec![b'x'; 100_000];
    s.write_all(&payload).await?;
    s.shutdown().await?;
    let rest = read_to_end(&mut s).await?;
    ensure!(
        rest.len() == 100_000 + "bye 100000\n".len() && rest.ends_with("bye 100000\n"),
        "after half-close got {} bytes ending {:?}",
        rest.len(),
        &rest[rest.len().saturating_sub(20)..]
    );

    // A backend that refuses: the client's connection is closed, not left hanging.
    // (The reset may already fail the client's connect-time socket options.)
    if let Ok(mut dead) = connect_from(net.client_ip(), net.addr(5, DEAD_PORT)).await {
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), dead.read(&mut buf)).await;
        ensure!(
            matches!(r, Ok(Ok(0)) | Ok(Err(_))),
            "connection to a dead backend was not closed: {r:?}"
        );
    }

    let status = env.status().await?;
    let route = status_item(&status, "TCPRoute", "default", "echo")?;
    let parent = route_parent(route, "edge", Some("tcp"))?;
    expect_condition(&parent["conditions"], "Accepted", "True", Some("Accepted"))?;
    expect_condition(&parent["conditions"], "ResolvedRefs", "True", None)?;
    let gateway = status_item(&status, "Gateway", "default", "edge")?;
    let tcp = gateway_listener(gateway, "tcp")?;
    ensure!(
        tcp["attachedRoutes"] == 1,
        "attachedRoutes {}",
        tcp["attachedRoutes"]
    );
    ensure!(
        tcp["supportedKinds"][0]["kind"] == "TCPRoute",
        "supportedKinds {}",
        tcp["supportedKinds"]
    );
    expect_condition(
        &gateway_listener(gateway, "udp")?["conditions"],
        "Conflicted",
        "False",
        None,
    )?;
    expect_condition(
        &gateway_listener(gateway, "http")?["conditions"],
        "Conflicted",
        "True",
        Some("ProtocolConflict"),
    )?;

    // /config_dump shows the L4 socket, its protocol and its route's backends.
    let dump = admin_get(net, "/config_dump").await?.json()?;
    let l = &dump["listeners"][gw.to_string()];
    ensure!(
        l["protocol"] == "Tcp" && l["l4"]["*"]["route"] == "default/echo",
        "config_dump of {gw}: {l}"
    );
    ensure!(
        dump["udp"][gw.to_string()]["protocol"] == "Udp",
        "config_dump has no UDP socket at {gw}: {}",
        dump["udp"]
    );

    let metrics = metrics_text(net).await?;
    ensure!(
        metric_sum_where(
            &metrics,
            "aether_tcp_connections_total",
            "route=\"default/echo\""
        ) > 0.0,
        "no aether_tcp_connections_total for default/echo:\n{metrics}"
    );
    ensure!(
        metrics
            .lines()
            .any(|l| l.starts_with("aether_tcp_refused_total")
                && l.contains("reason=\"connect_failed\"")),
        "no connect_failed refusal counted"
    );
    env.pass()
}

/// Connections split by backendRef weight (3:1), and a zero-weight backend gets none.
#[tokio::test(flavor = "multi_thread")]
async fn tcp_route_splits_connections_by_weight() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let _a = tcp_backend(net.addr(251, 7100), "a").await?;
    let _b = tcp_backend(net.addr(252, 7100), "b").await?;
    let _c = tcp_backend(net.addr(253, 7100), "c").await?;
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&l4_gateway(
        "default",
        "edge",
        &net.ip_str(5),
        &[("tcp", TCP_PORT, "TCP")],
    ));
    for (svc, host) in [("a", 251), ("b", 252), ("c", 253)] {
        m.push_str(&backend("default", svc, net.addr(host, 7100), true));
    }
    m.push_str(&l4_route(
        "TCPRoute",
        "split",
        "edge",
        None,
        &[],
        &[("a", 3), ("b", 1), ("c", 0)],
    ));
    env.write_manifest("l4.yaml", &m)?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.addr(5, TCP_PORT);
    let mut counts = std::collections::BTreeMap::<String, u32>::new();
    for i in 0..400 {
        let greeting = eventually("a connection is greeted", EVENTUALLY, || async move {
            let mut s = connect_from(net.client_ip(), gw).await?;
            let mut hello = [0u8; 13];
            tokio::time::timeout(REQUEST_TIMEOUT, s.read_exact(&mut hello))
                .await
                .map_err(|_| err("no greeting"))??;
            Ok(String::from_utf8_lossy(&hello).into_owned())
        })
        .await
        .map_err(|e| err(format!("connection {i}: {e}")))?;
        *counts.entry(greeting).or_default() += 1;
    }
    let a = counts.get("hello from a\n").copied().unwrap_or(0);
    let b = counts.get("hello from b\n").copied().unwrap_or(0);
    ensure!(
        a + b == 400,
        "a zero-weight backend got connections: {counts:?}"
    );
    // 300 expected; generous bounds keep this from flaking.
    ensure!((250..=350).contains(&a), "3:1 split gave {counts:?}");
    env.pass()
}
