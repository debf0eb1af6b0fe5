//! A burst of endpoint changes on a Service a route names: a thousand EndpointSlice
//! updates against the real API server while a client keeps requesting through the
//! edge's listener. Every request must be answered, the last endpoint set must be the
//! one served, and each reconcile must compile again only the one route that names the
//! Service, not every route.
//!
//! The API server refuses loopback endpoint addresses, so the churned Service's
//! endpoints are addresses that are never dialed; the client requests a redirect route
//! on the same listener, which proves the listener serves throughout the burst.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};
use serde_json::json;

use aether_test_support::metric;

use crate::churn::quiet_reloads;
use crate::cluster::{BoxError, Cluster};
use crate::{
    Edge, Net, Wait, admin_get, apply, class_and_namespaces, edge_pods, eventually_some, free_port,
    get, m, put, service_ports,
};

const NS: &str = "burst";
/// Routes that name another Service: a full reconcile would compile them too.
const OTHER_ROUTES: usize = 20;
const UPDATES: usize = 1_000;
/// Two endpoints (never dialed); a slice names either or both.
const BACKENDS: [&str; 2] = ["10.3.0.1", "10.3.0.2"];
const PORT: u16 = 8080;

async fn echo_slice(client: &Client, addresses: &[&str]) {
    let endpoints: Vec<serde_json::Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    apply(
        &Api::<EndpointSlice>::namespaced(client.clone(), NS),
        "echo-abcde",
        json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-abcde", "namespace": NS,
                     "labels": {"kubernetes.io/service-name": "echo",
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}]}),
    )
    .await;
}

async fn route(client: &Client, name: &str, host: &str, service: &str) {
    let route = m::HttpRoute::test(name)
        .namespace(NS)
        .parent("gw")
        .hostname(host)
        .backend(service, 8080);
    put::<HttpRoute>(client, &route).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slice_updates_are_served_throughout_and_recompile_one_route()
-> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &[NS]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;

    for svc in ["echo", "other"] {
        apply(
            &Api::<Service>::namespaced(client.clone(), NS),
            svc,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": svc, "namespace": NS},
                   "spec": {"ports": [{"name": "http", "port": 8080}]}}),
        )
        .await;
    }
    echo_slice(&client, &BACKENDS).await;
    crate::http_gateway(&client, NS).await;
    route(&client, "echo", "echo.example.com", "echo").await;
    let live = m::HttpRoute::test("live")
        .namespace(NS)
        .parent("gw")
        .hostname("live.example.com")
        .redirect("moved.example.com", 302);
    put::<HttpRoute>(&client, &live).await;
    for i in 0..OTHER_ROUTES {
        route(
            &client,
            &format!("other-{i}"),
            &format!("o{i}.example.com"),
            "other",
        )
        .await;
    }

    let admin_port = free_port();
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let listen = Net::allocate().ip(1);
    let _edge = Edge::new(&cluster, &listen.to_string(), "burst")
        .admin(admin_port)
        .start();
    let (_, ports) = service_ports(&client, NS, "gw").await;
    let internal = u16::try_from(ports[0].1)?;
    let at = SocketAddr::from((listen, internal));
    eventually_some("the listener serving", Wait::API, || async {
        (get(at, "live.example.com").await.ok()?.status == 302).then_some(())
    })
    .await?;
    let reloads = quiet_reloads(admin).await;
    let compiled = metric(admin, "aether_reconcile_routes_compiled_total")
        .await
        .ok()
        .unwrap_or(0.0);

    // A client requesting through the edge for as long as the burst lasts (bounded).
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client_task = {
        let (stop, ok, failed) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failed));
        tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(180);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                match get(at, "live.example.com").await {
                    Ok(answer) if answer.status == 302 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(answer) => {
                        eprintln!("failed: {}", answer.status);
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let started = Instant::now();
    // One endpoint, the other, both, and again; the last update names the second only.
    let set = |i: usize| -> &[&str] {
        match i % 3 {
            0 => &BACKENDS[1..],
            1 => &BACKENDS[..1],
            _ => &BACKENDS,
        }
    };
    for i in 0..UPDATES {
        echo_slice(&client, set(i)).await;
    }
    assert_eq!(set(UPDATES - 1), &BACKENDS[1..]);
    eventually_some("the last endpoint set served", Wait::API, || async {
        let dump = admin_get(admin, "/config_dump").await.ok()?.text();
        let has = |ip: &str| dump.contains(&format!("{ip}:{PORT}"));
        (has(BACKENDS[1]) && !has(BACKENDS[0])).then_some(())
    })
    .await?;
    let burst = started.elapsed();
    let reloads = quiet_reloads(admin).await - reloads;
    stop.store(true, Ordering::Relaxed);
    client_task.await?;
    let compiled = metric(admin, "aether_reconcile_routes_compiled_total")
        .await
        .ok()
        .unwrap_or(0.0)
        - compiled;
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "{UPDATES} slice updates in {burst:?}: {reloads} reconciles, {compiled} routes compiled, \
         {ok} requests answered, {failed} failed"
    );
    assert_eq!(failed, 0, "requests failed during the endpoint burst");
    assert!(ok > 0, "no request was made during the burst");
    assert!(reloads >= 1.0, "the burst was never reconciled");
    // Each reconcile compiled only the route that names the churned Service; a full
    // reconcile would have compiled all 22 routes.
    assert!(
        compiled <= reloads,
        "{compiled} routes compiled in {reloads} reconciles: more than the one route per run"
    );
    cluster.pass()
}
