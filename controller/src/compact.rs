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

use gateway_api::httproutes::HttpRoute;
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

/// Gives back the spare room of every list a route of the usual shape holds (filters'
/// own lists are rare and small, and left as parsed).
pub(crate) fn http_route(route: &mut HttpRoute) {
    let spec = &mut route.spec;
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

    /// An HTTPRoute as a watch delivers it after `kubectl apply` and a status write.
    fn route_from_a_cluster() -> HttpRoute {
        let json = serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
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
            "spec": {"parentRefs": [{"name": "edge"}], "hostnames": ["a.example.com"]}
        });
        serde_json::from_value(json).unwrap_or_default()
    }

    #[test]
    fn the_store_keeps_no_bookkeeping_of_other_tools() {
        let route = route_from_a_cluster();
        assert!(
            route.metadata.managed_fields.is_some(),
            "the fixture parses"
        );
        let mut store = Store::default();
        store.apply(Object::HttpRoute(Box::new(route), Default::default()));
        let kept = &store.http_routes[&ObjectKey::new("apps", "r")];
        assert_eq!(kept.metadata.managed_fields, None);
        let annotations = kept.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.into_iter().collect::<Vec<_>>(),
            [("team".to_owned(), "payments".to_owned())],
            "annotations of our own users stay"
        );
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(kept.spec.hostnames, Some(vec!["a.example.com".to_owned()]));
    }

    #[test]
    fn an_object_with_only_the_last_applied_annotation_keeps_none() {
        let mut meta = route_from_a_cluster().metadata;
        meta.annotations.iter_mut().for_each(|a| {
            a.remove("team");
        });
        drop_bookkeeping(&mut meta);
        assert_eq!(meta.annotations, None);
    }

    #[test]
    fn parsed_lists_have_no_spare_room() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: default}
spec:
  parentRefs: [{name: edge}]
  hostnames: ["a.example.com"]
  rules:
  - matches: [{path: {type: PathPrefix, value: "/"}, headers: [{name: x, value: y}]}]
    backendRefs: [{name: svc, port: 80}]
"#;
        let mut route: HttpRoute = serde_saphyr::from_str(yaml).unwrap_or_default();
        let before = route.clone();
        http_route(&mut route);
        assert_eq!(route, before);
        let spec = &route.spec;
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
