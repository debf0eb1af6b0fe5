//! Endpoint churn for Services no route names does not reconcile: the edge stores the
//! slices and counts them as ignored, its configuration generation stays put; a slice
//! of a Service a route names is reconciled and served at once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{
    Edge, Net, Wait, admin_get, apply, class_and_namespaces, edge_pods, eventually_some, free_port,
    m, put,
};
use aether_test_support::metric;

async fn slice(client: &Client, service: &str, ip: &str) {
    let name = format!("{service}-abcde");
    apply(
        &Api::<EndpointSlice>::namespaced(client.clone(), "churn"),
        &name,
        json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "churn",
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .await;
}

/// Reconciles until the count of config reloads has not moved for a while: our own
/// writes (Service, slices, status) come back as watch events and reconcile too.
pub(crate) async fn quiet_reloads(admin: SocketAddr) -> f64 {
    let mut last = -1.0;
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = metric(admin, "aether_config_reloads_total")
            .await
            .ok()
            .unwrap_or(-1.0);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > Duration::from_millis(1500) {
            return now;
        }
        assert!(Instant::now() < deadline, "reloads never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_of_unrelated_endpoints_does_not_reconcile() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["churn"]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;
    for svc in ["echo", "unrelated"] {
        apply(
            &Api::<Service>::namespaced(client.clone(), "churn"),
            svc,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": svc, "namespace": "churn"},
                   "spec": {"ports": [{"name": "http", "port": 8080}]}}),
        )
        .await;
    }
    crate::http_gateway(&client, "churn").await;
    let route = m::HttpRoute::test("echo")
        .namespace("churn")
        .parent("gw")
        .backend("echo", 8080);
    put::<HttpRoute>(&client, &route).await;
    let port = free_port();
    let admin = SocketAddr::from(([127, 0, 0, 1], port));
    let listen = Net::allocate().ip_str(1);
    let _edge = Edge::new(&cluster, &listen, "churn").admin(port).start();
    let routes = Api::<HttpRoute>::namespaced(client.clone(), "churn");
    eventually_some("the route's status", Wait::API, || async {
        let r = routes.get("echo").await.ok()?;
        (!r.status?.parents.is_empty()).then_some(())
    })
    .await?;

    let reloads = quiet_reloads(admin).await;
    let ignored = metric(admin, "aether_endpoint_events_ignored_total")
        .await
        .ok()
        .unwrap_or(0.0);
    for i in 0..20 {
        slice(&client, "unrelated", &format!("10.2.0.{}", i + 1)).await;
    }
    eventually_some("20 ignored endpoint events", Wait::API, || async {
        let now = metric(admin, "aether_endpoint_events_ignored_total")
            .await
            .ok()?;
        (now - ignored >= 20.0).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        metric(admin, "aether_config_reloads_total").await.ok(),
        Some(reloads),
        "a slice of a Service no route names reconciled"
    );

    // The route's own Service: reconciled, and its endpoint is in the served config.
    slice(&client, "echo", "10.2.1.1").await;
    eventually_some("the new endpoint in /config_dump", Wait::API, || async {
        admin_get(admin, "/config_dump")
            .await
            .ok()?
            .text()
            .contains("10.2.1.1:8080")
            .then_some(())
    })
    .await?;
    assert!(metric(admin, "aether_config_reloads_total").await.ok() > Some(reloads));
    cluster.pass()
}
