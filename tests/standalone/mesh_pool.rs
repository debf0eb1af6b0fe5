//! Mesh-mode pooling seen from the pod's inbound listener: many concurrent requests,
//! few connections.

use std::net::IpAddr;

use http::StatusCode;

use crate::common::*;
use crate::mesh::gateway_and_routes;

#[tokio::test(flavor = "multi_thread")]
async fn mesh_200_concurrent_requests_to_one_pod_use_a_handful_of_connections() -> TestResult {
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
    // The inbound listener allows 100 streams per connection.
    let (_echo, inbound) = env.spawn_app_pod(pod_ip, "pod-a", &ca).await?;
    let _edge = env
        .spawn_serving_mesh_edge(&file_flags(&edge_files))
        .await?;

    // 200 requests in flight at once (each held 500 ms at the backend), from 4 client
    // connections of 50 streams.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let conn = H2Conn::connect(net.client_ip(), net.gw()).await?;
        for _ in 0..50 {
            let mut c = conn.clone();
            tasks.push(tokio::spawn(async move {
                c.send("GET", "mesh.example", "/", &[("x-echo-delay-ms", "500")])
                    .await
            }));
        }
    }
    let mut ok = 0;
    for t in tasks {
        if t.await?
            .map(|r| r.status == StatusCode::OK)
            .unwrap_or(false)
        {
            ok += 1;
        }
    }
    ensure!(ok == 200, "{ok}/200 succeeded");
    let conns = inbound
        .stat("http.inbound.downstream_cx_total", net)
        .await?;
    // 200 streams at 100 per connection: 2, and a spare at most from timing.
    ensure!(
        (2..=4).contains(&conns),
        "the inbound listener saw {conns} connections"
    );
    env.pass()
}
