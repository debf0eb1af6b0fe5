//! TLSRoute in Terminate mode: the edge ends TLS with the listener's certificate and
//! forwards the decrypted bytes to the route's backend untouched (no HTTP parsing, no
//! forwarding headers, no ALPN chosen on the backend's behalf).

use crate::common::*;

const TLS_PORT: u16 = 8443;

fn manifests(net: Net, leaf: &Leaf) -> String {
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .address(&ip)
            .tls_terminate("tls", TLS_PORT, Some("*.example.com"), "wild")
            .yaml(),
    );
    m.push_str(&l4_route(
        "TLSRoute",
        "db",
        "edge",
        None,
        &["db.example.com"],
        &[("svc", 1)],
    ));
    m.push_str(&tls_secret("default", "wild", leaf));
    m.push_str(&backend("default", "svc", net.echo_a(), true));
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_terminate_forwards_the_decrypted_stream_by_sni() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = TestCa::new("edge-ca")?;
    let leaf = ca.leaf(&["*.example.com"])?;
    env.write_manifest("m.yaml", &manifests(net, &leaf))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.addr(5, TLS_PORT);

    // The client verifies the edge's certificate; what it then writes (HTTP here) is
    // the backend's business, and reaches it as written.
    let (tls, presented) = eventually("the TLS listener serves", EVENTUALLY, || async {
        tls_connect(
            net.client_ip(),
            gw,
            "db.example.com",
            &ca,
            &[b"h2", b"http/1.1"],
        )
        .await
    })
    .await?;
    ensure!(
        presented == leaf.cert_der,
        "the edge presented another certificate"
    );
    ensure!(
        tls.get_ref().1.alpn_protocol().is_none(),
        "the edge chose ALPN {:?} for a backend it does not speak for",
        tls.get_ref().1.alpn_protocol()
    );
    let mut c = H1Conn::over(tls).await?;
    let r = c.get("db.example.com", "/raw").await?;
    ensure!(r.status == 200, "status {}", r.status);
    let echo = r.echo()?;
    ensure!(echo.path() == "/raw", "path {}", echo.path());
    ensure!(
        echo.header("x-forwarded-for").is_none(),
        "the edge parsed HTTP on an L4 route: {}",
        echo.0
    );

    // A name no route serves has no certificate here: the handshake fails.
    let other = tls_connect(net.client_ip(), gw, "other.org", &ca, &[b"http/1.1"]).await;
    ensure!(other.is_err(), "a handshake for other.org succeeded");

    let st = env.status().await?;
    let route = status_item(&st, "TLSRoute", "default", "db")?;
    expect_condition(
        &route_parent(route, "edge", None)?["conditions"],
        "Accepted",
        "True",
        None,
    )?;
    let gateway = status_item(&st, "Gateway", "default", "edge")?;
    expect_condition(
        &gateway_listener(gateway, "tls")?["conditions"],
        "Programmed",
        "True",
        None,
    )?;
    env.pass()
}
