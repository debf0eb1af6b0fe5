//! A Gateway's backend client certificate (`spec.tls.backend.clientCertificateRef`):
//! the Secret it presents when it reaches backends over TLS (BackendTLSPolicy), and the
//! Gateway `ResolvedRefs` condition the spec asks for.

use std::sync::Arc;

use aether_proxy::backend_client_cert::ClientCertificate;
use gateway_api::gateways::Gateway;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::certificates::{self, SecretRef};
use super::conditions as cond;
use super::gateway::{GatewayModel, Problem};
use crate::store::Store;

/// What a Gateway's `spec.tls.backend` resolves to.
pub struct BackendClient {
    /// Given to the data plane whether usable or not: an unusable one makes the
    /// Gateway's TLS backend connections fail rather than go out without it.
    pub cert: Arc<ClientCertificate>,
    /// Why the reference cannot be used (`ResolvedRefs=False`).
    pub problem: Option<Problem>,
}

/// The Gateway's backend client certificate; `None` when it names none.
pub fn resolve(store: &Store, gateway_ns: &str, gateway: &Gateway) -> Option<BackendClient> {
    let r = gateway
        .spec
        .tls
        .as_ref()?
        .backend
        .as_ref()?
        .client_certificate_ref
        .as_ref()?;
    let namespace = r.namespace.as_deref().unwrap_or(gateway_ns);
    let reference: Arc<str> = format!("{namespace}/{}", r.name).into();
    let secret = SecretRef {
        field: "clientCertificateRef",
        group: r.group.as_deref().unwrap_or(""),
        kind: r.kind.as_deref().unwrap_or("Secret"),
        name: &r.name,
        namespace: r.namespace.as_deref(),
    };
    let owner = ("Gateway", gateway_ns);
    Some(
        match certificates::certified_key(store, owner, &secret, "InvalidClientCertificateRef") {
            Ok(key) => BackendClient {
                cert: Arc::new(ClientCertificate::new(reference, key)),
                problem: None,
            },
            Err(problem) => BackendClient {
                cert: Arc::new(ClientCertificate::invalid(reference, problem.1.as_str())),
                problem: Some(problem),
            },
        },
    )
}

/// The Gateway's `ResolvedRefs` condition, reported when it has a backend client
/// certificate (the reference the condition is about): its problem first, then the
/// listeners' (`ListenersNotResolved`, as the spec lists).
pub fn resolved_refs(model: &GatewayModel<'_>) -> Option<Condition> {
    let client = model.backend_client.as_ref()?;
    let generation = model.generation;
    if let Some((reason, msg)) = &client.problem {
        return Some(cond::unresolved_refs(generation, reason, msg.clone()));
    }
    let unresolved: Vec<&str> = model
        .listeners
        .iter()
        .filter(|l| l.set.is_none() && l.refs.is_err())
        .map(|l| l.spec.name.as_str())
        .collect();
    if unresolved.is_empty() {
        return Some(cond::resolved_refs(generation));
    }
    let msg = format!(
        "listeners with unresolved references: {}",
        unresolved.join(", ")
    );
    Some(cond::unresolved_refs(
        generation,
        "ListenersNotResolved",
        msg,
    ))
}
