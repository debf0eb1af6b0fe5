//! Endpoint churn for Services no route names does not reconcile: the edge stores the
//! slices and counts them as ignored, its configuration generation stays put; a slice
//! of a Service a route names is reconciled and served at once. ConfigMaps, Secrets
//! and Namespaces nothing reads cost no route work either.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
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

/// ConfigMaps, TLS Secrets and Namespace labels that nothing in the configuration
/// reads cost no route work, and updates that leave what the edge keeps as it was
/// (other data, labels, annotations, a new resourceVersion) do not reconcile at all.
/// Kubernetes mode watches every one of these in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_nothing_reads_cost_no_route_work() -> Result<(), BoxError> {
    const NS: &str = "quiet";
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &[NS]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;
    apply(
        &Api::<Service>::namespaced(client.clone(), NS),
        "echo",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "echo", "namespace": NS},
               "spec": {"ports": [{"name": "http", "port": 8080}]}}),
    )
    .await;
    crate::http_gateway(&client, NS).await;
    const ROUTES: usize = 10;
    for i in 0..ROUTES {
        let route = m::HttpRoute::test(&format!("r{i}"))
            .namespace(NS)
            .parent("gw")
            .hostname(&format!("r{i}.example.com"))
            .backend("echo", 8080);
        put::<HttpRoute>(&client, &route).await;
    }
    let port = free_port();
    let admin = SocketAddr::from(([127, 0, 0, 1], port));
    let listen = Net::allocate().ip_str(1);
    let _edge = Edge::new(&cluster, &listen, NS).admin(port).start();
    let routes = Api::<HttpRoute>::namespaced(client.clone(), NS);
    eventually_some("every route's status", Wait::API, || async {
        let list = routes.list(&Default::default()).await.ok()?;
        let done = list
            .items
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|s| !s.parents.is_empty()));
        (done.count() == ROUTES).then_some(())
    })
    .await?;
    let counter = |name: &'static str| async move { metric(admin, name).await.ok().unwrap_or(0.0) };
    let reloads = quiet_reloads(admin).await;
    let compiled = counter("aether_reconcile_routes_compiled_total").await;
    let attached = counter("aether_reconcile_routes_attached_total").await;

    // New objects nothing names: the Store changes, so they reconcile, but no route is
    // compiled or attached again.
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), NS);
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    let namespaces = Api::<Namespace>::all(client.clone());
    let config_map = |other: usize| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "bundle", "namespace": NS},
               "data": {"ca.crt": "not read by anything", "other": other.to_string()}})
    };
    let secret = |label: usize| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "unnamed", "namespace": NS,
                            "labels": {"v": label.to_string()}},
               "data": {"tls.crt": "bm90IHJlYWQ=", "tls.key": "bm90IHJlYWQ="}})
    };
    let namespace = |annotation: usize| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": NS, "labels": {"team": "quiet"},
                            "annotations": {"v": annotation.to_string()}}})
    };
    apply(&config_maps, "bundle", config_map(0)).await;
    apply(&secrets, "unnamed", secret(0)).await;
    apply(&namespaces, NS, namespace(0)).await;
    eventually_some("the new objects reconciled", Wait::API, || async {
        (metric(admin, "aether_config_reloads_total").await.ok()? > reloads).then_some(())
    })
    .await?;
    let reloads = quiet_reloads(admin).await;
    assert_eq!(
        counter("aether_reconcile_routes_compiled_total").await,
        compiled,
        "routes compiled for objects nothing names"
    );
    assert_eq!(
        counter("aether_reconcile_routes_attached_total").await,
        attached,
        "routes attached for objects nothing names"
    );

    // Updates of what the edge does not keep: counted as unchanged, never reconciled.
    let unchanged = counter("aether_watch_events_unchanged_total").await;
    const UPDATES: usize = 5;
    for i in 1..=UPDATES {
        apply(&config_maps, "bundle", config_map(i)).await;
        apply(&secrets, "unnamed", secret(i)).await;
        apply(&namespaces, NS, namespace(i)).await;
    }
    eventually_some("every update seen", Wait::API, || async {
        let now = metric(admin, "aether_watch_events_unchanged_total")
            .await
            .ok()?;
        (now - unchanged >= (3 * UPDATES) as f64).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        metric(admin, "aether_config_reloads_total").await.ok(),
        Some(reloads),
        "an update of nothing the edge keeps reconciled"
    );
    cluster.pass()
}
