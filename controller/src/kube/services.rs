//! Applies each Gateway's Service and its EndpointSlices, and a dedicated Gateway's
//! Deployment, PodDisruptionBudget and pods Service (server-side apply: idempotent, one field manager), and
//! deletes what belonged to Gateways that are gone.
//! Owner references would let the garbage collector do the deleting, but not every API
//! server runs one, and a Gateway's ports should be freed when it goes, not eventually.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};
use metrics::counter;
use serde_json::Value;
use tokio::sync::watch;

use super::FIELD_MANAGER;
use super::apply_errors::ApplyFailures;
use super::retry_schedule::{Retries, news_or_retry};
use super::watch::Shared;
use crate::reconcile::edge_slices::{LABEL_SLICE_MANAGED_BY, SLICE_MANAGED_BY};
use crate::reconcile::services::{
    GatewayObjects, LABEL_GATEWAY_NAME, LABEL_GATEWAY_NAMESPACE, LABEL_MANAGED_BY, MANAGED_BY,
};
use crate::store::{ObjectKey, OwnedKind, Store};

pub type Desired = Arc<BTreeMap<ObjectKey, GatewayObjects>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Service,
    EndpointSlice,
    Owned(OwnedKind),
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Owned(k) => k.as_str(),
        }
    }

    fn resource(self) -> ApiResource {
        match self {
            Kind::Service => ApiResource::erase::<Service>(&()),
            Kind::EndpointSlice => ApiResource::erase::<EndpointSlice>(&()),
            Kind::Owned(OwnedKind::Deployment) => ApiResource::erase::<Deployment>(&()),
            Kind::Owned(OwnedKind::PodDisruptionBudget) => {
                ApiResource::erase::<PodDisruptionBudget>(&())
            }
        }
    }
}

const MIN_INTERVAL: Duration = Duration::from_millis(200);

pub struct ServiceApplier {
    client: Client,
    shared: Arc<Shared>,
    /// What we last applied per object: applying it again would be a no-op request.
    applied: HashMap<(Kind, ObjectKey), Value>,
    /// Writes the server refused: logged once, reported on the Gateway.
    failures: ApplyFailures,
    /// Failed writes, each backing off on its own (see `retry_schedule`).
    retries: Retries<(Kind, ObjectKey)>,
}

impl ServiceApplier {
    pub fn new(client: Client, shared: Arc<Shared>) -> Self {
        Self {
            client,
            shared,
            applied: HashMap::new(),
            failures: ApplyFailures::default(),
            retries: Retries::default(),
        }
    }

    pub async fn run(mut self, mut rx: watch::Receiver<Desired>, mut held: watch::Receiver<bool>) {
        loop {
            if !super::lease::until_held(&mut held).await {
                return;
            }
            let desired = Arc::clone(&rx.borrow_and_update());
            self.sync(&desired).await;
            // At most one pass per MIN_INTERVAL, then news or the next retry due.
            tokio::time::sleep(MIN_INTERVAL).await;
            if !news_or_retry(&mut rx, &mut held, self.retries.next()).await {
                return;
            }
        }
    }

    fn api(&self, kind: Kind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &kind.resource())
    }

    async fn sync(&mut self, desired: &BTreeMap<ObjectKey, GatewayObjects>) -> bool {
        let wanted = wanted(desired);
        let (to_apply, to_delete) = self.shared.with(|store| {
            let apply: Vec<((Kind, ObjectKey), Value)> = wanted
                .iter()
                .filter(|(id, value)| {
                    !present_and_ours(store, id) || self.applied.get(*id) != Some(*value)
                })
                .map(|(id, value)| (id.clone(), value.clone()))
                .collect();
            let delete: Vec<(Kind, ObjectKey)> =
                ours(store).filter(|id| !wanted.contains_key(id)).collect();
            (apply, delete)
        });
        // Objects that need no write any more stop backing off; those whose backoff
        // still runs wait (the others are written at once).
        self.retries.retain(|id| {
            to_apply.iter().any(|(a, _)| a == id) || to_delete.iter().any(|d| d == id)
        });
        let now = tokio::time::Instant::now();
        let to_apply: Vec<_> = to_apply
            .into_iter()
            .filter(|(id, _)| self.retries.due(id, now))
            .collect();
        let to_delete: Vec<_> = to_delete
            .into_iter()
            .filter(|id| self.retries.due(id, now))
            .collect();
        let mut failed = false;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        // Services before slices: a slice for a Service that doesn't exist yet would
        // be harmless, but the order keeps the log readable.
        for ((kind, key), value) in to_apply {
            let result = self
                .api(kind, key.namespace())
                .patch(key.name(), &params, &Patch::Apply(&value))
                .await
                .map(drop);
            counter!(aether_proxy::telemetry::SERVICE_WRITES_TOTAL, "op" => "apply", "kind" => kind.as_str(), "result" => if result.is_ok() { "ok" } else { "error" }).increment(1);
            match result {
                Ok(()) => {
                    tracing::info!(kind = kind.as_str(), object = %key, "Gateway object applied");
                    self.failures.succeeded(kind.as_str(), &key);
                    self.retries.succeeded(&(kind, key.clone()));
                    self.applied.insert((kind, key), value);
                }
                Err(e) => {
                    self.failures.failed(kind.as_str(), &key, &value, &e);
                    self.retries
                        .failed((kind, key), tokio::time::Instant::now());
                    failed = true;
                }
            }
        }
        for (kind, key) in to_delete {
            let dp = DeleteParams::default();
            let result = self
                .api(kind, key.namespace())
                .delete(key.name(), &dp)
                .await
                .map(drop);
            let ok = match &result {
                Ok(()) => true,
                Err(kube::Error::Api(s)) => s.code == 404,
                Err(_) => false,
            };
            counter!(aether_proxy::telemetry::SERVICE_WRITES_TOTAL, "op" => "delete", "kind" => kind.as_str(), "result" => if ok { "ok" } else { "error" }).increment(1);
            if ok {
                tracing::info!(kind = kind.as_str(), object = %key, "object of a removed Gateway (or listener family) deleted");
                self.retries.succeeded(&(kind, key));
            } else if let Err(e) = result {
                tracing::warn!(kind = kind.as_str(), object = %key, error = %e, "cannot delete an object we no longer want; will retry");
                self.retries
                    .failed((kind, key), tokio::time::Instant::now());
                failed = true;
            }
        }
        self.applied.retain(|id, _| wanted.contains_key(id));
        self.failures.publish(&self.shared, |kind, key| {
            wanted.keys().any(|(k, o)| k.as_str() == kind && o == key)
        });
        failed
    }
}

/// Every object we want, serialized as it is applied.
fn wanted(desired: &BTreeMap<ObjectKey, GatewayObjects>) -> BTreeMap<(Kind, ObjectKey), Value> {
    let mut out = BTreeMap::new();
    for objects in desired.values() {
        if let Some(key) = key_of(&objects.service.metadata)
            && let Ok(v) = serde_json::to_value(&objects.service)
        {
            out.insert((Kind::Service, key), v);
        }
        for slice in &objects.slices {
            if let Some(key) = key_of(&slice.metadata)
                && let Ok(v) = serde_json::to_value(slice)
            {
                out.insert((Kind::EndpointSlice, key), v);
            }
        }
        if let Some(own) = &objects.dedicated {
            let owned = [
                (
                    Kind::Owned(OwnedKind::Deployment),
                    &own.deployment.metadata,
                    serde_json::to_value(&own.deployment),
                ),
                (
                    Kind::Owned(OwnedKind::PodDisruptionBudget),
                    &own.budget.metadata,
                    serde_json::to_value(&own.budget),
                ),
                (
                    Kind::Service,
                    &own.pods.metadata,
                    serde_json::to_value(&own.pods),
                ),
            ];
            for (kind, meta, value) in owned {
                if let (Some(key), Ok(v)) = (key_of(meta), value) {
                    out.insert((kind, key), v);
                }
            }
        }
    }
    out
}

fn key_of(meta: &ObjectMeta) -> Option<ObjectKey> {
    Some(ObjectKey::new(meta.namespace.clone()?, meta.name.clone()?))
}

fn is_managed(meta: &ObjectMeta) -> bool {
    let labels = meta.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(LABEL_MANAGED_BY) == Some(MANAGED_BY)
        && get(LABEL_GATEWAY_NAME).is_some()
        && get(LABEL_GATEWAY_NAMESPACE).is_some()
}

/// A slice we wrote. The labels of `is_managed` are not enough: Kubernetes' own
/// EndpointSlice controller copies a Service's labels onto the slices it writes for
/// it, so the slices of a dedicated Gateway's headless Service carry them too, and
/// deleting those as "not wanted" took the dedicated pods out of the Gateway's
/// endpoints every few seconds (the controller wrote them back, we deleted them again).
fn is_managed_slice(meta: &ObjectMeta) -> bool {
    is_managed(meta)
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SLICE_MANAGED_BY))
            .is_some_and(|v| v == SLICE_MANAGED_BY)
}

/// Services and slices in the store that we manage for some Gateway.
fn ours(store: &Store) -> impl Iterator<Item = (Kind, ObjectKey)> + '_ {
    let services = store
        .services
        .iter()
        .filter(|(_, s)| is_managed(&s.metadata))
        .map(|(k, _)| (Kind::Service, k.clone()));
    let slices = store
        .endpoint_slices
        .iter()
        .filter(|(_, s)| is_managed_slice(&s.metadata))
        .map(|(k, _)| (Kind::EndpointSlice, k.clone()));
    let owned = store
        .owned
        .iter()
        .filter(|(_, meta)| is_managed(meta))
        .map(|((kind, key), _)| (Kind::Owned(*kind), key.clone()));
    services.chain(slices).chain(owned)
}

/// Whether the object exists and is ours: if someone else deleted or took it, our
/// cached "already applied" must not stop us from applying it again.
fn present_and_ours(store: &Store, (kind, key): &(Kind, ObjectKey)) -> bool {
    match kind {
        Kind::Service => store
            .services
            .get(key)
            .is_some_and(|s| is_managed(&s.metadata)),
        Kind::EndpointSlice => store
            .endpoint_slices
            .get(key)
            .is_some_and(|s| is_managed_slice(&s.metadata)),
        Kind::Owned(owned) => store
            .owned
            .get(&(*owned, key.clone()))
            .is_some_and(is_managed),
    }
}
