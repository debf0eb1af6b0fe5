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

use std::sync::Arc;

use smallvec::SmallVec;

use aether_proxy::routing::RequestMatch;
use gateway_api::httproutes::{
    HttpRoute, HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesBackendRefs,
    HttpRouteRulesBackendRefsFilters, HttpRouteRulesFilters, HttpRouteRulesTimeouts, HttpRouteSpec,
    HttpRouteStatus,
};

use crate::route_match::compile_matches;
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
/// in its compact form and the status as parsed, and of the metadata only what is read
/// here (the name and namespace are the Store's key). `ObjectMeta` is 360 of an
/// `HttpRoute`'s 456 bytes, nearly all of it options no route sets, plus its own
/// copies of the name and namespace: at 5,000 routes about 1.8 MiB the reconciler
/// never read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredRoute {
    pub generation: Option<i64>,
    /// `creationTimestamp` in whole seconds, 0 when absent: routes of equal precedence
    /// are ordered by it.
    pub created: i64,
    /// `resourceVersion`, for the status writer (a number on every API server).
    pub resource_version: Option<u64>,
    pub spec: RouteSpec,
    /// Boxed: set only in Kubernetes mode, and gateway-api's 24 bytes of it per route.
    pub status: Option<Box<HttpRouteStatus>>,
}

/// An HTTPRoute's spec with its lists at their exact length (a boxed slice keeps no
/// spare room; a parsed Vec keeps its last growth's) and an absent list kept as an
/// empty one (the spec gives both one meaning). The elements are gateway-api's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteSpec {
    /// Usually one, kept inline (a boxed list of one was an allocation per route).
    pub hostnames: SmallVec<[Box<str>; 1]>,
    /// Shared with a neighbouring route that lists the same parents (see
    /// [`StoredRoute::share_parents`]): most routes name the same Gateway or two.
    pub parent_refs: Arc<[HttpRouteParentRefs]>,
    pub rules: Box<[RuleSpec]>,
}

/// One rule of a [`RouteSpec`]: half an `HttpRouteRules` (the timeouts, rarely set, are
/// boxed; the name is in the form the rule's model and logs share). Its matches are
/// kept compiled: they read nothing but themselves, and the rule's model shares them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleSpec {
    pub name: Option<Arc<str>>,
    /// Those that compiled; the spec's default match when the rule lists none.
    pub matches: Arc<[RequestMatch]>,
    /// Why a listed match did not compile (the first), which makes the rule invalid.
    pub match_problem: Option<Box<str>>,
    pub filters: Box<[HttpRouteRulesFilters]>,
    pub backend_refs: Box<[BackendRef]>,
    pub timeouts: Option<Box<HttpRouteRulesTimeouts>>,
}

/// A rule's backendRef: gateway-api's fields with boxed strings and lists (96 bytes
/// instead of 136; its optional strings are nearly always absent).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BackendRef {
    pub group: Option<Box<str>>,
    pub kind: Option<Box<str>>,
    /// Shared with neighbouring routes (see [`StoredRoute::share_backend_names`]).
    pub name: Arc<str>,
    pub namespace: Option<Box<str>>,
    pub port: Option<i32>,
    pub weight: Option<i32>,
    pub filters: Box<[HttpRouteRulesBackendRefsFilters]>,
}

impl From<HttpRouteRulesBackendRefs> for BackendRef {
    fn from(b: HttpRouteRulesBackendRefs) -> Self {
        Self {
            group: b.group.map(String::into_boxed_str),
            kind: b.kind.map(String::into_boxed_str),
            name: b.name.into(),
            namespace: b.namespace.map(String::into_boxed_str),
            port: b.port,
            weight: b.weight,
            filters: b.filters.unwrap_or_default().into(),
        }
    }
}

/// An HTTPRoute as a source hands it to the Store: already in the form the Store keeps,
/// made as each object is read. A manifest file's routes are all read before any is
/// applied, and as gateway-api's types they held 13 MiB at 5,000 routes: the peak of a
/// first load, which glibc then kept as the arena the long-lived data was scattered
/// over (`benches/RESULTS.md`, issue 14, session 28).
#[derive(Debug, Clone, Default)]
pub struct RouteObject {
    /// The name and namespace, which key the route; the rest of the metadata that is
    /// read is in `route`.
    pub metadata: ObjectMeta,
    pub route: StoredRoute,
}

impl From<HttpRoute> for RouteObject {
    fn from(route: HttpRoute) -> Self {
        let HttpRoute {
            metadata,
            spec,
            status,
        } = route;
        let route = StoredRoute::from_parts(&metadata, spec, status);
        let metadata = ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            ..ObjectMeta::default()
        };
        Self { metadata, route }
    }
}

impl StoredRoute {
    /// What the Store keeps of `route`.
    pub fn new(route: HttpRoute) -> Self {
        Self::from_parts(&route.metadata, route.spec, route.status)
    }

    fn from_parts(
        metadata: &ObjectMeta,
        spec: HttpRouteSpec,
        status: Option<HttpRouteStatus>,
    ) -> Self {
        Self {
            generation: metadata.generation,
            created: metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            resource_version: metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok()),
            spec: RouteSpec::new(spec),
            status: status.map(Box::new),
        }
    }

    /// Takes `other`'s list of parents when it is equal to this route's, so the two
    /// keep one.
    pub fn share_parents(&mut self, other: &StoredRoute) {
        if self.spec.parent_refs == other.spec.parent_refs {
            self.spec.parent_refs = Arc::clone(&other.spec.parent_refs);
        }
    }

    /// Takes `other`'s string for each backend name the two routes both name: routes
    /// in a namespace mostly send to a few Services.
    pub fn share_backend_names(&mut self, other: &StoredRoute) {
        let theirs = || other.spec.rules.iter().flat_map(|r| r.backend_refs.iter());
        for mine in self
            .spec
            .rules
            .iter_mut()
            .flat_map(|r| r.backend_refs.iter_mut())
        {
            if let Some(b) = theirs().find(|b| b.name == mine.name) {
                mine.name = Arc::clone(&b.name);
            }
        }
    }
}

impl RouteSpec {
    fn new(spec: HttpRouteSpec) -> Self {
        Self {
            hostnames: {
                let mut names: SmallVec<_> = (spec.hostnames.unwrap_or_default().into_iter())
                    .map(String::into_boxed_str)
                    .collect();
                names.shrink_to_fit();
                names
            },
            parent_refs: spec.parent_refs.unwrap_or_default().into(),
            rules: (spec.rules.unwrap_or_default().into_iter())
                .map(RuleSpec::new)
                .collect(),
        }
    }
}

impl RuleSpec {
    fn new(rule: HttpRouteRules) -> Self {
        let (matches, match_problem) = compile_matches(&rule.matches.unwrap_or_default());
        Self {
            name: rule.name.map(Arc::from),
            matches,
            match_problem: match_problem.map(String::into_boxed_str),
            // Filters' own lists are rare and small, and left as parsed.
            filters: rule.filters.unwrap_or_default().into(),
            backend_refs: (rule.backend_refs.unwrap_or_default().into_iter())
                .map(BackendRef::from)
                .collect(),
            timeouts: rule.timeouts.map(Box::new),
        }
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
        let before = route.spec.clone();
        let kept = StoredRoute::new(route);
        assert_eq!(kept.generation, Some(3));
        assert_eq!(kept.resource_version, Some(42));
        assert_eq!(kept.created, 1_796_454_000);
        let spec = &kept.spec;
        assert_eq!(&*spec.hostnames, [Box::from("a.example.com")]);
        assert_eq!(Some(spec.parent_refs.to_vec()), before.parent_refs);
        assert_eq!(spec.rules.len(), 1);
        assert_eq!(spec.rules[0].matches.len(), 1);
        assert_eq!(spec.rules[0].matches[0].headers().len(), 1);
        assert_eq!(spec.rules[0].match_problem, None);
        let backend = &spec.rules[0].backend_refs[0];
        assert_eq!((&*backend.name, backend.port), ("svc", Some(80)));
        assert_eq!(spec.rules[0].backend_refs.len(), 1);
        assert!(backend.group.is_none() && backend.kind.is_none() && backend.filters.is_empty());
        assert!(spec.rules[0].filters.is_empty() && spec.rules[0].timeouts.is_none());
    }

    #[test]
    fn a_rule_keeps_its_matches_compiled_and_why_one_did_not() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: default}
spec:
  rules:
  - backendRefs: [{name: svc, port: 80}]
  - matches: [{path: {type: Exact, value: "/a"}}, {path: {type: PathPrefix, value: "b"}}]
"#;
        let route: HttpRoute = serde_saphyr::from_str(yaml).unwrap_or_default();
        let kept = StoredRoute::new(route);
        let (none_listed, one_bad) = (&kept.spec.rules[0], &kept.spec.rules[1]);
        assert_eq!(*none_listed.matches, [RequestMatch::default()]);
        assert_eq!(none_listed.match_problem, None);
        assert_eq!(one_bad.matches.len(), 1, "the match that compiled is kept");
        assert!(
            one_bad
                .match_problem
                .as_deref()
                .is_some_and(|p| p.contains("must start with '/'")),
            "{:?}",
            one_bad.match_problem
        );
    }

    #[test]
    fn routes_with_the_same_parents_keep_one_list() {
        let route = |parent: &str| {
            let yaml = format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
                 metadata: {{name: r, namespace: default}}\n\
                 spec: {{parentRefs: [{{name: {parent}}}]}}\n"
            );
            let route: HttpRoute = serde_saphyr::from_str(&yaml).unwrap_or_default();
            StoredRoute::new(route)
        };
        let first = route("edge");
        let mut same = route("edge");
        let mut other = route("other");
        assert!(!Arc::ptr_eq(
            &first.spec.parent_refs,
            &same.spec.parent_refs
        ));
        same.share_parents(&first);
        assert!(Arc::ptr_eq(&first.spec.parent_refs, &same.spec.parent_refs));
        other.share_parents(&first);
        assert_eq!(other.spec.parent_refs[0].name, "other");
    }

    #[test]
    fn routes_naming_the_same_backend_keep_one_name() {
        let route = |backends: &str| {
            let yaml = format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
                 metadata: {{name: r, namespace: default}}\n\
                 spec: {{rules: [{{backendRefs: [{backends}]}}]}}\n"
            );
            let route: HttpRoute = serde_saphyr::from_str(&yaml).unwrap_or_default();
            StoredRoute::new(route)
        };
        let names = |r: &StoredRoute| -> Vec<Arc<str>> {
            let rule = &r.spec.rules[0];
            rule.backend_refs
                .iter()
                .map(|b| Arc::clone(&b.name))
                .collect()
        };
        let first = route("{name: a, port: 80}, {name: b, port: 80}");
        let mut second = route("{name: b, port: 81}, {name: c, port: 80}");
        second.share_backend_names(&first);
        let (first, second) = (names(&first), names(&second));
        assert_eq!(second, [Arc::from("b"), Arc::from("c")]);
        assert!(Arc::ptr_eq(&first[1], &second[0]), "b is shared");
        assert!(!Arc::ptr_eq(&first[0], &second[1]));
    }
}
