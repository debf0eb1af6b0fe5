//! What the Store keeps of an object: no more than the reconciler reads.
//!
//! Parsed lists at their exact length. Neither YAML nor JSON tells serde how long a
//! sequence is, so every list is grown by pushes and keeps the spare room of its last
//! growth: a one-element list of a 100-500 byte element reserves four. At 5,000
//! routes that room was 7 MiB of the Store (heaptrack, benches/RESULTS.md), kept for
//! as long as the object is.
//!
//! Other tools' bookkeeping dropped. In a cluster every object carries the API
//! server's record of which manager set which field (`managedFields`, a JSON tree per
//! manager), and an object applied with client-side `kubectl apply` a second copy of
//! itself in an annotation. Neither is read here, and for a route applied by kubectl
//! and given a status they are larger than the route itself.

use gateway_api::httproutes::{HttpRoute, HttpRouteSpec, HttpRouteStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// kubectl's copy of what it last applied (client-side apply).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what only the API server and kubectl read: `managedFields` and kubectl's
/// last-applied copy. Every other annotation stays (a Gateway's port pools and
/// replicas, a Service's mesh opt-out are annotations).
pub(crate) fn drop_bookkeeping(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// An HTTPRoute (or a GRPCRoute in its HTTPRoute form) as the Store keeps it: the spec
/// and status as parsed, and of the metadata only what is read here (the name and
/// namespace are the Store's key). `ObjectMeta` is 360 of an `HttpRoute`'s 456 bytes,
/// nearly all of it options no route sets, plus its own copies of the name and
/// namespace: at 5,000 routes about 1.8 MiB the reconciler never read.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRoute {
    pub generation: Option<i64>,
    /// `creationTimestamp` in whole seconds, 0 when absent: routes of equal precedence
    /// are ordered by it.
    pub created: i64,
    /// `resourceVersion`, for the status writer (a number on every API server).
    pub resource_version: Option<u64>,
    pub spec: HttpRouteSpec,
    pub status: Option<HttpRouteStatus>,
}

impl StoredRoute {
    /// What the Store keeps of `route`, its lists without spare room.
    pub fn new(route: HttpRoute) -> Self {
        let HttpRoute {
            metadata,
            mut spec,
            status,
        } = route;
        fit_lists(&mut spec);
        Self {
            generation: metadata.generation,
            created: metadata.creation_timestamp.map_or(0, |t| t.0.as_second()),
            resource_version: metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok()),
            spec,
            status,
        }
    }
}

/// Gives back the spare room of every list a route of the usual shape holds (filters'
/// own lists are rare and small, and left as parsed).
fn fit_lists(spec: &mut HttpRouteSpec) {
    fit(&mut spec.hostnames);
    fit(&mut spec.parent_refs);
    fit(&mut spec.rules);
    for rule in spec.rules.iter_mut().flatten() {
        fit(&mut rule.matches);
        fit(&mut rule.filters);
        fit(&mut rule.backend_refs);
        for m in rule.matches.iter_mut().flatten() {
            fit(&mut m.headers);
            fit(&mut m.query_params);
        }
        for b in rule.backend_refs.iter_mut().flatten() {
            fit(&mut b.filters);
        }
    }
}

fn fit<T>(list: &mut Option<Vec<T>>) {
    if let Some(list) = list {
        list.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Object, ObjectKey, Store};
    use gateway_api::gateways::Gateway;

    /// A Gateway as a watch delivers it after `kubectl apply` and a status write.
    fn gateway_from_a_cluster() -> Gateway {
        let json = serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {
                "name": "r", "namespace": "apps", "generation": 1, "resourceVersion": "42",
                "annotations": {
                    LAST_APPLIED: "{\"apiVersion\":\"gateway.networking.k8s.io/v1\"}",
                    "team": "payments"
                },
                "managedFields": [
                    {"manager": "kubectl-client-side-apply", "operation": "Update",
                     "apiVersion": "gateway.networking.k8s.io/v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:hostnames": {}}}},
                    {"manager": "aether-edge", "operation": "Update", "subresource": "status",
                     "apiVersion": "gateway.networking.k8s.io/v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:parents": {}}}}
                ]
            },
            "spec": {"gatewayClassName": "aether",
                     "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}
        });
        serde_json::from_value(json).unwrap_or_default()
    }

    #[test]
    fn the_store_keeps_no_bookkeeping_of_other_tools() {
        let gateway = gateway_from_a_cluster();
        assert!(
            gateway.metadata.managed_fields.is_some(),
            "the fixture parses"
        );
        let mut store = Store::default();
        store.apply(Object::Gateway(Box::new(gateway), Default::default()));
        let kept = &store.gateways[&ObjectKey::new("apps", "r")];
        assert_eq!(kept.metadata.managed_fields, None);
        let annotations = kept.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.into_iter().collect::<Vec<_>>(),
            [("team".to_owned(), "payments".to_owned())],
            "annotations of our own users stay"
        );
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(kept.spec.gateway_class_name, "aether");
    }

    #[test]
    fn an_object_with_only_the_last_applied_annotation_keeps_none() {
        let mut meta = gateway_from_a_cluster().metadata;
        meta.annotations.iter_mut().for_each(|a| {
            a.remove("team");
        });
        drop_bookkeeping(&mut meta);
        assert_eq!(meta.annotations, None);
    }

    #[test]
    fn a_stored_route_keeps_what_is_read_and_no_spare_room() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: default, generation: 3, resourceVersion: "42",
           creationTimestamp: "2026-12-05T07:00:00Z", labels: {team: payments}}
spec:
  parentRefs: [{name: edge}]
  hostnames: ["a.example.com"]
  rules:
  - matches: [{path: {type: PathPrefix, value: "/"}, headers: [{name: x, value: y}]}]
    backendRefs: [{name: svc, port: 80}]
"#;
        let route: HttpRoute = serde_saphyr::from_str(yaml).unwrap_or_default();
        let before = route.clone();
        let kept = StoredRoute::new(route);
        assert_eq!(kept.spec, before.spec);
        assert_eq!(kept.generation, Some(3));
        assert_eq!(kept.resource_version, Some(42));
        assert_eq!(kept.created, 1_796_454_000);
        let spec = &kept.spec;
        assert_eq!(spec.hostnames.as_ref().map(Vec::capacity), Some(1));
        assert_eq!(spec.parent_refs.as_ref().map(Vec::capacity), Some(1));
        let rules = spec.rules.as_deref().unwrap_or_default();
        assert_eq!(rules.len(), 1);
        assert!(rules.iter().all(|r| {
            r.matches.as_ref().map(Vec::capacity) == Some(1)
                && r.backend_refs.as_ref().map(Vec::capacity) == Some(1)
                && r.matches
                    .iter()
                    .flatten()
                    .all(|m| m.headers.as_ref().map(Vec::capacity) == Some(1))
        }));
    }
}
