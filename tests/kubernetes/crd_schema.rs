//! Gateway status against the CRDs users have: with the stock v1.6.1 CRDs (no GEP-5093
//! `routability`, so the API server refuses a status naming it) the Gateway is written
//! and programmed, its addresses without routability and a condition saying why; once
//! the chart's patch is applied to the running cluster, the edge sees the CRD change
//! and writes the routability, no restart.

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, edge, eventually_some, raw_gateway};

const NS: &str = "stock";
const LEFT_OUT: &str = "routability is not reported";
const WARNING: &str = "does not declare status.addresses[].routability";

fn condition<'a>(gw: &'a Value, ctype: &str) -> Option<&'a Value> {
    aether_test_support::condition(&gw["status"]["conditions"], ctype).ok()
}

fn is_true(gw: &Value, ctype: &str) -> bool {
    condition(gw, ctype).is_some_and(|c| c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_status_fits_the_installed_crd_stock_then_patched() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start_stock_crds().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &[NS]).await;
    crate::http_gateway(&client, NS).await;
    let listen = Net::allocate().ip_str(1);
    let _edge = edge(&cluster, &listen, "stock");
    let services = Api::<Service>::namespaced(client.clone(), NS);
    eventually_some("gw's Service", Wait::API, || async {
        services.get_opt("gw-aether").await.ok().flatten()
    })
    .await?;
    // The load balancer's answer, as a cloud controller would write it.
    services
        .patch_status(
            "gw-aether",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.60"}]}}})),
        )
        .await?;
    let log_path = cluster.dir.path().join("edge-stock.log");

    // Stock CRD: written, programmed, the address without routability, and the
    // condition says why.
    let gw = eventually_some(
        "stock CRD: Programmed=True with the address",
        Wait::API,
        || async {
            let gw = raw_gateway(&client, NS, "gw").await?;
            let addresses = gw["status"]["addresses"].as_array()?.clone();
            (is_true(&gw, "Programmed")
                && addresses == vec![json!({"type": "IPAddress", "value": "192.0.2.60"})])
            .then_some(gw)
        },
    )
    .await?;
    let message = condition(&gw, "AddressesAssigned").ok_or("no AddressesAssigned")?["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains(LEFT_OUT), "AddressesAssigned: {message}");
    let log = std::fs::read_to_string(&log_path)?;
    assert_eq!(
        log.matches(WARNING).count(),
        1,
        "said once in the log:\n{log}"
    );
    assert!(
        !log.contains("field not declared in schema"),
        "no write was refused:\n{log}"
    );

    // The chart's patch, applied to the running cluster: the edge reads the changed
    // CRD and writes the routability, and the message no longer says it is left out.
    tokio::task::block_in_place(|| cluster.patch_routability())?;
    eventually_some(
        "patched CRD: the address with routability External",
        Wait::API,
        || async {
            let gw = raw_gateway(&client, NS, "gw").await?;
            let message = condition(&gw, "AddressesAssigned")?["message"]
                .as_str()?
                .to_owned();
            (gw["status"]["addresses"]
                == json!([{"type": "IPAddress", "value": "192.0.2.60", "routability": "External"}])
                && is_true(&gw, "Programmed")
                && !message.contains(LEFT_OUT))
            .then_some(())
        },
    )
    .await?;
    let log = std::fs::read_to_string(&log_path)?;
    assert!(
        log.contains("declares status.addresses[].routability"),
        "the change is logged:\n{log}"
    );
    assert_eq!(log.matches(WARNING).count(), 1, "still once:\n{log}");
    cluster.pass()
}
