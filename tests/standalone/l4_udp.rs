//! UDPRoute: datagram round trips per client flow, idle expiry, and a bounded flow
//! table against one source spraying from many ports.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;

use crate::common::*;

const UDP_PORT: u16 = 7000;

fn manifests(net: Net) -> String {
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&l4_gateway(
        "default",
        "edge",
        &net.ip_str(5),
        &[("udp", UDP_PORT, "UDP"), ("tcp", UDP_PORT, "TCP")],
    ));
    m.push_str(&backend("default", "udp-a", net.addr(251, 7100), true));
    m.push_str(&l4_route(
        "UDPRoute",
        "dns",
        "edge",
        Some("udp"),
        &[],
        &[("udp-a", 1)],
    ));
    m
}

/// Sends `msg` from `sock` to `to` and returns the answer, if one comes within `wait`.
async fn round_trip(
    sock: &UdpSocket,
    to: SocketAddr,
    msg: &str,
    wait: Duration,
) -> Result<String, BoxError> {
    sock.send_to(msg.as_bytes(), to).await?;
    let mut buf = [0u8; 2048];
    let (n, from) = tokio::time::timeout(wait, sock.recv_from(&mut buf))
        .await
        .map_err(|_| err(format!("no answer to {msg:?}")))??;
    ensure!(from == to, "answer came from {from}, not {to}");
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn udp_route_round_trips_per_flow_expires_idle_flows_and_bounds_one_source() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let _backend = udp_backend(net.addr(251, 7100), "a").await?;
    env.write_manifest("l4.yaml", &manifests(net))?;
    let _edge = env
        .spawn_edge_args(
            "edge",
            &[env.manifests()],
            &[
                "--udp-idle-timeout",
                "1s",
                "--udp-max-flows-per-source",
                "4",
            ],
        )
        .await?;
    let gw = net.addr(5, UDP_PORT);

    let first = UdpSocket::bind(SocketAddr::new(net.client_ip(), 0)).await?;
    eventually("UDP listener answers", EVENTUALLY, || {
        let first = &first;
        async move {
            let got = round_trip(first, gw, "ping", Duration::from_millis(300)).await?;
            ensure!(got == "a:ping", "got {got:?}");
            Ok(())
        }
    })
    .await?;
    // Several round trips on the same flow, and a second client with its own flow.
    let second = UdpSocket::bind(SocketAddr::new(net.client_ip(), 0)).await?;
    for i in 0..20 {
        let msg = format!("m{i}");
        let s = if i % 2 == 0 { &first } else { &second };
        let got = round_trip(s, gw, &msg, REQUEST_TIMEOUT).await?;
        ensure!(got == format!("a:{msg}"), "round trip {i}: {got:?}");
    }
    let m = metrics_text(net).await?;
    ensure!(
        metric_sum_where(&m, "aether_udp_flows_total", "route=\"default/dns\"") == 2.0,
        "expected 2 flows:\n{m}"
    );

    // Idle flows expire (1 s here); the table empties.
    eventually(
        "idle UDP flows expire",
        Duration::from_secs(5),
        || async move {
            let m = metrics_text(net).await?;
            let active = metric_sum_where(&m, "aether_udp_flows_active", "");
            ensure!(active == 0.0, "{active} flows still active");
            Ok(())
        },
    )
    .await?;

    // One source IP spraying from ten ports gets four flows; the rest is dropped and
    // counted, and the listener keeps serving.
    // All sent at once and answers collected within one window shorter than the idle
    // timeout, so no flow expires and frees a slot meanwhile.
    let mut sockets = Vec::new();
    for i in 0..10 {
        let s = UdpSocket::bind(SocketAddr::new(net.client_ip(), 0)).await?;
        s.send_to(format!("f{i}").as_bytes(), gw).await?;
        sockets.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut answered = 0;
    let mut buf = [0u8; 64];
    for s in &sockets {
        if s.try_recv_from(&mut buf).is_ok() {
            answered += 1;
        }
    }
    ensure!(
        answered == 4,
        "{answered} of 10 flows from one source were served"
    );
    let m = metrics_text(net).await?;
    ensure!(
        metric_sum_where(
            &m,
            "aether_udp_dropped_total",
            "reason=\"source_flow_limit\""
        ) >= 6.0,
        "drops not counted:\n{m}"
    );

    let status = env.status().await?;
    let route = status_item(&status, "UDPRoute", "default", "dns")?;
    let parent = route_parent(route, "edge", Some("udp"))?;
    expect_condition(&parent["conditions"], "Accepted", "True", None)?;
    let gateway = status_item(&status, "Gateway", "default", "edge")?;
    let udp = gateway_listener(gateway, "udp")?;
    ensure!(
        udp["supportedKinds"][0]["kind"] == "UDPRoute",
        "{}",
        udp["supportedKinds"]
    );
    expect_condition(&udp["conditions"], "Conflicted", "False", None)?;
    expect_condition(
        &gateway_listener(gateway, "tcp")?["conditions"],
        "Conflicted",
        "False",
        None,
    )?;
    env.pass()
}
