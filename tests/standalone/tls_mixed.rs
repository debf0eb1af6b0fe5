//! TLSRoute mixed mode (the suite's TLSRouteMixedTerminationSameNamespace): one port
//! with a Terminate listener and a Passthrough listener. The edge reads the SNI from
//! the ClientHello, then either ends TLS with the Terminate listener's certificate and
//! forwards the plaintext, or forwards the untouched TLS stream to a backend that
//! completes the handshake with its own certificate.

use tokio::io::AsyncWriteExt;

use crate::common::*;

const TLS_PORT: u16 = 8883;

fn manifests(net: Net, edge_leaf: &Leaf) -> String {
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .address(&ip)
            .tls_terminate(
                "tls-terminate",
                TLS_PORT,
                Some("tls.example.com"),
                "edge-cert",
            )
            .tls_passthrough("tls-passthrough", TLS_PORT, Some("*.example.com"))
            .yaml(),
    );
    // No sectionName: each route's hostname picks its listener.
    m.push_str(&l4_route(
        "TLSRoute",
        "terminated",
        "edge",
        None,
        &["tls.example.com"],
        &[("plain", 1)],
    ));
    m.push_str(&l4_route(
        "TLSRoute",
        "passed",
        "edge",
        None,
        &["abc.example.com"],
        &[("tls-svc", 1)],
    ));
    m.push_str(&tls_secret("default", "edge-cert", edge_leaf));
    m.push_str(&backend("default", "plain", net.echo_a(), true));
    m.push_str(&backend("default", "tls-svc", net.addr(251, 9443), true));
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_mixed_port_terminates_or_passes_through_by_sni() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let edge_ca = TestCa::new("edge CA")?;
    let edge_leaf = edge_ca.leaf(&["tls.example.com"])?;
    let backend_ca = TestCa::new("passthrough backend CA")?;
    let backend_leaf = backend_ca.leaf(&["abc.example.com"])?;
    let tls_backend = TlsBackend::start(net.addr(251, 9443), &backend_leaf).await?;
    env.write_manifest("m.yaml", &manifests(net, &edge_leaf))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.addr(5, TLS_PORT);

    // Terminate: the edge's certificate, and the backend gets the plaintext as sent.
    let (tls, presented) = eventually("the mixed port terminates", EVENTUALLY, || async {
        tls_connect(net.client_ip(), gw, "tls.example.com", &edge_ca, &[]).await
    })
    .await?;
    ensure!(
        presented == edge_leaf.cert_der,
        "tls.example.com: the edge presented another certificate"
    );
    let mut c = H1Conn::over(tls).await?;
    let r = c.get("tls.example.com", "/terminated").await?;
    ensure!(r.status == 200, "terminated: status {}", r.status);
    let echo = r.echo()?;
    ensure!(echo.name() == "a", "terminated: reached {}", echo.name());
    ensure!(
        echo.path() == "/terminated",
        "terminated: path {}",
        echo.path()
    );

    // Passthrough on the same port: the backend's own certificate, and the backend saw
    // the client's SNI (its handshake is the client's).
    let (tls, presented) =
        tls_connect(net.client_ip(), gw, "abc.example.com", &backend_ca, &[]).await?;
    ensure!(
        presented == backend_leaf.cert_der,
        "abc.example.com: not the backend's certificate"
    );
    let mut c = H1Conn::over(tls).await?;
    let r = c.get("abc.example.com", "/passed").await?;
    ensure!(r.status == 200, "passthrough: status {}", r.status);
    let seen = tls_backend.seen_for("/passed");
    ensure!(
        seen.first().and_then(|s| s.sni.as_deref()) == Some("abc.example.com"),
        "passthrough: the backend saw {seen:?}"
    );

    // A name that only the Passthrough listener's wildcard covers, without a route:
    // refused before any handshake, by either side.
    let other = tls_connect(net.client_ip(), gw, "other.example.com", &backend_ca, &[]).await;
    ensure!(other.is_err(), "other.example.com completed a handshake");
    // A name neither listener covers.
    let outside = tls_connect(net.client_ip(), gw, "tls.example.org", &edge_ca, &[]).await;
    ensure!(outside.is_err(), "tls.example.org completed a handshake");
    // Bytes that are not TLS are closed and the port keeps serving.
    let mut garbage = connect_from(net.client_ip(), gw).await?;
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    drop(garbage);
    let (tls, _) = tls_connect(net.client_ip(), gw, "tls.example.com", &edge_ca, &[]).await?;
    let r = H1Conn::over(tls)
        .await?
        .get("tls.example.com", "/again")
        .await?;
    ensure!(r.status == 200, "after garbage: status {}", r.status);

    let status = env.status().await?;
    let gateway = status_item(&status, "Gateway", "default", "edge")?;
    // The wildcard Passthrough listener also takes the tls.example.com route: a route
    // attaches wherever its hostname intersects, and the more specific Terminate
    // listener owning that name keeps it from being passed through.
    for (name, attached) in [("tls-terminate", 1), ("tls-passthrough", 2)] {
        let l = gateway_listener(gateway, name)?;
        for (t, s) in [
            ("Accepted", "True"),
            ("Conflicted", "False"),
            ("Programmed", "True"),
        ] {
            expect_condition(&l["conditions"], t, s, None)?;
        }
        ensure!(
            l["attachedRoutes"] == attached,
            "{name}: attachedRoutes {}",
            l["attachedRoutes"]
        );
    }
    for name in ["terminated", "passed"] {
        let route = status_item(&status, "TLSRoute", "default", name)?;
        expect_condition(
            &route_parent(route, "edge", None)?["conditions"],
            "Accepted",
            "True",
            None,
        )?;
    }
    env.pass()
}
