//! HTTPS listeners' certificateRefs: Secret lookup, ReferenceGrant, PEM parsing.

use std::sync::Arc;

use aether_proxy::tls::{self, CertifiedKey};
use gateway_api::gateways::{GatewayListenersTls, GatewayListenersTlsMode};
use k8s_openapi::api::core::v1::Secret;

use super::gateway::Problem;
use crate::store::{ObjectKey, Store};

/// The certificate an HTTPS listener terminates with. Only the first certificateRef
/// is served: one key type per listener is what clients of this edge need today.
/// `owner_kind` (Gateway or ListenerSet) in `gateway_ns` declares the listener: a
/// ReferenceGrant must admit that kind.
pub fn resolve(
    store: &Store,
    owner_kind: &str,
    gateway_ns: &str,
    tls: Option<&GatewayListenersTls>,
) -> Result<Arc<CertifiedKey>, Problem> {
    let Some(tls) = tls else {
        return Err((
            "InvalidCertificateRef",
            "an HTTPS listener needs tls.certificateRefs".to_owned(),
        ));
    };
    if matches!(tls.mode, Some(GatewayListenersTlsMode::Passthrough)) {
        return Err((
            "InvalidCertificateRef",
            "HTTPS listeners terminate TLS; Passthrough is for TLS listeners".to_owned(),
        ));
    }
    let Some(r) = tls.certificate_refs.iter().flatten().next() else {
        return Err((
            "InvalidCertificateRef",
            "tls.certificateRefs is empty".to_owned(),
        ));
    };
    let r = SecretRef {
        field: "certificateRef",
        group: r.group.as_deref().unwrap_or(""),
        kind: r.kind.as_deref().unwrap_or("Secret"),
        name: &r.name,
        namespace: r.namespace.as_deref(),
    };
    certified_key(store, (owner_kind, gateway_ns), &r, "InvalidCertificateRef")
}

/// A reference to a Secret holding a certificate and its key, whatever field it is in.
pub struct SecretRef<'a> {
    /// The referring field, for messages (`certificateRef`).
    pub field: &'static str,
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

/// The certificate and key of the Secret `r` names, referred to by an `owner` (kind and
/// namespace; a ReferenceGrant must admit that kind across namespaces). Problems other
/// than a missing grant carry `invalid`, the reason the referring field's spec names.
pub fn certified_key(
    store: &Store,
    (owner_kind, owner_ns): (&str, &str),
    r: &SecretRef<'_>,
    invalid: &'static str,
) -> Result<Arc<CertifiedKey>, Problem> {
    let (group, kind) = (r.group, r.kind);
    if !group.is_empty() || kind != "Secret" {
        return Err((
            invalid,
            format!("{} {group}/{kind} {} is not a Secret", r.field, r.name),
        ));
    }
    let namespace = r.namespace.unwrap_or(owner_ns);
    if namespace != owner_ns
        && !store.reference_granted(owner_kind, owner_ns, "", "Secret", namespace, r.name)
    {
        return Err((
            "RefNotPermitted",
            format!(
                "{} to Secret {namespace}/{} crosses namespaces without a ReferenceGrant",
                r.field, r.name
            ),
        ));
    }
    let key = ObjectKey::new(namespace, r.name);
    let Some(secret) = store.secrets.get(&key) else {
        return Err((invalid, format!("Secret {key} not found")));
    };
    if let Some(why) = store.oversized_secrets.get(&key) {
        return Err((invalid, format!("Secret {key} is too large: {why}")));
    }
    let (Some(cert), Some(private_key)) = (field(secret, "tls.crt"), field(secret, "tls.key"))
    else {
        return Err((invalid, format!("Secret {key} has no tls.crt and tls.key")));
    };
    // The parse error names what is wrong, never the key material itself.
    tls::certified_key(&cert, &private_key).map_err(|e| (invalid, format!("Secret {key}: {e}")))
}

/// A Secret field from `data` (decoded) or `stringData` (as written in manifests).
fn field(secret: &Secret, name: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(name))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(name))
                .map(|s| s.as_bytes().to_vec())
        })
}

#[cfg(test)]
#[path = "certificates_tests.rs"]
mod tests;
