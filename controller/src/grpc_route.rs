//! GRPCRoute, expressed as the HTTPRoute it is on the wire.
//!
//! A gRPC call is an HTTP/2 POST to `/<service>/<method>`, so every GRPCRoute match
//! is a path match plus header matches, and its filters (header modifiers, mirrors)
//! and backendRefs have HTTPRoute's exact shapes. Converting once at ingestion lets
//! attachment, hostname intersection, ReferenceGrants, status and the data plane's
//! route table serve both kinds with one implementation. What stays gRPC-specific is
//! kept apart: the kind name (allowedRoutes, ReferenceGrant `from`, status), HTTP/2 to
//! the backends, and gRPC status codes for the errors the proxy produces.

use gateway_api::grpcroutes::{
    GrpcRoute, GrpcRouteRulesMatchesMethod, GrpcRouteRulesMatchesMethodType,
};
use gateway_api::httproutes::HttpRoute;
use serde_json::{Value, json};

/// The HTTPRoute form of `route` (same metadata, parents, hostnames, status).
pub fn to_http_route(route: &GrpcRoute) -> Result<HttpRoute, serde_json::Error> {
    let mut v = serde_json::to_value(route)?;
    if let Some(rules) = v["spec"]["rules"].as_array_mut() {
        for rule in rules {
            // GRPCRoute's sessionPersistence and names carry over; nothing else differs
            // outside the matches.
            let matches = rule.get("matches").and_then(Value::as_array).cloned();
            let Some(matches) = matches else { continue };
            let converted: Vec<Value> = matches.iter().map(http_match).collect();
            rule["matches"] = Value::Array(converted);
        }
    }
    v["apiVersion"] = json!("gateway.networking.k8s.io/v1");
    v["kind"] = json!("HTTPRoute");
    serde_json::from_value(v)
}

/// One GRPCRoute match as an HTTPRoute match: the method becomes a path.
fn http_match(m: &Value) -> Value {
    let method: Option<GrpcRouteRulesMatchesMethod> = m
        .get("method")
        .and_then(|x| serde_json::from_value(x.clone()).ok());
    let mut out = json!({});
    if let Some(headers) = m.get("headers") {
        out["headers"] = headers.clone();
    }
    if let Some(path) = method.as_ref().and_then(method_path) {
        out["path"] = path;
    }
    out
}

/// The path match for a method match, as the GRPCRoute spec defines the fields: an
/// absent service or method matches any.
fn method_path(m: &GrpcRouteRulesMatchesMethod) -> Option<Value> {
    let service = m.service.as_deref().filter(|s| !s.is_empty());
    let method = m.method.as_deref().filter(|s| !s.is_empty());
    let regex = matches!(
        m.r#type,
        Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
    );
    Some(match (regex, service, method) {
        (_, None, None) => return None,
        (false, Some(s), Some(m)) => json!({"type": "Exact", "value": format!("/{s}/{m}")}),
        (false, Some(s), None) => json!({"type": "PathPrefix", "value": format!("/{s}")}),
        (false, None, Some(m)) => json!({
            "type": "RegularExpression",
            "value": format!("/[^/]+/{}", regex::escape(m)),
        }),
        (true, s, m) => json!({
            "type": "RegularExpression",
            "value": format!("/(?:{})/(?:{})", s.unwrap_or("[^/]+"), m.unwrap_or("[^/]+")),
        }),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn convert(yaml: &str) -> HttpRoute {
        let g: GrpcRoute = serde_saphyr::from_str(yaml).unwrap();
        to_http_route(&g).unwrap()
    }

    #[test]
    fn methods_become_paths_and_the_rest_carries_over() {
        let r = convert(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: ns}
spec:
  parentRefs: [{name: gw, sectionName: grpc}]
  hostnames: [grpc.example.com]
  rules:
  - matches:
    - method: {service: pkg.Svc, method: Get}
      headers: [{name: x-tenant, value: a}]
    - method: {service: pkg.Svc}
    - method: {method: Get}
    - method: {type: RegularExpression, service: "pkg\\..*", method: "Get|List"}
    - headers: [{name: x-only, value: b}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-a, value: "1"}]}}]
    backendRefs: [{name: svc, port: 9000, weight: 2}]
"#,
        );
        assert_eq!(r.spec.hostnames.clone().unwrap(), vec!["grpc.example.com"]);
        assert_eq!(
            r.spec.parent_refs.clone().unwrap()[0]
                .section_name
                .as_deref(),
            Some("grpc")
        );
        let rule = &r.spec.rules.clone().unwrap()[0];
        let m = rule.matches.clone().unwrap();
        let path = |i: usize| {
            let p = m[i].path.clone().unwrap();
            (format!("{:?}", p.r#type.unwrap()), p.value.unwrap())
        };
        assert_eq!(path(0), ("Exact".into(), "/pkg.Svc/Get".into()));
        assert_eq!(m[0].headers.clone().unwrap()[0].name, "x-tenant");
        assert_eq!(path(1), ("PathPrefix".into(), "/pkg.Svc".into()));
        assert_eq!(path(2), ("RegularExpression".into(), "/[^/]+/Get".into()));
        assert_eq!(
            path(3),
            (
                "RegularExpression".into(),
                "/(?:pkg\\..*)/(?:Get|List)".into()
            )
        );
        assert!(m[4].path.is_none());
        assert_eq!(rule.backend_refs.clone().unwrap()[0].weight, Some(2));
        assert_eq!(rule.filters.clone().unwrap().len(), 1);
    }
}
