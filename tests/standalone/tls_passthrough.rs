//! TLSRoute passthrough: the edge reads the SNI without terminating, picks the route
//! (exact name over wildcard), and the client completes TLS with the backend's own
//! certificate.

use std::net::SocketAddr;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::common::*;

const TLS_PORT: u16 = 8443;

/// A TLS backend (tokio-rustls) that terminates with `leaf` and answers `<name>\n`.
async fn tls_backend(
    addr: SocketAddr,
    name: &str,
    leaf: &Leaf,
) -> Result<JoinHandle<()>, BoxError> {
    let acceptor = leaf.acceptor(&[])?;
    let listener = TcpListener::bind(addr).await?;
    let name = name.to_owned();
    Ok(tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, name) = (acceptor.clone(), name.clone());
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(s).await {
                    let _ = tls.write_all(format!("{name}\n").as_bytes()).await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    }))
}

fn manifests(net: Net) -> String {
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&l4_gateway(
        "default",
        "edge",
        &net.ip_str(5),
        &[("tls", TLS_PORT, "TLS")],
    ));
    m.push_str(&backend("default", "svc-exact", net.addr(251, 9443), true));
    m.push_str(&backend("default", "svc-wild", net.addr(252, 9443), true));
    m.push_str(&l4_route(
        "TLSRoute",
        "exact",
        "edge",
        None,
        &["exact.example.com"],
        &[("svc-exact", 1)],
    ));
    m.push_str(&l4_route(
        "TLSRoute",
        "wild",
        "edge",
        None,
        &["\"*.example.com\""],
        &[("svc-wild", 1)],
    ));
    m
}

/// Completes TLS through the edge with `sni`, trusting only `ca`; returns the
/// certificate presented and what the backend said.
async fn through(
    net: Net,
    sni: &str,
    ca: &TestCa,
) -> Result<(CertificateDer<'static>, String), BoxError> {
    let (mut tls, presented) =
        tls_connect(net.client_ip(), net.addr(5, TLS_PORT), sni, ca, &[]).await?;
    let mut said = String::new();
    tokio::time::timeout(REQUEST_TIMEOUT, tls.read_to_string(&mut said))
        .await
        .map_err(|_| err("backend did not answer"))??;
    Ok((presented, said))
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_passthrough_routes_by_sni_and_the_client_sees_the_backends_certificate() -> TestResult
{
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = TestCa::new("passthrough backends CA")?;
    let exact = ca.leaf(&["exact.example.com"])?;
    let wild = ca.leaf(&["*.example.com"])?;
    let _b1 = tls_backend(net.addr(251, 9443), "exact", &exact).await?;
    let _b2 = tls_backend(net.addr(252, 9443), "wild", &wild).await?;
    env.write_manifest("l4.yaml", &manifests(net))?;
    let _edge = env.spawn_edge("edge").await?;

    let ca = &ca;
    let (cert, said) = eventually("passthrough reaches the exact backend", EVENTUALLY, || {
        through(net, "exact.example.com", ca)
    })
    .await?;
    ensure!(
        cert == exact.cert_der,
        "exact.example.com: not the exact backend's certificate"
    );
    ensure!(said == "exact\n", "exact.example.com reached {said:?}");
    let (cert, said) = through(net, "other.example.com", ca).await?;
    ensure!(
        cert == wild.cert_der,
        "other.example.com: not the wildcard backend's certificate"
    );
    ensure!(said == "wild\n", "other.example.com reached {said:?}");

    // A name no route serves, and bytes that are not TLS: closed, counted, and the
    // listener keeps serving.
    ensure!(
        through(net, "nobody.org", ca).await.is_err(),
        "a name without a route completed a handshake"
    );
    let mut garbage = connect_from(net.client_ip(), net.addr(5, TLS_PORT)).await?;
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(5), garbage.read(&mut buf)).await;
    ensure!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "garbage was not closed: {r:?}"
    );
    let (_, said) = through(net, "exact.example.com", ca).await?;
    ensure!(said == "exact\n", "after garbage: {said:?}");
    let m = metrics_text(net).await?;
    for reason in ["no_route", "bad_client_hello"] {
        ensure!(
            m.lines()
                .any(|l| l.starts_with("aether_tcp_refused_total") && l.contains(reason)),
            "no {reason} refusal counted"
        );
    }

    let status = env.status().await?;
    for name in ["exact", "wild"] {
        let route = status_item(&status, "TLSRoute", "default", name)?;
        expect_condition(
            &route_parent(route, "edge", None)?["conditions"],
            "Accepted",
            "True",
            None,
        )?;
    }
    let gateway = status_item(&status, "Gateway", "default", "edge")?;
    let tls = gateway_listener(gateway, "tls")?;
    ensure!(
        tls["attachedRoutes"] == 2,
        "attachedRoutes {}",
        tls["attachedRoutes"]
    );
    ensure!(
        tls["supportedKinds"][0]["kind"] == "TLSRoute",
        "{}",
        tls["supportedKinds"]
    );
    env.pass()
}
