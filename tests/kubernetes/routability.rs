//! GEP-5093 against the real API server with the chart's CRD patch installed:
//! `routability` survives in spec and status, each scope gets the Service that
//! provides it, and the conditions read as the GEP states.

use gateway_api::gateways::Gateway;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, edge, eventually_some, m, put, raw_gateway};

async fn gateway(client: &Client, name: &str, addresses: Value) {
    let gw = m::Gateway::test(name)
        .namespace("scopes")
        .spec("addresses", addresses)
        .http("http", 80);
    put::<Gateway>(client, &gw).await;
}

/// (value, routability) of each status address, and (status, reason) of a condition.
fn addresses(gw: &Value) -> Vec<(String, String)> {
    gw["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["value"].as_str().unwrap_or("").to_owned(),
                a["routability"].as_str().unwrap_or("(unset)").to_owned(),
            )
        })
        .collect()
}

fn condition(gw: &Value, ctype: &str) -> Option<(String, String)> {
    let c = aether_test_support::condition(&gw["status"]["conditions"], ctype).ok()?;
    Some((
        c["status"].as_str().unwrap_or("").to_owned(),
        c["reason"].as_str().unwrap_or("").to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routability_scopes_services_and_conditions() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &["scopes"]).await;
    gateway(
        &client,
        "internal",
        json!([{"type": "IPAddress", "routability": "Cluster"}]),
    )
    .await;
    gateway(
        &client,
        "mixed",
        json!([{"type": "IPAddress", "value": "192.0.2.50", "routability": "External"},
               {"type": "IPAddress", "routability": "Cluster"},
               {"type": "IPAddress", "routability": "example.com/CorpWan"}]),
    )
    .await;
    gateway(
        &client,
        "nowhere",
        json!([{"type": "IPAddress", "routability": "example.com/CorpWan"}]),
    )
    .await;
    // The patched CRD kept the field (an unpatched one prunes it).
    let stored = raw_gateway(&client, "scopes", "mixed")
        .await
        .ok_or("no Gateway mixed")?;
    assert_eq!(stored["spec"]["addresses"][1]["routability"], "Cluster");
    let listen = Net::allocate().ip_str(1);
    let _edge = edge(&cluster, &listen, "scopes");
    let services = Api::<Service>::namespaced(client.clone(), "scopes");

    // Cluster only: a ClusterIP Service; its cluster IP in status as Cluster.
    let svc = eventually_some("internal's Service", Wait::API, || async {
        services.get_opt("internal-aether").await.ok().flatten()
    })
    .await?;
    let spec = svc.spec.clone().unwrap_or_default();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let cluster_ip = spec.cluster_ip.clone().ok_or("no clusterIP allocated")?;
    eventually_some("internal: Cluster address, Assigned", Wait::API, || async {
        let gw = raw_gateway(&client, "scopes", "internal").await?;
        (addresses(&gw) == vec![(cluster_ip.clone(), "Cluster".to_owned())]
            && condition(&gw, "AddressesAssigned")? == ("True".into(), "Assigned".into())
            && condition(&gw, "Programmed")? == ("True".into(), "Programmed".into()))
            .then_some(())
    })
    .await?;

    // Both scopes and an unknown one: a LoadBalancer Service asking for the IP. Before
    // the load balancer answers, only the Cluster address; then both, each with its
    // scope. The unknown scope keeps it PartiallyAssigned; it stays programmed.
    let svc = eventually_some("mixed's Service", Wait::API, || async {
        services.get_opt("mixed-aether").await.ok().flatten()
    })
    .await?;
    let spec = svc.spec.clone().unwrap_or_default();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.load_balancer_ip.as_deref(), Some("192.0.2.50"));
    let mixed_cluster_ip = spec.cluster_ip.clone().ok_or("no clusterIP allocated")?;
    eventually_some(
        "mixed: Cluster only, PartiallyAssigned",
        Wait::API,
        || async {
            let gw = raw_gateway(&client, "scopes", "mixed").await?;
            // Shown only if this step times out: what the server holds, and the edge's
            // warnings so far.
            eprintln!("mixed status now: {}", gw["status"]);
            let log = std::fs::read_to_string(cluster.dir.path().join("edge-scopes.log"))
                .unwrap_or_default();
            for l in log.lines().filter(|l| l.contains("WARN")).take(5) {
                eprintln!("edge: {l}");
            }
            (addresses(&gw) == vec![(mixed_cluster_ip.clone(), "Cluster".to_owned())]
                && condition(&gw, "AddressesAssigned")?
                    == ("False".into(), "PartiallyAssigned".into())
                && condition(&gw, "Programmed")?.0 == "True")
                .then_some(())
        },
    )
    .await?;
    services
        .patch_status(
            "mixed-aether",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.50"}]}}})),
        )
        .await?;
    eventually_some("mixed: External and Cluster", Wait::API, || async {
        let gw = raw_gateway(&client, "scopes", "mixed").await?;
        (addresses(&gw)
            == vec![
                ("192.0.2.50".to_owned(), "External".to_owned()),
                (mixed_cluster_ip.clone(), "Cluster".to_owned()),
            ]
            && condition(&gw, "AddressesAssigned")? == ("False".into(), "PartiallyAssigned".into()))
            .then_some(())
    })
    .await?;

    // Nothing satisfiable: never substituted, no Service, not programmed.
    eventually_some("nowhere: NotAssigned", Wait::API, || async {
        let gw = raw_gateway(&client, "scopes", "nowhere").await?;
        (condition(&gw, "AddressesAssigned")? == ("False".into(), "NotAssigned".into())
            && condition(&gw, "Programmed")? == ("False".into(), "AddressNotAssigned".into())
            && addresses(&gw).is_empty())
        .then_some(())
    })
    .await?;
    assert!(services.get_opt("nowhere-aether").await?.is_none());
    cluster.pass()
}
