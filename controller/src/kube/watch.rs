//! Watches for every kind the reconciler reads, applied into one shared Store. A
//! re-list (after a watch expired or the API server came back) replaces that kind's
//! objects wholesale, so deletions missed while disconnected are not kept.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::Object;
use crate::store::{ObjectKey, Store};

/// The Store the watches fill, and how the reconcile loop learns of changes.
#[derive(Default)]
pub struct Shared {
    store: Mutex<Store>,
    /// Signalled on every change (a stored permit, so none is lost between waits).
    pub changed: Notify,
    /// Watches that have not finished their first list yet.
    pending: AtomicUsize,
}

impl Shared {
    /// A copy of the Store. The lock is held only for the clone.
    pub fn snapshot(&self) -> Store {
        self.store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` on the Store under the lock (keep it short).
    pub fn with<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&self.store.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn update(&self, f: impl FnOnce(&mut Store)) {
        f(&mut self.store.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_one();
    }

    /// Has every watch listed its kind once? Before that the Store is partial, and a
    /// reconcile of it could delete Services of Gateways not seen yet.
    pub fn is_synced(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }
}

/// A kind the Store holds.
trait Kind: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static {
    fn object(self) -> Object;
    fn clear(store: &mut Store);
    fn remove(store: &mut Store, meta: &ObjectMeta);
}

macro_rules! namespaced {
    ($ty:ty, $variant:ident, $field:ident) => {
        impl Kind for $ty {
            fn object(self) -> Object {
                Object::$variant(Box::new(self))
            }
            fn clear(store: &mut Store) {
                store.$field.clear();
            }
            fn remove(store: &mut Store, meta: &ObjectMeta) {
                store.$field.remove(&ObjectKey::of(meta));
            }
        }
    };
}

macro_rules! cluster {
    ($ty:ty, $variant:ident, $field:ident) => {
        impl Kind for $ty {
            fn object(self) -> Object {
                Object::$variant(Box::new(self))
            }
            fn clear(store: &mut Store) {
                store.$field.clear();
            }
            fn remove(store: &mut Store, meta: &ObjectMeta) {
                store
                    .$field
                    .remove(meta.name.as_deref().unwrap_or_default());
            }
        }
    };
}

cluster!(GatewayClass, GatewayClass, gateway_classes);
cluster!(Namespace, Namespace, namespaces);
namespaced!(Gateway, Gateway, gateways);
namespaced!(HttpRoute, HttpRoute, http_routes);
namespaced!(ReferenceGrant, ReferenceGrant, reference_grants);
namespaced!(Service, Service, services);
namespaced!(EndpointSlice, EndpointSlice, endpoint_slices);
namespaced!(Secret, Secret, secrets);
namespaced!(Pod, Pod, pods);

/// Starts one watch per kind, cluster-wide. Secrets are limited to `kubernetes.io/tls`
/// by a field selector, so the cache never holds the cluster's other Secrets. Pods are
/// watched only for mesh mode (`pods`), so other setups need no RBAC on them.
pub fn spawn(client: &Client, shared: &Arc<Shared>, pods: bool) {
    let all = watcher::Config::default();
    shared
        .pending
        .store(if pods { 9 } else { 8 }, Ordering::Release);
    start::<GatewayClass>(Api::all(client.clone()), all.clone(), shared);
    start::<Gateway>(Api::all(client.clone()), all.clone(), shared);
    start::<HttpRoute>(Api::all(client.clone()), all.clone(), shared);
    start::<ReferenceGrant>(Api::all(client.clone()), all.clone(), shared);
    start::<Service>(Api::all(client.clone()), all.clone(), shared);
    start::<EndpointSlice>(Api::all(client.clone()), all.clone(), shared);
    start::<Namespace>(Api::all(client.clone()), all.clone(), shared);
    if pods {
        // Mesh mode's pod identities; the Store trims each Pod to its service account.
        start::<Pod>(Api::all(client.clone()), all.clone(), shared);
    }
    start::<Secret>(
        Api::all(client.clone()),
        all.fields("type=kubernetes.io/tls"),
        shared,
    );
}

fn start<K: Kind>(api: Api<K>, config: watcher::Config, shared: &Arc<Shared>) {
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let kind = K::kind(&());
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut relist: Vec<K> = Vec::new();
        let mut first = true;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Apply(o)) => shared.update(|s| s.apply(o.object())),
                Ok(Event::Delete(o)) => shared.update(|s| K::remove(s, o.meta())),
                Ok(Event::Init) => relist.clear(),
                Ok(Event::InitApply(o)) => relist.push(o),
                Ok(Event::InitDone) => {
                    let items = std::mem::take(&mut relist);
                    tracing::debug!(%kind, count = items.len(), "listed");
                    shared.update(|s| {
                        K::clear(s);
                        for o in items {
                            s.apply(o.object());
                        }
                    });
                    if std::mem::take(&mut first)
                        && shared.pending.fetch_sub(1, Ordering::AcqRel) == 1
                    {
                        tracing::info!("every watch has listed once; reconciling");
                        shared.changed.notify_one();
                    }
                }
                // The stream retries with backoff; say why, once per failure.
                Err(e) => tracing::warn!(%kind, error = %e, "watch failed; retrying"),
            }
        }
    });
}
