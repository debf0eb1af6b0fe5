//! What the reconciler keeps per HTTPRoute and GRPCRoute from one run to the next, and
//! the indexes patched from it: each route's status, and how many routes each listener
//! has attached. A run compiles and attaches only the routes that are new or stale, and
//! names them (see [`RouteMemo::changed`]) so translation rebuilds only what they feed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use imbl::ordmap::DiffItem;

use super::backend::{BackendResolver, Referenced};
use super::incremental::{Changes, Redone};
use super::route::{Attached, Placements, RouteModel};
use super::route_status::SharedStatuses;
use super::translate::RouteActions;
use crate::compact::StoredRoute;
use crate::route_ext::HttpRouteExt;
use crate::status::{ObjectStatus, RouteStatuses};
use crate::store::{Map, ObjectKey, Store, repack_grown};

/// A route's identity across kinds; HTTPRoutes order before GRPCRoutes, as the phases
/// take them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct RouteId {
    pub grpc: bool,
    pub key: ObjectKey,
}

/// Per route, what was derived from it, and the Store's route maps as the last run saw
/// them: a run finds the routes that changed by a diff of those and the Store's (which
/// skips the subtrees they share), not by a walk over every route.
#[derive(Default)]
pub(super) struct RouteMemo {
    http: BTreeMap<ObjectKey, CachedRoute>,
    grpc: BTreeMap<ObjectKey, CachedRoute>,
    seen: Seen,
    /// The routes that resolved each Service: those to compile again when it or its
    /// EndpointSlices change, and the endpoint interest of routes not compiled again.
    interest: BTreeMap<ObjectKey, BTreeSet<RouteId>>,
    /// The statuses of the routes with any parent to report, patched where a route's
    /// attachment was decided again or the route went: each run hands out an O(1)
    /// copy, and the publisher finds the changes by a diff.
    http_statuses: RouteStatuses,
    grpc_statuses: RouteStatuses,
    /// Per (Gateway, listener index), the routes attached there, kept by adding and
    /// removing each changed route's placements.
    listener_routes: BTreeMap<(ObjectKey, usize), usize>,
    shared: SharedStatuses,
    /// The routes this run compiled, attached again or dropped; `None` when every
    /// route was attached again (the Gateway side changed, or the first run).
    changed: Option<Vec<RouteId>>,
    /// Where the routes this run compiled again or dropped were placed before, while
    /// translation may patch the Snapshot (see [`RouteMemo::patches`]): it withdraws
    /// their old contributions by these, and takes them. A table of every route's
    /// places, kept for this, was 0.8 MiB at 5,000 routes.
    retired: Vec<(RouteId, Placements)>,
    /// What the last run did again rather than reuse.
    pub(super) redone: Redone,
}

/// Copies (O(1)) of the Store's route maps as the last run saw them.
#[derive(Default)]
struct Seen {
    http: Map<ObjectKey, Arc<StoredRoute>>,
    http_ext: Map<ObjectKey, HttpRouteExt>,
    grpc: Map<ObjectKey, Arc<StoredRoute>>,
}

pub(super) struct CachedRoute {
    object: Arc<StoredRoute>,
    pub(super) model: Arc<RouteModel>,
    /// The Services its compile resolved, sorted (usually one, kept inline: a
    /// one-element BTreeSet would hold a node of eleven).
    referenced: Referenced,
    /// Its attachment, decided on the Gateway side as it stood then.
    attached: Option<Attached>,
    /// Its rule actions per Gateway it serves on, for the Snapshot (see `translate`).
    pub(super) actions: RouteActions,
}

impl CachedRoute {
    /// Its model, its attachment (set by [`RouteMemo::attach`] for every route it
    /// keeps), and its actions to fill.
    pub(super) fn parts_mut(&mut self) -> (&Arc<RouteModel>, Option<&Attached>, &mut RouteActions) {
        (&self.model, self.attached.as_ref(), &mut self.actions)
    }
}

/// What attaching a route reads besides the route.
#[derive(Clone, Copy)]
pub(super) struct GatewaySideRefs<'a, 'g> {
    pub sets: &'a super::listenerset::ListenerSets,
    pub controller_name: &'a str,
    pub gateways: &'a BTreeMap<ObjectKey, super::gateway::GatewayModel<'g>>,
}

impl RouteMemo {
    /// Phase: HTTPRoutes then GRPCRoutes (in HTTPRoute form), each brought up to date
    /// with the Store (compiled again only when stale), then attached where the
    /// decision is stale. Returns the HTTPRoute and GRPCRoute statuses.
    pub(super) fn attach<'s>(
        &mut self,
        store: &'s Store,
        changes: &Changes,
        resolver: &mut BackendResolver<'s>,
        gateway_side: GatewaySideRefs<'_, '_>,
    ) -> [RouteStatuses; 2] {
        self.redone = Redone::default();
        self.retired.clear();
        let before = [self.http_statuses.len(), self.grpc_statuses.len()];
        let everything = changes.gateway_side;
        if everything {
            self.listener_routes.clear();
        }
        let mut changed = Vec::new();
        // Whether translation patches the Snapshot with `changed`; it rebuilds it when
        // every route is attached again.
        let mut patches = !everything;
        if changes.all_stale {
            self.seen.remember(store);
            patches = self.compile_all(store, resolver, &mut changed, patches);
        } else {
            let mut stale = self.seen.stale(store);
            for svc in &changes.services {
                stale.extend(self.interest.get(svc).into_iter().flatten().cloned());
            }
            let batch = stale.len();
            patches = patches && self.patches(batch);
            let mut work = Work {
                interest: &mut self.interest,
                listener_routes: &mut self.listener_routes,
                changed: &mut changed,
                retired: patches.then_some(&mut self.retired),
                redone: &mut self.redone,
                resolver,
            };
            for id in stale {
                let (cache, statuses, current) = match id.grpc {
                    false => (&mut self.http, &mut self.http_statuses, &store.http_routes),
                    true => (&mut self.grpc, &mut self.grpc_statuses, &store.grpc_routes),
                };
                let ext = match id.grpc {
                    false => store.http_route_ext.get(&id.key),
                    true => None,
                };
                work.sync(cache, statuses, id, current, ext);
            }
            if batch > (self.http.len() + self.grpc.len()) / 4 {
                self.repack();
            }
        }
        let mut attach = Attach {
            store,
            side: gateway_side,
            listener_routes: &mut self.listener_routes,
            redone: &mut self.redone,
            shared: &mut self.shared,
        };
        if everything {
            let kinds = [
                (&mut self.http, &mut self.http_statuses),
                (&mut self.grpc, &mut self.grpc_statuses),
            ];
            for (cache, statuses) in kinds {
                for (key, c) in cache.iter_mut() {
                    c.attached = None;
                    attach.one(key, c, statuses);
                }
            }
            self.changed = None;
        } else {
            for id in &changed {
                let (cache, statuses) = match id.grpc {
                    false => (&mut self.http, &mut self.http_statuses),
                    true => (&mut self.grpc, &mut self.grpc_statuses),
                };
                if let Some(c) = cache.get_mut(&id.key) {
                    attach.one(&id.key, c, statuses);
                }
            }
            self.changed = patches.then_some(changed);
        }
        repack_grown(&mut self.http_statuses, before[0]);
        repack_grown(&mut self.grpc_statuses, before[1]);
        [self.http_statuses.clone(), self.grpc_statuses.clone()]
    }

    /// Rebuilds the maps a large batch of changes inserted into. Keys inserted in order
    /// (a file of new routes) leave each node a little over half full, as a full node
    /// splits in the middle; collecting sorted entries fills every node. At 5,000
    /// routes added file by file that was 0.7 MiB of half-empty nodes, and the moves
    /// cost little beside compiling the batch.
    fn repack(&mut self) {
        for cache in [&mut self.http, &mut self.grpc] {
            *cache = std::mem::take(cache).into_iter().collect();
        }
        for routes in self.interest.values_mut() {
            *routes = std::mem::take(routes).into_iter().collect();
        }
    }

    /// Compiles every route again (a first load, or a change every route may read:
    /// grants, policies). The old entries and their indexes go whole and the new ones
    /// are collected in key order, which builds each map in one pass: inserting them
    /// one by one searched every map for every route (a tenth of a first load).
    /// Returns whether translation may patch (`may_patch`, and few routes).
    fn compile_all<'s>(
        &mut self,
        store: &'s Store,
        resolver: &mut BackendResolver<'s>,
        changed: &mut Vec<RouteId>,
        may_patch: bool,
    ) -> bool {
        // Every placement the counts hold is an old entry's.
        self.listener_routes.clear();
        self.interest.clear();
        let mut interest: BTreeMap<ObjectKey, Vec<RouteId>> = BTreeMap::new();
        let kinds = [
            (
                false,
                &mut self.http,
                &mut self.http_statuses,
                &store.http_routes,
            ),
            (
                true,
                &mut self.grpc,
                &mut self.grpc_statuses,
                &store.grpc_routes,
            ),
        ];
        let mut gone = false;
        let mut olds = Vec::new();
        for (grpc, cache, statuses, current) in kinds {
            let id = |key: &ObjectKey| RouteId {
                grpc,
                key: key.clone(),
            };
            let old = std::mem::take(cache);
            for key in old.keys().filter(|k| !current.contains_key(*k)) {
                statuses.remove(key);
                changed.push(id(key));
                gone = true;
            }
            *cache = current
                .iter()
                .map(|(key, route)| {
                    let ext = match grpc {
                        false => store.http_route_ext.get(key),
                        true => None,
                    };
                    let c = compile(&mut self.redone, resolver, grpc, key, route, ext);
                    for svc in &c.referenced {
                        interest.entry(svc.clone()).or_default().push(id(key));
                    }
                    changed.push(id(key));
                    (key.clone(), c)
                })
                .collect();
            olds.push((grpc, old));
        }
        // A handful of routes (a small world whose backend side changed) is patched.
        let patches = may_patch && self.patches(changed.len());
        if patches {
            for (grpc, old) in olds {
                for (key, c) in old {
                    if let Some(a) = c.attached {
                        self.retired.push((RouteId { grpc, key }, a.placements));
                    }
                }
            }
        }
        // In order unless routes went: those came before their kind's current ones.
        if gone {
            changed.sort_unstable();
        }
        self.interest = interest
            .into_iter()
            .map(|(svc, routes)| (svc, routes.into_iter().collect()))
            .collect();
        patches
    }

    /// The routes the last run compiled, attached again or dropped, in order, for
    /// translation to patch the Snapshot with; `None` when it attached every route
    /// again or changed too many to patch (see [`Self::patches`]).
    pub(super) fn changed(&self) -> Option<&[RouteId]> {
        self.changed.as_deref()
    }

    /// Does translation patch the Snapshot for `n` changed routes rather than build it
    /// again? A patch costs a lookup per changed route where a rebuild walks every
    /// route once: past a quarter of them, it rebuilds.
    fn patches(&self, n: usize) -> bool {
        n <= self.len() / 4 + 8
    }

    /// Where the routes the last run compiled again or dropped were placed before (see
    /// `retired`); empty unless translation may patch.
    pub(super) fn take_retired(&mut self) -> Vec<(RouteId, Placements)> {
        std::mem::take(&mut self.retired)
    }

    pub(super) fn route_mut(&mut self, id: &RouteId) -> Option<&mut CachedRoute> {
        match id.grpc {
            false => self.http.get_mut(&id.key),
            true => self.grpc.get_mut(&id.key),
        }
    }

    /// Every route, HTTPRoutes first, each in key order.
    pub(super) fn all_mut(&mut self) -> impl Iterator<Item = (RouteId, &mut CachedRoute)> {
        let http = self.http.iter_mut().map(|(k, c)| (k, c, false));
        let grpc = self.grpc.iter_mut().map(|(k, c)| (k, c, true));
        http.chain(grpc).map(|(key, c, grpc)| {
            let id = RouteId {
                grpc,
                key: key.clone(),
            };
            (id, c)
        })
    }

    pub(super) fn len(&self) -> usize {
        self.http.len() + self.grpc.len()
    }

    /// Per (Gateway, listener index), how many routes are attached there.
    pub(super) fn listener_routes(&self) -> &BTreeMap<(ObjectKey, usize), usize> {
        &self.listener_routes
    }

    /// The Services the cached routes resolved.
    pub(super) fn interest(&self) -> impl Iterator<Item = &ObjectKey> {
        self.interest.keys()
    }
}

/// Attaching routes again, and the indexes that follows.
struct Attach<'a, 's, 'g> {
    store: &'s Store,
    side: GatewaySideRefs<'a, 'g>,
    listener_routes: &'a mut BTreeMap<(ObjectKey, usize), usize>,
    redone: &'a mut Redone,
    shared: &'a mut SharedStatuses,
}

impl Attach<'_, '_, '_> {
    /// Decides `c`'s attachment if it has none.
    fn one(&mut self, key: &ObjectKey, c: &mut CachedRoute, statuses: &mut RouteStatuses) {
        if c.attached.is_some() {
            return;
        }
        self.redone.attached += 1;
        let attached = super::route::attach_route(
            self.store,
            self.side.sets,
            self.side.controller_name,
            &c.model,
            &c.object,
            self.side.gateways,
            self.shared,
        );
        // Actions for a Gateway the route no longer serves on are not needed.
        c.actions
            .retain(|gw| attached.placements.iter().any(|p| p.gateway == *gw));
        report(statuses, key, c.model.generation, &attached);
        for p in &attached.placements {
            *self
                .listener_routes
                .entry((p.gateway.clone(), p.listener))
                .or_default() += 1;
        }
        c.attached = Some(attached);
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

impl Seen {
    /// The routes whose object or experimental fields differ from what the last run saw,
    /// in order; remembers the Store's maps.
    fn stale(&mut self, store: &Store) -> BTreeSet<RouteId> {
        let mut stale = BTreeSet::new();
        let mut note = |grpc: bool, key: &ObjectKey| {
            stale.insert(RouteId {
                grpc,
                key: key.clone(),
            });
        };
        for d in self.http.diff(&store.http_routes) {
            note(false, changed_key(&d));
        }
        for d in self.http_ext.diff(&store.http_route_ext) {
            note(false, changed_key(&d));
        }
        for d in self.grpc.diff(&store.grpc_routes) {
            note(true, changed_key(&d));
        }
        self.remember(store);
        stale
    }

    fn remember(&mut self, store: &Store) {
        self.http = store.http_routes.clone();
        self.http_ext = store.http_route_ext.clone();
        self.grpc = store.grpc_routes.clone();
    }
}

fn changed_key<'a, K, V>(d: &DiffItem<'a, 'a, K, V>) -> &'a K {
    match d {
        DiffItem::Add(k, _) | DiffItem::Remove(k, _) => k,
        DiffItem::Update { new: (k, _), .. } => k,
    }
}

/// What compiling routes again needs besides the cache it updates.
struct Work<'w, 's> {
    interest: &'w mut BTreeMap<ObjectKey, BTreeSet<RouteId>>,
    listener_routes: &'w mut BTreeMap<(ObjectKey, usize), usize>,
    changed: &'w mut Vec<RouteId>,
    /// Where dropped entries were placed, kept when translation may patch.
    retired: Option<&'w mut Vec<(RouteId, Placements)>>,
    redone: &'w mut Redone,
    resolver: &'w mut BackendResolver<'s>,
}

impl Work<'_, '_> {
    /// Brings route `id`'s entry up to date with the Store (`current` is its kind's
    /// map): dropped when the route went, compiled again otherwise.
    fn sync(
        &mut self,
        cache: &mut BTreeMap<ObjectKey, CachedRoute>,
        statuses: &mut RouteStatuses,
        id: RouteId,
        current: &Map<ObjectKey, Arc<StoredRoute>>,
        ext: Option<&HttpRouteExt>,
    ) {
        // The old entry leaves the indexes before the new one enters them: both are
        // filed under the same id.
        if let Some(c) = cache.remove(&id.key) {
            self.forget(&id, &c);
            if let (Some(retired), Some(a)) = (self.retired.as_deref_mut(), c.attached) {
                retired.push((id.clone(), a.placements));
            }
        }
        match current.get(&id.key) {
            None => {
                statuses.remove(&id.key);
            }
            Some(route) => {
                let fresh = self.compile(&id, route, ext);
                cache.insert(id.key.clone(), fresh);
            }
        }
        self.changed.push(id);
    }

    fn compile(
        &mut self,
        id: &RouteId,
        route: &Arc<StoredRoute>,
        ext: Option<&HttpRouteExt>,
    ) -> CachedRoute {
        let c = compile(self.redone, self.resolver, id.grpc, &id.key, route, ext);
        for svc in &c.referenced {
            let routes = self.interest.entry(svc.clone()).or_default();
            routes.insert(id.clone());
        }
        c
    }

    /// Takes a dropped entry out of the indexes: its endpoint interest, and its
    /// placements (already cleared when every route is attached again).
    fn forget(&mut self, id: &RouteId, c: &CachedRoute) {
        for svc in &c.referenced {
            if let Some(routes) = self.interest.get_mut(svc) {
                routes.remove(id);
                if routes.is_empty() {
                    self.interest.remove(svc);
                }
            }
        }
        for p in c.attached.iter().flat_map(|a| &a.placements) {
            let slot = (p.gateway.clone(), p.listener);
            if let Some(n) = self.listener_routes.get_mut(&slot) {
                *n -= 1;
                if *n == 0 {
                    self.listener_routes.remove(&slot);
                }
            }
        }
    }
}

/// Compiles one route into its entry (not yet in the endpoint interest index).
fn compile<'s>(
    redone: &mut Redone,
    resolver: &mut BackendResolver<'s>,
    grpc: bool,
    key: &ObjectKey,
    route: &Arc<StoredRoute>,
    ext: Option<&HttpRouteExt>,
) -> CachedRoute {
    redone.compiled += 1;
    resolver.record();
    let kind = if grpc { "GRPCRoute" } else { "HTTPRoute" };
    let model = super::route::compile(key.clone(), kind, route, ext, resolver);
    CachedRoute {
        object: Arc::clone(route),
        model: Arc::new(model),
        referenced: resolver.recorded(),
        attached: None,
        actions: RouteActions::default(),
    }
}
