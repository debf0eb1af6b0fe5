//! `spec.infrastructure` reaches what is made for a Gateway, checked the way the
//! upstream GatewayInfrastructure test checks it: the ServiceAccounts, Pods and
//! Services of the Gateway's namespace labelled
//! `gateway.networking.k8s.io/gateway-name=<gateway>` carry every infrastructure label
//! and annotation, and there is at least one of them.

use std::collections::BTreeMap;

use gateway_api::gateways::Gateway;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, class_and_namespaces, edge, edge_pods, eventually_some, m, put};

const NS: &str = "infra";
const GATEWAY: &str = "gateway-with-infrastructure-metadata";

/// The metadata of everything the upstream test looks at.
async fn labelled(client: &Client) -> Result<Vec<ObjectMeta>, kube::Error> {
    let by_name =
        ListParams::default().labels(&format!("gateway.networking.k8s.io/gateway-name={GATEWAY}"));
    let mut found: Vec<ObjectMeta> = Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .list(&by_name)
        .await?
        .items
        .into_iter()
        .map(|o| o.metadata)
        .collect();
    let pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&by_name)
        .await?;
    found.extend(pods.items.into_iter().map(|o| o.metadata));
    let services = Api::<Service>::namespaced(client.clone(), NS)
        .list(&by_name)
        .await?;
    found.extend(services.items.into_iter().map(|o| o.metadata));
    Ok(found)
}

fn contains(have: Option<&BTreeMap<String, String>>, want: &[(&str, &str)]) -> bool {
    want.iter()
        .all(|(k, v)| have.and_then(|h| h.get(*k)).map(String::as_str) == Some(*v))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infrastructure_labels_and_annotations_reach_the_gateways_objects() -> Result<(), BoxError>
{
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &[NS]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;
    // The upstream test's Gateway, as its manifest writes it.
    let labels = [("key", "value")];
    let annotations = [("key", "value")];
    let gw = m::Gateway::test(GATEWAY)
        .namespace(NS)
        .infrastructure(json!({"labels": {"key": "value"}, "annotations": {"key": "value"}}))
        .http("http", 80);
    put::<Gateway>(&client, &gw).await;
    let listen = Net::allocate().ip_str(1);
    let _edge = edge(&cluster, &listen, "infrastructure");

    let found = eventually_some("the Gateway's labelled objects", Wait::API, || async {
        let found = labelled(&client).await.ok()?;
        (!found.is_empty()).then_some(found)
    })
    .await?;
    for meta in &found {
        let name = meta.name.as_deref().unwrap_or_default();
        assert!(
            contains(meta.labels.as_ref(), &labels),
            "{name}: labels {:?} lack {labels:?}",
            meta.labels
        );
        assert!(
            contains(meta.annotations.as_ref(), &annotations),
            "{name}: annotations {:?} lack {annotations:?}",
            meta.annotations
        );
    }
    let gateways = Api::<Gateway>::namespaced(client.clone(), NS);
    eventually_some("the Gateway Accepted", Wait::API, || async {
        let gw = gateways.get(GATEWAY).await.ok()?;
        gw.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Accepted" && c.status == "True")
            .then_some(())
    })
    .await?;
    cluster.pass()
}
