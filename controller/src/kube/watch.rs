//! Watches for every kind the reconciler reads, applied into one shared Store. A
//! re-list (after a watch expired or the API server came back) replaces that kind's
//! objects wholesale, so deletions missed while disconnected are not kept.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::grpcroutes::GrpcRoute;
use gateway_api::httproutes::HttpRoute;
use gateway_api::listenersets::ListenerSet;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use metrics::counter;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use tokio::sync::Notify;

use crate::Object;
use crate::compact::RouteObject;
use crate::gateway_ext::GatewayExt;
use crate::grpc_route::to_http_route;
use crate::l4route::{L4Kind, L4Route};
use crate::route_ext::HttpRouteExt;
use crate::store::{ObjectKey, OwnedKind, Store};

/// The Store the watches fill, and how the reconcile loop learns of changes.
#[derive(Default)]
pub struct Shared {
    store: Mutex<Store>,
    /// Signalled on every change (a stored permit, so none is lost between waits).
    pub changed: Notify,
    /// Watches that have not finished their first list yet.
    pending: AtomicUsize,
    /// Which Services' EndpointSlices the last outcome depends on (None before the
    /// first), and the Services whose slice events were stored without a signal.
    endpoints: Mutex<EndpointInterest>,
    /// The Store's route counts at the last snapshot: the first list (or a burst of
    /// new routes) fills its maps in key order, which leaves them half empty until
    /// repacked (see `store::packed`).
    routes_at_snapshot: Mutex<[usize; 3]>,
}

#[derive(Default)]
struct EndpointInterest {
    services: Option<BTreeSet<ObjectKey>>,
    skipped: BTreeSet<ObjectKey>,
}

impl Shared {
    /// A copy of the Store. The lock is held only for the clone, and for a repack of
    /// the route maps after a batch that grew them by more than a quarter.
    pub fn snapshot(&self) -> Store {
        let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        let mut counted = self
            .routes_at_snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        store.repack_grown(*counted);
        *counted = store.route_counts();
        store.clone()
    }

    /// Runs `f` on the Store under the lock (keep it short).
    pub fn with<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&self.store.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut Store)) {
        f(&mut self.store.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_one();
    }

    /// [`Self::update`] for one object's event: signals a reconcile only when `f`
    /// changed the Store. The Store keeps only what is read (a Pod's service account,
    /// a ConfigMap's CA bundle, a Namespace's labels), so most of a cluster's updates
    /// (Pod status, new resourceVersions, labels, other data) change nothing here.
    fn apply(&self, f: impl FnOnce(&mut Store) -> bool) {
        let changed = f(&mut self.store.lock().unwrap_or_else(PoisonError::into_inner));
        if changed {
            self.changed.notify_one();
        } else {
            counter!(aether_proxy::telemetry::WATCH_EVENTS_UNCHANGED_TOTAL).increment(1);
        }
    }

    /// Stores a change to an EndpointSlice of `service`, signalling it only if the
    /// last outcome depended on that Service. Most of a cluster's endpoint churn is
    /// for Services no route names; reconciling for it would rebuild everything to
    /// change nothing.
    fn update_endpoints(&self, service: Option<ObjectKey>, f: impl FnOnce(&mut Store) -> bool) {
        if !f(&mut self.store.lock().unwrap_or_else(PoisonError::into_inner)) {
            counter!(aether_proxy::telemetry::WATCH_EVENTS_UNCHANGED_TOTAL).increment(1);
            return;
        }
        let mut interest = self
            .endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let wanted = match (&interest.services, &service) {
            (Some(set), Some(svc)) => set.contains(svc),
            _ => true,
        };
        if wanted {
            drop(interest);
            self.changed.notify_one();
        } else if let Some(svc) = service {
            interest.skipped.insert(svc);
            counter!(aether_proxy::telemetry::ENDPOINT_EVENTS_IGNORED_TOTAL).increment(1);
        }
    }

    /// Records what the outcome just published depends on. A slice event skipped
    /// while that reconcile ran may belong to a Service it has just started to depend
    /// on (a route added meanwhile): then another reconcile is signalled.
    pub fn set_endpoint_interest(&self, services: BTreeSet<ObjectKey>) {
        let mut interest = self
            .endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = interest.skipped.len();
        interest.skipped.retain(|s| !services.contains(s));
        let missed = interest.skipped.len() != before;
        interest.services = Some(services);
        drop(interest);
        if missed {
            self.changed.notify_one();
        }
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
    /// For an EndpointSlice, its Service: its events signal a reconcile only when
    /// the last outcome depends on that Service.
    fn endpoints_of(&self) -> Option<Option<ObjectKey>> {
        None
    }
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

/// A Gateway as watched: the typed object and the fields its type lacks, both read
/// from one raw object (typed deserialization alone would drop them).
#[derive(Clone, Debug)]
struct RawGateway {
    gateway: Gateway,
    ext: GatewayExt,
}

impl<'de> Deserialize<'de> for RawGateway {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(d)?;
        let ext = GatewayExt::from_raw(&raw);
        let gateway = serde_json::from_value(raw).map_err(serde::de::Error::custom)?;
        Ok(Self { gateway, ext })
    }
}

impl Resource for RawGateway {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Gateway::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Gateway::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Gateway::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Gateway::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.gateway.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.gateway.metadata
    }
}

impl Kind for RawGateway {
    fn object(self) -> Object {
        Object::Gateway(Box::new(self.gateway), self.ext)
    }
    fn clear(store: &mut Store) {
        store.gateways.clear();
        store.gateway_ext.clear();
    }
    fn remove(store: &mut Store, meta: &ObjectMeta) {
        let key = ObjectKey::of(meta);
        store.gateway_ext.remove(&key);
        store.gateways.remove(&key);
    }
}

/// An HTTPRoute as watched, with its experimental fields (see `route_ext`).
#[derive(Clone, Debug)]
struct RawHttpRoute {
    route: HttpRoute,
    ext: HttpRouteExt,
}

impl<'de> Deserialize<'de> for RawHttpRoute {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(d)?;
        let ext = HttpRouteExt::from_raw(&raw);
        let route = serde_json::from_value(raw).map_err(serde::de::Error::custom)?;
        Ok(Self { route, ext })
    }
}

impl Resource for RawHttpRoute {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        HttpRoute::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        HttpRoute::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        HttpRoute::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        HttpRoute::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.route.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.route.metadata
    }
}

impl Kind for RawHttpRoute {
    fn object(self) -> Object {
        Object::HttpRoute(Box::new(RouteObject::from(self.route)), self.ext)
    }
    fn clear(store: &mut Store) {
        store.http_routes.clear();
        store.http_route_ext.clear();
    }
    fn remove(store: &mut Store, meta: &ObjectMeta) {
        let key = ObjectKey::of(meta);
        store.http_route_ext.remove(&key);
        store.http_routes.remove(&key);
    }
}

impl Kind for GrpcRoute {
    fn object(self) -> Object {
        match to_http_route(&self) {
            Ok(r) => Object::GrpcRoute(Box::new(RouteObject::from(r))),
            // Unreachable for an object that deserialized as a GRPCRoute; keep the
            // route visible rather than drop it silently.
            Err(e) => {
                tracing::warn!(route = %ObjectKey::of(&self.metadata), error = %e, "cannot convert a GRPCRoute");
                Object::GrpcRoute(Box::default())
            }
        }
    }
    fn clear(store: &mut Store) {
        store.grpc_routes.clear();
    }
    fn remove(store: &mut Store, meta: &ObjectMeta) {
        store.grpc_routes.remove(&ObjectKey::of(meta));
    }
}
namespaced!(ReferenceGrant, ReferenceGrant, reference_grants);
namespaced!(ListenerSet, ListenerSet, listener_sets);
namespaced!(Service, Service, services);

impl Kind for EndpointSlice {
    fn object(self) -> Object {
        Object::EndpointSlice(Box::new(self))
    }
    fn clear(store: &mut Store) {
        store.endpoint_slices.clear();
    }
    fn remove(store: &mut Store, meta: &ObjectMeta) {
        store.endpoint_slices.remove(&ObjectKey::of(meta));
    }
    fn endpoints_of(&self) -> Option<Option<ObjectKey>> {
        let service = self
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::reconcile::edge_slices::LABEL_SERVICE_NAME));
        let namespace = self.metadata.namespace.as_deref();
        Some(
            service.map(|name| {
                ObjectKey::new(namespace.unwrap_or(crate::store::DEFAULT_NAMESPACE), name)
            }),
        )
    }
}
impl Kind for Secret {
    fn object(self) -> Object {
        Object::Secret(Box::new(self))
    }
    fn clear(store: &mut Store) {
        store.secrets.clear();
        store.oversized_secrets.clear();
    }
    fn remove(store: &mut Store, meta: &ObjectMeta) {
        store.remove_secret(&ObjectKey::of(meta));
    }
}
namespaced!(ConfigMap, ConfigMap, config_maps);
namespaced!(Pod, Pod, pods);
namespaced!(BackendTlsPolicy, BackendTlsPolicy, backend_tls_policies);
/// Objects made for dedicated Gateways: only their metadata is stored.
macro_rules! owned {
    ($ty:ty, $kind:ident) => {
        impl Kind for $ty {
            fn object(self) -> Object {
                Object::Owned(OwnedKind::$kind, Box::new(self.metadata))
            }
            fn clear(store: &mut Store) {
                crate::store::retain_keys(&mut store.owned, |(k, _)| *k != OwnedKind::$kind);
            }
            fn remove(store: &mut Store, meta: &ObjectMeta) {
                store.owned.remove(&(OwnedKind::$kind, ObjectKey::of(meta)));
            }
        }
    };
}

owned!(Deployment, Deployment);
owned!(PodDisruptionBudget, PodDisruptionBudget);

/// TCPRoute, UDPRoute and TLSRoute at `gateway.networking.k8s.io/v1`, read into the
/// one L4 route type (the gateway-api crate has no v1 types for them).
macro_rules! l4_kind {
    ($name:ident, $kind:literal, $plural:literal, $variant:ident) => {
        #[derive(Clone, Debug, Deserialize)]
        #[serde(transparent)]
        struct $name(L4Route);

        impl Resource for $name {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("gateway.networking.k8s.io")
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("v1")
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.0.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.0.metadata
            }
        }

        impl Kind for $name {
            fn object(self) -> Object {
                Object::L4Route(Box::new(self.0))
            }
            fn clear(store: &mut Store) {
                crate::store::retain_keys(&mut store.l4_routes, |(k, _)| *k != L4Kind::$variant);
            }
            fn remove(store: &mut Store, meta: &ObjectMeta) {
                store
                    .l4_routes
                    .remove(&(L4Kind::$variant, ObjectKey::of(meta)));
            }
        }
    };
}

l4_kind!(TcpRouteV1, "TCPRoute", "tcproutes", Tcp);
l4_kind!(UdpRouteV1, "UDPRoute", "udproutes", Udp);
l4_kind!(TlsRouteV1, "TLSRoute", "tlsroutes", Tls);

/// What to watch beyond the Gateway API kinds, Services, EndpointSlices, Namespaces,
/// ConfigMaps and TLS Secrets. Each is off unless needed, so a setup without it needs
/// no RBAC for it.
#[derive(Debug, Clone, Default)]
pub struct Extra {
    /// Mesh mode's pod identities.
    pub pods: bool,
    /// The namespace of dedicated Gateways' Deployments and PodDisruptionBudgets
    /// (ours, by label).
    pub deployments: Option<String>,
}

/// Starts one watch per kind, cluster-wide. Secrets are limited to `kubernetes.io/tls`
/// by a field selector, so the cache never holds the cluster's other Secrets.
pub fn spawn(client: &Client, shared: &Arc<Shared>, extra: &Extra) {
    let all = watcher::Config::default();
    // Each `start` counts its watch in; this extra one holds the count above zero
    // until every watch is counted, so a fast first list can't declare the Store
    // synced early. (A hand-kept total went stale when two kinds were added at once.)
    shared.pending.store(1, Ordering::Release);
    start::<GatewayClass>(Api::all(client.clone()), all.clone(), shared);
    start::<RawGateway>(Api::all(client.clone()), all.clone(), shared);
    start::<RawHttpRoute>(Api::all(client.clone()), all.clone(), shared);
    start::<GrpcRoute>(Api::all(client.clone()), all.clone(), shared);
    start::<TcpRouteV1>(Api::all(client.clone()), all.clone(), shared);
    start::<UdpRouteV1>(Api::all(client.clone()), all.clone(), shared);
    start::<TlsRouteV1>(Api::all(client.clone()), all.clone(), shared);
    start::<ReferenceGrant>(Api::all(client.clone()), all.clone(), shared);
    start::<ListenerSet>(Api::all(client.clone()), all.clone(), shared);
    // BackendTLSPolicy (standard since v1.4); a cluster without its CRD lists it empty.
    start::<BackendTlsPolicy>(Api::all(client.clone()), all.clone(), shared);
    start::<Service>(Api::all(client.clone()), all.clone(), shared);
    start::<EndpointSlice>(Api::all(client.clone()), all.clone(), shared);
    start::<Namespace>(Api::all(client.clone()), all.clone(), shared);
    // Every ConfigMap is listed (a CA bundle can't be told apart by a selector), but
    // the Store keeps only their `ca.crt`.
    start::<ConfigMap>(Api::all(client.clone()), all.clone(), shared);
    if extra.pods {
        // Mesh mode's pod identities; the Store trims each Pod to its service account.
        start::<Pod>(Api::all(client.clone()), all.clone(), shared);
    }
    if let Some(ns) = &extra.deployments {
        let ours = format!(
            "{}={}",
            crate::reconcile::services::LABEL_MANAGED_BY,
            crate::reconcile::services::MANAGED_BY
        );
        start::<Deployment>(
            Api::namespaced(client.clone(), ns),
            all.clone().labels(&ours),
            shared,
        );
        start::<PodDisruptionBudget>(
            Api::namespaced(client.clone(), ns),
            all.clone().labels(&ours),
            shared,
        );
    }
    start::<Secret>(
        Api::all(client.clone()),
        all.fields("type=kubernetes.io/tls"),
        shared,
    );
    if shared.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
        // Every watch listed before the last one was counted in.
        tracing::info!("every watch has listed once; reconciling");
        shared.changed.notify_one();
    }
}

fn start<K: Kind>(api: Api<K>, config: watcher::Config, shared: &Arc<Shared>) {
    shared.pending.fetch_add(1, Ordering::AcqRel);
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let kind = K::kind(&());
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut relist: Vec<K> = Vec::new();
        let mut first = true;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Apply(o)) => match o.endpoints_of() {
                    Some(service) => shared.update_endpoints(service, |s| s.apply(o.object())),
                    None => shared.apply(|s| s.apply(o.object())),
                },
                Ok(Event::Delete(o)) => match o.endpoints_of() {
                    Some(service) => shared.update_endpoints(service, |s| {
                        K::remove(s, o.meta());
                        true
                    }),
                    None => shared.update(|s| K::remove(s, o.meta())),
                },
                Ok(Event::Init) => relist.clear(),
                Ok(Event::InitApply(mut o)) => {
                    // The whole list is held until it ends: keep it lean meanwhile.
                    crate::compact::drop_bookkeeping(o.meta_mut());
                    relist.push(o);
                }
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
                // A kind whose CRD is not installed (an older Gateway API release) must
                // not hold up every other kind: it counts as listed, empty, and the
                // watch keeps retrying, so installing the CRD later brings its objects.
                Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.code == 404 => {
                    if std::mem::take(&mut first) {
                        tracing::warn!(%kind, "this kind is not served (CRD not installed?); its objects are ignored until it is");
                        if shared.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                            tracing::info!("every watch has listed once; reconciling");
                            shared.changed.notify_one();
                        }
                    }
                }
                // The stream retries with backoff; say why, once per failure.
                Err(e) => tracing::warn!(%kind, error = %e, "watch failed; retrying"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn signalled(shared: &Shared) -> bool {
        tokio::time::timeout(Duration::from_millis(20), shared.changed.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn slice_events_signal_only_for_services_the_outcome_depends_on() {
        let shared = Shared::default();
        let (a, b) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"));
        // Before the first outcome everything counts.
        shared.update_endpoints(Some(b.clone()), |_| true);
        assert!(signalled(&shared).await);

        shared.set_endpoint_interest(BTreeSet::from([a.clone()]));
        assert!(!signalled(&shared).await);
        shared.update_endpoints(Some(b.clone()), |_| true);
        assert!(!signalled(&shared).await, "b is not depended on");
        shared.update_endpoints(Some(a.clone()), |_| true);
        assert!(signalled(&shared).await);
        // A slice without a Service label can't be told apart: it counts.
        shared.update_endpoints(None, |_| true);
        assert!(signalled(&shared).await);

        // The next outcome depends on b, whose event was skipped: reconcile again.
        shared.set_endpoint_interest(BTreeSet::from([a.clone(), b.clone()]));
        assert!(signalled(&shared).await);
        shared.set_endpoint_interest(BTreeSet::from([a, b]));
        assert!(!signalled(&shared).await, "nothing skipped any more");
    }

    /// An event that leaves the Store as it was signals nothing: a Pod's status, a
    /// ConfigMap's other data or labels, a new resourceVersion.
    #[tokio::test]
    async fn events_that_change_nothing_kept_signal_no_reconcile() {
        let shared = Shared::default();
        let pod = |phase: &str, version: &str| {
            let mut pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "resourceVersion": version},
                "spec": {"serviceAccountName": "sa", "containers": []},
                "status": {"phase": phase}
            }))
            .expect("a Pod");
            pod.metadata.labels = Some([("v".to_owned(), version.to_owned())].into());
            pod
        };
        let config_map = |ca: &str, other: &str| {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "ca", "namespace": "ns", "resourceVersion": other},
                "data": {"ca.crt": ca, "other": other}
            }))
            .expect("a ConfigMap");
            cm
        };
        shared.apply(|s| s.apply(pod("Pending", "1").object()));
        assert!(signalled(&shared).await, "a new Pod");
        shared.apply(|s| s.apply(pod("Running", "2").object()));
        assert!(
            !signalled(&shared).await,
            "only its status and labels changed"
        );
        shared.apply(|s| s.apply(config_map("a", "1").object()));
        assert!(signalled(&shared).await, "a new ConfigMap");
        shared.apply(|s| s.apply(config_map("a", "2").object()));
        assert!(!signalled(&shared).await, "only data never read changed");
        shared.apply(|s| s.apply(config_map("b", "2").object()));
        assert!(signalled(&shared).await, "its CA bundle changed");
    }
}
