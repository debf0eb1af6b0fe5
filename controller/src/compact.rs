//! Parsed lists at their exact length. Neither YAML nor JSON tells serde how long a
//! sequence is, so every list is grown by pushes and keeps the spare room of its last
//! growth: a one-element list of a 100-500 byte element reserves four. At 5,000
//! routes that room was 7 MiB of the Store (heaptrack, benches/RESULTS.md), kept for
//! as long as the object is.

use gateway_api::httproutes::HttpRoute;

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
