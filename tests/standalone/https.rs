//! HTTPS listeners: termination by SNI, HTTP/1.1 and HTTP/2 by ALPN, certificate
//! rotation with no restart, bad certificate references, and 421 for a Host that the
//! connection's certificate does not serve.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::common::*;

const HTTPS_PORT: u16 = 8443;

/// One Gateway at .5: HTTPS :8443 for *.example.com (Secret `wild`), HTTPS :8443 for
/// other.org (Secret `other`), HTTP :8080, and HTTPS :9443 naming a missing Secret.
fn manifests(net: Net) -> String {
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .address(&ip)
            .https_host("https-wild", HTTPS_PORT, "*.example.com", "wild")
            .https_host("https-other", HTTPS_PORT, "other.org", "other")
            .http("http", LISTENER_PORT)
            .https("https-broken", 9443, "missing")
            .yaml(),
    );
    m.push_str(&backend("default", "svc", net.echo_a(), true));
    m.push_str(&route(
        "default",
        "web",
        "edge",
        &[],
        &[("PathPrefix", "/", "svc")],
    ));
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn https_terminates_by_sni_rotates_certificates_and_reports_bad_refs() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let tls_addr = net.addr(5, HTTPS_PORT);
    let ca = TestCa::new("aether test CA")?;
    let first = ca.leaf(&["*.example.com"])?;
    let other = ca.leaf(&["other.org"])?;
    env.write_manifest("gateway.yaml", &manifests(net))?;
    env.write_manifest("secret-other.yaml", &tls_secret("default", "other", &other))?;
    env.write_manifest("secret-wild.yaml", &tls_secret("default", "wild", &first))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    // Both sockets come from one Snapshot, so the HTTP one answering means both are bound.
    env.wait_listener(net.addr(5, LISTENER_PORT)).await?;

    // HTTP/1.1 over TLS: the backend sees the client's host and x-forwarded-proto https.
    let (tls, presented) = tls_connect(
        net.client_ip(),
        tls_addr,
        "a.example.com",
        &ca,
        &[b"http/1.1"],
    )
    .await?;
    ensure!(
        presented == first.cert_der,
        "SNI a.example.com got another certificate"
    );
    let mut kept = H1Conn::over(tls).await?;
    let r = kept.get("a.example.com", "/secure").await?;
    let e = r.echo()?;
    ensure!(
        e.path() == "/secure" && e.host() == "a.example.com",
        "backend saw {}",
        e.0
    );
    ensure!(
        e.header("x-forwarded-proto") == Some("https"),
        "x-forwarded-proto: {}",
        e.0
    );

    // ALPN h2 gets HTTP/2.
    let (tls, _) = tls_connect(net.client_ip(), tls_addr, "b.example.com", &ca, &[b"h2"]).await?;
    ensure!(
        tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()),
        "ALPN did not pick h2"
    );
    // The other listener's name gets its own certificate on the same port.
    let (_, presented) =
        tls_connect(net.client_ip(), tls_addr, "other.org", &ca, &[b"http/1.1"]).await?;
    ensure!(
        presented == other.cert_der,
        "SNI other.org got another certificate"
    );
    // No listener claims this name and none is the default: a clean handshake failure.
    let refused = tls_connect(net.client_ip(), tls_addr, "nobody.net", &ca, &[b"http/1.1"]).await;
    ensure!(
        refused.is_err(),
        "a name no listener serves completed a handshake"
    );

    // A Host served with another certificate than this connection's: 421.
    let r = kept.get("other.org", "/").await?;
    ensure!(
        r.status == StatusCode::MISDIRECTED_REQUEST,
        "Host other.org over an *.example.com session: {}",
        r.status
    );

    // Status: the broken listener says why, and the rest is programmed.
    let st = env.status().await?;
    let gw = status_item(&st, "Gateway", "default", "edge")?;
    let broken = gateway_listener(gw, "https-broken")?;
    expect_condition(
        &broken["conditions"],
        "ResolvedRefs",
        "False",
        Some("InvalidCertificateRef"),
    )?;
    expect_condition(&broken["conditions"], "Programmed", "False", None)?;
    let wild = gateway_listener(gw, "https-wild")?;
    expect_condition(&wild["conditions"], "Programmed", "True", None)?;
    let dump = admin_get(net, "/config_dump").await?.text();
    ensure!(
        !dump.contains("PRIVATE KEY") && !dump.contains(first.key_pem.trim()),
        "config_dump shows key material"
    );
    let status_text = admin_get(net, "/status").await?.text();
    ensure!(
        !status_text.contains("PRIVATE KEY"),
        "/status shows key material"
    );

    // Rotation: a new certificate in the Secret is used by new handshakes, without a
    // restart, while the established session keeps working.
    let second = ca.leaf(&["*.example.com"])?;
    env.add_manifest_atomically("secret-wild.yaml", &tls_secret("default", "wild", &second))?;
    let rotated = Instant::now();
    eventually(
        "new handshakes present the rotated certificate",
        Duration::from_secs(5),
        || async {
            let (_, presented) = tls_connect(
                net.client_ip(),
                tls_addr,
                "a.example.com",
                &ca,
                &[b"http/1.1"],
            )
            .await?;
            ensure!(presented == second.cert_der, "still the old certificate");
            Ok(())
        },
    )
    .await?;
    eprintln!("rotated certificate served after {:?}", rotated.elapsed());
    let r = kept.get("a.example.com", "/after-rotation").await?;
    ensure!(
        r.echo()?.path() == "/after-rotation",
        "the established session broke: {}",
        r.status
    );

    // Plain HTTP on the same Gateway is unaffected by all of this.
    let r = env
        .h1(net.addr(5, LISTENER_PORT), "plain.example.com", "/plain")
        .await?;
    ensure!(
        r.status == StatusCode::OK,
        "HTTP listener answered {}",
        r.status
    );
    env.pass()
}
