//! A measurement, run on demand: the edge's memory with many HTTPRoutes from a real API
//! server, in the shape a cluster delivers them: created as client-side `kubectl
//! apply` creates them (with its last-applied copy in an annotation), with the
//! server's `managedFields`, and with the status the edge writes. It prints the
//! edge's resident set; figures go in benches/RESULTS.md.
//!
//! `SCALE_ROUTES=2000 cargo test --locked --test kubernetes -- --ignored
//! memory_with_routes_from_a_cluster --nocapture`

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use crate::churn::quiet_reloads;
use crate::cluster::{BoxError, Cluster};
use crate::{Edge, Net, apply, class_and_namespaces, edge_pods, free_port};

/// The body client-side `kubectl apply` sends: the object, and itself as the
/// last-applied annotation.
fn route(i: usize) -> serde_json::Value {
    let mut body = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": format!("r{i}"), "namespace": "scale"},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "hostnames": [format!("h{}.example.com", i % 1000)],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": format!("/r{i}")}}],
                "backendRefs": [{"name": "echo", "port": 8080}]
            }]
        }
    });
    let applied = body.to_string();
    body["metadata"]["annotations"] =
        json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
    body
}

/// `VmRSS` and `RssAnon` of `pid`, in KiB.
fn resident_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.trim().trim_end_matches("kB").trim().parse().ok()
    };
    Some((field("VmRSS:")?, field("RssAnon:")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run on demand (see the module's comment)"]
async fn memory_with_routes_from_a_cluster() -> Result<(), BoxError> {
    let count: usize = std::env::var("SCALE_ROUTES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["scale"]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;
    apply(
        &Api::<Service>::namespaced(client.clone(), "scale"),
        "echo",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "echo", "namespace": "scale"},
               "spec": {"ports": [{"name": "http", "port": 8080}]}}),
    )
    .await;
    crate::http_gateway(&client, "scale").await;
    let port = free_port();
    let admin = SocketAddr::from(([127, 0, 0, 1], port));
    let listen = Net::allocate().ip_str(1);
    let edge = Edge::new(&cluster, &listen, "scale").admin(port).start();
    quiet_reloads(admin).await;
    let before = resident_kib(edge.pid()).ok_or("no /proc status")?;

    let routes = Api::<HttpRoute>::namespaced(client.clone(), "scale");
    let started = Instant::now();
    for i in 0..count {
        let body: HttpRoute = serde_json::from_value(route(i))?;
        routes.create(&PostParams::default(), &body).await?;
    }
    let created = started.elapsed();
    // Every route's status written (so each carries the edge's managedFields too).
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = routes.list(&ListParams::default()).await?;
        let with_status = list
            .items
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|s| !s.parents.is_empty()))
            .count();
        if with_status == count {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{with_status} of {count} routes have a status after 10 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    quiet_reloads(admin).await;
    let after = resident_kib(edge.pid()).ok_or("no /proc status")?;
    println!(
        "{count} routes (created in {created:?}, statuses in {:?}): VmRSS {} -> {} KiB, \
         RssAnon {} -> {} KiB",
        started.elapsed(),
        before.0,
        after.0,
        before.1,
        after.1
    );
    cluster.pass()
}
