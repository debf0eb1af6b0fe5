//! TCPRoute, UDPRoute and TLSRoute as one type.
//!
//! Gateway API v1.6 serves all three at `gateway.networking.k8s.io/v1` in the standard
//! channel, but the `gateway-api` crate 0.22 has TCPRoute and UDPRoute only as
//! `v1alpha2` behind its `experimental` feature. The fields the edge reads (parentRefs,
//! hostnames, rules[].backendRefs) are the same in every version, so one small serde
//! type reads whatever apiVersion users write, and a Kubernetes watch can later use it
//! with the `v1` ApiResource.

use gateway_api::httproutes::HttpRouteParentRefs;
/// L4 route status has HTTPRoute's shape (parents: parentRef, controllerName,
/// conditions).
pub use gateway_api::httproutes::HttpRouteStatus as L4RouteStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// Which of the three L4 route kinds an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum L4Kind {
    #[serde(rename = "TCPRoute")]
    Tcp,
    #[serde(rename = "UDPRoute")]
    Udp,
    #[serde(rename = "TLSRoute")]
    Tls,
}

impl L4Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            L4Kind::Tcp => "TCPRoute",
            L4Kind::Udp => "UDPRoute",
            L4Kind::Tls => "TLSRoute",
        }
    }

    pub fn from_kind(kind: &str) -> Option<Self> {
        match kind {
            "TCPRoute" => Some(L4Kind::Tcp),
            "UDPRoute" => Some(L4Kind::Udp),
            "TLSRoute" => Some(L4Kind::Tls),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct L4Route {
    pub kind: L4Kind,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: L4RouteSpec,
    /// The status as last written (Kubernetes) or published (standalone): port pools
    /// read the ports routes already hold from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<L4RouteStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct L4RouteSpec {
    /// The parentRef shape is the same for every route kind.
    #[serde(default)]
    pub parent_refs: Option<Vec<HttpRouteParentRefs>>,
    /// TLSRoute only: SNI names.
    #[serde(default)]
    pub hostnames: Option<Vec<String>>,
    #[serde(default)]
    pub rules: Vec<L4Rule>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct L4Rule {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub backend_refs: Option<Vec<L4BackendRef>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct L4BackendRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub weight: Option<i32>,
}

/// Gives each L4 route of `store` that carries no status of its own the status last
/// published for it. Standalone mode has no API server to keep status, and port pools
/// read the ports routes already hold from it (see `reconcile::portpool`).
pub fn carry_status(
    store: &mut crate::Store,
    previous: &std::collections::BTreeMap<
        (L4Kind, crate::ObjectKey),
        crate::status::ObjectStatus<gateway_api::httproutes::HttpRouteStatus>,
    >,
) {
    let missing: Vec<(L4Kind, crate::ObjectKey)> = store
        .l4_routes
        .iter()
        .filter(|(key, route)| route.status.is_none() && previous.contains_key(key))
        .map(|(key, _)| key.clone())
        .collect();
    for key in missing {
        if let (Some(route), Some(s)) = (store.l4_routes.get_mut(&key), previous.get(&key)) {
            std::sync::Arc::make_mut(route).status = Some((*s.status).clone());
        }
    }
}
