//! ListenerSets in Kubernetes mode: watched, their listeners exposed on the parent
//! Gateway's Service and bound, routes on them served, and status written to the
//! ListenerSet, the route and the Gateway.

use std::net::SocketAddr;

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use gateway_api::listenersets::ListenerSet;
use kube::Api;
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, apply, edge, eventually_some, get, m, put, service_ports};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listenersets_get_service_ports_traffic_and_status() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &["lsk"]).await;
    let gw = m::Gateway::test("gw")
        .namespace("lsk")
        .spec("allowedListeners", json!({"namespaces": {"from": "Same"}}))
        .http("http", 80);
    put::<Gateway>(&client, &gw).await;
    apply(
        &Api::<ListenerSet>::namespaced(client.clone(), "lsk"),
        "extra",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
               "metadata": {"name": "extra", "namespace": "lsk"},
               "spec": {"parentRef": {"name": "gw"},
                        "listeners": [{"name": "extra", "port": 8081, "protocol": "HTTP",
                                       "hostname": "extra.example.com"}]}}),
    )
    .await;
    // Answered at the edge: the API server refuses loopback endpoints.
    let route = m::HttpRoute::test("on-set")
        .namespace("lsk")
        .parent_ref(
            json!({"group": "gateway.networking.k8s.io", "kind": "ListenerSet",
                           "name": "extra"}),
        )
        .redirect("moved.example.com", 302);
    put::<HttpRoute>(&client, &route).await;
    let listen = Net::allocate().ip(1);
    let _edge = edge(&cluster, &listen.to_string(), "listenerset");

    // The Gateway's Service exposes the ListenerSet's port, at an internal port the
    // edge binds and serves the ListenerSet's route on.
    let (_, ports) = eventually_some(
        "the Service with the ListenerSet's port",
        Wait::API,
        || async {
            let (svc, ports) = service_ports(&client, "lsk", "gw").await;
            (ports.len() == 2).then_some((svc, ports))
        },
    )
    .await?;
    let mut listener_ports: Vec<i32> = ports.iter().map(|p| p.0).collect();
    listener_ports.sort_unstable();
    assert_eq!(listener_ports, vec![80, 8081]);
    let internal = ports
        .iter()
        .find(|p| p.0 == 8081)
        .map(|p| p.1)
        .ok_or("no 8081")?;
    let addr = SocketAddr::from((listen, u16::try_from(internal)?));
    let answer = eventually_some("the ListenerSet's route answers", Wait::API, || async {
        let r = get(addr, "extra.example.com").await.ok()?;
        (r.status == 302).then_some(r)
    })
    .await?;
    assert!(
        answer
            .header("location")
            .is_some_and(|l| l.starts_with("http://moved.example.com")),
        "{answer:?}"
    );

    // Status on all three objects.
    let sets = Api::<ListenerSet>::namespaced(client.clone(), "lsk");
    eventually_some("the ListenerSet's status", Wait::API, || async {
        let ls = sets.get("extra").await.ok()?;
        let st = ls.status?;
        let ok = |t: &str| {
            st.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == t && c.status == "True")
        };
        let l = st.listeners?.into_iter().find(|l| l.name == "extra")?;
        (ok("Accepted") && ok("Programmed") && l.attached_routes == 1).then_some(())
    })
    .await?;
    let routes = Api::<HttpRoute>::namespaced(client.clone(), "lsk");
    eventually_some("the route's ListenerSet parent", Wait::API, || async {
        let r = routes.get("on-set").await.ok()?;
        let p = r.status?.parents.into_iter().next()?;
        (p.parent_ref.kind.as_deref() == Some("ListenerSet")
            && p.conditions
                .iter()
                .any(|c| c.type_ == "Accepted" && c.status == "True"))
        .then_some(())
    })
    .await?;
    let gateways = Api::<Gateway>::namespaced(client.clone(), "lsk");
    eventually_some("the Gateway's attachedListenerSets", Wait::API, || async {
        let g = gateways.get("gw").await.ok()?;
        let st = g.status?;
        (st.attached_listener_sets == Some(1)
            && st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "AttachedListenerSets" && c.reason == "ListenerSetsAttached"))
        .then_some(())
    })
    .await?;
    cluster.pass()
}
