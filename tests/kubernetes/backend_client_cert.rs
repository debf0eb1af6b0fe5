//! Gateway `spec.tls.backend.clientCertificateRef` in Kubernetes mode: the Secret is
//! found through the edge's Secret watch (`kubernetes.io/tls` Secrets), and the
//! Gateway's ResolvedRefs condition written to the API server follows it: False
//! (InvalidClientCertificateRef) while the Secret is missing, True once it exists, and
//! RefNotPermitted for a Secret of another namespace until a ReferenceGrant allows it.

use gateway_api::gateways::Gateway;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{
    Net, Wait, apply, class_and_namespaces, edge, eventually_some, gateway_condition, m, put,
};

const NS: &str = "bcc";
const OTHER: &str = "bcc-certs";

/// Gateway `gw` presenting Secret `name` of `namespace` to TLS backends.
async fn gateway(client: &Client, namespace: &str, name: &str) {
    apply(
        &Api::<Gateway>::namespaced(client.clone(), NS),
        "gw",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "gw", "namespace": NS},
               "spec": {"gatewayClassName": "aether",
                        "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
                        "tls": {"backend": {"clientCertificateRef": {
                            "group": "", "kind": "Secret", "name": name, "namespace": namespace}}}}}),
    )
    .await;
}

/// Waits until gw's (ResolvedRefs, Accepted) are `refs` and True/Accepted.
async fn wait_refs(gateways: &Api<Gateway>, what: &str, refs: &str) -> Result<(), BoxError> {
    eventually_some(what, Wait::API, || async {
        let gw = gateways.get("gw").await.ok()?;
        let (status, reason, _) = gateway_condition(&gw, "ResolvedRefs")?;
        let (a_status, a_reason, _) = gateway_condition(&gw, "Accepted")?;
        (format!("{status}/{reason}") == refs && a_status == "True" && a_reason == "Accepted")
            .then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_backend_client_certificate_status_follows_its_secret() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &[NS, OTHER]).await;
    gateway(&client, NS, "client").await;
    let listen = Net::allocate().ip_str(1);
    let _edge = edge(&cluster, &listen, "bcc");
    let gateways = Api::<Gateway>::namespaced(client.clone(), NS);
    wait_refs(
        &gateways,
        "InvalidClientCertificateRef while the Secret is missing",
        "False/InvalidClientCertificateRef",
    )
    .await?;

    let ca = aether_test_support::tls::TestCa::new("bcc-ca")?;
    let leaf = ca.client_leaf("gw")?;
    put::<Secret>(
        &client,
        &m::tls_secret(NS, "client", &leaf.cert_pem, &leaf.key_pem),
    )
    .await;
    wait_refs(
        &gateways,
        "ResolvedRefs once the Secret exists",
        "True/ResolvedRefs",
    )
    .await?;

    // Another namespace's Secret needs a ReferenceGrant there.
    put::<Secret>(
        &client,
        &m::tls_secret(OTHER, "client", &leaf.cert_pem, &leaf.key_pem),
    )
    .await;
    gateway(&client, OTHER, "client").await;
    wait_refs(
        &gateways,
        "RefNotPermitted without a grant",
        "False/RefNotPermitted",
    )
    .await?;
    apply(
        &Api::<ReferenceGrant>::namespaced(client.clone(), OTHER),
        "gateways",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
               "metadata": {"name": "gateways", "namespace": OTHER},
               "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": NS}],
                        "to": [{"group": "", "kind": "Secret"}]}}),
    )
    .await;
    wait_refs(&gateways, "ResolvedRefs once granted", "True/ResolvedRefs").await?;
    cluster.pass()
}
