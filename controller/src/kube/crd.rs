//! What the installed Gateway CRD lets us write. GEP-5093's `routability` is
//! provisional: the published CRDs (v1.6.1) don't declare it, and the API server
//! refuses a status apply naming a field its schema lacks (`.status.addresses[0].
//! routability: field not declared in schema`), which left every Gateway unwritten.
//! So the CRD `gateways.gateway.networking.k8s.io` is watched, and the status writer
//! adds `routability` only while the schema declares it: both the stock CRDs and the
//! chart's patched one work, and patching (or re-applying the stock CRD) takes effect
//! without a restart.

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::watch;

const GATEWAY_CRD: &str = "gateways.gateway.networking.k8s.io";
/// The version the status writer applies with.
const VERSION: &str = "v1";

/// What the installed Gateway CRD declares, as far as the writers care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewaySchema {
    /// `status.addresses[].routability` (GEP-5093) is declared.
    pub status_routability: bool,
}

/// Appended to a Gateway's `AddressesAssigned` message when routability is left out.
pub const ROUTABILITY_LEFT_OUT: &str = "routability is not reported: the installed Gateway CRD does not declare status.addresses[].routability (GEP-5093 is provisional; charts/aether-edge/crd-patches/gateway-routability.yaml adds it)";

/// Watches the Gateway CRD. The receiver holds None until the CRD was read (or could
/// not be), then what it declares.
pub fn spawn(client: &Client) -> watch::Receiver<Option<GatewaySchema>> {
    let (tx, rx) = watch::channel(None);
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    // One object by name: the chart grants get/list/watch on this CRD alone.
    let config = watcher::Config::default().fields(&format!("metadata.name={GATEWAY_CRD}"));
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        // The list in progress: the CRD, if it exists.
        let mut listed: Option<GatewaySchema> = None;
        while let Some(event) = stream.next().await {
            let next = match event {
                Ok(Event::Apply(crd)) => of(&crd),
                // Gone: nothing can be written to Gateways anyway; say "not declared"
                // so a re-installed stock CRD is not written to with the field.
                Ok(Event::Delete(_)) => GatewaySchema {
                    status_routability: false,
                },
                Ok(Event::Init) => {
                    listed = None;
                    continue;
                }
                Ok(Event::InitApply(crd)) => {
                    listed = Some(of(&crd));
                    continue;
                }
                Ok(Event::InitDone) => listed.take().unwrap_or(GatewaySchema {
                    status_routability: false,
                }),
                Err(e) => {
                    // Unreadable (RBAC without the chart's rule, say): leaving the
                    // field out is what every CRD accepts. The watch keeps retrying,
                    // so a grant later brings the real answer.
                    tracing::debug!(crd = GATEWAY_CRD, error = %e, "Gateway CRD watch failed; retrying");
                    if tx.borrow().is_none() {
                        tracing::warn!(crd = GATEWAY_CRD, error = %e, "cannot read the Gateway CRD; Gateway status is written without GEP-5093 routability until it can be read");
                        tx.send_replace(Some(GatewaySchema {
                            status_routability: false,
                        }));
                    }
                    continue;
                }
            };
            report(&tx, next);
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Publishes `next`, logging once per change of what the CRD declares.
fn report(tx: &watch::Sender<Option<GatewaySchema>>, next: GatewaySchema) {
    let before = *tx.borrow();
    if before.map(|b| b.status_routability) != Some(next.status_routability) {
        if next.status_routability {
            tracing::info!(
                crd = GATEWAY_CRD,
                "the Gateway CRD declares status.addresses[].routability (GEP-5093); Gateway status carries it"
            );
        } else {
            tracing::warn!(
                crd = GATEWAY_CRD,
                "the Gateway CRD does not declare status.addresses[].routability (GEP-5093 is provisional; the published CRDs lack it): Gateway status is written without it, and spec.addresses[].routability reads as External. charts/aether-edge/crd-patches/gateway-routability.yaml adds the field"
            );
        }
    }
    tx.send_replace(Some(next));
}

fn of(crd: &CustomResourceDefinition) -> GatewaySchema {
    GatewaySchema {
        status_routability: declares_status_routability(
            &serde_json::to_value(&crd.spec).unwrap_or(Value::Null),
        ),
    }
}

/// Does the CRD spec's `v1` schema let `status.addresses[]` carry `routability`?
/// Declared outright, or kept as an unknown field.
fn declares_status_routability(spec: &Value) -> bool {
    let Some(version) = spec["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == VERSION))
    else {
        return false;
    };
    let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"];
    let addresses = &status["properties"]["addresses"];
    let item = &addresses["items"];
    [status, addresses, item]
        .iter()
        .any(|s| s["x-kubernetes-preserve-unknown-fields"] == true)
        || item["properties"].get("routability").is_some()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(item: Value) -> Value {
        json!({"versions": [
            {"name": "v1beta1", "schema": {"openAPIV3Schema": {"properties": {"status": {
                "properties": {"addresses": {"items": {"properties": {"routability": {}}}}}}}}}},
            {"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"status": {
                "properties": {"addresses": {"items": item}}}}}}}]})
    }

    #[test]
    fn routability_is_read_from_the_v1_schema() {
        let stock = spec(json!({"properties": {"type": {}, "value": {}}}));
        assert!(
            !declares_status_routability(&stock),
            "v1beta1's field is not v1's"
        );
        let patched = spec(json!({"properties": {"value": {}, "routability": {"type": "string"}}}));
        assert!(declares_status_routability(&patched));
        let open = spec(json!({"x-kubernetes-preserve-unknown-fields": true}));
        assert!(declares_status_routability(&open));
        assert!(!declares_status_routability(&json!({})));
    }

    #[test]
    fn the_published_v1_6_1_crd_lacks_it_and_the_charts_patch_adds_it() {
        // The real CRD layout, as far as it matters: the chart's JSON patch must land
        // exactly where this reads.
        let version = |name: &str| {
            json!({"name": name, "schema": {"openAPIV3Schema": {"properties": {
                "spec": {"properties": {"addresses": {"items": {"properties": {"value": {}}}}}},
                "status": {"properties": {"addresses": {"items": {"properties": {"value": {}}}}}}}}}})
        };
        let stock = json!({"versions": [version("v1"), version("v1beta1")]});
        assert!(!declares_status_routability(&stock));
        let mut patched = stock.clone();
        let ops: Vec<Value> = serde_saphyr::from_str(include_str!(
            "../../../charts/aether-edge/crd-patches/gateway-routability.yaml"
        ))
        .unwrap_or_default();
        assert!(!ops.is_empty());
        for op in ops.iter().filter(|o| o["op"] == "add") {
            let path = op["path"].as_str().unwrap_or_default();
            let Some(rest) = path.strip_prefix("/spec/") else {
                continue;
            };
            let mut parts: Vec<&str> = rest.split('/').collect();
            let Some(last) = parts.pop() else { continue };
            let mut at = &mut patched;
            for p in parts {
                at = match p.parse::<usize>() {
                    Ok(i) => &mut at[i],
                    Err(_) => &mut at[p],
                };
            }
            at[last] = op["value"].clone();
        }
        assert!(declares_status_routability(&patched));
    }
}
