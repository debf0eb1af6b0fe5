//! ListenerSet merging, precedence, status and route attachment, on the reconciler
//! alone (the cases in tests/cases/listenerset-* drive the real binary).

use crate::reconcile::Outcome;
use crate::store::ObjectKey;
use crate::testing::{self, condition};

const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: aether
  allowedListeners: {namespaces: {from: Same}}
  listeners:
  - {name: http, port: 8080, protocol: HTTP, hostname: gw.example.com}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: closed, namespace: edge}
spec:
  gatewayClassName: aether
  listeners:
  - {name: http, port: 8080, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: older, namespace: edge, creationTimestamp: "2026-01-01T00:00:00Z", generation: 2}
spec:
  parentRef: {name: gw}
  listeners:
  - {name: http, port: 8080, protocol: HTTP, hostname: gw.example.com}
  - {name: extra, port: 8090, protocol: HTTP, hostname: ls.example.com}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: a-newer, namespace: edge, creationTimestamp: "2026-02-01T00:00:00Z"}
spec:
  parentRef: {name: gw}
  listeners:
  - {name: dup, port: 8090, protocol: HTTP, hostname: ls.example.com}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: elsewhere, namespace: apps}
spec:
  parentRef: {name: gw, namespace: edge}
  listeners:
  - {name: other, port: 8091, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: refused, namespace: edge}
spec:
  parentRef: {name: closed}
  listeners:
  - {name: other, port: 8092, protocol: HTTP}
"#;

/// The outcome of BASE and `extra`.
fn outcome(extra: &str) -> Outcome {
    testing::outcome(&format!("{BASE}---\n{extra}"))
}

#[test]
fn precedence_conflicts_and_set_conditions() {
    let out = outcome("");
    let sets = &out.statuses.listener_sets;
    let older = &sets[&ObjectKey::new("edge", "older")];
    assert_eq!(older.generation, 2);
    let conds = older.status.conditions.as_deref().unwrap_or_default();
    // One of its listeners lost a conflict: accepted, saying so.
    assert_eq!(condition(conds, "Accepted"), ("True", "ListenersNotValid"));
    assert_eq!(condition(conds, "Programmed"), ("True", "Programmed"));
    assert!(conds.iter().all(|c| c.observed_generation == Some(2)));
    let ls = older.status.listeners.as_deref().unwrap_or_default();
    // The Gateway's own listener wins over the set's identical one.
    assert_eq!(ls[0].name, "http");
    assert_eq!(
        condition(&ls[0].conditions, "Conflicted"),
        ("True", "HostnameConflict")
    );
    assert_eq!(
        condition(&ls[0].conditions, "Accepted"),
        ("False", "HostnameConflict")
    );
    assert_eq!(
        condition(&ls[0].conditions, "Programmed"),
        ("False", "HostnameConflict")
    );
    assert_eq!(
        condition(&ls[1].conditions, "Accepted"),
        ("True", "Accepted")
    );

    // Older beats newer although "a-newer" sorts first by name.
    let newer = &sets[&ObjectKey::new("edge", "a-newer")];
    let conds = newer.status.conditions.as_deref().unwrap_or_default();
    assert_eq!(condition(conds, "Accepted"), ("False", "ListenersNotValid"));
    assert_eq!(
        condition(conds, "Programmed"),
        ("False", "ListenersNotValid")
    );

    let elsewhere = &sets[&ObjectKey::new("apps", "elsewhere")];
    let conds = elsewhere.status.conditions.as_deref().unwrap_or_default();
    assert_eq!(condition(conds, "Accepted"), ("False", "NotAllowed"));
    let refused = &sets[&ObjectKey::new("edge", "refused")];
    let conds = refused.status.conditions.as_deref().unwrap_or_default();
    assert_eq!(condition(conds, "Accepted"), ("False", "NotAllowed"));

    let gw = &out.statuses.gateways[&ObjectKey::new("edge", "gw")].status;
    assert_eq!(gw.attached_listener_sets, Some(1));
    let conds = gw.conditions.as_deref().unwrap_or_default();
    assert_eq!(
        condition(conds, "AttachedListenerSets"),
        ("True", "ListenerSetsAttached")
    );
    assert_eq!(condition(conds, "Accepted"), ("True", "Accepted"));
    // Only the Gateway's own listeners are reported on it.
    assert_eq!(gw.listeners.as_deref().unwrap_or_default().len(), 1);
    let closed = &out.statuses.gateways[&ObjectKey::new("edge", "closed")].status;
    assert_eq!(closed.attached_listener_sets, Some(0));
    assert_eq!(
        condition(
            closed.conditions.as_deref().unwrap_or_default(),
            "AttachedListenerSets"
        ),
        ("False", "ListenerSetsNotAllowed")
    );
    // The set's valid listener is served on the Gateway's address; refused sets' are not.
    let ports: Vec<u16> = out.snapshot.listeners.keys().map(|a| a.port()).collect();
    assert!(ports.contains(&8090), "{ports:?}");
    assert!(
        !ports.contains(&8091) && !ports.contains(&8092),
        "{ports:?}"
    );
}

#[test]
fn routes_attach_to_sets_and_not_through_the_gateway() {
    let out = outcome(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: via-set, namespace: edge}
spec:
  parentRefs: [{kind: ListenerSet, group: gateway.networking.k8s.io, name: older, sectionName: extra}]
  rules: [{backendRefs: []}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: via-gateway, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: extra}]
  rules: [{backendRefs: []}]
"#,
    );
    let r = &out.statuses.http_routes[&ObjectKey::new("edge", "via-set")].status;
    assert_eq!(r.parents[0].parent_ref.kind.as_deref(), Some("ListenerSet"));
    assert_eq!(r.parents[0].parent_ref.name, "older");
    assert_eq!(
        condition(&r.parents[0].conditions, "Accepted"),
        ("True", "Accepted")
    );
    let r = &out.statuses.http_routes[&ObjectKey::new("edge", "via-gateway")].status;
    assert_eq!(
        condition(&r.parents[0].conditions, "Accepted"),
        ("False", "NoMatchingParent")
    );
    let older = &out.statuses.listener_sets[&ObjectKey::new("edge", "older")].status;
    let ls = older.listeners.as_deref().unwrap_or_default();
    assert_eq!(ls[1].attached_routes, 1);
    let gw = &out.statuses.gateways[&ObjectKey::new("edge", "gw")].status;
    assert_eq!(
        gw.listeners.as_deref().unwrap_or_default()[0].attached_routes,
        0
    );
}

#[test]
fn kubernetes_mode_gateway_service_exposes_listenerset_ports() {
    let addressing = testing::internal_ports("20000-29999", testing::shared_service());
    let out = testing::outcome_with(BASE, &addressing);
    let service = &out.services[&ObjectKey::new("edge", "gw")].service;
    let mut ports: Vec<i32> = service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| p.port)
        .collect();
    ports.sort_unstable();
    // The Gateway's 8080 and the admitted set's 8090; refused sets add nothing.
    assert_eq!(ports, vec![8080, 8090]);
    let closed = &out.services[&ObjectKey::new("edge", "closed")].service;
    let n = closed
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .count();
    assert_eq!(n, 1);
}

#[test]
fn a_set_of_a_gateway_that_is_not_accepted_serves_nothing() {
    let out = outcome(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: broken, namespace: edge}
spec:
  gatewayClassName: aether
  allowedListeners: {namespaces: {from: All}}
  listeners: [{name: sctp, port: 9000, protocol: SCTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: orphan, namespace: apps}
spec:
  parentRef: {name: broken, namespace: edge}
  listeners: [{name: web, port: 9100, protocol: HTTP}]
"#,
    );
    let gw = &out.statuses.gateways[&ObjectKey::new("edge", "broken")].status;
    let conds = gw.conditions.as_deref().unwrap_or_default();
    assert_eq!(condition(conds, "Accepted"), ("False", "ListenersNotValid"));
    let set = &out.statuses.listener_sets[&ObjectKey::new("apps", "orphan")].status;
    let conds = set.conditions.as_deref().unwrap_or_default();
    assert_eq!(condition(conds, "Accepted"), ("False", "ParentNotAccepted"));
    assert_eq!(
        condition(conds, "Programmed"),
        ("False", "ParentNotProgrammed")
    );
    let ports: Vec<u16> = out.snapshot.listeners.keys().map(|a| a.port()).collect();
    assert!(!ports.contains(&9100), "{ports:?}");
}

#[test]
fn tcp_routes_attach_to_a_set_listener() {
    let out = outcome(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: tcp-set, namespace: edge}
spec:
  parentRef: {name: gw}
  listeners: [{name: db, port: 5432, protocol: TCP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: db, namespace: edge}
spec:
  parentRefs: [{kind: ListenerSet, name: tcp-set, sectionName: db}]
  rules: [{backendRefs: [{name: echo, port: 80}]}]
"#,
    );
    let set = &out.statuses.listener_sets[&ObjectKey::new("edge", "tcp-set")].status;
    let l = &set.listeners.as_deref().unwrap_or_default()[0];
    assert_eq!((l.name.as_str(), l.attached_routes), ("db", 1));
    let route = out
        .statuses
        .l4_routes
        .iter()
        .find(|((_, k), _)| k.name() == "db")
        .map(|(_, s)| &s.status)
        .unwrap_or_else(|| panic!("no TCPRoute status"));
    let parent = &route.parents[0];
    assert_eq!(parent.parent_ref.kind.as_deref(), Some("ListenerSet"));
    assert_eq!(
        condition(&parent.conditions, "Accepted"),
        ("True", "Accepted")
    );
    assert!(out.snapshot.listeners.keys().any(|a| a.port() == 5432));
}
