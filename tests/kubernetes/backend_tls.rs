//! BackendTLSPolicy in Kubernetes mode: policies and CA ConfigMaps are watched, and the
//! policy status (ancestors, Accepted, ResolvedRefs) is written to the API server,
//! following a ConfigMap that appears after the policy.

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{Net, Wait, apply, edge, eventually_some, m, put};

const NS: &str = "btls";

async fn objects(client: &Client) {
    crate::http_gateway(client, NS).await;
    apply(
        &Api::<Service>::namespaced(client.clone(), NS),
        "secure",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "secure", "namespace": NS},
               "spec": {"ports": [{"name": "https", "port": 443}]}}),
    )
    .await;
    let route = m::HttpRoute::test("r")
        .namespace(NS)
        .parent("gw")
        .backend("secure", 443);
    put::<HttpRoute>(client, &route).await;
    apply(
        &Api::<BackendTlsPolicy>::namespaced(client.clone(), NS),
        "p",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
               "metadata": {"name": "p", "namespace": NS},
               "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "secure"}],
                        "validation": {"hostname": "secure.example.com",
                            "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]}}}),
    )
    .await;
}

/// The reasons of our ancestor `gw`'s Accepted and ResolvedRefs conditions.
async fn reasons(api: &Api<BackendTlsPolicy>) -> Option<(String, String)> {
    let p = api.get("p").await.ok()?;
    let a = p
        .status?
        .ancestors
        .into_iter()
        .find(|a| a.ancestor_ref.name == "gw" && a.controller_name == "aether.io/edge")?;
    let reason = |t: &str| {
        a.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| format!("{}/{}", c.status, c.reason))
    };
    Some((reason("Accepted")?, reason("ResolvedRefs")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_tls_policy_status_follows_its_ca_config_map() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::class_and_namespaces(&client, &[NS]).await;
    objects(&client).await;
    let listen = Net::allocate().ip_str(1);
    let _edge = edge(&cluster, &listen, "btls");
    let policies = Api::<BackendTlsPolicy>::namespaced(client.clone(), NS);
    eventually_some(
        "NoValidCACertificate while the ConfigMap is missing",
        Wait::API,
        || async {
            let r = reasons(&policies).await?;
            (r == (
                "False/NoValidCACertificate".to_owned(),
                "False/InvalidCACertificateRef".to_owned(),
            ))
                .then_some(())
        },
    )
    .await?;

    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let pem = params.self_signed(&rcgen::KeyPair::generate()?)?.pem();
    apply(
        &Api::<ConfigMap>::namespaced(client.clone(), NS),
        "ca",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "ca", "namespace": NS}, "data": {"ca.crt": pem}}),
    )
    .await;
    eventually_some("Accepted once the ConfigMap exists", Wait::API, || async {
        let r = reasons(&policies).await?;
        (r == ("True/Accepted".to_owned(), "True/ResolvedRefs".to_owned())).then_some(())
    })
    .await?;
    cluster.pass()
}
