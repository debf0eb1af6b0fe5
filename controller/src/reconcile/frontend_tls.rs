//! A Gateway's frontend TLS validation (`spec.tls.frontend`): the client-certificate
//! CAs each HTTPS port requires, from ConfigMaps, with the spec's listener conditions.

use std::sync::Arc;

use aether_proxy::client_auth::CertificateDer;
use aether_proxy::client_auth::{self, ClientAuth};
use gateway_api::gateways::{
    Gateway, GatewayTlsFrontendDefaultValidationMode, GatewayTlsFrontendPerPortTlsValidationMode,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::conditions;
use super::gateway::Problem;
use crate::store::{CA_BUNDLE_KEY, ObjectKey, Store};

/// What validation one HTTPS port gets.
pub enum Outcome {
    /// No client certificates asked for.
    None,
    /// Client certificates required (or optional, in fallback mode), with the problem
    /// of any reference that could not be used (ResolvedRefs=False).
    Validate(Arc<ClientAuth>, Option<Problem>),
    /// Every reference is unusable: the listener is not accepted
    /// (`NoValidCACertificate`), and ResolvedRefs says why.
    NoValidCa(Problem),
}

/// One CA reference in the shape both the default and per-port settings use.
struct CaRef<'a> {
    group: &'a str,
    kind: &'a str,
    name: &'a str,
    namespace: Option<&'a str>,
}

/// The Gateway condition the spec asks for while any port's validation lets clients
/// without a valid certificate through (`AllowInsecureFallback`): operators must see
/// that mutual TLS is not enforced.
pub fn insecure_fallback_condition(gateway: &Gateway, generation: i64) -> Option<Condition> {
    let frontend = gateway.spec.tls.as_ref()?.frontend.as_ref()?;
    let default = frontend.default.validation.as_ref().is_some_and(|v| {
        matches!(
            v.mode,
            Some(GatewayTlsFrontendDefaultValidationMode::AllowInsecureFallback)
        )
    });
    let ports: Vec<String> = frontend
        .per_port
        .iter()
        .flatten()
        .filter(|p| {
            p.tls.validation.as_ref().is_some_and(|v| {
                matches!(
                    v.mode,
                    Some(GatewayTlsFrontendPerPortTlsValidationMode::AllowInsecureFallback)
                )
            })
        })
        .map(|p| p.port.to_string())
        .collect();
    if !default && ports.is_empty() {
        return None;
    }
    let scope = match (default, ports.is_empty()) {
        (true, true) => "the default frontend validation".to_owned(),
        (true, false) => format!("the default and port(s) {}", ports.join(", ")),
        (false, _) => format!("port(s) {}", ports.join(", ")),
    };
    Some(conditions::condition(
        "InsecureFrontendValidationMode",
        true,
        "ConfigurationChanged",
        format!("{scope} allow clients without a valid certificate (AllowInsecureFallback)"),
        generation,
    ))
}

/// The frontend validation for HTTPS listeners on `port`: the `perPort` entry for it,
/// else the default.
pub fn for_port(store: &Store, gateway_ns: &str, gateway: &Gateway, port: i32) -> Outcome {
    let Some(frontend) = gateway.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
        return Outcome::None;
    };
    let per_port = frontend
        .per_port
        .iter()
        .flatten()
        .find(|p| p.port == port)
        .map(|p| p.tls.validation.as_ref());
    let (refs, fallback): (Vec<CaRef<'_>>, bool) = match per_port {
        Some(None) => return Outcome::None,
        Some(Some(v)) => (
            v.ca_certificate_refs
                .iter()
                .map(|r| CaRef {
                    group: &r.group,
                    kind: &r.kind,
                    name: &r.name,
                    namespace: r.namespace.as_deref(),
                })
                .collect(),
            matches!(
                v.mode,
                Some(GatewayTlsFrontendPerPortTlsValidationMode::AllowInsecureFallback)
            ),
        ),
        None => {
            let Some(v) = frontend.default.validation.as_ref() else {
                return Outcome::None;
            };
            (
                v.ca_certificate_refs
                    .iter()
                    .map(|r| CaRef {
                        group: &r.group,
                        kind: &r.kind,
                        name: &r.name,
                        namespace: r.namespace.as_deref(),
                    })
                    .collect(),
                matches!(
                    v.mode,
                    Some(GatewayTlsFrontendDefaultValidationMode::AllowInsecureFallback)
                ),
            )
        }
    };
    let mut cas: Vec<CertificateDer<'static>> = Vec::new();
    let mut problem: Option<Problem> = None;
    for r in &refs {
        match resolve(store, gateway_ns, r) {
            Ok(mut certs) => cas.append(&mut certs),
            Err(p) => {
                problem.get_or_insert(p);
            }
        }
    }
    if cas.is_empty() {
        let p = problem.unwrap_or((
            "InvalidCACertificateRef",
            "frontend validation names no CA certificate".to_owned(),
        ));
        return Outcome::NoValidCa(p);
    }
    match ClientAuth::new(cas, fallback) {
        Ok(auth) => Outcome::Validate(Arc::new(auth), problem),
        Err(e) => Outcome::NoValidCa(("InvalidCACertificateRef", e.to_string())),
    }
}

fn resolve(
    store: &Store,
    gateway_ns: &str,
    r: &CaRef<'_>,
) -> Result<Vec<CertificateDer<'static>>, Problem> {
    if !(r.group.is_empty() || r.group == "core") || r.kind != "ConfigMap" {
        return Err((
            "InvalidCACertificateKind",
            format!(
                "caCertificateRef {}/{} {} is not a ConfigMap",
                r.group, r.kind, r.name
            ),
        ));
    }
    let namespace = r.namespace.unwrap_or(gateway_ns);
    if namespace != gateway_ns
        && !store.reference_granted("Gateway", gateway_ns, "", "ConfigMap", namespace, r.name)
    {
        return Err((
            "RefNotPermitted",
            format!(
                "caCertificateRef to ConfigMap {namespace}/{} crosses namespaces without a ReferenceGrant",
                r.name
            ),
        ));
    }
    let key = ObjectKey::new(namespace, r.name);
    let Some(cm) = store.config_maps.get(&key) else {
        return Err((
            "InvalidCACertificateRef",
            format!("ConfigMap {key} not found"),
        ));
    };
    let Some(pem) = cm.data.as_ref().and_then(|d| d.get(CA_BUNDLE_KEY)) else {
        return Err((
            "InvalidCACertificateRef",
            format!("ConfigMap {key} has no {CA_BUNDLE_KEY}"),
        ));
    };
    client_auth::ca_bundle(pem.as_bytes())
        .map_err(|e| ("InvalidCACertificateRef", format!("ConfigMap {key}: {e}")))
}
