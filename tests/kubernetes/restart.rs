//! The API server goes away and comes back: the edge keeps serving meanwhile, its
//! watches resume, a change made after the restart is reconciled, and nothing is
//! written twice.

use std::time::Duration;

use gateway_api::gateways::Gateway;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, edge, eventually_some, m, put};

async fn gateway(client: &Client, listeners: serde_json::Value) {
    let gw = m::Gateway::test("g")
        .namespace("r")
        .spec("listeners", listeners);
    put::<Gateway>(client, &gw).await;
}

/// Distinct resourceVersions of the Gateway and its Service seen over `window`, less
/// the two starting ones: how many writes happened.
async fn writes(client: &Client, window: Duration) -> usize {
    let gateways = Api::<Gateway>::namespaced(client.clone(), "r");
    let services = Api::<Service>::namespaced(client.clone(), "r");
    crate::writes_during(window, (&gateways, "g"), (&services, "g-aether")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_restart_resumes_watches_without_duplicate_writes() -> Result<(), BoxError> {
    let Some(mut cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &["r"]).await;
    gateway(
        &client,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    )
    .await;
    let listen = Net::allocate().ip_str(1);
    let mut edge_proc = edge(&cluster, &listen, "restart");
    let services = Api::<Service>::namespaced(client.clone(), "r");
    let ports = |svc: &Service| -> Vec<i32> {
        svc.spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| p.port)
            .collect()
    };
    eventually_some("the Gateway Service", Wait::API, || async {
        let svc = services.get_opt("g-aether").await.ok()??;
        (ports(&svc) == vec![80]).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Down for a few seconds, then back: the edge survives and writes nothing new.
    cluster.restart_apiserver(Duration::from_secs(3)).await?;
    let client = cluster.client().await?;
    assert!(
        edge_proc.try_exit()?.is_none(),
        "the edge exited while the API server was down"
    );
    let after = writes(&client, Duration::from_secs(4)).await;
    assert_eq!(
        after, 0,
        "{after} writes after the restart with nothing changed"
    );

    // The watches resumed: a change made now is reconciled.
    gateway(
        &client,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"},
               {"name": "alt", "port": 8080, "protocol": "HTTP"}]),
    )
    .await;
    let services = Api::<Service>::namespaced(client.clone(), "r");
    eventually_some(
        "the new listener port on the Service",
        Wait::API,
        || async {
            let svc = services.get_opt("g-aether").await.ok()??;
            (ports(&svc) == vec![80, 8080]).then_some(())
        },
    )
    .await?;
    cluster.pass()
}
