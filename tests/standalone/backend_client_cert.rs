//! Gateway `spec.tls.backend.clientCertificateRef` end to end: the real binary presents
//! the Gateway's certificate when it dials a TLS backend (BackendTLSPolicy) that
//! requires client certificates, a real rustls server on loopback. The backend records
//! the certificate it was shown; a Gateway without one, or with a reference that does
//! not resolve, is refused by that backend (or refuses to dial); a rotated Secret is
//! presented from the next connection on. TLSRoute Terminate streams present it too.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

/// Gateways (each with an HTTP listener on 8080 at its own address) and their routes
/// to the one TLS backend `secure`: `edge` presents Secret `client`, `bare` presents
/// nothing, `broken` names a Secret that does not exist. `edge` also has a TLS
/// Terminate listener on 8443 (certificate `edge-cert`) with a TLSRoute to `secure`.
fn manifests(net: Net, backend_ca: &TestCa, client: &Leaf, edge_cert: &Leaf) -> String {
    let mut m = gateway_class("aether", CONTROLLER);
    let gateways = [
        ("edge", 5, Some("client")),
        ("bare", 6, None),
        ("broken", 7, Some("missing")),
    ];
    for (name, host, secret) in gateways {
        let mut gw = Gateway::test(name)
            .address(&net.ip_str(host))
            .http("http", LISTENER_PORT);
        if name == "edge" {
            gw = gw.tls_terminate("tls", 8443, None, "edge-cert");
        }
        if let Some(s) = secret {
            gw = gw.spec(
                "tls",
                json!({"backend": {"clientCertificateRef": {"group": "", "kind": "Secret", "name": s}}}),
            );
        }
        m.push_str(&gw.yaml());
        m.push_str(&route(
            "default",
            name,
            name,
            &[],
            &[("PathPrefix", "/", "secure")],
        ));
    }
    m.push_str(&tls_secret("default", "client", client));
    m.push_str(&tls_secret("default", "edge-cert", edge_cert));
    m.push_str(&l4_route(
        "TLSRoute",
        "db",
        "edge",
        Some("tls"),
        &["db.example.com"],
        &[("secure", 1)],
    ));
    m.push_str(&ca_config_map("default", "ca", backend_ca));
    m.push_str(&Backend::test("secure").endpoint(net.echo_a(), true).yaml());
    m.push_str(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: secure, namespace: default}
spec:
  targetRefs: [{group: \"\", kind: Service, name: secure}]
  validation:
    hostname: backend.example.com
    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}]
",
    );
    m
}

fn gateway_conditions(status: &Value, name: &str) -> Result<Value, BoxError> {
    Ok(status_item(status, "Gateway", "default", name)?["status"]["conditions"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_presents_its_client_certificate_to_tls_backends() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let backend_ca = TestCa::new("backend-ca")?;
    let client_ca = TestCa::new("client-ca")?;
    let client = client_ca.client_leaf("edge-client")?;
    let edge_ca = TestCa::new("edge-ca")?;
    let edge_cert = edge_ca.leaf(&["db.example.com"])?;
    let backend = TlsBackend::start_requiring_client(
        net.echo_a(),
        &backend_ca.leaf(&["backend.example.com"])?,
        &client_ca,
    )
    .await?;
    env.write_manifest("m.yaml", &manifests(net, &backend_ca, &client, &edge_cert))?;
    let _edge = env.spawn_edge("edge").await?;
    let src = net.client_ip();
    let get = move |host: u8, path: &'static str| {
        h1_get_from(src, net.addr(host, LISTENER_PORT), "app.example.com", path)
    };

    eventually(
        "the TLS backend answers the Gateway presenting a certificate",
        Duration::from_secs(10),
        || async {
            let r = get(5, "/with-cert").await?;
            ensure!(
                r.status == 200 && r.text() == "tls-backend",
                "{} {}",
                r.status,
                r.text()
            );
            Ok(())
        },
    )
    .await?;
    let seen = backend.seen_for("/with-cert");
    let first = seen.first().ok_or_else(|| err("backend saw nothing"))?;
    ensure!(
        first.client_cert.as_deref() == Some(client.cert_der.as_ref()),
        "the backend was not shown the Gateway's certificate: {first:?}"
    );

    // A TLSRoute Terminate stream: the edge's own TLS to the backend presents it too.
    let (tls, _) = tls_connect(
        net.client_ip(),
        net.addr(5, 8443),
        "db.example.com",
        &edge_ca,
        &[b"http/1.1"],
    )
    .await?;
    let r = H1Conn::over(tls)
        .await?
        .get("db.example.com", "/l4")
        .await?;
    ensure!(r.status == 200, "through the TLSRoute: {}", r.status);
    let seen = backend.seen_for("/l4");
    ensure!(
        seen.first().and_then(|s| s.client_cert.as_deref()) == Some(client.cert_der.as_ref()),
        "the TLSRoute's stream did not present the Gateway's certificate: {seen:?}"
    );

    // The same backend, through a Gateway without a certificate: the backend refuses
    // the handshake (a connection made for `edge` is not reused for `bare`).
    let r = get(6, "/without-cert").await?;
    ensure!(
        [502, 503].contains(&r.status.as_u16()),
        "without a client certificate: {}",
        r.status
    );
    ensure!(
        backend.seen_for("/without-cert").is_empty(),
        "the backend served a client without a certificate"
    );
    // An unresolvable reference: the edge does not dial without the certificate.
    let r = get(7, "/broken").await?;
    ensure!(
        [502, 503].contains(&r.status.as_u16()),
        "broken: {}",
        r.status
    );
    ensure!(
        backend.seen_for("/broken").is_empty(),
        "broken reached the backend"
    );

    let st = env.status().await?;
    let edge = gateway_conditions(&st, "edge")?;
    expect_condition(&edge, "ResolvedRefs", "True", Some("ResolvedRefs"))?;
    expect_condition(&edge, "Accepted", "True", Some("Accepted"))?;
    let broken = gateway_conditions(&st, "broken")?;
    expect_condition(
        &broken,
        "ResolvedRefs",
        "False",
        Some("InvalidClientCertificateRef"),
    )?;
    expect_condition(&broken, "Accepted", "True", Some("Accepted"))?;
    ensure!(
        condition(&gateway_conditions(&st, "bare")?, "ResolvedRefs").is_err(),
        "a Gateway without spec.tls.backend reports ResolvedRefs"
    );

    // Rotation: Secret `client` now holds another certificate of the same CA; new
    // connections present it.
    let rotated = client_ca.client_leaf("edge-client-2")?;
    env.write_manifest("m.yaml", &manifests(net, &backend_ca, &rotated, &edge_cert))?;
    eventually(
        "the rotated certificate is presented",
        Duration::from_secs(10),
        || async {
            let r = get(5, "/rotated").await?;
            ensure!(r.status == 200, "{}", r.status);
            let seen = backend.seen_for("/rotated");
            ensure!(
                seen.last().and_then(|s| s.client_cert.as_deref())
                    == Some(rotated.cert_der.as_ref()),
                "still the old certificate"
            );
            Ok(())
        },
    )
    .await?;
    env.pass()
}
