use super::*;
use crate::testing::{self, condition};

const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: other}
spec: {controllerName: example.com/other}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge, generation: 3}
spec:
  gatewayClassName: aether
  listeners:
  - {name: http, port: 8080, protocol: HTTP, hostname: "*.example.com", allowedRoutes: {namespaces: {from: All}}}
  - {name: sctp, port: 9000, protocol: SCTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: foreign, namespace: edge}
spec:
  gatewayClassName: other
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: apps}
spec: {ports: [{name: http, port: 80, targetPort: 9000}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-1, namespace: apps, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{name: http, port: 9000}]
endpoints:
- {addresses: ["127.0.0.5"], conditions: {ready: true}}
- {addresses: ["127.0.0.6"], conditions: {ready: false}}
"#;

/// The outcome of BASE and `extra`.
fn outcome(extra: &str) -> Outcome {
    testing::outcome(&format!("{BASE}---\n{extra}"))
}

#[test]
fn only_our_classes_and_gateways_get_status() {
    let out = outcome("");
    assert_eq!(
        out.statuses.gateway_classes.keys().collect::<Vec<_>>(),
        vec!["aether"]
    );
    assert_eq!(out.statuses.gateways.len(), 1);
    let gw = &out.statuses.gateways[&ObjectKey::new("edge", "gw")];
    assert_eq!(gw.generation, 3);
    let conds = gw.status.conditions.as_deref().unwrap_or_default();
    assert_eq!(condition(conds, "Accepted"), ("True", "ListenersNotValid"));
    assert_eq!(condition(conds, "Programmed"), ("True", "Programmed"));
    assert!(conds.iter().all(|c| c.observed_generation == Some(3)));
    let listeners = gw.status.listeners.as_deref().unwrap_or_default();
    assert_eq!(
        condition(&listeners[1].conditions, "Accepted"),
        ("False", "UnsupportedProtocol")
    );
    assert_eq!(out.snapshot.listeners.len(), 1);
}

#[test]
fn route_attaches_resolves_ready_endpoints_and_reports_missing_backends() {
    let out = outcome(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: apps}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  hostnames: [a.example.com, b.example.net]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api}}]
    backendRefs: [{name: echo, port: 80}, {name: missing, port: 80}]
"#,
    );
    let route = &out.statuses.http_routes[&ObjectKey::new("apps", "r")].status;
    assert_eq!(route.parents.len(), 1);
    assert_eq!(
        condition(&route.parents[0].conditions, "Accepted"),
        ("True", "Accepted")
    );
    assert_eq!(
        condition(&route.parents[0].conditions, "ResolvedRefs"),
        ("False", "BackendNotFound")
    );
    let gw = &out.statuses.gateways[&ObjectKey::new("edge", "gw")].status;
    assert_eq!(
        gw.listeners.as_deref().unwrap_or_default()[0].attached_routes,
        1
    );
    let listener = out
        .snapshot
        .listeners
        .values()
        .next()
        .unwrap_or_else(|| panic!("no listener"));
    assert!(listener.routes.virtual_host("b.example.net").is_none());
    let vh = listener
        .routes
        .virtual_host("a.example.com")
        .unwrap_or_else(|| panic!("no vhost"));
    let backends = vh.entries()[0].action.backends.backends();
    let aether_proxy::backend::BackendTarget::Service(b) = &backends[0].target else {
        panic!("echo did not resolve")
    };
    let eps: Vec<String> = b.endpoints.iter().map(|e| e.addr.to_string()).collect();
    assert_eq!(eps, vec!["127.0.0.5:9000"]);
}

#[test]
fn parent_problems_get_the_spec_reasons() {
    let out = outcome(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: wrong-section, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: nope}, {name: foreign}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: wrong-host, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.example.org]
"#,
    );
    let r = &out.statuses.http_routes[&ObjectKey::new("edge", "wrong-section")].status;
    // The parentRef to another controller's Gateway gets no entry from us.
    assert_eq!(r.parents.len(), 1);
    assert_eq!(
        condition(&r.parents[0].conditions, "Accepted"),
        ("False", "NoMatchingParent")
    );
    let r = &out.statuses.http_routes[&ObjectKey::new("edge", "wrong-host")].status;
    assert_eq!(
        condition(&r.parents[0].conditions, "Accepted"),
        ("False", "NoMatchingListenerHostname")
    );
}

#[test]
fn reconcile_is_deterministic() {
    let a = outcome("");
    let b = outcome("");
    assert_eq!(a.statuses, b.statuses);
    let dump = |o: &Outcome| serde_json::to_string(&o.snapshot).unwrap_or_default();
    assert_eq!(dump(&a), dump(&b));
}

#[test]
fn cross_namespace_backends_need_a_reference_grant() {
    let route = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: echo, namespace: apps, port: 80}]}]
"#;
    let resolved = |o: &Outcome| {
        let r = &o.statuses.http_routes[&ObjectKey::new("edge", "r")].status;
        let (status, reason) = condition(&r.parents[0].conditions, "ResolvedRefs");
        (status.to_owned(), reason.to_owned())
    };
    assert_eq!(
        resolved(&outcome(route)),
        ("False".into(), "RefNotPermitted".into())
    );
    let grant = r#"---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: allow-edge, namespace: apps}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: edge}]
  to: [{group: "", kind: Service}]
"#;
    assert_eq!(
        resolved(&outcome(&format!("{route}{grant}"))),
        ("True".into(), "ResolvedRefs".into())
    );
    let wrong_name = grant.replace("kind: Service}", "kind: Service, name: other}");
    assert_eq!(
        resolved(&outcome(&format!("{route}{wrong_name}"))),
        ("False".into(), "RefNotPermitted".into())
    );
}

#[test]
fn filters_compile_and_bad_rules_answer_500_without_taking_the_route_down() {
    let out = outcome(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  hostnames: [f.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, statusCode: 301, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}
  - matches: [{path: {type: Exact, value: /bad}}]
    filters:
    - type: URLRewrite
      urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /x}}
"#,
    );
    let r = &out.statuses.http_routes[&ObjectKey::new("edge", "r")].status;
    let conds = &r.parents[0].conditions;
    assert_eq!(condition(conds, "Accepted"), ("True", "Accepted"));
    assert_eq!(
        condition(conds, "PartiallyInvalid"),
        ("True", "UnsupportedValue")
    );
    let listener = out
        .snapshot
        .listeners
        .values()
        .next()
        .unwrap_or_else(|| panic!("no listener"));
    let vh = listener
        .routes
        .virtual_host("f.example.com")
        .unwrap_or_else(|| panic!("no vhost"));
    let find = |path: &str| {
        vh.find(&http::Method::GET, path, None, &http::HeaderMap::new())
            .unwrap_or_else(|| panic!("no match for {path}"))
    };
    let redirect = find("/old/x").action.filters.redirect.as_ref();
    assert_eq!(redirect.map(|r| r.status.as_u16()), Some(301));
    // The invalid rule still matches its requests, and sends them to a 500.
    let bad = find("/bad");
    assert!(matches!(
        bad.action.backends.pick(),
        aether_proxy::backend::Pick::Invalid
    ));
}
