//! L4 routes in Kubernetes mode: TCPRoutes are watched and get status; a UDP listener's
//! Gateway Service port is UDP; the UDPRoute CRD is not installed in this cluster, and
//! that must not hold anything up.

use gateway_api::gateways::Gateway;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, apply, edge, eventually_some, m, put};

fn tcp_routes(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "TCPRoute");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "tcproutes");
    Api::namespaced_with(client.clone(), "l4", &resource)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_routes_get_status_and_udp_listeners_udp_service_ports() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &["l4"]).await;
    let gw = m::Gateway::test("db")
        .namespace("l4")
        .annotation("aether.io/port-range.apps", "30000-30009")
        .listener(json!({"name": "pg", "port": 5432, "protocol": "TCP"}))
        .listener(json!({"name": "dns", "port": 53, "protocol": "UDP"}))
        .listener(json!({"name": "apps", "port": 30000, "protocol": "TCP"}));
    put::<Gateway>(&client, &gw).await;
    apply(
        &tcp_routes(&client),
        "pg",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
               "metadata": {"name": "pg", "namespace": "l4"},
               "spec": {"parentRefs": [{"name": "db", "sectionName": "pg"}],
                        "rules": [{"backendRefs": [{"name": "postgres", "port": 5432}]}]}}),
    )
    .await;
    // A route asking the pool for a port of its own.
    apply(
        &tcp_routes(&client),
        "redis",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
               "metadata": {"name": "redis", "namespace": "l4"},
               "spec": {"parentRefs": [{"name": "db", "sectionName": "apps", "port": 30007}],
                        "rules": [{"backendRefs": [{"name": "redis", "port": 6379}]}]}}),
    )
    .await;
    let listen = Net::allocate().ip(1);
    let _edge = edge(&cluster, &listen.to_string(), "l4");

    // The route is watched and its status written (ResolvedRefs=False: no Service).
    let routes = tcp_routes(&client);
    eventually_some("the TCPRoute's status", Wait::API, || async {
        let r = routes.get("pg").await.ok()?;
        let parent = r.data["status"]["parents"].as_array()?.first()?.clone();
        let conditions = parent["conditions"].as_array()?.clone();
        let has = |t: &str, st: &str| {
            conditions
                .iter()
                .any(|c| c["type"] == t && c["status"] == st)
        };
        (parent["parentRef"]["sectionName"] == "pg"
            && has("Accepted", "True")
            && has("ResolvedRefs", "False"))
        .then_some(())
    })
    .await?;

    // The pool's route holds its port in status.
    eventually_some("the pool route's port in status", Wait::API, || async {
        let r = routes.get("redis").await.ok()?;
        let parent = r.data["status"]["parents"].as_array()?.first()?.clone();
        (parent["parentRef"]["port"] == 30007
            && parent["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Accepted" && c["status"] == "True"))
        .then_some(())
    })
    .await?;

    // The Gateway Service carries each listener port with its own transport, and the
    // pool's assigned port (not the pool listener's own): all of them internal ports
    // the edge binds.
    let services = Api::<Service>::namespaced(client.clone(), "l4");
    let svc = eventually_some(
        "the Gateway Service with the pool port",
        Wait::API,
        || async {
            let svc = services.get_opt("db-aether").await.ok().flatten()?;
            let n = svc.spec.as_ref()?.ports.as_ref()?.len();
            (n == 3).then_some(svc)
        },
    )
    .await?;
    let ports = svc.spec.and_then(|s| s.ports).unwrap_or_default();
    let mut seen: Vec<(i32, String)> = ports
        .iter()
        .map(|p| (p.port, p.protocol.clone().unwrap_or_default()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (53, "UDP".to_owned()),
            (5432, "TCP".to_owned()),
            (30007, "TCP".to_owned())
        ]
    );
    let internal = ports
        .iter()
        .find(|p| p.port == 30007)
        .and_then(|p| match p.target_port {
            Some(IntOrString::Int(t)) => u16::try_from(t).ok(),
            _ => None,
        })
        .ok_or("no internal port for the pool port")?;
    // The edge binds it (the route's backend does not exist, so a connection is
    // accepted and closed; binding is what this checks).
    eventually_some(
        "the pool port's internal port is bound",
        Wait::API,
        || async {
            tokio::net::TcpStream::connect((listen, internal))
                .await
                .ok()
                .map(drop)
        },
    )
    .await?;
    cluster.pass()
}
