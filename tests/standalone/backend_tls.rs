//! BackendTLSPolicy end to end: the real binary originates TLS to real TLS backends on
//! loopback with the policy's SNI, CA bundle and names; wrong CAs, names and SANs fail
//! and are counted; a rotated CA ConfigMap applies live; policy status follows the spec.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

const URI_B: &str = "spiffe://cluster.local/ns/default/sa/b";

/// A Service `svc` (port `http` 80, optional appProtocol) with one ready endpoint.
fn service(svc: &str, endpoint: SocketAddr, app_protocol: Option<&str>) -> String {
    let mut b = Backend::test(svc);
    if let Some(p) = app_protocol {
        b = b.app_protocol(p);
    }
    b.endpoint(endpoint, true).yaml()
}

fn policy(name: &str, created: &str, svc: &str, validation: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}, namespace: default, creationTimestamp: \"{created}\"}}
spec:
  targetRefs: [{{group: \"\", kind: Service, name: {svc}}}]
  validation: {validation}
"
    )
}

fn ca_ref(host: &str, cm: &str) -> String {
    format!(
        "{{hostname: {host}, caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: {cm}}}]}}"
    )
}

/// Everything, with ConfigMap `ca` holding `trusted`.
fn manifests(net: Net, trusted: &TestCa, other: &TestCa) -> String {
    let (a, b) = (net.echo_a(), net.echo_b());
    let mut m = edge_gateway(net);
    m.push_str(&ca_config_map("default", "ca", trusted));
    m.push_str(&ca_config_map("default", "other-ca", other));
    let cases: [(&str, SocketAddr, Option<&str>, String); 8] = [
        ("secure", a, None, ca_ref("backend.example.com", "ca")),
        ("wrong-name", a, None, ca_ref("wrong.example.com", "ca")),
        ("wrong-ca", a, None, ca_ref("backend.example.com", "other-ca")),
        ("missing-ca", a, None, ca_ref("backend.example.com", "missing")),
        (
            "sans",
            a,
            None,
            "{hostname: sni.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}], subjectAltNames: [{type: Hostname, hostname: backend.example.com}]}".to_owned(),
        ),
        (
            "uri",
            b,
            None,
            format!("{{hostname: b.example.com, caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: ca}}], subjectAltNames: [{{type: URI, uri: \"{URI_B}\"}}]}}"),
        ),
        (
            "uri-wrong",
            b,
            None,
            "{hostname: b.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}], subjectAltNames: [{type: URI, uri: \"spiffe://cluster.local/ns/default/sa/x\"}]}".to_owned(),
        ),
        (
            "h2",
            a,
            Some("kubernetes.io/h2c"),
            ca_ref("backend.example.com", "ca"),
        ),
    ];
    let mut rules: Vec<&str> = Vec::new();
    for (name, ep, app, validation) in &cases {
        m.push_str(&service(name, *ep, *app));
        m.push_str(&policy(name, "2024-01-01T00:00:00Z", name, validation));
        rules.push(*name);
    }
    // Newer, for the same Service: Conflicted, and never used (it trusts the wrong CA).
    m.push_str(&policy(
        "late",
        "2024-06-01T00:00:00Z",
        "secure",
        &ca_ref("backend.example.com", "other-ca"),
    ));
    let paths: Vec<String> = rules.iter().map(|r| format!("/{r}")).collect();
    let rules: Vec<(&str, &str, &str)> = rules
        .iter()
        .zip(&paths)
        .map(|(svc, path)| ("PathPrefix", path.as_str(), *svc))
        .collect();
    m.push_str(&route("default", "r", "edge", &[], &rules));
    m
}

fn ancestor(status: &Value, policy: &str) -> Result<Value, BoxError> {
    let p = status_item(status, "BackendTLSPolicy", "default", policy)?;
    let a = p["status"]["ancestors"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["ancestorRef"]["name"] == "edge"))
        .ok_or_else(|| err(format!("policy {policy} has no ancestor edge: {p}")))?;
    ensure!(a["controllerName"] == CONTROLLER, "{a}");
    Ok(a["conditions"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_tls_policy_originates_verified_tls_and_follows_ca_rotation() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = TestCa::new("backend-ca")?;
    let other = TestCa::new("other-ca")?;
    let backend_a = TlsBackend::start(net.echo_a(), &ca.leaf(&["backend.example.com"])?).await?;
    let backend_b =
        TlsBackend::start(net.echo_b(), &ca.leaf_with_uri(&["b.example.com"], URI_B)?).await?;
    env.write_manifest("m.yaml", &manifests(net, &ca, &other))?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.gw();
    let client = net.client_ip();
    let get = move |path: &'static str| h1_get_from(client, gw, "app.example.com", path);

    eventually(
        "the TLS backend answers",
        Duration::from_secs(10),
        || async {
            let r = get("/secure").await?;
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
    let seen = backend_a.seen_for("/secure");
    let first = seen.first().ok_or_else(|| err("backend saw nothing"))?;
    ensure!(
        first.sni.as_deref() == Some("backend.example.com"),
        "{first:?}"
    );
    ensure!(first.alpn.as_deref() == Some("http/1.1"), "{first:?}");

    // subjectAltNames: SNI is the hostname, authentication is by the SAN.
    let r = get("/sans").await?;
    ensure!(r.status == 200, "sans: {}", r.status);
    let s = backend_a.seen_for("/sans");
    ensure!(
        s.first().and_then(|s| s.sni.as_deref()) == Some("sni.example.com"),
        "{s:?}"
    );
    let r = get("/uri").await?;
    ensure!(r.status == 200, "uri SAN: {}", r.status);
    ensure!(
        !backend_b.seen_for("/uri").is_empty(),
        "backend b saw nothing"
    );

    // An h2 backend: ALPN h2 and HTTP/2 over the policy's TLS.
    let r = get("/h2").await?;
    ensure!(r.status == 200, "h2: {}", r.status);
    let s = backend_a.seen_for("/h2");
    let s = s.first().ok_or_else(|| err("h2 backend saw nothing"))?;
    ensure!(
        s.alpn.as_deref() == Some("h2") && s.version == "HTTP/2.0",
        "{s:?}"
    );

    // Failures: the request never reaches the backend, answers 5xx and is counted.
    let before = metric(net, "aether_upstream_tls_errors_total").await?;
    for path in ["/wrong-name", "/wrong-ca", "/uri-wrong", "/missing-ca"] {
        let r = get(path).await?;
        ensure!(
            [500, 502, 503].contains(&r.status.as_u16()),
            "{path}: {}",
            r.status
        );
    }
    ensure!(
        backend_a.seen_for("/wrong-name").is_empty() && backend_a.seen_for("/wrong-ca").is_empty(),
        "a refused backend got the request"
    );
    ensure!(
        backend_b.seen_for("/uri-wrong").is_empty(),
        "a backend with the wrong URI SAN got the request"
    );
    let after = metric(net, "aether_upstream_tls_errors_total").await?;
    ensure!(after - before >= 3.0, "tls errors {before} -> {after}");

    // Status: the spec's conditions, per Gateway ancestor.
    let st = env.status().await?;
    let ok = ancestor(&st, "secure")?;
    expect_condition(&ok, "Accepted", "True", Some("Accepted"))?;
    expect_condition(&ok, "ResolvedRefs", "True", Some("ResolvedRefs"))?;
    let missing = ancestor(&st, "missing-ca")?;
    expect_condition(&missing, "Accepted", "False", Some("NoValidCACertificate"))?;
    expect_condition(
        &missing,
        "ResolvedRefs",
        "False",
        Some("InvalidCACertificateRef"),
    )?;
    let late = ancestor(&st, "late")?;
    expect_condition(&late, "Accepted", "False", Some("Conflicted"))?;

    // Rotation: ConfigMap `ca` now holds the other CA, so /secure fails; back, it serves.
    env.write_manifest("m.yaml", &manifests(net, &other, &ca))?;
    eventually(
        "the rotated CA applies",
        Duration::from_secs(10),
        || async {
            let r = get("/secure").await?;
            ensure!(r.status != 200, "still {}", r.status);
            Ok(())
        },
    )
    .await?;
    env.write_manifest("m.yaml", &manifests(net, &ca, &other))?;
    eventually(
        "the original CA applies again",
        Duration::from_secs(10),
        || async {
            let r = get("/secure").await?;
            ensure!(r.status == 200, "{}", r.status);
            Ok(())
        },
    )
    .await?;
    env.pass()
}

/// TLSRoute Terminate: the edge ends the client's TLS and opens its own to the backend
/// as the policy says, with no ALPN (the stream is opaque to the edge).
#[tokio::test(flavor = "multi_thread")]
async fn tls_route_terminate_backend_is_reached_over_policy_tls() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let edge_ca = TestCa::new("edge-ca")?;
    let backend_ca = TestCa::new("backend-ca")?;
    let backend =
        TlsBackend::start(net.echo_a(), &backend_ca.leaf(&["backend.example.com"])?).await?;
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .address(&ip)
            .tls_terminate("tls", 8443, None, "wild")
            .yaml(),
    );
    m.push_str(&l4_route(
        "TLSRoute",
        "db",
        "edge",
        None,
        &["db.example.com"],
        &[("secure", 1)],
    ));
    m.push_str(&tls_secret(
        "default",
        "wild",
        &edge_ca.leaf(&["*.example.com"])?,
    ));
    m.push_str(&ca_config_map("default", "ca", &backend_ca));
    m.push_str(&service("secure", net.echo_a(), None));
    m.push_str(&policy(
        "secure",
        "2024-01-01T00:00:00Z",
        "secure",
        &ca_ref("backend.example.com", "ca"),
    ));
    env.write_manifest("m.yaml", &m)?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.addr(5, 8443);
    let (tls, _) = eventually(
        "the TLS listener serves",
        Duration::from_secs(10),
        || async {
            tls_connect(
                net.client_ip(),
                gw,
                "db.example.com",
                &edge_ca,
                &[b"http/1.1"],
            )
            .await
        },
    )
    .await?;
    let mut c = H1Conn::over(tls).await?;
    let r = c.get("db.example.com", "/l4").await?;
    ensure!(
        r.status == 200 && r.text() == "tls-backend",
        "{} {}",
        r.status,
        r.text()
    );
    let seen = backend.seen_for("/l4");
    let s = seen.first().ok_or_else(|| err("backend saw nothing"))?;
    ensure!(s.sni.as_deref() == Some("backend.example.com"), "{s:?}");
    ensure!(
        s.alpn.is_none(),
        "the edge chose ALPN for an opaque stream: {s:?}"
    );
    let st = env.status().await?;
    expect_condition(
        &ancestor(&st, "secure")?,
        "Accepted",
        "True",
        Some("Accepted"),
    )?;
    env.pass()
}
