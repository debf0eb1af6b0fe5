//! A Service with the name a Gateway's Service would have, made by someone else, is
//! left alone: the Gateway says why it has no address; once that Service is gone,
//! the Gateway gets its own.

use std::time::Duration;

use gateway_api::gateways::Gateway;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{
    Net, Wait, apply, class_and_namespaces, edge, edge_pods, eventually_some, m, programmed, put,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_we_do_not_own_is_left_alone() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["taken"]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;
    let services = Api::<Service>::namespaced(client.clone(), "taken");
    apply(
        &services,
        "x-aether",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "x-aether", "namespace": "taken", "labels": {"team": "other"}},
               "spec": {"ports": [{"name": "theirs", "port": 1234}]}}),
    )
    .await;
    let gw = m::Gateway::test("x").namespace("taken").http("http", 80);
    put::<Gateway>(&client, &gw).await;
    let listen = Net::allocate().ip_str(1);
    let _edge = edge(&cluster, &listen, "collision");
    let gateways = Api::<Gateway>::namespaced(client.clone(), "taken");
    eventually_some("Programmed=False AddressNotUsable", Wait::API, || async {
        let gw = gateways.get("x").await.ok()?;
        (programmed(&gw)? == ("False".into(), "AddressNotUsable".into())).then_some(())
    })
    .await?;
    // Status is written after the Services pass: give a wrong write time to land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let theirs = services.get("x-aether").await?;
    let ports: Vec<i32> = theirs
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, vec![1234], "the foreign Service was rewritten");
    let labels = theirs.metadata.labels.unwrap_or_default();
    assert!(
        !labels.contains_key("app.kubernetes.io/managed-by"),
        "{labels:?}"
    );

    services
        .delete("x-aether", &DeleteParams::default())
        .await?;
    eventually_some("our own Service", Wait::API, || async {
        let svc = services.get_opt("x-aether").await.ok()??;
        let port = svc.spec?.ports?.first()?.port;
        (port == 80).then_some(())
    })
    .await?;
    cluster.pass()
}
