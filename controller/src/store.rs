//! The typed objects the reconciler reads. Both sources (manifest files, and later the
//! Kubernetes watches) fill the same Store, so everything downstream is identical.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::listenersets::ListenerSet;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, PodSpec, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::compact::{RouteObject, StoredRoute};
use crate::gateway_ext::GatewayExt;
use crate::l4route::{L4Kind, L4Route};
use crate::route_ext::HttpRouteExt;

/// `namespace/name` of a namespaced object (an empty namespace for the cluster-scoped
/// GatewayClass and Namespace). The reconciler copies keys into every map that
/// remembers something per object, on every run: a route's key is in a dozen maps and
/// lists (the Store, the route memo and its indexes, both status maps, placements,
/// actions), so a key is one thin pointer, and a copy one count increment.
///
/// What it points to holds the text `namespace/name`, which is also the name routes
/// and Gateways carry into the Snapshot ([`Self::joined`]), and where the namespace
/// ends: two allocations per key where a pair of names, and the joined name beside
/// it, were three (benches/RESULTS.md, issue 14, session 32). The text alone, as an
/// `Arc<str>`, would be one allocation but a pointer twice as wide in every copy.
///
/// Keys copied from one another share their text, and the reconciler compares such
/// copies on every run (its memos against the Store): equal pointers answer without
/// reading the text. Ordered and hashed as the pair (namespace, name), as
/// [`KeyParts`] is.
#[derive(Clone)]
pub struct ObjectKey(Arc<KeyText>);

struct KeyText {
    joined: Arc<str>,
    /// Where the namespace ends, at the `/`.
    split: u32,
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectKey")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .finish()
    }
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.split == other.0.split && self.0.joined == other.0.joined)
    }
}

impl Eq for ObjectKey {}

/// By content, as equality is (shared pointers are only a shortcut to it).
impl std::hash::Hash for ObjectKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.namespace().hash(state);
        self.name().hash(state);
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl ObjectKey {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        let namespace = namespace.as_ref();
        Self(Arc::new(KeyText {
            joined: joined(namespace, name.as_ref()),
            // Namespaces are DNS labels (63 bytes); one past u32 would only misplace
            // the split of a key that names no object.
            split: u32::try_from(namespace.len()).unwrap_or(u32::MAX),
        }))
    }

    pub fn namespace(&self) -> &str {
        self.parts().0
    }

    pub fn name(&self) -> &str {
        self.parts().1
    }

    /// `namespace/name`, borrowed.
    pub fn as_str(&self) -> &str {
        &self.0.joined
    }

    /// `namespace/name` as one shared string (the name routes and Gateways carry into
    /// the Snapshot): the key's own text, so no allocation.
    pub fn joined(&self) -> Arc<str> {
        Arc::clone(&self.0.joined)
    }

    /// The key of a namespaced object; objects without a namespace live in `default`,
    /// as `kubectl apply` would put them.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

/// `namespace/name`, allocated once: through a `String` it was two allocations and a
/// copy (a first load of 10,000 routes makes tens of thousands of keys).
fn joined(namespace: &str, name: &str) -> Arc<str> {
    const ON_STACK: usize = 256;
    let len = namespace.len() + 1 + name.len();
    if len <= ON_STACK {
        let mut text = [0; ON_STACK];
        text[..namespace.len()].copy_from_slice(namespace.as_bytes());
        text[namespace.len()] = b'/';
        text[namespace.len() + 1..len].copy_from_slice(name.as_bytes());
        if let Ok(text) = std::str::from_utf8(&text[..len]) {
            return Arc::from(text);
        }
    }
    Arc::from([namespace, "/", name].concat())
}

/// A key's two strings, borrowed: maps keyed by [`ObjectKey`] are searched with
/// `&(namespace, name) as &dyn KeyParts` without building (allocating) a key, and the
/// key found can be cloned for its shared strings. Ordered, compared and hashed as
/// `ObjectKey` is, as `Borrow` requires.
pub trait KeyParts {
    fn parts(&self) -> (&str, &str);
}

impl KeyParts for ObjectKey {
    fn parts(&self) -> (&str, &str) {
        let text = &*self.0.joined;
        let split = self.0.split as usize;
        // Always there, as `new` made it; an empty name rather than a panic otherwise.
        match (text.get(..split), text.get(split + 1..)) {
            (Some(namespace), Some(name)) => (namespace, name),
            _ => (text, ""),
        }
    }
}

impl KeyParts for (&str, &str) {
    fn parts(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn KeyParts + 'a> for ObjectKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl Ord for dyn KeyParts + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for dyn KeyParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::hash::Hash for dyn KeyParts + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (namespace, name) = self.parts();
        namespace.hash(state);
        name.hash(state);
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub const DEFAULT_NAMESPACE: &str = "default";

/// Which object: its kind and `namespace/name` (an empty namespace for the
/// cluster-scoped GatewayClass and Namespace). What a source needs to withdraw an
/// object it no longer declares.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    pub kind: &'static str,
    pub key: ObjectKey,
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.key)
    }
}

/// The ConfigMap key holding a PEM CA bundle, as the Gateway API names it.
pub const CA_BUNDLE_KEY: &str = "ca.crt";

/// One object of a kind the reconciler understands.
#[derive(Debug, Clone)]
pub enum Object {
    GatewayClass(Box<GatewayClass>),
    /// The typed Gateway and the fields its type lacks.
    Gateway(Box<Gateway>, GatewayExt),
    /// An HTTPRoute as the Store keeps it, and the experimental fields its type lacks.
    HttpRoute(Box<RouteObject>, HttpRouteExt),
    /// A GRPCRoute in its HTTPRoute form (see `grpc_route`).
    GrpcRoute(Box<RouteObject>),
    ReferenceGrant(Box<ReferenceGrant>),
    ListenerSet(Box<ListenerSet>),
    Secret(Box<Secret>),
    ConfigMap(Box<ConfigMap>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Namespace(Box<Namespace>),
    /// TCPRoute, UDPRoute or TLSRoute.
    L4Route(Box<L4Route>),
    /// Kept trimmed to name, namespace and service account: mesh mode needs only a
    /// pod's workload identity.
    Pod(Box<Pod>),
    BackendTlsPolicy(Box<BackendTlsPolicy>),
    /// An object the controller makes for dedicated Gateways, kept as metadata only:
    /// it needs to know which exist (to delete those no longer wanted), not their specs.
    Owned(OwnedKind, Box<ObjectMeta>),
}

/// Kinds of [`Object::Owned`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnedKind {
    Deployment,
    PodDisruptionBudget,
}

impl OwnedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnedKind::Deployment => "Deployment",
            OwnedKind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }
}

impl Object {
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Object::GatewayClass(o) => &o.metadata,
            Object::Gateway(o, _) => &o.metadata,
            Object::HttpRoute(o, _) => &o.metadata,
            Object::GrpcRoute(o) => &o.metadata,
            Object::ReferenceGrant(o) => &o.metadata,
            Object::ListenerSet(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::L4Route(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::BackendTlsPolicy(o) => &o.metadata,
            Object::Owned(_, meta) => meta,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::GatewayClass(o) => &mut o.metadata,
            Object::Gateway(o, _) => &mut o.metadata,
            Object::HttpRoute(o, _) => &mut o.metadata,
            Object::GrpcRoute(o) => &mut o.metadata,
            Object::ReferenceGrant(o) => &mut o.metadata,
            Object::ListenerSet(o) => &mut o.metadata,
            Object::Secret(o) => &mut o.metadata,
            Object::ConfigMap(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::EndpointSlice(o) => &mut o.metadata,
            Object::Namespace(o) => &mut o.metadata,
            Object::L4Route(o) => &mut o.metadata,
            Object::Pod(o) => &mut o.metadata,
            Object::BackendTlsPolicy(o) => &mut o.metadata,
            Object::Owned(_, meta) => meta,
        }
    }

    /// The object's identity, with the namespace defaulted as [`Store::apply`] does
    /// (cluster-scoped objects have none).
    pub fn id(&self) -> ObjectId {
        let meta = self.meta();
        let namespace = match self {
            Object::GatewayClass(_) | Object::Namespace(_) => "",
            _ => meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE),
        };
        ObjectId {
            kind: self.kind(),
            key: ObjectKey::new(namespace, meta.name.as_deref().unwrap_or_default()),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Object::GatewayClass(_) => "GatewayClass",
            Object::Gateway(..) => "Gateway",
            Object::HttpRoute(..) => "HTTPRoute",
            Object::GrpcRoute(_) => "GRPCRoute",
            Object::ReferenceGrant(_) => "ReferenceGrant",
            Object::ListenerSet(_) => "ListenerSet",
            Object::Secret(_) => "Secret",
            Object::ConfigMap(_) => "ConfigMap",
            Object::Service(_) => "Service",
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::Namespace(_) => "Namespace",
            Object::L4Route(o) => o.kind.as_str(),
            Object::Pod(_) => "Pod",
            Object::BackendTlsPolicy(_) => "BackendTLSPolicy",
            Object::Owned(kind, _) => kind.as_str(),
        }
    }
}

/// The Store's maps: persistent, so a copy of the Store costs O(1) and what changed
/// between two copies is found by a diff that skips the subtrees they share.
pub type Map<K, V> = imbl::OrdMap<K, V>;

/// Keeps the entries whose key `keep` accepts (`imbl` maps have no `retain`).
pub fn retain_keys<K: Ord + Clone, V: Clone>(map: &mut Map<K, V>, keep: impl Fn(&K) -> bool) {
    let gone: Vec<K> = map.keys().filter(|k| !keep(k)).cloned().collect();
    for k in gone {
        map.remove(&k);
    }
}

/// `map` rebuilt with its leaves full. `imbl` splits a full node in the middle, so keys
/// inserted in order (a first load, a file of new routes) leave every node half empty,
/// and its `FromIterator` inserts one by one. Every other key first and then the rest
/// fills each leaf's gaps exactly (a leaf of 16 holds 8 keys that span 16). A copy of
/// the map that shares nothing with `map`: for after a batch, not per change.
pub fn packed<K: Ord + Clone, V: Clone>(map: &Map<K, V>) -> Map<K, V> {
    let mut out = Map::new();
    for (k, v) in map.iter().step_by(2).chain(map.iter().skip(1).step_by(2)) {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// Repacks `map` (see [`packed`]) if it grew by more than a quarter since it had
/// `before` entries.
pub fn repack_grown<K: Ord + Clone, V: Clone>(map: &mut Map<K, V>, before: usize) {
    if map.len() > before + before / 4 + 64 {
        *map = packed(map);
    }
}

/// `route` as the Store keeps it, sharing its list of parents with the version it
/// replaces or the route beside it when they list the same: routes in a namespace
/// usually attach to the same Gateways.
fn stored(
    routes: &Map<ObjectKey, Arc<StoredRoute>>,
    key: &ObjectKey,
    mut route: StoredRoute,
) -> StoredRoute {
    for (_, near) in routes.get_prev(key).into_iter().chain(routes.get_next(key)) {
        route.share_parents(near);
        route.share_backend_names(near);
    }
    route
}

/// Objects are kept by `Arc`: a copy of the Store (the Kubernetes source takes one per
/// reconcile) shares them, and the incremental reconciler tells an unchanged object
/// from a replaced one by pointer.
#[derive(Debug, Default, Clone)]
pub struct Store {
    pub gateway_classes: Map<String, Arc<GatewayClass>>,
    pub gateways: Map<ObjectKey, Arc<Gateway>>,
    /// Per Gateway, what its typed form can't hold (see `gateway_ext`).
    pub gateway_ext: Map<ObjectKey, GatewayExt>,
    pub http_routes: Map<ObjectKey, Arc<StoredRoute>>,
    /// Per HTTPRoute that has any, its experimental fields (see `route_ext`).
    pub http_route_ext: Map<ObjectKey, HttpRouteExt>,
    /// GRPCRoutes, in their HTTPRoute form.
    pub grpc_routes: Map<ObjectKey, Arc<StoredRoute>>,
    pub reference_grants: Map<ObjectKey, Arc<ReferenceGrant>>,
    /// Extra listeners for Gateways that allow them (GEP-1713).
    pub listener_sets: Map<ObjectKey, Arc<ListenerSet>>,
    /// Secrets trimmed to their TLS fields (see `tls_secret`).
    pub secrets: Map<ObjectKey, Arc<Secret>>,
    /// Secrets whose TLS fields were over the size cap (kept without data), and why.
    pub oversized_secrets: Map<ObjectKey, String>,
    /// ConfigMaps, holding only their `ca.crt` (frontend TLS validation CA bundles).
    pub config_maps: Map<ObjectKey, Arc<ConfigMap>>,
    pub services: Map<ObjectKey, Arc<Service>>,
    pub endpoint_slices: Map<ObjectKey, Arc<EndpointSlice>>,
    pub namespaces: Map<String, Arc<Namespace>>,
    /// TCPRoutes, UDPRoutes and TLSRoutes, by kind then `namespace/name`.
    pub l4_routes: Map<(L4Kind, ObjectKey), Arc<L4Route>>,
    pub pods: Map<ObjectKey, Arc<Pod>>,
    pub backend_tls_policies: Map<ObjectKey, Arc<BackendTlsPolicy>>,
    /// Dedicated Gateways' Deployments and PodDisruptionBudgets (metadata only:
    /// name, namespace, labels), in Kubernetes mode.
    pub owned: Map<(OwnedKind, ObjectKey), ObjectMeta>,
    /// Per Gateway, why the API server refused to write what the controller creates for
    /// it (Kubernetes mode: set by the Service applier, not by a watch; see
    /// `kube::apply_errors`). The reconcile reports it in the Gateway's status.
    pub apply_failures: Map<ObjectKey, String>,
}

impl Store {
    pub fn from_objects(objects: impl IntoIterator<Item = Object>) -> Self {
        let mut store = Self::default();
        for o in objects {
            store.apply(o);
        }
        store
    }

    /// Inserts or replaces an object; true unless an equal object was already there.
    /// Namespaced objects without a namespace are put in `default`, so later lookups
    /// never see a missing namespace.
    pub fn apply(&mut self, object: Object) -> bool {
        self.apply_keyed(object, None)
    }

    /// [`Self::apply`] with the object's id as a source keeps it (see
    /// [`Object::id_in`]): the Store's key shares that id's strings instead of holding
    /// a copy of the name (one allocation per route a file declares).
    pub fn apply_as(&mut self, object: Object, id: &ObjectId) -> bool {
        self.apply_keyed(object, Some(&id.key))
    }

    fn apply_keyed(&mut self, mut object: Object, known: Option<&ObjectKey>) -> bool {
        /// Stores `value`; true if it differs from what was there.
        fn put<K: Ord + Clone, V: PartialEq + Clone>(
            map: &mut Map<K, V>,
            key: K,
            value: V,
        ) -> bool {
            match map.get_mut(&key) {
                Some(old) if *old == value => false,
                Some(old) => {
                    *old = value;
                    true
                }
                None => {
                    map.insert(key, value);
                    true
                }
            }
        }
        let defaulted = |meta: &mut ObjectMeta| -> ObjectKey {
            let namespace = meta
                .namespace
                .get_or_insert_with(|| DEFAULT_NAMESPACE.to_owned());
            let name = meta.name.as_deref().unwrap_or_default();
            if let Some(key) = known.filter(|k| *k.namespace() == **namespace && *k.name() == *name)
            {
                return key.clone();
            }
            ObjectKey::new(namespace, name)
        };
        crate::compact::drop_bookkeeping(object.meta_mut());
        match object {
            Object::GatewayClass(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                put(&mut self.gateway_classes, name, Arc::new(*o))
            }
            Object::Gateway(mut o, ext) => {
                let key = defaulted(&mut o.metadata);
                let ext_changed = put(&mut self.gateway_ext, key.clone(), ext);
                put(&mut self.gateways, key, Arc::new(*o)) | ext_changed
            }
            Object::HttpRoute(mut o, ext) => {
                let key = defaulted(&mut o.metadata);
                let ext_changed = if ext.is_empty() {
                    self.http_route_ext.remove(&key).is_some()
                } else {
                    put(&mut self.http_route_ext, key.clone(), ext)
                };
                let route = stored(&self.http_routes, &key, o.route);
                put(&mut self.http_routes, key, Arc::new(route)) | ext_changed
            }
            Object::GrpcRoute(mut o) => {
                let key = defaulted(&mut o.metadata);
                let route = stored(&self.grpc_routes, &key, o.route);
                put(&mut self.grpc_routes, key, Arc::new(route))
            }
            Object::ReferenceGrant(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.reference_grants, key, Arc::new(*o))
            }
            Object::ListenerSet(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.listener_sets, key, Arc::new(*o))
            }
            Object::Secret(mut o) => {
                let key = defaulted(&mut o.metadata);
                let (kept, too_large) = crate::tls_secret::trim(*o);
                let size_changed = match too_large {
                    Some(why) => put(&mut self.oversized_secrets, key.clone(), why),
                    None => self.oversized_secrets.remove(&key).is_some(),
                };
                put(&mut self.secrets, key, Arc::new(kept)) | size_changed
            }
            Object::ConfigMap(mut o) => {
                let key = defaulted(&mut o.metadata);
                // Only CA bundles are ever read (the key names the object), and the
                // cluster's every ConfigMap is watched: an update that leaves the
                // bundle as it was (a new resourceVersion, a label, another key) must
                // be no change at all, and the rest costs memory for nothing.
                if let Some(data) = o.data.as_mut() {
                    data.retain(|k, _| k == CA_BUNDLE_KEY);
                }
                o.binary_data = None;
                o.immutable = None;
                o.metadata = ObjectMeta::default();
                put(&mut self.config_maps, key, Arc::new(*o))
            }
            Object::Service(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.services, key, Arc::new(*o))
            }
            Object::EndpointSlice(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.endpoint_slices, key, Arc::new(*o))
            }
            Object::Namespace(o) => {
                // Only its labels are read (namespace selectors): an update of anything
                // else (annotations, its phase, a resourceVersion) is no change.
                let name = o.metadata.name.clone().unwrap_or_default();
                let kept = Namespace {
                    metadata: ObjectMeta {
                        name: o.metadata.name,
                        labels: o.metadata.labels,
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                };
                put(&mut self.namespaces, name, Arc::new(kept))
            }
            Object::L4Route(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.l4_routes, (o.kind, key), Arc::new(*o))
            }
            Object::Pod(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.pods, key, Arc::new(trimmed(*o)))
            }
            Object::Owned(kind, mut meta) => {
                let key = defaulted(&mut meta);
                let kept = ObjectMeta {
                    name: meta.name.take(),
                    namespace: meta.namespace.take(),
                    labels: meta.labels.take(),
                    ..ObjectMeta::default()
                };
                put(&mut self.owned, (kind, key), kept)
            }
            Object::BackendTlsPolicy(mut o) => {
                let key = defaulted(&mut o.metadata);
                put(&mut self.backend_tls_policies, key, Arc::new(*o))
            }
        }
    }

    /// How many routes of each kind the Store holds, for [`Self::repack_grown`].
    pub fn route_counts(&self) -> [usize; 3] {
        [
            self.http_routes.len(),
            self.grpc_routes.len(),
            self.l4_routes.len(),
        ]
    }

    /// Repacks the route maps that grew by more than a quarter since they held
    /// `before` (see [`packed`]): a source calls it after a batch (a load of files).
    pub fn repack_grown(&mut self, before: [usize; 3]) {
        repack_grown(&mut self.http_routes, before[0]);
        repack_grown(&mut self.grpc_routes, before[1]);
        repack_grown(&mut self.l4_routes, before[2]);
    }

    /// Is the object `id` names here?
    pub fn contains(&self, id: &ObjectId) -> bool {
        let key = &id.key;
        match id.kind {
            "GatewayClass" => self.gateway_classes.contains_key(key.name()),
            "Gateway" => self.gateways.contains_key(key),
            "HTTPRoute" => self.http_routes.contains_key(key),
            "GRPCRoute" => self.grpc_routes.contains_key(key),
            "ReferenceGrant" => self.reference_grants.contains_key(key),
            "ListenerSet" => self.listener_sets.contains_key(key),
            "Secret" => self.secrets.contains_key(key),
            "ConfigMap" => self.config_maps.contains_key(key),
            "Service" => self.services.contains_key(key),
            "EndpointSlice" => self.endpoint_slices.contains_key(key),
            "Namespace" => self.namespaces.contains_key(key.name()),
            "Pod" => self.pods.contains_key(key),
            "BackendTLSPolicy" => self.backend_tls_policies.contains_key(key),
            kind => {
                if let Some(l4) = L4Kind::from_kind(kind) {
                    return self.l4_routes.contains_key(&(l4, key.clone()));
                }
                let owned = [OwnedKind::Deployment, OwnedKind::PodDisruptionBudget]
                    .into_iter()
                    .find(|o| o.as_str() == kind);
                owned.is_some_and(|o| self.owned.contains_key(&(o, key.clone())))
            }
        }
    }

    /// Removes the object `id` names, and what is kept beside it; true if it was there.
    pub fn remove(&mut self, id: &ObjectId) -> bool {
        let key = &id.key;
        match id.kind {
            "GatewayClass" => self.gateway_classes.remove(key.name()).is_some(),
            "Gateway" => {
                self.gateway_ext.remove(key);
                self.gateways.remove(key).is_some()
            }
            "HTTPRoute" => {
                self.http_route_ext.remove(key);
                self.http_routes.remove(key).is_some()
            }
            "GRPCRoute" => self.grpc_routes.remove(key).is_some(),
            "ReferenceGrant" => self.reference_grants.remove(key).is_some(),
            "ListenerSet" => self.listener_sets.remove(key).is_some(),
            "Secret" => {
                self.oversized_secrets.remove(key);
                self.secrets.remove(key).is_some()
            }
            "ConfigMap" => self.config_maps.remove(key).is_some(),
            "Service" => self.services.remove(key).is_some(),
            "EndpointSlice" => self.endpoint_slices.remove(key).is_some(),
            "Namespace" => self.namespaces.remove(key.name()).is_some(),
            "Pod" => self.pods.remove(key).is_some(),
            "BackendTLSPolicy" => self.backend_tls_policies.remove(key).is_some(),
            kind => {
                if let Some(l4) = L4Kind::from_kind(kind) {
                    return self.l4_routes.remove(&(l4, key.clone())).is_some();
                }
                let owned = [OwnedKind::Deployment, OwnedKind::PodDisruptionBudget]
                    .into_iter()
                    .find(|o| o.as_str() == kind);
                owned.is_some_and(|o| self.owned.remove(&(o, key.clone())).is_some())
            }
        }
    }

    /// Removes a Secret and what is known about it.
    pub fn remove_secret(&mut self, key: &ObjectKey) {
        self.secrets.remove(key);
        self.oversized_secrets.remove(key);
    }

    /// Does a ReferenceGrant in `to_namespace` let a `from_kind` in `from_namespace`
    /// refer to the `to_group`/`to_kind` object named `to_name`?
    pub fn reference_granted(
        &self,
        from_kind: &str,
        from_namespace: &str,
        to_group: &str,
        to_kind: &str,
        to_namespace: &str,
        to_name: &str,
    ) -> bool {
        self.reference_grants
            .range(ObjectKey::new(to_namespace, "")..)
            .take_while(|(k, _)| k.namespace() == to_namespace)
            .any(|(_, grant)| {
                let from_ok = grant.spec.from.iter().any(|f| {
                    f.group == "gateway.networking.k8s.io"
                        && f.kind == from_kind
                        && f.namespace == from_namespace
                });
                let to_ok = grant.spec.to.iter().any(|t| {
                    t.group == to_group
                        && t.kind == to_kind
                        && t.name.as_deref().is_none_or(|n| n == to_name)
                });
                from_ok && to_ok
            })
    }

    /// The mesh identity path `/ns/<ns>/sa/<serviceAccount>` of a known Pod.
    pub fn pod_identity(&self, key: &ObjectKey) -> Option<String> {
        let spec = self.pods.get(key)?.spec.as_ref();
        // The API server defaults an unset service account to `default`.
        let sa = spec
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        Some(format!("/ns/{}/sa/{sa}", key.namespace()))
    }

    /// Labels of a namespace; a namespace the Store has never seen has none except the
    /// well-known `kubernetes.io/metadata.name`, which the API server always sets.
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        let mut labels = self
            .namespaces
            .get(name)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        labels.insert("kubernetes.io/metadata.name".to_owned(), name.to_owned());
        labels
    }
}

/// What the Store keeps of a Pod: identity only, not the cluster's pod specs.
fn trimmed(pod: Pod) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name,
            namespace: pod.metadata.namespace,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            service_account_name: pod.spec.and_then(|s| s.service_account_name),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_reads_back_its_names_and_orders_as_the_pair() {
        let keys = [
            ObjectKey::new("a", "y"),
            ObjectKey::new("a-b", "x"),
            ObjectKey::new("", "class"),
            ObjectKey::new("a", "y-z"),
            ObjectKey::new("ab", "a"),
            ObjectKey::new("a", "y/z"),
        ];
        for key in &keys {
            assert_eq!(ObjectKey::new(key.namespace(), key.name()), *key, "{key:?}");
            assert_eq!(*key.joined(), format!("{}/{}", key.namespace(), key.name()));
        }
        assert_eq!((keys[5].namespace(), keys[5].name()), ("a", "y/z"));
        assert_eq!((keys[2].namespace(), keys[2].name()), ("", "class"));
        for a in &keys {
            for b in &keys {
                let pair = (a.namespace(), a.name()).cmp(&(b.namespace(), b.name()));
                assert_eq!(a.cmp(b), pair, "{a:?} against {b:?}");
                let parts: &dyn KeyParts = &(b.namespace(), b.name());
                let key: &dyn KeyParts = std::borrow::Borrow::borrow(a);
                assert_eq!(key.cmp(parts), pair, "{a:?} against {b:?}");
            }
        }
    }

    #[test]
    fn a_packed_map_holds_the_same_entries_in_order() {
        for n in [0, 1, 2, 15, 16, 17, 33, 1000, 5001] {
            let map: Map<u32, u32> = (0..n).map(|i| (i, i * 7)).collect();
            let packed = packed(&map);
            assert_eq!(packed, map, "{n} entries");
            assert!(packed.iter().map(|(k, _)| *k).eq(0..n), "{n} in order");
        }
        let mut grown: Map<u32, u32> = (0..100u32).map(|i| (i, i)).collect();
        repack_grown(&mut grown, 0);
        assert_eq!(grown.len(), 100);
    }
}
