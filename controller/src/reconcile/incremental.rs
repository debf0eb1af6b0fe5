//! The reconciler that keeps what it derived: a change costs what it touches.
//!
//! [`Reconciler::reconcile`] runs the same phases as a full reconcile, but each
//! expensive phase reuses what the last run derived from inputs that have not changed
//! since, telling changed objects from unchanged ones by diffs of the Store's
//! persistent maps and its `Arc`s:
//! - a route is compiled again only when it, or a Service or EndpointSlice its
//!   backendRefs resolved, changed (Pods, ReferenceGrants, BackendTLSPolicies and the
//!   ConfigMaps those policies name, which are rare and read from everywhere, make
//!   every route stale; see `route_memo`);
//! - a route's attachment (its status parents and the listeners it serves on) is
//!   reused while its model and the Gateway side (classes, Gateways, ListenerSets,
//!   Secrets, the ConfigMaps the Gateways' frontend validation names, Namespaces,
//!   ReferenceGrants) stand.
//!
//! A ConfigMap nothing names changes nothing: Kubernetes mode watches every ConfigMap
//! of the cluster (a CA bundle can't be told apart by a selector), and any of them
//! once made every route compile again.
//! - the Snapshot is the last one with the changed routes' virtual hosts rebuilt and
//!   patched in (see `translate::TranslateMemo`).
//!
//! A fresh `Reconciler` has nothing to reuse, so its first run *is* the full reconcile;
//! the property test in `incremental_tests` holds a long-lived one to a fresh one after
//! every step of random changes.

use std::collections::BTreeSet;
use std::sync::Arc;

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::listenersets::ListenerSet;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::backend::{BackendCache, BackendResolver};
use super::route_memo::RouteMemo;
use super::translate::TranslateMemo;
use super::{Addressing, Outcome, Settings};
use crate::store::{Map, ObjectKey, Store};
use imbl::ordmap::DiffItem;

/// A reconciler for one source's Store, reused across changes.
pub struct Reconciler {
    settings: Settings,
    addressing: Addressing,
    memo: Memo,
}

impl Reconciler {
    pub fn new(settings: Settings, addressing: Addressing) -> Self {
        Self {
            settings,
            addressing,
            memo: Memo::default(),
        }
    }

    /// Standalone mode: addresses from `settings.address_pool`.
    pub fn standalone(settings: Settings) -> Self {
        let addressing = Addressing::LocalPool(settings.address_pool);
        Self::new(settings, addressing)
    }

    /// The Outcome a full reconcile of `store` would give.
    pub fn reconcile(&mut self, store: &Store) -> Outcome {
        super::phases::run(store, &self.settings, &self.addressing, &mut self.memo)
    }
}

/// What one run keeps for the next.
#[derive(Default)]
pub(super) struct Memo {
    pub(super) routes: RouteMemo,
    backends: BackendCache,
    seen: Seen,
    pub(super) translate: TranslateMemo,
}

/// Counts of work a run did rather than reuse: what a change cost, for logs and
/// metrics (a full reconcile compiles and attaches every route).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Redone {
    /// HTTPRoutes and GRPCRoutes compiled again.
    pub compiled: usize,
    /// Routes whose attachment was decided again.
    pub attached: usize,
}

/// The inputs as the last run saw them. Holding the `Arc`s keeps those objects alive,
/// so an unchanged pointer really is the same object (no address reuse).
#[derive(Default)]
struct Seen {
    services: Map<ObjectKey, Arc<Service>>,
    slices: Map<ObjectKey, Arc<EndpointSlice>>,
    /// Everything else a route's compile may read.
    backend_side: Option<BackendSide>,
    /// Everything a route's attachment may read besides the route itself.
    gateway_side: Option<GatewaySide>,
}

#[derive(Clone)]
struct BackendSide {
    pods: Map<ObjectKey, Arc<Pod>>,
    grants: Map<ObjectKey, Arc<ReferenceGrant>>,
    policies: Map<ObjectKey, Arc<BackendTlsPolicy>>,
    /// The ConfigMaps the policies name (the set stands while the policies do).
    config_maps: Named<ConfigMap>,
}

impl BackendSide {
    fn of(store: &Store) -> Self {
        let named = store.backend_tls_policies.iter().flat_map(|(key, p)| {
            let refs = p.spec.validation.ca_certificate_refs.iter().flatten();
            refs.map(|r| ObjectKey::new(key.namespace(), r.name.as_str()))
        });
        Self {
            pods: store.pods.clone(),
            grants: store.reference_grants.clone(),
            policies: store.backend_tls_policies.clone(),
            config_maps: Named::of(&store.config_maps, named),
        }
    }

    fn same(&self, store: &Store) -> bool {
        same(&self.pods, &store.pods)
            && same(&self.grants, &store.reference_grants)
            && same(&self.policies, &store.backend_tls_policies)
            && self.config_maps.same(&store.config_maps)
    }
}

/// Some objects by key, as the Store had them (`None`: absent): only the keys a side's
/// objects name, as the cluster's others are never read by it (Kubernetes mode
/// watches every ConfigMap and every TLS Secret). Named by kind-blind references: a
/// reference of another kind adds a key that never matters.
struct Named<V>(Box<[(ObjectKey, Option<Arc<V>>)]>);

impl<V> Clone for Named<V> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<V> Named<V> {
    fn of(map: &Map<ObjectKey, Arc<V>>, named: impl Iterator<Item = ObjectKey>) -> Self {
        let keys: BTreeSet<ObjectKey> = named.collect();
        let with = |key: ObjectKey| {
            let object = map.get(&key).cloned();
            (key, object)
        };
        Self(keys.into_iter().map(with).collect())
    }

    fn same(&self, map: &Map<ObjectKey, Arc<V>>) -> bool {
        self.0.iter().all(|(key, seen)| match (seen, map.get(key)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        })
    }
}

#[derive(Clone)]
struct GatewaySide {
    classes: Map<String, Arc<GatewayClass>>,
    gateways: Map<ObjectKey, Arc<Gateway>>,
    gateway_ext: Map<ObjectKey, crate::gateway_ext::GatewayExt>,
    sets: Map<ObjectKey, Arc<ListenerSet>>,
    /// The Secrets the Gateways' and ListenerSets' listeners and the Gateways'
    /// backend client certificates name.
    secrets: Named<Secret>,
    oversized_secrets: Map<ObjectKey, String>,
    /// The ConfigMaps the Gateways' frontend validation names.
    config_maps: Named<ConfigMap>,
    /// The Namespaces, only while some listener admits routes or ListenerSets by a
    /// namespace selector: their labels are read for nothing else (a cluster's
    /// namespaces come and go with its workloads).
    namespaces: Option<Map<String, Arc<Namespace>>>,
    grants: Map<ObjectKey, Arc<ReferenceGrant>>,
}

impl GatewaySide {
    fn of(store: &Store) -> Self {
        Self {
            classes: store.gateway_classes.clone(),
            gateways: store.gateways.clone(),
            gateway_ext: store.gateway_ext.clone(),
            sets: store.listener_sets.clone(),
            secrets: Named::of(&store.secrets, secret_refs(store)),
            oversized_secrets: store.oversized_secrets.clone(),
            config_maps: Named::of(&store.config_maps, frontend_ca_refs(store)),
            namespaces: selects_namespaces(store).then(|| store.namespaces.clone()),
            grants: store.reference_grants.clone(),
        }
    }

    fn same(&self, store: &Store) -> bool {
        same(&self.classes, &store.gateway_classes)
            && same(&self.gateways, &store.gateways)
            && equal(&self.gateway_ext, &store.gateway_ext)
            && same(&self.sets, &store.listener_sets)
            && self.secrets.same(&store.secrets)
            && equal(&self.oversized_secrets, &store.oversized_secrets)
            && self.config_maps.same(&store.config_maps)
            && self
                .namespaces
                .as_ref()
                .is_none_or(|n| same(n, &store.namespaces))
            && same(&self.grants, &store.reference_grants)
    }
}

/// Does any Gateway or ListenerSet choose namespaces by their labels (`from: Selector`
/// in a listener's allowedRoutes or a Gateway's allowedListeners)? The answer stands
/// while those objects do, and the side compares them.
fn selects_namespaces(store: &Store) -> bool {
    use gateway_api::gateways::{
        GatewayAllowedListenersNamespacesFrom as GatewaySets,
        GatewayListenersAllowedRoutesNamespacesFrom as GatewayRoutes,
    };
    use gateway_api::listenersets::ListenerSetListenersAllowedRoutesNamespacesFrom as SetRoutes;
    let gateways = store.gateways.values().any(|gw| {
        let sets = gw.spec.allowed_listeners.as_ref();
        let sets = sets.and_then(|a| a.namespaces.as_ref()?.from.as_ref());
        matches!(sets, Some(GatewaySets::Selector))
            || gw.spec.listeners.iter().any(|l| {
                let from = l.allowed_routes.as_ref();
                let from = from.and_then(|a| a.namespaces.as_ref()?.from.as_ref());
                matches!(from, Some(GatewayRoutes::Selector))
            })
    });
    gateways
        || store.listener_sets.values().any(|set| {
            set.spec.listeners.iter().any(|l| {
                let from = l.allowed_routes.as_ref();
                let from = from.and_then(|a| a.namespaces.as_ref()?.from.as_ref());
                matches!(from, Some(SetRoutes::Selector))
            })
        })
}

/// The Secrets every Gateway's and ListenerSet's listeners (certificateRefs) and every
/// Gateway's backend client certificate name.
fn secret_refs(store: &Store) -> impl Iterator<Item = ObjectKey> + '_ {
    let key = |owner: &ObjectKey, ns: &Option<String>, name: &str| {
        let ns = ns.as_deref().unwrap_or(owner.namespace());
        ObjectKey::new(ns, name)
    };
    let gateways = store.gateways.iter().flat_map(move |(owner, gw)| {
        let listeners = gw.spec.listeners.iter().filter_map(|l| l.tls.as_ref());
        let refs = listeners.flat_map(|t| t.certificate_refs.iter().flatten());
        let client = gw.spec.tls.as_ref().and_then(|t| t.backend.as_ref());
        let client = client.and_then(|b| b.client_certificate_ref.as_ref());
        refs.map(move |r| key(owner, &r.namespace, &r.name))
            .chain(client.map(|r| key(owner, &r.namespace, &r.name)))
    });
    let sets = store.listener_sets.iter().flat_map(move |(owner, set)| {
        let listeners = set.spec.listeners.iter().filter_map(|l| l.tls.as_ref());
        let refs = listeners.flat_map(|t| t.certificate_refs.iter().flatten());
        refs.map(move |r| key(owner, &r.namespace, &r.name))
    });
    gateways.chain(sets)
}

/// The ConfigMaps every Gateway's frontend validation (default and per port) names.
fn frontend_ca_refs(store: &Store) -> impl Iterator<Item = ObjectKey> + '_ {
    store.gateways.iter().flat_map(|(key, gw)| {
        let frontend = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
        let default = frontend
            .and_then(|f| f.default.validation.as_ref())
            .map(|v| {
                v.ca_certificate_refs
                    .iter()
                    .map(|r| (&r.namespace, &r.name))
            });
        let per_port = frontend
            .and_then(|f| f.per_port.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.tls.validation.as_ref())
            .flat_map(|v| {
                v.ca_certificate_refs
                    .iter()
                    .map(|r| (&r.namespace, &r.name))
            });
        default
            .into_iter()
            .flatten()
            .chain(per_port)
            .map(|(ns, name)| {
                let ns = ns.as_deref().unwrap_or(key.namespace());
                ObjectKey::new(ns, name.as_str())
            })
    })
}

/// Do two maps hold the same objects (by identity) under the same keys? A map nothing
/// was written to since it was copied is answered by one pointer comparison.
fn same<K: Ord + Clone, V>(a: &Map<K, Arc<V>>, b: &Map<K, Arc<V>>) -> bool {
    a.ptr_eq(b)
        || (a.len() == b.len()
            && a.iter()
                .zip(b.iter())
                .all(|((ka, va), (kb, vb))| ka == kb && Arc::ptr_eq(va, vb)))
}

/// [`same`] for maps of values compared by content.
fn equal<K: Ord + Clone, V: PartialEq + Clone>(a: &Map<K, V>, b: &Map<K, V>) -> bool {
    a.ptr_eq(b) || a == b
}

/// What changed since the last run, as the phases need it.
pub(super) struct Changes {
    /// Every route must be compiled again.
    pub all_stale: bool,
    /// Services whose object or EndpointSlices changed.
    pub services: BTreeSet<ObjectKey>,
    /// Attachments must be decided again.
    pub gateway_side: bool,
}

impl Memo {
    /// When both sides changed, nothing cached can be reused: the run starts from an
    /// empty memo, keeping only what `observe` just recorded, and builds as a first
    /// load does (in key order, appending) instead of replacing every entry in place
    /// (benches/RESULTS.md, issue 14, session 27). The old memo is freed first and
    /// whole, here: its memory is what the build then reuses. Freed on a thread of
    /// its own instead, the build ran slower than before (fresh pages, and the two
    /// threads taking turns on the arena's lock).
    pub(super) fn restart(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        *self = Memo {
            seen,
            ..Memo::default()
        };
    }

    /// Compares the Store with what the last run saw, and remembers it.
    pub(super) fn observe(&mut self, store: &Store) -> Changes {
        let mut services = BTreeSet::new();
        diff(&self.seen.services, &store.services, |k, _, _| {
            services.insert(k.clone());
        });
        diff(&self.seen.slices, &store.endpoint_slices, |k, old, new| {
            for slice in [old, new].into_iter().flatten() {
                if let Some(svc) = BackendResolver::service_of(k, slice) {
                    services.insert(svc);
                }
            }
        });
        self.seen.services = store.services.clone();
        self.seen.slices = store.endpoint_slices.clone();
        let all_stale = !self
            .seen
            .backend_side
            .as_ref()
            .is_some_and(|s| s.same(store));
        if all_stale {
            self.seen.backend_side = Some(BackendSide::of(store));
        }
        let gateway_side = !self
            .seen
            .gateway_side
            .as_ref()
            .is_some_and(|s| s.same(store));
        if gateway_side {
            self.seen.gateway_side = Some(GatewaySide::of(store));
        }
        Changes {
            all_stale,
            services,
            gateway_side,
        }
    }
}

impl Memo {
    /// The Backends still valid after `changes`, for this run's resolver.
    pub(super) fn take_backends(&mut self, changes: &Changes) -> BackendCache {
        let mut cache = std::mem::take(&mut self.backends);
        if changes.all_stale {
            cache.clear();
        } else if !changes.services.is_empty() {
            cache.retain(|(svc, ..), _| !changes.services.contains(svc));
        }
        cache
    }

    /// The Backends this run's resolver built or kept, for the next run.
    pub(super) fn keep_backends(&mut self, cache: BackendCache) {
        self.backends = cache;
    }
}

/// Calls `changed` for every key whose object differs between `old` and `new` (added,
/// removed or replaced by a different one); the subtrees the maps share are skipped.
fn diff<K: Ord + Clone, V: PartialEq>(
    old: &Map<K, Arc<V>>,
    new: &Map<K, Arc<V>>,
    mut changed: impl FnMut(&K, Option<&V>, Option<&V>),
) {
    for d in old.diff(new) {
        match d {
            DiffItem::Add(k, v) => changed(k, None, Some(v)),
            DiffItem::Update {
                old: (k, a),
                new: (_, b),
            } => changed(k, Some(a), Some(b)),
            DiffItem::Remove(k, v) => changed(k, Some(v), None),
        }
    }
}

#[cfg(test)]
#[path = "incremental_tests.rs"]
mod tests;
