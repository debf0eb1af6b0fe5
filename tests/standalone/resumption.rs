//! TLS session resumption: a client that comes back resumes its session (no full
//! handshake), whichever worker's socket the kernel hands the new connection to, and
//! never past a change of the listener's client validation: a session made before the
//! Gateway required client certificates does not let a client without one back in.

use std::sync::Arc;
use std::time::Duration;

use rustls::HandshakeKind;

use crate::common::*;

const HTTPS: u16 = 8443;
const HOST: &str = "app.example.com";
/// Reconnects after the first: with a store per worker instead of per listener, each
/// would have a one-in-two chance of a full handshake, so all resuming is 2^-8 likely.
const RETURNS: usize = 8;

fn manifests(net: Net, server: &Leaf, client_ca: Option<&TestCa>) -> String {
    let ip = net.ip_str(5);
    let mut gw = Gateway::test("edge")
        .address(&ip)
        .https("https", HTTPS, "server");
    if client_ca.is_some() {
        gw = gw.spec(
            "tls",
            serde_json::json!({"frontend": {"default": {"validation": {"caCertificateRefs":
                [{"group": "", "kind": "ConfigMap", "name": "client-ca"}]}}}}),
        );
    }
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&gw.yaml());
    m.push_str(&tls_secret("default", "server", server));
    if let Some(ca) = client_ca {
        m.push_str(&ca_config_map("default", "client-ca", ca));
    }
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

/// One client: its session cache lives in `config`, shared by its connections.
fn client(server_ca: &TestCa) -> Result<Arc<rustls::ClientConfig>, BoxError> {
    client_config(&server_ca.cert_der, &[b"http/1.1"], None)
}

/// A GET on a new connection: how the handshake went, and the status. Reading the
/// answer also reads the session tickets the edge sent after the handshake.
async fn get(
    net: Net,
    config: &Arc<rustls::ClientConfig>,
) -> Result<(Option<HandshakeKind>, u16), BoxError> {
    let tls = tls_connect_with(net.client_ip(), net.addr(5, HTTPS), HOST, config).await?;
    let kind = tls.get_ref().1.handshake_kind();
    let mut c = H1Conn::over(tls).await?;
    let status = c.get(HOST, "/").await?.status.as_u16();
    Ok((kind, status))
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_resume_on_any_worker_but_not_past_a_new_client_certificate_rule() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let server_ca = TestCa::new("server-ca")?;
    let server = server_ca.leaf(&[HOST])?;
    env.write_manifest("m.yaml", &manifests(net, &server, None))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--workers", "2"])
        .await?;
    eventually(
        "the HTTPS listener serves",
        Duration::from_secs(10),
        || async {
            let (_, status) = get(net, &client(&server_ca)?).await?;
            ensure!(status == 200, "status {status}");
            Ok(())
        },
    )
    .await?;

    let returning = client(&server_ca)?;
    let (first, status) = get(net, &returning).await?;
    ensure!(status == 200, "first visit: {status}");
    ensure!(first == Some(HandshakeKind::Full), "first visit: {first:?}");
    for i in 0..RETURNS {
        let (kind, status) = get(net, &returning).await?;
        ensure!(status == 200, "return {i}: {status}");
        ensure!(
            kind == Some(HandshakeKind::Resumed),
            "return {i} did not resume: {kind:?}"
        );
    }

    // The Gateway now requires client certificates. The returning client holds tickets
    // from before; they must not stand in for a certificate.
    let client_ca = TestCa::new("client-ca")?;
    env.write_manifest("m.yaml", &manifests(net, &server, Some(&client_ca)))?;
    eventually(
        "a new client without a certificate is refused",
        Duration::from_secs(10),
        || async {
            let refused = get(net, &client(&server_ca)?).await;
            ensure!(refused.is_err(), "still served: {refused:?}");
            Ok(())
        },
    )
    .await?;
    for i in 0..RETURNS {
        let resumed = get(net, &returning).await;
        ensure!(
            resumed.is_err(),
            "return {i} after the rule got through on an old session: {resumed:?}"
        );
    }
    env.pass()
}
