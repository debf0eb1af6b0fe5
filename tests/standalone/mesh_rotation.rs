//! Mesh mode with the SPIFFE Workload API as identity source: a test server speaking
//! the real workload.proto on a Unix socket hands out SVIDs and rotates them; a real
//! Envoy at pod_ip:15008 reports (in XFCC) which SVID each request came with.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use aether_test_workload_api::WorkloadApi;
use http::StatusCode;

use crate::common::*;

fn manifests(net: Net, pod_ip: IpAddr) -> String {
    let mut m = edge_gateway(net);
    m.push_str(&route(
        "default",
        "r",
        "edge",
        &["mesh.example"],
        &[("PathPrefix", "/", "svc")],
    ));
    m.push_str(&pod("default", "pod-a", "app"));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(pod_ip, Some("pod-a"))],
        &[],
    ));
    m
}

fn socket_flags(socket: &Path) -> Vec<String> {
    vec![
        "--spiffe-socket".to_owned(),
        format!("unix://{}", socket.display()),
    ]
}

/// The subject CN of the SVID the inbound listener saw, from Envoy's XFCC.
fn xfcc_cn(e: &Echo) -> String {
    let xfcc = e.header("x-forwarded-client-cert").unwrap_or_default();
    xfcc.split(';')
        .find_map(|kv| {
            kv.strip_prefix("Subject=\"CN=")
                .map(|v| v.trim_end_matches('"').to_owned())
        })
        .unwrap_or_else(|| format!("<no subject in {xfcc:?}>"))
}

#[tokio::test(flavor = "multi_thread")]
async fn mesh_svid_rotation_under_load_drops_no_request_and_new_connections_use_the_new_svid()
-> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let pod_ip = IpAddr::V4(net.ip(11));
    env.write_manifest("mesh.yaml", &manifests(net, pod_ip))?;
    let socket = env.dir.path().join("agent.sock");
    let api = WorkloadApi::serve(&socket)?;
    api.rotate(ca.svid(EDGE_ID, "edge-1")?.wire(EDGE_ID, &ca));
    let (_echo, inbound) = env.spawn_app_pod(pod_ip, "pod-a", &ca).await?;
    let _edge = env.spawn_serving_mesh_edge(&socket_flags(&socket)).await?;

    // 4 clients, each 150 requests in sequence on one keep-alive connection (bounded),
    // each held 5 ms at the backend so some are always in flight; the SVID rotates
    // while they run.
    let mut workers = Vec::new();
    for _ in 0..4 {
        let mut c = H1Conn::connect(net.client_ip(), net.gw()).await?;
        workers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..150 {
                let r = c
                    .send("GET", "mesh.example", "/", &[("x-echo-delay-ms", "5")])
                    .await?;
                seen.push(
                    r.echo()
                        .map(|e| xfcc_cn(&e))
                        .unwrap_or_else(|e| format!("FAILED {e}")),
                );
            }
            Ok::<_, BoxError>(seen)
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    api.rotate(ca.svid(EDGE_ID, "edge-2")?.wire(EDGE_ID, &ca));
    let mut all = Vec::new();
    for w in workers {
        all.push(w.await??);
    }
    let failed: Vec<&String> = all
        .iter()
        .flatten()
        .filter(|s| s.starts_with("FAILED") || s.starts_with('<'))
        .collect();
    ensure!(
        failed.is_empty(),
        "{} requests failed during rotation, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    let first = all.iter().flatten().filter(|s| *s == "edge-1").count();
    let second = all.iter().flatten().filter(|s| *s == "edge-2").count();
    ensure!(
        first > 0 && second > 0,
        "edge-1: {first}, edge-2: {second}: the rotation did not fall inside the loop"
    );
    // Once rotated, every client's last requests go out with the new SVID.
    for seen in &all {
        ensure!(
            seen.iter().rev().take(20).all(|s| s == "edge-2"),
            "requests after rotation still used the old SVID: {:?}",
            &seen[seen.len() - 20..]
        );
    }
    let conns = inbound
        .stat("http.inbound.downstream_cx_total", net)
        .await?;
    ensure!(
        conns >= 2,
        "the inbound listener saw {conns} connections: the new SVID needs a new one"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn mesh_workload_api_absent_then_gone_keeps_the_current_svid_and_picks_up_the_next()
-> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let pod_ip = IpAddr::V4(net.ip(11));
    env.write_manifest("mesh.yaml", &manifests(net, pod_ip))?;
    let socket = env.dir.path().join("agent.sock");
    let (_echo, _inbound) = env.spawn_app_pod(pod_ip, "pod-a", &ca).await?;

    // No agent socket yet: the edge runs, but is not ready and says why.
    let mut edge = env.spawn_mesh_edge("edge", &socket_flags(&socket))?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    edge.check_alive()?;
    let r = admin_get(net, "/readyz").await?;
    ensure!(
        r.status == StatusCode::SERVICE_UNAVAILABLE,
        "ready without an SVID: {}",
        r.status
    );

    let api = WorkloadApi::serve(&socket)?;
    api.rotate(ca.svid(EDGE_ID, "edge-1")?.wire(EDGE_ID, &ca));
    env.wait_ready(&mut edge).await?;
    env.wait_listener(net.gw()).await?;
    let e = env.h1(net.gw(), "mesh.example", "/").await?.echo()?;
    ensure!(xfcc_cn(&e) == "edge-1", "XFCC: {}", e.0);

    // The agent streams garbage: refused, logged, counted; the current SVID stays.
    api.rotate(aether_test_workload_api::SvidDer {
        spiffe_id: EDGE_ID.to_owned(),
        chain: b"not a certificate".to_vec(),
        key: b"not a key".to_vec(),
        bundle: ca.der.to_vec(),
    });
    eventually("the garbage update is counted", EVENTUALLY, || async {
        ensure!(
            metric(net, "aether_mesh_identity_source_errors_total").await? >= 1.0,
            "not counted"
        );
        Ok(())
    })
    .await?;
    let e = env.h1(net.gw(), "mesh.example", "/").await?.echo()?;
    ensure!(xfcc_cn(&e) == "edge-1", "XFCC after garbage: {}", e.0);
    let errors_before = metric(net, "aether_mesh_identity_source_errors_total").await?;
    let logged_before = edge.log().matches("SPIFFE Workload API error").count();

    // The agent goes away: the current SVID keeps serving.
    drop(api);
    std::fs::remove_file(&socket)?;
    for _ in 0..10 {
        let e = env.h1(net.gw(), "mesh.example", "/").await?.echo()?;
        ensure!(xfcc_cn(&e) == "edge-1", "XFCC: {}", e.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        admin_get(net, "/readyz").await?.status == StatusCode::OK,
        "not ready with a valid SVID held"
    );
    ensure!(
        edge.log().matches("SPIFFE Workload API error").count() > logged_before,
        "the agent's absence was not logged"
    );
    ensure!(
        metric(net, "aether_mesh_identity_source_errors_total").await? > errors_before,
        "the agent's absence was not counted"
    );

    // It comes back with a new SVID: the edge reconnects and uses it.
    let api = WorkloadApi::serve(&socket)?;
    api.rotate(ca.svid(EDGE_ID, "edge-2")?.wire(EDGE_ID, &ca));
    eventually(
        "requests carry the new SVID",
        Duration::from_secs(30),
        || async {
            let e = env.h1(net.gw(), "mesh.example", "/").await?.echo()?;
            ensure!(xfcc_cn(&e) == "edge-2", "XFCC subject {}", xfcc_cn(&e));
            Ok(())
        },
    )
    .await?;
    env.pass()
}
