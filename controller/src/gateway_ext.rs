//! Gateway fields the gateway-api crate's types don't have yet, read from the raw
//! object: GEP-5093's `routability` on `spec.addresses[]` and `status.addresses[]`.
//! Typed deserialization drops unknown fields, so every source (manifests, the
//! Kubernetes watch) reads these from the raw JSON next to the typed object.

use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayExt {
    /// `spec.addresses[i].routability`, index for index.
    pub spec_routability: Vec<Option<String>>,
    /// `status.addresses[i].routability` as the server holds it, so the status writer
    /// compares like with like.
    pub status_routability: Vec<Option<String>>,
}

impl GatewayExt {
    pub fn from_raw(raw: &Value) -> Self {
        fn column(addresses: &Value) -> Vec<Option<String>> {
            addresses
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    a.get("routability")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .collect()
        }
        Self {
            spec_routability: column(&raw["spec"]["addresses"]),
            status_routability: column(&raw["status"]["addresses"]),
        }
    }

    /// The routability requested for spec address `i`, if any.
    pub fn spec(&self, i: usize) -> Option<&str> {
        self.spec_routability.get(i).and_then(Option::as_deref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_columns_index_for_index() {
        let raw = serde_json::json!({
            "spec": {"addresses": [{"type": "IPAddress", "routability": "Cluster"}, {"value": "192.0.2.1"}]},
            "status": {"addresses": [{"value": "10.0.0.1", "routability": "Cluster"}]}
        });
        let ext = GatewayExt::from_raw(&raw);
        assert_eq!(ext.spec(0), Some("Cluster"));
        assert_eq!(ext.spec(1), None);
        assert_eq!(ext.spec(2), None);
        assert_eq!(ext.status_routability, vec![Some("Cluster".to_owned())]);
        assert_eq!(GatewayExt::from_raw(&Value::Null), GatewayExt::default());
    }
}
