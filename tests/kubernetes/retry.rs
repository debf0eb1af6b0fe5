//! The experimental HTTPRoute `retry` field through a real API server: with the
//! experimental channel's HTTPRoute CRD installed the field is stored, the edge's
//! watch reads it from the raw object (the crate's standard types have no such
//! field), and it reaches the data plane's configuration.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gateway_api::httproutes::HttpRoute;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{BoxError, Cluster};
use crate::{Edge, Net, Wait, apply, eventually_some, free_port};
use aether_test_support::config_dump;

async fn install_experimental_httproute_crd(client: &Client) -> Result<(), BoxError> {
    let path = tokio::task::spawn_blocking(crate::cluster::crds_dir)
        .await??
        .ok_or("no Gateway API CRDs")?
        .join("config/crd/experimental/gateway.networking.k8s.io_httproutes.yaml");
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(path)?)?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("aether-test").force(),
            &Patch::Apply(&crd),
        )
        .await?;
    Ok(())
}

fn route_body() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "retries"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{
            "backendRefs": [{"name": "app", "port": 80}],
            "retry": {"codes": [503], "attempts": 3, "backoff": "50ms"}}]}})
}

/// The first `retry` object anywhere in `v`.
fn find_retry(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) => m.get("retry").or_else(|| m.values().find_map(find_retry)),
        Value::Array(a) => a.iter().find_map(find_retry),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httproute_retry_is_read_from_the_api_server() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &["retries"]).await;
    install_experimental_httproute_crd(&client).await?;
    crate::http_gateway(&client, "retries").await;
    // The new schema takes a moment to apply: re-apply until the server keeps the field.
    let raw: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "retries",
        &ApiResource::erase::<HttpRoute>(&()),
    );
    let routes = Api::<HttpRoute>::namespaced(client.clone(), "retries");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        apply(&routes, "r", route_body()).await;
        let stored = raw.get("r").await?.data;
        if find_retry(&stored).is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the API server keeps pruning retry: {stored}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let port = free_port();
    let admin = SocketAddr::from(([127, 0, 0, 1], port));
    let listen = Net::allocate().ip_str(1);
    let _edge = Edge::new(&cluster, &listen, "retry").admin(port).start();
    let retry = eventually_some("the retry in /config_dump", Wait::API, || async {
        config_dump(admin)
            .await
            .ok()
            .and_then(|d| find_retry(&d).cloned())
    })
    .await?;
    assert_eq!(retry["attempts"], 3, "{retry}");
    assert_eq!(retry["codes"], json!([503]), "{retry}");
    assert_eq!(
        retry["backoff"],
        json!({"secs": 0, "nanos": 50_000_000}),
        "{retry}"
    );
    cluster.pass()
}
