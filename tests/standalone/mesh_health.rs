//! Mesh mode when a pod dies under load: connects that fail before the request was
//! sent are retried on another endpoint, and passive health ejects the dead one.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn mesh_endpoint_killed_under_load_costs_under_a_thousandth_of_requests() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let (a, b) = (IpAddr::V4(net.ip(11)), IpAddr::V4(net.ip(12)));
    let edge_files = write_svid(env.dir.path(), "edge", &ca.svid(EDGE_ID, "edge-1")?, &ca)?;
    let mut m = edge_gateway(net);
    m.push_str(&route(
        "default",
        "r",
        "edge",
        &["mesh.example"],
        &[("PathPrefix", "/", "svc")],
    ));
    m.push_str(&pod("default", "pod-a", "app"));
    m.push_str(&pod("default", "pod-b", "app"));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(a, Some("pod-a")), (b, Some("pod-b"))],
        &[],
    ));
    env.write_manifest("mesh.yaml", &m)?;
    let app = ca.svid(&spiffe_id("default", "app"), "app")?;
    let _echo_a = env
        .spawn_echo(SocketAddr::new(a, ECHO_PORT), "pod-a")
        .await?;
    let echo_b = env
        .spawn_echo(SocketAddr::new(b, ECHO_PORT), "pod-b")
        .await?;
    let _inbound_a = env.spawn_inbound(a, &app, &ca, EDGE_ID).await?;
    let inbound_b = env.spawn_inbound(b, &app, &ca, EDGE_ID).await?;
    let edge = env
        .spawn_serving_mesh_edge(&file_flags(&edge_files))
        .await?;

    // 4 clients, 2000 sequential requests each (bounded); pod B dies 300 ms in.
    const PER_CLIENT: usize = 2000;
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..4 {
        let mut c = H1Conn::connect(net.client_ip(), net.gw()).await?;
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed, mut after_b) = (0usize, Vec::new(), 0usize);
            for _ in 0..PER_CLIENT {
                match c.get("mesh.example", "/").await {
                    Ok(r) if r.status == http::StatusCode::OK => {
                        ok += 1;
                        if r.echo().map(|e| e.name() == "pod-b").unwrap_or(false) {
                            after_b = ok;
                        }
                    }
                    Ok(r) => failed.push(format!("{} {}", r.status, r.text())),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed, after_b)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(inbound_b);
    drop(echo_b);
    let mut ok = 0;
    let mut failed = Vec::new();
    for w in workers {
        let (o, f, _) = w.await?;
        ok += o;
        failed.extend(f);
    }
    let total = ok + failed.len();
    eprintln!(
        "{total} requests in {:?}, {} failed: {:?}",
        started.elapsed(),
        failed.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    ensure!(total == 4 * PER_CLIENT, "{total} requests");
    ensure!(
        failed.len() * 1000 < total,
        "{} of {total} requests failed (>= 0.1%): {:?}",
        failed.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    let a_seen = env.echo_requests("pod-a")?.len();
    let b_seen = env.echo_requests("pod-b")?.len();
    ensure!(
        b_seen > 10 && a_seen > b_seen,
        "pod-a saw {a_seen}, pod-b {b_seen}: the load did not spread before the kill"
    );
    ensure!(
        edge.log().contains("endpoint ejected"),
        "the dead endpoint was not ejected"
    );
    env.pass()
}
