//! The reconciler that keeps what it derived: a change costs what it touches.
//!
//! [`Reconciler::reconcile`] runs the same phases as a full reconcile, but each
//! expensive phase reuses what the last run derived from inputs that have not changed
//! since, telling changed objects from unchanged ones by the Store's `Arc`s:
//! - a route is compiled again only when it, or a Service or EndpointSlice its
//!   backendRefs resolved, changed (Pods, ReferenceGrants, BackendTLSPolicies and
//!   ConfigMaps, which are rare and read from everywhere, make every route stale);
//! - a route's attachment (its status parents and the listeners it serves on) is
//!   reused while its model and the Gateway side (classes, Gateways, ListenerSets,
//!   Secrets, ConfigMaps, Namespaces, ReferenceGrants) stand;
//! - the Snapshot shares each unchanged route's rule actions and each unchanged
//!   hostname's virtual host with the one before (see `translate::TranslateMemo`).
//!
//! A fresh `Reconciler` has nothing to reuse, so its first run *is* the full reconcile;
//! the property test in `incremental_tests` holds a long-lived one to a fresh one after
//! every step of random changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use gateway_api::listenersets::ListenerSet;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::backend::{BackendCache, BackendResolver};
use super::route::{Attached, RouteModel};
use super::translate::{RouteActions, TranslateMemo};
use super::{Addressing, Outcome, Settings};
use crate::route_ext::HttpRouteExt;
use crate::status::{ObjectStatus, RouteStatuses};
use crate::store::{ObjectKey, Store};

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
        super::run(store, &self.settings, &self.addressing, &mut self.memo)
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

/// Per route, what was derived from it. Kept in key order, like the Store's maps, so
/// a run finds what changed by walking both side by side (a pointer comparison per
/// route) and hands the phases after it each route's entry without a lookup.
#[derive(Default)]
pub(super) struct RouteMemo {
    http: BTreeMap<ObjectKey, CachedRoute>,
    grpc: BTreeMap<ObjectKey, CachedRoute>,
    /// How many cached routes resolved each Service: the endpoint interest of routes
    /// not compiled again.
    interest: BTreeMap<ObjectKey, usize>,
    /// The statuses of the routes with any parent to report, patched where a route's
    /// attachment was decided again or the route went: each run hands out an O(1)
    /// copy, and the publisher finds the changes by a diff.
    http_statuses: RouteStatuses,
    grpc_statuses: RouteStatuses,
    /// What the last run did again rather than reuse.
    pub(super) redone: Redone,
}

pub(super) struct CachedRoute {
    object: Arc<HttpRoute>,
    ext: Option<HttpRouteExt>,
    pub(super) model: Arc<RouteModel>,
    /// The Services its compile resolved, sorted (usually one: a one-element BTreeSet
    /// would hold a node of eleven).
    referenced: Box<[ObjectKey]>,
    /// Its attachment, decided on the Gateway side as it stood then.
    attached: Option<Attached>,
    /// Its rule actions per Gateway it serves on, for the Snapshot (see `translate`).
    pub(super) actions: RouteActions,
}

impl CachedRoute {
    /// Its attachment; set by [`RouteMemo::attach`] for every route it returns.
    pub(super) fn attached(&self) -> Option<&Attached> {
        self.attached.as_ref()
    }
}

/// The inputs as the last run saw them. Holding the `Arc`s keeps those objects alive,
/// so an unchanged pointer really is the same object (no address reuse).
#[derive(Default)]
struct Seen {
    services: BTreeMap<ObjectKey, Arc<Service>>,
    slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    /// Everything else a route's compile may read.
    backend_side: Option<BackendSide>,
    /// Everything a route's attachment may read besides the route itself.
    gateway_side: Option<GatewaySide>,
}

#[derive(Clone)]
struct BackendSide {
    pods: BTreeMap<ObjectKey, Arc<Pod>>,
    grants: BTreeMap<ObjectKey, Arc<ReferenceGrant>>,
    policies: BTreeMap<ObjectKey, Arc<BackendTlsPolicy>>,
    config_maps: BTreeMap<ObjectKey, Arc<ConfigMap>>,
}

impl BackendSide {
    fn of(store: &Store) -> Self {
        Self {
            pods: store.pods.clone(),
            grants: store.reference_grants.clone(),
            policies: store.backend_tls_policies.clone(),
            config_maps: store.config_maps.clone(),
        }
    }

    fn same(&self, store: &Store) -> bool {
        same(&self.pods, &store.pods)
            && same(&self.grants, &store.reference_grants)
            && same(&self.policies, &store.backend_tls_policies)
            && same(&self.config_maps, &store.config_maps)
    }
}

#[derive(Clone)]
struct GatewaySide {
    classes: BTreeMap<String, Arc<GatewayClass>>,
    gateways: BTreeMap<ObjectKey, Arc<Gateway>>,
    gateway_ext: BTreeMap<ObjectKey, crate::gateway_ext::GatewayExt>,
    sets: BTreeMap<ObjectKey, Arc<ListenerSet>>,
    secrets: BTreeMap<ObjectKey, Arc<Secret>>,
    oversized_secrets: BTreeMap<ObjectKey, String>,
    config_maps: BTreeMap<ObjectKey, Arc<ConfigMap>>,
    namespaces: BTreeMap<String, Arc<Namespace>>,
    grants: BTreeMap<ObjectKey, Arc<ReferenceGrant>>,
}

impl GatewaySide {
    fn of(store: &Store) -> Self {
        Self {
            classes: store.gateway_classes.clone(),
            gateways: store.gateways.clone(),
            gateway_ext: store.gateway_ext.clone(),
            sets: store.listener_sets.clone(),
            secrets: store.secrets.clone(),
            oversized_secrets: store.oversized_secrets.clone(),
            config_maps: store.config_maps.clone(),
            namespaces: store.namespaces.clone(),
            grants: store.reference_grants.clone(),
        }
    }

    fn same(&self, store: &Store) -> bool {
        same(&self.classes, &store.gateway_classes)
            && same(&self.gateways, &store.gateways)
            && self.gateway_ext == store.gateway_ext
            && same(&self.sets, &store.listener_sets)
            && same(&self.secrets, &store.secrets)
            && self.oversized_secrets == store.oversized_secrets
            && same(&self.config_maps, &store.config_maps)
            && same(&self.namespaces, &store.namespaces)
            && same(&self.grants, &store.reference_grants)
    }
}

/// Do two maps hold the same objects (by identity) under the same keys?
fn same<K: Ord, V>(a: &BTreeMap<K, Arc<V>>, b: &BTreeMap<K, Arc<V>>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && Arc::ptr_eq(va, vb))
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
        self.seen.services.clone_from(&store.services);
        self.seen.slices.clone_from(&store.endpoint_slices);
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

impl RouteMemo {
    /// Phase: HTTPRoutes then GRPCRoutes (in HTTPRoute form), each brought up to date
    /// with the Store (compiled again only when stale), then each attached (decided
    /// again only where the decision is stale). Returns every route's entry in key
    /// order, HTTPRoutes first, each with its attachment set, and the HTTPRoute and
    /// GRPCRoute statuses.
    pub(super) fn attach<'m, 's>(
        &'m mut self,
        store: &'s Store,
        changes: &Changes,
        resolver: &mut BackendResolver<'s>,
        gateway_side: GatewaySideRefs<'_, '_>,
    ) -> (Vec<&'m mut CachedRoute>, [RouteStatuses; 2]) {
        self.redone = Redone::default();
        let ext_of = |k: &ObjectKey| store.http_route_ext.get(k);
        let mut work = Work {
            interest: &mut self.interest,
            redone: &mut self.redone,
            changes,
            resolver,
        };
        work.sync(
            &mut self.http,
            &mut self.http_statuses,
            "HTTPRoute",
            &store.http_routes,
            ext_of,
        );
        work.sync(
            &mut self.grpc,
            &mut self.grpc_statuses,
            "GRPCRoute",
            &store.grpc_routes,
            |_| None,
        );
        let mut routes = Vec::with_capacity(self.http.len() + self.grpc.len());
        let kinds = [
            (&mut self.http, &mut self.http_statuses),
            (&mut self.grpc, &mut self.grpc_statuses),
        ];
        for (cache, statuses) in kinds {
            for (key, c) in cache.iter_mut() {
                if changes.gateway_side {
                    c.attached = None;
                }
                if c.attached.is_none() {
                    self.redone.attached += 1;
                    let attached = super::route::attach_route(
                        store,
                        gateway_side.sets,
                        gateway_side.controller_name,
                        &c.model,
                        &c.object,
                        gateway_side.gateways,
                    );
                    // Actions for a Gateway the route no longer serves on are not needed.
                    c.actions
                        .retain(|gw| attached.placements.iter().any(|p| p.gateway == *gw));
                    report(statuses, key, c.model.generation, &attached);
                    c.attached = Some(attached);
                }
                routes.push(c);
            }
        }
        let statuses = [self.http_statuses.clone(), self.grpc_statuses.clone()];
        (routes, statuses)
    }

    /// The Services the cached routes resolved.
    pub(super) fn interest(&self) -> impl Iterator<Item = &ObjectKey> {
        self.interest.keys()
    }
}

/// Puts a route's status as `attached` decided it; a route with no parent to report
/// (none of its parents is ours) has none.
fn report(statuses: &mut RouteStatuses, key: &ObjectKey, generation: i64, attached: &Attached) {
    if attached.status.parents.is_empty() {
        statuses.remove(key);
    } else {
        let entry = ObjectStatus {
            generation,
            status: Arc::clone(&attached.status),
        };
        statuses.insert(key.clone(), entry);
    }
}

/// What attaching a route reads besides the route.
#[derive(Clone, Copy)]
pub(super) struct GatewaySideRefs<'a, 'g> {
    pub sets: &'a super::listenerset::ListenerSets,
    pub controller_name: &'a str,
    pub gateways: &'a BTreeMap<ObjectKey, super::gateway::GatewayModel<'g>>,
}

/// What compiling routes again needs besides the cache it updates.
struct Work<'w, 's> {
    interest: &'w mut BTreeMap<ObjectKey, usize>,
    redone: &'w mut Redone,
    changes: &'w Changes,
    resolver: &'w mut BackendResolver<'s>,
}

impl Work<'_, '_> {
    /// Brings `cache` up to date with `current`: entries of routes that went are
    /// dropped, routes that are new or stale are compiled. Both maps are in key order,
    /// so one walk side by side finds them; a route that stays costs a comparison.
    fn sync<'e>(
        &mut self,
        cache: &mut BTreeMap<ObjectKey, CachedRoute>,
        statuses: &mut RouteStatuses,
        kind: &'static str,
        current: &BTreeMap<ObjectKey, Arc<HttpRoute>>,
        ext_of: impl Fn(&ObjectKey) -> Option<&'e HttpRouteExt>,
    ) {
        let changes = self.changes;
        let stands = |c: &CachedRoute, route: &Arc<HttpRoute>, ext: Option<&HttpRouteExt>| {
            !changes.all_stale
                && Arc::ptr_eq(&c.object, route)
                && c.ext.as_ref() == ext
                && !c.referenced.iter().any(|s| changes.services.contains(s))
        };
        let mut stale: Vec<(&ObjectKey, &Arc<HttpRoute>)> = Vec::new();
        let mut gone: Vec<ObjectKey> = Vec::new();
        let mut old = cache.iter().peekable();
        let mut new = current.iter().peekable();
        loop {
            match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some((ko, c)), Some((kn, route))) => match ko.cmp(kn) {
                    std::cmp::Ordering::Less => {
                        gone.push((*ko).clone());
                        old.next();
                    }
                    std::cmp::Ordering::Greater => {
                        stale.push((kn, route));
                        new.next();
                    }
                    std::cmp::Ordering::Equal => {
                        if !stands(c, route, ext_of(kn)) {
                            stale.push((kn, route));
                        }
                        old.next();
                        new.next();
                    }
                },
                (Some((ko, _)), None) => {
                    gone.push((*ko).clone());
                    old.next();
                }
                (None, Some((kn, route))) => {
                    stale.push((kn, route));
                    new.next();
                }
            }
        }
        for key in gone {
            statuses.remove(&key);
            if let Some(c) = cache.remove(&key) {
                forget_interest(self.interest, &c);
            }
        }
        for (key, route) in stale {
            let fresh = self.compile(kind, key, route, ext_of(key));
            if let Some(c) = cache.insert(key.clone(), fresh) {
                forget_interest(self.interest, &c);
            }
        }
    }

    fn compile(
        &mut self,
        kind: &'static str,
        key: &ObjectKey,
        route: &Arc<HttpRoute>,
        ext: Option<&HttpRouteExt>,
    ) -> CachedRoute {
        self.redone.compiled += 1;
        self.resolver.record();
        let model = super::route::compile(key.clone(), kind, route, ext, self.resolver);
        let referenced: Box<[ObjectKey]> = self.resolver.recorded().into_iter().collect();
        for svc in &referenced {
            *self.interest.entry(svc.clone()).or_default() += 1;
        }
        CachedRoute {
            object: Arc::clone(route),
            ext: ext.cloned(),
            model: Arc::new(model),
            referenced,
            attached: None,
            actions: RouteActions::default(),
        }
    }
}

fn forget_interest(interest: &mut BTreeMap<ObjectKey, usize>, c: &CachedRoute) {
    for svc in &c.referenced {
        if let Some(n) = interest.get_mut(svc) {
            *n -= 1;
            if *n == 0 {
                interest.remove(svc);
            }
        }
    }
}

/// Calls `changed` for every key whose object differs between `old` and `new` (added,
/// removed or replaced).
fn diff<K: Ord, V>(
    old: &BTreeMap<K, Arc<V>>,
    new: &BTreeMap<K, Arc<V>>,
    mut changed: impl FnMut(&K, Option<&V>, Option<&V>),
) {
    let mut a = old.iter().peekable();
    let mut b = new.iter().peekable();
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                std::cmp::Ordering::Less => {
                    changed(ka, Some(va), None);
                    a.next();
                }
                std::cmp::Ordering::Greater => {
                    changed(kb, None, Some(vb));
                    b.next();
                }
                std::cmp::Ordering::Equal => {
                    if !Arc::ptr_eq(va, vb) {
                        changed(ka, Some(va), Some(vb));
                    }
                    a.next();
                    b.next();
                }
            },
            (Some((ka, va)), None) => {
                changed(ka, Some(va), None);
                a.next();
            }
            (None, Some((kb, vb))) => {
                changed(kb, None, Some(vb));
                b.next();
            }
        }
    }
}

#[cfg(test)]
#[path = "incremental_tests.rs"]
mod tests;
