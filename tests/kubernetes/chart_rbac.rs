//! The chart's RBAC is enough: the edge runs as a user bound to exactly the ClusterRole
//! and Role `helm template` renders, and serves a Gateway end to end (its Service and
//! EndpointSlice written, status written, traffic answered) with not one request
//! refused, by the API server's audit log and the edge's own log.

use std::net::SocketAddr;

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{BoxError, Cluster, USER};
use crate::{
    Edge, Net, Wait, apply, class_and_namespaces, eventually_some, get, m, programmed, put,
    service_ports,
};

/// Applies the chart's ClusterRole and Role as rendered, and binds USER to them (the
/// chart binds its ServiceAccount; a token user stands in for it here). Returns the
/// role names.
async fn chart_roles(client: &Client) -> Result<(String, String), BoxError> {
    let yaml = crate::chart::render(None)?;
    let (mut cluster_role, mut role) = (None, None);
    for doc in yaml.split("\n---") {
        let Ok(value) = serde_saphyr::from_str::<Value>(doc) else {
            continue;
        };
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match value["kind"].as_str() {
            Some("ClusterRole") => {
                apply(&Api::<ClusterRole>::all(client.clone()), &name, value).await;
                cluster_role = Some(name);
            }
            Some("Role") => {
                let ns = value["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("aether-system");
                apply(
                    &Api::<Role>::namespaced(client.clone(), ns),
                    &name,
                    value.clone(),
                )
                .await;
                role = Some(name);
            }
            _ => {}
        }
    }
    let cluster_role = cluster_role.ok_or("the chart renders no ClusterRole")?;
    let role = role.ok_or("the chart renders no Role")?;
    let subjects = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]);
    apply(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        "chart-as-user",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "chart-as-user"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
               "subjects": subjects}),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(client.clone(), "aether-system"),
        "chart-as-user",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "chart-as-user", "namespace": "aether-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
               "subjects": subjects}),
    )
    .await;
    Ok((cluster_role, role))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_rbac_is_enough_to_serve_a_gateway() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["team"]).await;
    chart_roles(&client).await?;
    crate::http_gateway(&client, "team").await;
    let routes = Api::<HttpRoute>::namespaced(client.clone(), "team");
    let route = m::HttpRoute::test("r")
        .namespace("team")
        .parent("gw")
        .hostname("app.example.com")
        .redirect("moved.example.com", 302);
    put::<HttpRoute>(&client, &route).await;
    // Internal ports on a loopback network of its own: the port range is shared.
    let listen = Net::allocate().ip_str(1);
    let mut edge = Edge::new(&cluster, &listen, "chart-rbac")
        .kubeconfig(&cluster.user_kubeconfig)
        .start();

    // Its Service and EndpointSlice are written.
    let (_, ports) = service_ports(&client, "team", "gw").await;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "team");
    eventually_some("the Gateway's EndpointSlice", Wait::API, || async {
        slices.get_opt("gw-aether").await.ok().flatten()
    })
    .await?;
    // Status is written: the route's, and the Gateway's once it has an address.
    Api::<Service>::namespaced(client.clone(), "team")
        .patch_status(
            "gw-aether",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.30"}]}}})),
        )
        .await?;
    let gateways = Api::<Gateway>::namespaced(client.clone(), "team");
    eventually_some("Programmed=True", Wait::API, || async {
        let gw = gateways.get("gw").await.ok()?;
        (programmed(&gw)? == ("True".into(), "Programmed".into())).then_some(())
    })
    .await?;
    eventually_some("the route's Accepted=True", Wait::API, || async {
        let r = routes.get("r").await.ok()?;
        let parent = r.status?.parents.into_iter().next()?;
        parent
            .conditions
            .iter()
            .any(|c| c.type_ == "Accepted" && c.status == "True")
            .then_some(())
    })
    .await?;
    // Traffic is answered.
    let internal = u16::try_from(ports.first().ok_or("no Service port")?.1)?;
    let addr = SocketAddr::new(listen.parse()?, internal);
    eventually_some("traffic through the internal port", Wait::API, || async {
        get(addr, "app.example.com")
            .await
            .ok()
            .filter(|r| r.status == 302)
    })
    .await?;

    // Not one write refused (the audit log records every write the user made), and
    // the edge never saw a refusal, reads included.
    let writes = cluster.user_writes();
    let refused: Vec<&Value> = writes
        .iter()
        .filter(|e| e["responseStatus"]["code"] == 403)
        .collect();
    assert!(writes.len() >= 4, "too few writes audited: {writes:?}");
    assert!(refused.is_empty(), "refused: {refused:?}");
    let log = edge.log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "the edge met a refusal:\n{log}"
    );
    assert!(edge.try_exit()?.is_none(), "the edge exited");
    cluster.pass()
}
