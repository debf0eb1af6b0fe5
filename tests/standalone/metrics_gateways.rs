//! Series labelled by a Gateway or a listener leave `/metrics` with it: the per-Gateway
//! duration histogram, the listeners' connection series and a UDP listener's flows;
//! those of a Gateway that stays go on counting, and a Gateway added back starts
//! from 0.

use std::net::SocketAddr;

use http::StatusCode;
use tokio::net::UdpSocket;

use crate::common::*;

const UDP_PORT: u16 = 7000;

/// Gateway `default/edge` (.5, listener `http`) with route `keep`; with `gone`, also
/// Gateway `default/gone` (.6, listeners `web` on HTTP and `dns` on UDP) with an
/// HTTPRoute and a UDPRoute. One file, rewritten to remove Gateway gone.
fn manifests(net: Net, gone: bool) -> String {
    let mut m = edge_gateway(net);
    m.push_str(&backend("default", "svc-a", net.echo_a(), true));
    m.push_str(&route(
        "default",
        "keep",
        "edge",
        &[],
        &[("PathPrefix", "/", "svc-a")],
    ));
    if gone {
        m.push_str(&l4_gateway(
            "default",
            "gone",
            &net.ip_str(6),
            &[("web", LISTENER_PORT, "HTTP"), ("dns", UDP_PORT, "UDP")],
        ));
        m.push_str(&route(
            "default",
            "gone-web",
            "gone",
            &[],
            &[("PathPrefix", "/", "svc-a")],
        ));
        m.push_str(&backend("default", "udp-a", net.addr(251, 7100), true));
        m.push_str(&l4_route(
            "UDPRoute",
            "gone-dns",
            "gone",
            Some("dns"),
            &[],
            &[("udp-a", 1)],
        ));
    }
    m
}

const GONE: &str = "gateway=\"default/gone\"";
const EDGE: &str = "gateway=\"default/edge\"";

/// Sample lines (not HELP/TYPE) that contain `what`.
fn lines_with<'a>(text: &'a str, what: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(what))
        .collect()
}

/// `aether_request_duration_seconds_count` of `gateway` (a `gateway="..."` label).
fn duration_count(text: &str, gateway: &str) -> f64 {
    metric_sum_where(text, "aether_request_duration_seconds_count", gateway)
}

async fn get(net: Net, to: SocketAddr, path: &str) -> Result<StatusCode, BoxError> {
    Ok(h1_get_from(net.client_ip(), to, "any.example.com", path)
        .await?
        .status)
}

#[tokio::test(flavor = "multi_thread")]
async fn removed_gateway_and_listener_series_are_dropped() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let (edge_at, gone_at) = (net.gw(), net.addr(6, LISTENER_PORT));
    env.write_manifest("gateways.yaml", &manifests(net, true))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _udp = udp_backend(net.addr(251, 7100), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(edge_at).await?;
    env.wait_listener(gone_at).await?;

    for path in ["/1", "/2", "/3"] {
        ensure!(
            get(net, edge_at, path).await? == StatusCode::OK,
            "edge {path}"
        );
    }
    ensure!(get(net, gone_at, "/1").await? == StatusCode::OK, "gone /1");
    // A UDP flow through Gateway gone, still open (idle timeout 1m) at the removal.
    let client = UdpSocket::bind(SocketAddr::new(net.client_ip(), 0)).await?;
    let dns = net.addr(6, UDP_PORT);
    client.send_to(b"ping", dns).await?;
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(REQUEST_TIMEOUT, client.recv_from(&mut buf))
        .await
        .map_err(|_| err("no UDP answer through Gateway gone"))??;
    ensure!(&buf[..n] == b"a:ping", "UDP answer {:?}", &buf[..n]);

    let text = metrics_text(net).await?;
    ensure!(
        duration_count(&text, EDGE) == 3.0 && duration_count(&text, GONE) == 1.0,
        "durations before the removal: {:?}",
        lines_with(&text, "aether_request_duration_seconds_count")
    );
    for (name, labels) in [
        ("aether_downstream_connections_total", "listener=\"web\""),
        ("aether_udp_flows_active", "listener=\"dns\""),
        ("aether_downstream_connections_total", "listener=\"http\""),
    ] {
        ensure!(
            metric_sum_where(&text, name, labels) >= 1.0,
            "no {name}{{{labels}}} >= 1: {:?}",
            lines_with(&text, name)
        );
    }

    // Rewrite the manifest without Gateway gone (and its routes).
    env.write_manifest("gateways.yaml", &manifests(net, false))?;
    eventually("Gateway gone stops serving", EVENTUALLY, || async move {
        ensure!(
            get(net, gone_at, "/after").await.is_err(),
            "Gateway gone still answers"
        );
        Ok(())
    })
    .await?;
    let text = eventually(
        "Gateway gone's series leave /metrics",
        EVENTUALLY,
        || async move {
            let text = metrics_text(net).await?;
            let left = lines_with(&text, "default/gone");
            ensure!(left.is_empty(), "series of the removed Gateway: {left:?}");
            Ok(text)
        },
    )
    .await?;
    // Gateway edge's series stay and go on from where they were (no reset).
    ensure!(get(net, edge_at, "/4").await? == StatusCode::OK, "edge /4");
    let text_after = metrics_text(net).await?;
    ensure!(
        duration_count(&text_after, EDGE) == 4.0,
        "edge's durations after the removal: {:?}",
        lines_with(&text_after, "aether_request_duration_seconds_count")
    );
    for name in [
        "aether_downstream_connections_total",
        "aether_downstream_connections_active",
        "aether_request_duration_seconds_bucket",
        "aether_request_duration_seconds_sum",
    ] {
        ensure!(
            text.lines()
                .any(|l| l.starts_with(name) && l.contains(EDGE)),
            "{name} of Gateway edge is gone too: {:?}",
            lines_with(&text, "default/edge")
        );
    }
    ensure!(
        text.contains(
            "aether_request_duration_seconds_bucket{gateway=\"default/edge\",le=\"+Inf\"} 3\n"
        ),
        "edge's +Inf bucket is not its 3 requests: {:?}",
        lines_with(&text, "aether_request_duration_seconds_bucket")
    );

    // Added back, Gateway gone starts from 0.
    env.write_manifest("gateways.yaml", &manifests(net, true))?;
    env.wait_listener(gone_at).await?;
    ensure!(
        get(net, gone_at, "/again").await? == StatusCode::OK,
        "gone /again"
    );
    let text = metrics_text(net).await?;
    ensure!(
        duration_count(&text, GONE) == 1.0,
        "Gateway gone added back: {:?}",
        lines_with(&text, "aether_request_duration_seconds_count")
    );
    ensure!(
        metric_sum_where(&text, "aether_udp_flows_active", GONE) == 0.0,
        "the old UDP flow still counts: {:?}",
        lines_with(&text, "aether_udp_flows_active")
    );
    env.pass()
}
