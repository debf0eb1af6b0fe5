//! Applies each Gateway's Service (server-side apply: idempotent, one field manager)
//! and deletes the Services of Gateways that are gone. Owner references would let the
//! garbage collector do the deleting, but not every API server runs one, and a
//! Gateway's ports should be freed when it goes, not eventually.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use metrics::counter;
use serde_json::Value;
use tokio::sync::watch;

use super::FIELD_MANAGER;
use super::watch::Shared;
use crate::reconcile::services::{LABEL_GATEWAY_NAME, LABEL_GATEWAY_NAMESPACE, is_ours};
use crate::store::ObjectKey;

pub type Desired = Arc<BTreeMap<ObjectKey, Service>>;

const MIN_INTERVAL: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub struct ServiceApplier {
    client: Client,
    shared: Arc<Shared>,
    /// What we last applied per Gateway: applying it again would be a no-op request.
    applied: HashMap<ObjectKey, Value>,
}

impl ServiceApplier {
    pub fn new(client: Client, shared: Arc<Shared>) -> Self {
        Self {
            client,
            shared,
            applied: HashMap::new(),
        }
    }

    pub async fn run(mut self, mut rx: watch::Receiver<Desired>) {
        let mut backoff = MIN_INTERVAL;
        loop {
            let desired = Arc::clone(&rx.borrow_and_update());
            let failed = self.sync(&desired).await;
            backoff = if failed {
                (backoff * 2).min(MAX_BACKOFF)
            } else {
                MIN_INTERVAL
            };
            tokio::time::sleep(backoff).await;
            if !failed && rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn sync(&mut self, desired: &BTreeMap<ObjectKey, Service>) -> bool {
        let (to_apply, to_delete) = self.shared.with(|store| {
            let apply: Vec<(ObjectKey, Value)> = desired
                .iter()
                .filter_map(|(gw, svc)| {
                    let value = serde_json::to_value(svc).ok()?;
                    let name = svc.metadata.name.clone().unwrap_or_default();
                    let present = store
                        .services
                        .get(&ObjectKey::new(&gw.namespace, name))
                        .is_some_and(|s| is_ours(s, gw));
                    (!present || self.applied.get(gw) != Some(&value)).then(|| (gw.clone(), value))
                })
                .collect();
            let delete: Vec<ObjectKey> = store
                .services
                .iter()
                .filter_map(|(key, svc)| {
                    let labels = svc.metadata.labels.as_ref()?;
                    let gw = ObjectKey::new(
                        labels.get(LABEL_GATEWAY_NAMESPACE)?,
                        labels.get(LABEL_GATEWAY_NAME)?,
                    );
                    (is_ours(svc, &gw) && !desired.contains_key(&gw)).then(|| key.clone())
                })
                .collect();
            (apply, delete)
        });
        let mut failed = false;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for (gw, value) in to_apply {
            let Some(name) = value["metadata"]["name"].as_str().map(str::to_owned) else {
                continue;
            };
            let api = Api::<Service>::namespaced(self.client.clone(), &gw.namespace);
            let result = api.patch(&name, &params, &Patch::Apply(&value)).await;
            counter!("aether_service_writes_total", "op" => "apply", "result" => if result.is_ok() { "ok" } else { "error" }).increment(1);
            match result {
                Ok(_) => {
                    tracing::info!(gateway = %gw, service = %name, "Gateway Service applied");
                    self.applied.insert(gw, value);
                }
                Err(e) => {
                    tracing::warn!(gateway = %gw, service = %name, error = %e, "cannot apply the Gateway Service; will retry");
                    failed = true;
                }
            }
        }
        for key in to_delete {
            let api = Api::<Service>::namespaced(self.client.clone(), &key.namespace);
            let result = api.delete(&key.name, &DeleteParams::default()).await;
            let ok = match &result {
                Ok(_) => true,
                Err(kube::Error::Api(s)) => s.code == 404,
                Err(_) => false,
            };
            counter!("aether_service_writes_total", "op" => "delete", "result" => if ok { "ok" } else { "error" }).increment(1);
            if ok {
                tracing::info!(service = %key, "Service of a removed Gateway deleted");
            } else if let Err(e) = result {
                tracing::warn!(service = %key, error = %e, "cannot delete the Service of a removed Gateway; will retry");
                failed = true;
            }
        }
        self.applied.retain(|gw, _| desired.contains_key(gw));
        failed
    }
}
