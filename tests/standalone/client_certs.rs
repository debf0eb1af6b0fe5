//! Frontend TLS validation: client certificates checked against CA bundles from
//! ConfigMaps, per Gateway and per port, including AllowInsecureFallback; bad
//! references get the spec's listener conditions while the rest keeps serving; a
//! changed CA bundle applies to the next handshake.

use std::time::Duration;

use crate::common::*;

const STRICT: u16 = 8443;
const FALLBACK: u16 = 9443;
const BROKEN: u16 = 10443;
const WRONG_KIND: u16 = 11443;

fn manifests(net: Net, server: &Leaf, client_ca: &TestCa) -> String {
    let ip = net.ip_str(5);
    let listener = |name: &str, port: u16| {
        format!(
            "  - {{name: {name}, port: {port}, protocol: HTTPS, tls: {{certificateRefs: [{{name: server}}]}}}}\n"
        )
    };
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: edge
  namespace: default
spec:
  gatewayClassName: aether
  addresses: [{{type: IPAddress, value: {ip}}}]
  tls:
    frontend:
      default:
        validation:
          caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: client-ca}}]
      perPort:
      - port: {FALLBACK}
        tls:
          validation:
            mode: AllowInsecureFallback
            caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: client-ca}}]
      - port: {BROKEN}
        tls:
          validation:
            caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: missing}}]
      - port: {WRONG_KIND}
        tls:
          validation:
            caCertificateRefs: [{{group: \"\", kind: Secret, name: server}}]
  listeners:
{}{}{}{}",
        listener("strict", STRICT),
        listener("fallback", FALLBACK),
        listener("broken", BROKEN),
        listener("wrong-kind", WRONG_KIND),
    ));
    m.push_str(&tls_secret("default", "server", server));
    m.push_str(&ca_config_map("default", "client-ca", client_ca));
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

/// A GET over TLS to `port` presenting `client`; the status, or the error that
/// stopped it (a refused handshake surfaces at the first read in TLS 1.3).
async fn get(
    net: Net,
    port: u16,
    server_ca: &TestCa,
    client: Option<&Leaf>,
) -> Result<u16, BoxError> {
    let (tls, _) = tls_connect_as(
        net.client_ip(),
        net.addr(5, port),
        "app.example.com",
        server_ca,
        &[b"http/1.1"],
        client,
    )
    .await?;
    let mut c = H1Conn::over(tls).await?;
    Ok(c.get("app.example.com", "/").await?.status.as_u16())
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificates_are_required_per_port_with_fallback_and_live_cas() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let server_ca = TestCa::new("server-ca")?;
    let server = server_ca.leaf(&["app.example.com"])?;
    let client_ca = TestCa::new("client-ca")?;
    let good = client_ca.client_leaf("good-client")?;
    let other_ca = TestCa::new("other-ca")?;
    let stranger = other_ca.client_leaf("stranger")?;
    env.write_manifest("m.yaml", &manifests(net, &server, &client_ca))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    eventually(
        "the HTTPS listeners serve",
        Duration::from_secs(10),
        || async {
            let status = get(net, FALLBACK, &server_ca, None).await?;
            ensure!(status == 200, "status {status}");
            Ok(())
        },
    )
    .await?;

    // Strict (the Gateway default): only a certificate from the ConfigMap's CA.
    let ok = get(net, STRICT, &server_ca, Some(&good)).await?;
    ensure!(ok == 200, "a valid client certificate got {ok}");
    let none = get(net, STRICT, &server_ca, None).await;
    ensure!(none.is_err(), "no client certificate got through: {none:?}");
    let wrong = get(net, STRICT, &server_ca, Some(&stranger)).await;
    ensure!(
        wrong.is_err(),
        "a certificate from another CA got through: {wrong:?}"
    );

    // AllowInsecureFallback on its port: everyone gets in.
    for (who, client) in [
        ("good", Some(&good)),
        ("none", None),
        ("stranger", Some(&stranger)),
    ] {
        let status = get(net, FALLBACK, &server_ca, client).await?;
        ensure!(status == 200, "fallback port, {who}: {status}");
    }

    // Bad references: conditions on those listeners only.
    let st = env.status().await?;
    let gw = status_item(&st, "Gateway", "default", "edge")?;
    let broken = gateway_listener(gw, "broken")?;
    expect_condition(
        &broken["conditions"],
        "Accepted",
        "False",
        Some("NoValidCACertificate"),
    )?;
    expect_condition(
        &broken["conditions"],
        "ResolvedRefs",
        "False",
        Some("InvalidCACertificateRef"),
    )?;
    let kind = gateway_listener(gw, "wrong-kind")?;
    expect_condition(
        &kind["conditions"],
        "ResolvedRefs",
        "False",
        Some("InvalidCACertificateKind"),
    )?;
    let strict = gateway_listener(gw, "strict")?;
    expect_condition(&strict["conditions"], "Programmed", "True", None)?;
    let refused = connect_from(net.client_ip(), net.addr(5, BROKEN)).await;
    ensure!(refused.is_err(), "the listener without a valid CA is bound");

    // The ConfigMap now trusts the other CA: the next handshakes follow it.
    env.write_manifest("m.yaml", &manifests(net, &server, &other_ca))?;
    eventually(
        "the new CA bundle applies",
        Duration::from_secs(10),
        || async {
            let stranger_ok = get(net, STRICT, &server_ca, Some(&stranger)).await?;
            ensure!(
                stranger_ok == 200,
                "the newly trusted client got {stranger_ok}"
            );
            let old = get(net, STRICT, &server_ca, Some(&good)).await;
            ensure!(old.is_err(), "the no longer trusted client got through");
            Ok(())
        },
    )
    .await?;
    env.pass()
}
