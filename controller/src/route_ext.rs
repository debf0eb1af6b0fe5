//! HTTPRoute fields of the experimental channel that the gateway-api crate's standard
//! types don't have: GEP-1731's `spec.rules[].retry`. Read from the raw object next to
//! the typed one, as `gateway_ext` does for Gateways: the reconciler keeps working on
//! the one standard `HttpRoute` type, and the crate's `experimental` feature (a second
//! copy of every route type, for one field) is not compiled in.

use serde::Deserialize;
use serde_json::Value;

/// `spec.rules[i].retry`, as written (validated when the rule is compiled).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RetrySpec {
    #[serde(default)]
    pub codes: Option<Vec<i64>>,
    #[serde(default)]
    pub attempts: Option<i64>,
    #[serde(default)]
    pub backoff: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRouteExt {
    /// Per rule, index for index: its `retry`, or why it could not be read.
    pub retries: Vec<Option<Result<RetrySpec, String>>>,
}

impl HttpRouteExt {
    pub fn from_raw(raw: &Value) -> Self {
        let rules = raw["spec"]["rules"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        Self::from_retries(rules.iter().map(|rule| rule.get("retry")))
    }

    /// From a manifest's YAML, which the typed route was read from: only the rules'
    /// `retry` is kept, the rest skipped. (A whole `Value` of each route was built and
    /// dropped before: the first load's largest temporary, interleaved with what the
    /// Store keeps.) Unreadable YAML has no extension, as the typed parse reports it.
    pub fn from_yaml(doc: &str) -> Self {
        #[derive(Deserialize, Default)]
        struct Route {
            #[serde(default)]
            spec: Option<Spec>,
        }
        #[derive(Deserialize)]
        struct Spec {
            #[serde(default)]
            rules: Option<Vec<Rule>>,
        }
        #[derive(Deserialize)]
        struct Rule {
            #[serde(default)]
            retry: Option<Value>,
        }
        let route: Route = serde_saphyr::from_str(doc).unwrap_or_default();
        let rules = route.spec.and_then(|s| s.rules).unwrap_or_default();
        Self::from_retries(rules.iter().map(|rule| rule.retry.as_ref()))
    }

    fn from_retries<'v>(retries: impl Iterator<Item = Option<&'v Value>> + Clone) -> Self {
        let set = |r: Option<&'v Value>| r.filter(|r| !r.is_null());
        // Nearly every route: no list (a route's objects are all read before any is
        // applied, so a list of nothing per route added to a first load's peak).
        if retries.clone().all(|r| set(r).is_none()) {
            return Self::default();
        }
        let retries = retries
            .map(|r| {
                let r = set(r)?;
                Some(RetrySpec::deserialize(r).map_err(|e| format!("invalid retry: {e}")))
            })
            .collect();
        Self { retries }
    }

    /// Rule `i`'s retry, if it has one.
    pub fn retry(&self, i: usize) -> Option<&Result<RetrySpec, String>> {
        self.retries.get(i).and_then(Option::as_ref)
    }

    pub fn is_empty(&self) -> bool {
        self.retries.iter().all(Option::is_none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_rules_retry_index_for_index() {
        let raw = serde_json::json!({"spec": {"rules": [
            {"retry": {"codes": [500, 503], "attempts": 2, "backoff": "100ms"}},
            {},
            {"retry": {"attempts": "many"}},
        ]}});
        let ext = HttpRouteExt::from_raw(&raw);
        assert_eq!(
            ext.retry(0),
            Some(&Ok(RetrySpec {
                codes: Some(vec![500, 503]),
                attempts: Some(2),
                backoff: Some("100ms".into()),
            }))
        );
        assert_eq!(ext.retry(1), None);
        assert!(matches!(ext.retry(2), Some(Err(_))));
        assert_eq!(ext.retry(3), None);
        assert!(HttpRouteExt::from_raw(&Value::Null).is_empty());
    }

    #[test]
    fn a_route_without_retries_holds_no_list() {
        let raw = serde_json::json!({"spec": {"rules": [{}, {"retry": null}]}});
        assert_eq!(HttpRouteExt::from_raw(&raw).retries.capacity(), 0);
    }

    #[test]
    fn yaml_reads_the_rules_retries_as_the_raw_object_does() {
        let doc = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, labels: {retry: "not a rule's"}}
spec:
  parentRefs: [{name: edge}]
  rules:
  - retry: {codes: [500, 503], attempts: 2, backoff: 100ms}
    backendRefs: [{name: a, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /x}}]
    retry: ~
  - retry: {attempts: many}
"#;
        let raw: Value = serde_saphyr::from_str(doc).expect("test YAML parses");
        let ext = HttpRouteExt::from_yaml(doc);
        assert_eq!(ext, HttpRouteExt::from_raw(&raw));
        assert!(matches!(ext.retry(0), Some(Ok(r)) if r.attempts == Some(2)));
        assert_eq!(ext.retry(1), None);
        assert!(matches!(ext.retry(2), Some(Err(_))));

        let plain = "kind: HTTPRoute\nmetadata: {name: r}\nspec: {rules: [{}, {retry: null}]}\n";
        assert_eq!(HttpRouteExt::from_yaml(plain).retries.capacity(), 0);
        assert!(HttpRouteExt::from_yaml("kind: HTTPRoute\nspec: 3\n").is_empty());
        assert!(HttpRouteExt::from_yaml("kind: HTTPRoute\n").is_empty());
    }
}
