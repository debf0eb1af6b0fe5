//! Mesh mode end to end: the edge (SVID from PEM files here) forwards over mTLS HTTP/2
//! to a real Envoy as each pod's inbound listener at pod_ip:15008, which checks the
//! edge's SPIFFE ID, sets XFCC and forwards to the echo backend.

use std::net::{IpAddr, SocketAddr};

use http::StatusCode;
use tokio::io::AsyncReadExt;

use crate::common::*;

/// Gateway `default/edge` at .5:8080 with one route per `(hostname, service)`.
pub(crate) fn gateway_and_routes(net: Net, routes: &[(&str, &str)]) -> String {
    let mut m = edge_gateway(net);
    for (i, (host, svc)) in routes.iter().enumerate() {
        m.push_str(&route(
            "default",
            &format!("r{i}"),
            "edge",
            &[host],
            &[("PathPrefix", "/", svc)],
        ));
    }
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn mesh_request_reaches_the_inbound_listener_over_mtls_as_the_edge() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let pod_ip = IpAddr::V4(net.ip(11));
    let direct_ip = IpAddr::V4(net.ip(12));
    let edge_files = write_svid(env.dir.path(), "edge", &ca.svid(EDGE_ID, "edge-1")?, &ca)?;

    let mut m = gateway_and_routes(
        net,
        &[
            ("mesh.example", "svc"),
            ("direct.example", "svc-direct"),
            ("unknown.example", "svc-unknown"),
        ],
    );
    m.push_str(&pod("default", "pod-a", "app"));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(pod_ip, Some("pod-a"))],
        &[],
    ));
    m.push_str(&mesh_backend(
        "default",
        "svc-direct",
        ECHO_PORT,
        &[(direct_ip, None)],
        &[("aether.io/mesh", "disabled")],
    ));
    m.push_str(&mesh_backend(
        "default",
        "svc-unknown",
        ECHO_PORT,
        &[(pod_ip, None)],
        &[],
    ));
    env.write_manifest("mesh.yaml", &m)?;

    let _pod = env.spawn_app_pod(pod_ip, "pod-a", &ca).await?;
    let _direct = env
        .spawn_echo(SocketAddr::new(direct_ip, ECHO_PORT), "direct")
        .await?;
    let _edge = env
        .spawn_serving_mesh_edge(&file_flags(&edge_files))
        .await?;

    // A client-supplied XFCC must not survive: only the inbound listener sets one.
    let direct_workload = SocketAddr::new(direct_ip, ECHO_PORT).to_string();
    let mut c = H1Conn::connect(net.client_ip(), net.gw()).await?;
    let r = c
        .send(
            "GET",
            "mesh.example",
            "/hello?x=1",
            &[
                (
                    "x-forwarded-client-cert",
                    "URI=spiffe://mesh.test/ns/kube-system/sa/admin",
                ),
                // A client may not pick the workload port behind the inbound listener.
                ("x-envoy-original-dst-host", &direct_workload),
            ],
        )
        .await?;
    let e = r.echo()?;
    ensure!(e.name() == "pod-a", "reached {}", e.0);
    ensure!(e.host() == "mesh.example", "host {:?}", e.host());
    ensure!(e.path() == "/hello?x=1", "path {:?}", e.path());
    let xfcc = e.header("x-forwarded-client-cert").unwrap_or_default();
    ensure!(
        xfcc.contains(&format!("URI={EDGE_ID}")),
        "XFCC {xfcc:?} does not name the edge: {}",
        e.0
    );
    ensure!(
        xfcc.contains("CN=edge-1"),
        "XFCC {xfcc:?} lacks the edge SVID's subject"
    );
    ensure!(
        !xfcc.contains("kube-system"),
        "the client's XFCC leaked through: {xfcc:?}"
    );
    let client = net.client_ip().to_string();
    ensure!(
        e.header("x-forwarded-for")
            .is_some_and(|v| v.starts_with(&client)),
        "x-forwarded-for: {}",
        e.0
    );
    ensure!(
        e.header("x-forwarded-proto") == Some("http"),
        "x-forwarded-proto: {}",
        e.0
    );

    // The opted-out Service is reached directly: no inbound listener, no XFCC.
    let e = c
        .send(
            "GET",
            "direct.example",
            "/",
            &[("x-envoy-original-dst-host", "10.0.0.1:22")],
        )
        .await?
        .echo()?;
    ensure!(e.name() == "direct", "reached {}", e.0);
    ensure!(
        e.header("x-envoy-original-dst-host").is_none(),
        "a client's x-envoy-original-dst-host crossed the edge: {}",
        e.0
    );
    ensure!(
        e.header("x-forwarded-client-cert").is_none(),
        "XFCC on a direct request: {}",
        e.0
    );

    // An endpoint with no known pod identity is refused, not trusted.
    let before = env.echo_requests("pod-a")?.len();
    let r = env.h1(net.gw(), "unknown.example", "/").await?;
    ensure!(
        r.status == StatusCode::BAD_GATEWAY,
        "unknown identity answered {}",
        r.status
    );
    ensure!(
        env.echo_requests("pod-a")?.len() == before,
        "an unverified endpoint got the request"
    );
    ensure!(
        metric(net, "aether_mesh_peer_identity_unknown_total").await? >= 1.0,
        "unknown identity not counted"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn mesh_peer_with_the_wrong_spiffe_id_is_refused_and_counted() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let other_ca = SpiffeCa::new()?;
    let pod_ip = IpAddr::V4(net.ip(11));
    let foreign_ip = IpAddr::V4(net.ip(12));
    let edge_files = write_svid(env.dir.path(), "edge", &ca.svid(EDGE_ID, "edge-1")?, &ca)?;
    let mut m = gateway_and_routes(
        net,
        &[("mesh.example", "svc"), ("foreign.example", "svc-foreign")],
    );
    m.push_str(&pod("default", "pod-a", "app"));
    m.push_str(&pod("default", "pod-f", "app"));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(pod_ip, Some("pod-a"))],
        &[],
    ));
    m.push_str(&mesh_backend(
        "default",
        "svc-foreign",
        ECHO_PORT,
        &[(foreign_ip, Some("pod-f"))],
        &[],
    ));
    env.write_manifest("mesh.yaml", &m)?;
    let _echo = env
        .spawn_echo(SocketAddr::new(pod_ip, ECHO_PORT), "pod-a")
        .await?;
    let _echo_f = env
        .spawn_echo(SocketAddr::new(foreign_ip, ECHO_PORT), "pod-f")
        .await?;
    // The pod's listener presents another service account's SVID...
    let _inbound = env
        .spawn_inbound(
            pod_ip,
            &ca.svid(&spiffe_id("default", "other"), "other")?,
            &ca,
            EDGE_ID,
        )
        .await?;
    // ...and this one the right ID, but from another trust domain's CA.
    let _foreign = env
        .spawn_inbound(
            foreign_ip,
            &other_ca.svid(&spiffe_id("default", "app"), "forged")?,
            &ca,
            EDGE_ID,
        )
        .await?;
    let edge = env
        .spawn_serving_mesh_edge(&file_flags(&edge_files))
        .await?;

    let seen = |name: &str| env.echo_requests(name).map(|r| r.len());
    let before = (seen("pod-a")?, seen("pod-f")?);
    for host in ["mesh.example", "foreign.example"] {
        let r = env.h1(net.gw(), host, "/").await?;
        ensure!(
            r.status == StatusCode::BAD_GATEWAY,
            "{host}: wrong peer answered {}: {}",
            r.status,
            r.text()
        );
    }
    ensure!(
        (seen("pod-a")?, seen("pod-f")?) == before,
        "a refused peer got the request"
    );
    ensure!(
        metric(net, "aether_mesh_peer_identity_mismatch_total").await? >= 1.0,
        "mismatch not counted"
    );
    ensure!(
        edge.log().contains("mesh peer identity refused"),
        "no log line for the mismatch"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn mesh_never_sends_plaintext_to_the_inbound_port() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let pod_ip = IpAddr::V4(net.ip(11));
    let edge_files = write_svid(env.dir.path(), "edge", &ca.svid(EDGE_ID, "edge-1")?, &ca)?;
    let mut m = gateway_and_routes(net, &[("mesh.example", "svc")]);
    m.push_str(&pod("default", "pod-a", "app"));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(pod_ip, Some("pod-a"))],
        &[],
    ));
    env.write_manifest("mesh.yaml", &m)?;
    // Not Envoy: a socket that records the first bytes anyone sends to 15008.
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(pod_ip, MESH_PORT)).await?;
    let first = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut buf)).await??;
        Ok::<Vec<u8>, BoxError>(buf[..n].to_vec())
    });
    let _edge = env
        .spawn_serving_mesh_edge(&file_flags(&edge_files))
        .await?;
    let r = env.h1(net.gw(), "mesh.example", "/secret").await?;
    ensure!(
        r.status.is_server_error(),
        "a peer that never finished TLS answered {}",
        r.status
    );
    let bytes = first.await??;
    // 0x16 0x03: a TLS handshake record (ClientHello), not "PRI * HTTP/2" or "GET".
    ensure!(
        bytes.len() >= 2 && bytes[0] == 0x16 && bytes[1] == 0x03,
        "first bytes to 15008 were {bytes:?}"
    );
    ensure!(
        !String::from_utf8_lossy(&bytes).contains("PRI")
            && !String::from_utf8_lossy(&bytes).contains("GET"),
        "plaintext: {bytes:?}"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn mesh_mode_is_not_ready_until_it_holds_an_svid() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let mut m = gateway_and_routes(net, &[("mesh.example", "svc")]);
    m.push_str(&pod("default", "pod-a", "app"));
    let pod_ip = IpAddr::V4(net.ip(11));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(pod_ip, Some("pod-a"))],
        &[],
    ));
    env.write_manifest("mesh.yaml", &m)?;
    let dir = env.dir.path().join("svid");
    std::fs::create_dir_all(&dir)?;
    let paths = [
        dir.join("edge.crt"),
        dir.join("edge.key"),
        dir.join("bundle.pem"),
    ];
    let mut edge = env.spawn_mesh_edge("edge", &file_flags(&paths))?;
    // The files don't exist yet: the process runs, but is not ready.
    eventually("admin /readyz answers 503", EVENTUALLY, || async {
        let r = admin_get(net, "/readyz").await?;
        ensure!(
            r.status == StatusCode::SERVICE_UNAVAILABLE && r.text().contains("SVID"),
            "/readyz: {} {}",
            r.status,
            r.text()
        );
        Ok(())
    })
    .await?;
    edge.check_alive()?;
    // An expired SVID is no identity either.
    write_svid(&dir, "edge", &ca.svid_valid(EDGE_ID, "old", false)?, &ca)?;
    eventually("the expired SVID is loaded", EVENTUALLY, || async {
        ensure!(
            metric(net, "aether_mesh_svid_updates_total").await? >= 1.0,
            "not loaded yet"
        );
        Ok(())
    })
    .await?;
    let r = admin_get(net, "/readyz").await?;
    ensure!(
        r.status == StatusCode::SERVICE_UNAVAILABLE,
        "ready with an expired SVID: {}",
        r.status
    );
    // Nor does it serve mesh traffic with it: the listener answers, the request is 503
    // before any connection to the pod.
    let r = eventually("the listener answers", EVENTUALLY, || {
        env.h1(net.gw(), "mesh.example", "/")
    })
    .await?;
    ensure!(
        r.status == StatusCode::SERVICE_UNAVAILABLE,
        "expired SVID, mesh request answered {}",
        r.status
    );
    ensure!(
        metric(net, "aether_mesh_svid_expiry_seconds").await? < 0.0,
        "expiry gauge not negative"
    );
    // Broken PEM keeps what is held (nothing usable here) and is counted.
    std::fs::write(
        dir.join("edge.crt"),
        "-----BEGIN CERTIFICATE-----\ngarbage\n",
    )?;
    eventually("the broken SVID file is counted", EVENTUALLY, || async {
        ensure!(
            metric(net, "aether_mesh_identity_source_errors_total").await? >= 1.0,
            "not counted"
        );
        Ok(())
    })
    .await?;
    write_svid(&dir, "edge", &ca.svid(EDGE_ID, "edge-1")?, &ca)?;
    env.wait_ready(&mut edge).await?;
    let expiry = metric(net, "aether_mesh_svid_expiry_seconds").await?;
    ensure!(
        expiry > 3600.0,
        "aether_mesh_svid_expiry_seconds is {expiry}"
    );
    env.pass()
}
