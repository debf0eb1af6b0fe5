//! `--per-gateway-addressing=false` against the real API server: no Service per
//! Gateway, every Gateway reports the edge Service's load-balancer address, two
//! Gateways share a listener port told apart by hostname, and a (port, hostname) the
//! older Gateway holds is Conflicted on the newer one.

use std::net::SocketAddr;

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{
    Edge, Net, Wait, apply, class_and_namespaces, eventually_some, get, listener_condition, m, put,
};

/// Unusual, so binding it clashes with nothing else.
const PORT: u16 = 47281;

async fn gateway(client: &Client, ns: &str, name: &str, listeners: serde_json::Value) {
    let gw = m::Gateway::test(name)
        .namespace(ns)
        .spec("listeners", listeners);
    put::<Gateway>(client, &gw).await;
}

async fn redirect_route(client: &Client, ns: &str, gateway: &str, to: &str) {
    let route = m::HttpRoute::test("redirect")
        .namespace(ns)
        .parent_ref(json!({"name": gateway, "sectionName": "web"}))
        .redirect(to, 302);
    put::<HttpRoute>(client, &route).await;
}

/// (status, reason) of condition `ctype` on listener `listener` of the Gateway.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_addressing_reports_the_edge_address_and_demuxes_by_hostname() -> Result<(), BoxError>
{
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["one", "two"]).await;
    // The edge's own Service, as the chart creates it, with its load-balancer address
    // (what MetalLB or a cloud would write).
    let services = Api::<Service>::namespaced(client.clone(), "aether-system");
    apply(
        &services,
        "aether-edge",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "aether-edge", "namespace": "aether-system"},
               "spec": {"type": "LoadBalancer", "selector": {"app": "aether-edge"},
                        "ports": [{"name": "web", "port": PORT}]}}),
    )
    .await;
    services
        .patch_status(
            "aether-edge",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.50"}]}}})),
        )
        .await?;
    gateway(
        &client,
        "one",
        "a",
        json!([{"name": "web", "port": PORT, "protocol": "HTTP", "hostname": "a.example.com"}]),
    )
    .await;
    // One second later, so `b` is the newer Gateway by creationTimestamp too.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    gateway(
        &client,
        "two",
        "b",
        json!([{"name": "web", "port": PORT, "protocol": "HTTP", "hostname": "b.example.com"},
               {"name": "dup", "port": PORT, "protocol": "HTTP", "hostname": "a.example.com"}]),
    )
    .await;
    redirect_route(&client, "one", "a", "moved-a.example.com").await;
    redirect_route(&client, "two", "b", "moved-b.example.com").await;
    let listen = Net::allocate().ip(1);
    let _edge = Edge::new(&cluster, &listen.to_string(), "shared")
        .args(&["--per-gateway-addressing=false"])
        .start();

    for (ns, name) in [("one", "a"), ("two", "b")] {
        let api = Api::<Gateway>::namespaced(client.clone(), ns);
        eventually_some(
            &format!("{ns}/{name} reports the edge address"),
            Wait::API,
            || async {
                let gw = api.get(name).await.ok()?;
                let addrs = gw.status.as_ref()?.addresses.clone()?;
                let programmed = gw
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Programmed" && c.status == "True");
                (addrs.len() == 1 && addrs[0].value == "192.0.2.50" && programmed).then_some(())
            },
        )
        .await?;
    }
    let b = Api::<Gateway>::namespaced(client.clone(), "two");
    eventually_some("b's dup listener is Conflicted", Wait::API, || async {
        let gw = b.get("b").await.ok()?;
        let (status, reason, _) = listener_condition(&gw, "dup", "Conflicted")?;
        ((status, reason) == ("True".to_owned(), "HostnameConflict".to_owned())
            && listener_condition(&gw, "web", "Programmed")?.0 == "True")
            .then_some(())
    })
    .await?;

    // One socket, both Gateways' routes, by hostname.
    let addr = SocketAddr::from((listen, PORT));
    for (host, to) in [
        ("a.example.com", "moved-a.example.com"),
        ("b.example.com", "moved-b.example.com"),
    ] {
        let answer = eventually_some(&format!("{host} is served"), Wait::API, || async {
            get(addr, host).await.ok().filter(|r| r.status == 302)
        })
        .await?;
        assert!(
            answer
                .header("location")
                .is_some_and(|l| l.starts_with(&format!("http://{to}:{PORT}/hello"))),
            "{host}: {answer:?}"
        );
    }
    let other = get(addr, "c.example.com").await?;
    assert_eq!(other.status, 404, "{other:?}");

    // No Gateway got a Service of its own.
    let managed = Api::<Service>::all(client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=aether-edge"))
        .await?;
    assert!(
        managed.items.is_empty(),
        "per-Gateway Services were created: {:?}",
        managed
            .items
            .iter()
            .map(|s| &s.metadata.name)
            .collect::<Vec<_>>()
    );
    cluster.pass()
}
