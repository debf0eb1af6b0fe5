//! Kubernetes mode: the EndpointSlices behind each Gateway Service.
//!
//! A Service selects pods only in its own namespace, but a Gateway's Service lives in
//! the Gateway's namespace and the edge pods live in the edge's. A selector would match
//! nothing outside the edge's namespace, so Gateway Services carry no selector and we
//! write their endpoints ourselves: the edge pods, as the EndpointSlices of the edge's
//! own Service list them (the cluster keeps those current with pod readiness and
//! termination), with the Gateway Service's ports pointing at the internal ports.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::services::{LABEL_GATEWAY_NAME, LABEL_GATEWAY_NAMESPACE, LABEL_MANAGED_BY, MANAGED_BY};
use crate::store::{ObjectKey, Store};

/// The label every EndpointSlice carries to name its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Tells the cluster's EndpointSlice controllers these slices are not theirs.
pub const LABEL_SLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub const SLICE_MANAGED_BY: &str = "edge.aether.io";

/// The edge pods' endpoints by address type (`IPv4`, `IPv6`), from the EndpointSlices
/// of the edge Service `edge`. Deduplicated by address and sorted, so every replica
/// writes the same bytes whatever order the slices were listed in.
pub fn edge_endpoints(store: &Store, edge: &ObjectKey) -> BTreeMap<String, Vec<Endpoint>> {
    let mut by_type: BTreeMap<String, BTreeMap<String, Endpoint>> = BTreeMap::new();
    for (key, slice) in &store.endpoint_slices {
        let names_edge = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .is_some_and(|s| **s == *edge.name());
        if key.namespace() != edge.namespace() || !names_edge {
            continue;
        }
        let family = by_type.entry(slice.address_type.clone()).or_default();
        for ep in &slice.endpoints {
            let Some(first) = ep.addresses.first() else {
                continue;
            };
            // Ports are per slice; what a Gateway Service needs is only the addresses,
            // their readiness and where they run.
            family.entry(first.clone()).or_insert_with(|| Endpoint {
                addresses: ep.addresses.clone(),
                conditions: ep.conditions.clone(),
                hostname: ep.hostname.clone(),
                node_name: ep.node_name.clone(),
                target_ref: ep.target_ref.clone(),
                zone: ep.zone.clone(),
                ..Endpoint::default()
            });
        }
    }
    by_type
        .into_iter()
        .map(|(family, eps)| (family, eps.into_values().collect()))
        .collect()
}

/// Whether any of `endpoints` is ready (unset counts as ready, as the EndpointSlice
/// API says consumers should read it).
pub fn any_ready(endpoints: &BTreeMap<String, Vec<Endpoint>>) -> bool {
    endpoints
        .values()
        .flatten()
        .any(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
}

/// One slice per address family the edge pods have (an empty IPv4 slice when they
/// have none yet, so the Service's endpoints are ours from the start), each listing
/// the Service's ports by name with the internal port as the destination.
pub fn desired(
    key: &ObjectKey,
    service: &Service,
    owner: Option<&OwnerReference>,
    edge: &BTreeMap<String, Vec<Endpoint>>,
) -> Vec<EndpointSlice> {
    let Some(service_name) = service.metadata.name.clone() else {
        return Vec::new();
    };
    let ports: Vec<EndpointPort> = service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|p| match p.target_port {
            Some(IntOrString::Int(internal)) => Some(EndpointPort {
                name: p.name.clone(),
                port: Some(internal),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            }),
            _ => None,
        })
        .collect();
    let mut labels: BTreeMap<String, String> = [
        (LABEL_SERVICE_NAME, service_name.as_str()),
        (LABEL_SLICE_MANAGED_BY, SLICE_MANAGED_BY),
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_GATEWAY_NAME, key.name()),
        (LABEL_GATEWAY_NAMESPACE, key.namespace()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    labels.extend(
        service
            .metadata
            .labels
            .iter()
            .flatten()
            .filter(|(k, _)| {
                !k.starts_with("kubernetes.io/") && !k.starts_with("endpointslice.kubernetes.io/")
            })
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let families: Vec<(&str, &[Endpoint])> = if edge.is_empty() {
        vec![("IPv4", &[])]
    } else {
        edge.iter()
            .map(|(f, eps)| (f.as_str(), eps.as_slice()))
            .collect()
    };
    families
        .into_iter()
        .map(|(family, endpoints)| EndpointSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&service_name, family)),
                namespace: Some(key.namespace().to_string()),
                labels: Some(labels.clone()),
                owner_references: owner.map(|o| vec![o.clone()]),
                ..ObjectMeta::default()
            },
            address_type: family.to_owned(),
            endpoints: endpoints.to_vec(),
            ports: Some(ports.clone()),
        })
        .collect()
}

/// `<service>` for IPv4, `<service>-<family>` otherwise: stable, so a re-apply updates
/// the same object.
pub fn slice_name(service: &str, family: &str) -> String {
    if family == "IPv4" {
        service.to_owned()
    } else {
        format!("{service}-{}", family.to_ascii_lowercase())
    }
}
