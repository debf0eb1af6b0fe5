//! Translation of the validated model into the proxy's Snapshot.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use aether_proxy::backend::{BackendSet, BackendTarget, WeightedBackend};
use aether_proxy::backend_client_cert::ClientCertificate;
use aether_proxy::client_auth::ClientAuth;
use aether_proxy::filters::Filters;
use aether_proxy::routing::{
    RouteEntry, RouteKind, RouteOrder, RouteTable, RuleAction, RuleExtras, VirtualHost,
};
use aether_proxy::telemetry::RouteStats;
use aether_proxy::tls::TlsCerts;
use aether_proxy::{Listener, Snapshot};
use foldhash::HashMap;
use smallvec::SmallVec;

use super::gateway::GatewayModel;
use super::route::{Placement, RouteModel};
use super::route_memo::{CachedRoute, RouteId, RouteMemo};
use crate::store::ObjectKey;

/// What translation keeps from one Snapshot to the next, so that a change rebuilds only
/// the virtual hosts the changed routes feed: per socket, per hostname, the routes'
/// contributions and the virtual host built from them; per route, where it contributed.
///
/// A run whose Gateway side (and so every socket's listeners) is as the last run saw it
/// withdraws the changed routes' contributions and adds their new ones, and a socket
/// none of whose hostnames changed keeps its `Listener`. Any other run rebuilds every
/// contribution, and still shares the virtual host of each hostname whose routes'
/// actions are unchanged. An empty memo builds everything.
#[derive(Default)]
pub struct TranslateMemo {
    sockets: BTreeMap<SocketAddr, Socket>,
    /// Per Gateway, per listener index, the socket it served on in the last run: a
    /// patch finds a changed route's old contributions from its old placements, which
    /// name listeners, so the sockets must be where they were.
    placed_on: BTreeMap<ObjectKey, Vec<Option<SocketAddr>>>,
    /// The internal ports the sockets were planned with (Kubernetes mode).
    internal_ports: Option<BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
}

#[derive(Default)]
struct Socket {
    /// Per hostname (`""` for any host).
    hosts: HashMap<Arc<str>, Host>,
    listener: Option<Arc<Listener>>,
}

#[derive(Default)]
struct Host {
    /// In the order a full build visits them: Gateway, listener, route.
    contributions: Vec<Contribution>,
    vhost: Arc<VirtualHost>,
}

/// A route attached for a hostname, with its actions there. The route's own key is its
/// model's (a `RouteId` here too was 40 of 96 bytes, kept per route and hostname).
struct Contribution {
    /// The Gateway and listener index it attached through.
    gateway: ObjectKey,
    listener: usize,
    grpc: bool,
    route: Arc<RouteModel>,
    actions: Actions,
}

impl Contribution {
    /// Where a full build visits it: by Gateway, listener, then route (HTTPRoutes
    /// before GRPCRoutes, as `RouteId` orders them).
    fn order(&self) -> (&ObjectKey, usize, bool, &ObjectKey) {
        (&self.gateway, self.listener, self.grpc, &self.route.key)
    }

    fn is(&self, id: &RouteId) -> bool {
        self.grpc == id.grpc && self.route.key == id.key
    }
}

/// Per Gateway a route serves on (usually one), its rule actions there. Kept with the
/// route, so they go when the route is compiled again or removed.
#[derive(Default)]
pub struct RouteActions(SmallVec<[(ObjectKey, Actions); 1]>);

impl RouteActions {
    /// Keeps the actions of the Gateways `keep` names.
    pub fn retain(&mut self, keep: impl Fn(&ObjectKey) -> bool) {
        self.0.retain(|(gw, _)| keep(gw));
    }

    /// The actions on Gateway `key` (named `gateway` in metrics, presenting `client` to
    /// TLS backends), built if missing or made with another client certificate.
    fn on(
        &mut self,
        key: &ObjectKey,
        (gateway, client): (&Arc<str>, &Client),
        route: &RouteModel,
    ) -> Actions {
        if let Some(at) = self.0.iter().position(|(gw, _)| gw == key) {
            if let Some((_, acts)) = self.0.get(at).filter(|(_, a)| a.made_with(client)) {
                return acts.clone();
            }
            self.0.swap_remove(at);
        }
        let acts = rule_actions(gateway, client, route);
        self.0.push((key.clone(), acts.clone()));
        acts
    }
}

/// One route's rule actions on one Gateway. A copy shares the rules; one rule is kept
/// inline (an `Arc` around the list was an allocation per route and Gateway).
#[derive(Clone)]
pub struct Actions {
    rules: SmallVec<[Arc<RuleAction>; 1]>,
}

impl Actions {
    /// Whether the rules present `client` to TLS backends (the Gateway's certificate
    /// they were made with). A route without rules serves alike with any.
    fn made_with(&self, client: &Client) -> bool {
        self.rules
            .first()
            .is_none_or(|r| match (r.backend_client_cert(), client) {
                (None, None) => true,
                (Some(a), Some(b)) => a.same(b),
                _ => false,
            })
    }

    /// Whether the two are copies of one build.
    fn same(&self, other: &Actions) -> bool {
        self.rules.len() == other.rules.len()
            && self
                .rules
                .iter()
                .zip(&other.rules)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

/// A Gateway's backend client certificate (`spec.tls.backend`), if it has one.
type Client = Option<Arc<ClientCertificate>>;

/// Per socket, the hostnames to build again; `None` for all of them.
type Dirty = BTreeMap<SocketAddr, Option<HashSet<Box<str>>>>;

/// Per Gateway, per listener index, the socket it serves on, the Gateway's name and its
/// backend client certificate (`None`: the listener serves no HTTP routes).
type ListenerSockets<'g> = BTreeMap<&'g ObjectKey, Vec<Option<(SocketAddr, Arc<str>, Client)>>>;

impl TranslateMemo {
    pub(super) fn snapshot(
        &mut self,
        gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
        routes: &mut RouteMemo,
        internal_ports: Option<&BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
    ) -> Snapshot {
        let (plans, listeners) = plan_sockets(gateways, internal_ports);
        let placed_on: BTreeMap<_, Vec<_>> = listeners
            .iter()
            .map(|(gw, ls)| {
                let addrs = ls.iter().map(|l| l.as_ref().map(|(addr, ..)| *addr));
                ((*gw).clone(), addrs.collect())
            })
            .collect();
        let retired = routes.take_retired();
        let changed = routes.changed().map(<[RouteId]>::to_vec).filter(|_| {
            self.internal_ports.as_ref() == internal_ports
                && self.sockets.keys().eq(plans.keys())
                && self.placed_on == placed_on
        });
        let mut dirty = Dirty::new();
        let mut previous = BTreeMap::new();
        match changed {
            Some(changed) => {
                for (id, places) in &retired {
                    self.withdraw(id, places, &listeners, &mut dirty);
                }
                for id in &changed {
                    if let Some(c) = routes.route_mut(id) {
                        self.contribute(id, c, &listeners, &mut dirty);
                    }
                }
            }
            None => {
                previous = std::mem::take(&mut self.sockets);
                self.placed_on = placed_on;
                self.internal_ports = internal_ports.cloned();
                dirty.extend(plans.keys().map(|addr| (*addr, None)));
                for (id, c) in routes.all_mut() {
                    self.contribute(&id, c, &listeners, &mut dirty);
                }
            }
        }
        let mut snapshot = Snapshot::default();
        for (addr, plan) in plans {
            let socket = self.sockets.entry(addr).or_default();
            if let Some(hosts) = dirty.remove(&addr) {
                let old = previous.remove(&addr);
                let table = socket.rebuild(hosts, old.as_ref().map(|s| &s.hosts));
                socket.listener = Some(Arc::new(plan.listener(addr, table)));
            }
            if let Some(listener) = &socket.listener {
                snapshot.listeners.insert(addr, Arc::clone(listener));
            }
        }
        self.sockets
            .retain(|addr, _| snapshot.listeners.contains_key(addr));
        snapshot
    }

    /// Takes route `id`'s contributions out of where `places` (its placements when it
    /// contributed) put them, marking their hostnames dirty.
    fn withdraw(
        &mut self,
        id: &RouteId,
        places: &[Placement],
        listeners: &ListenerSockets<'_>,
        dirty: &mut Dirty,
    ) {
        for p in places {
            let Some((addr, ..)) = listeners
                .get(&p.gateway)
                .and_then(|ls| ls.get(p.listener))
                .and_then(Option::as_ref)
            else {
                continue;
            };
            let Some(socket) = self.sockets.get_mut(addr) else {
                continue;
            };
            for host in p.hostnames.iter() {
                let host = host.as_deref().unwrap_or("");
                if let Some(h) = socket.hosts.get_mut(host) {
                    h.contributions.retain(|c| !c.is(id));
                }
                mark(dirty, *addr, host);
            }
        }
    }

    /// Adds route `id`'s contributions where it is attached, marking their hostnames
    /// dirty.
    fn contribute(
        &mut self,
        id: &RouteId,
        c: &mut CachedRoute,
        listeners: &ListenerSockets<'_>,
        dirty: &mut Dirty,
    ) {
        let (model, attached, actions) = c.parts_mut();
        let Some(attached) = attached else {
            return;
        };
        for p in &attached.placements {
            let Some((addr, gateway, client)) = listeners
                .get(&p.gateway)
                .and_then(|ls| ls.get(p.listener))
                .and_then(Option::as_ref)
            else {
                continue;
            };
            let acts = actions.on(&p.gateway, (gateway, client), model);
            let socket = self.sockets.entry(*addr).or_default();
            for host in p.hostnames.iter() {
                let host = host.as_deref().unwrap_or("");
                let h = match socket.hosts.get_mut(host) {
                    Some(h) => h,
                    None => socket.hosts.entry(host.into()).or_default(),
                };
                let contribution = Contribution {
                    gateway: p.gateway.clone(),
                    listener: p.listener,
                    grpc: id.grpc,
                    route: Arc::clone(model),
                    actions: acts.clone(),
                };
                // A full build visits routes in order: append without a search.
                match h.contributions.last() {
                    Some(last) if last.order() >= contribution.order() => {
                        let order = contribution.order();
                        let at = h.contributions.partition_point(|c| c.order() < order);
                        h.contributions.insert(at, contribution);
                    }
                    _ => h.contributions.push(contribution),
                }
                mark(dirty, *addr, host);
            }
        }
    }
}

/// Marks `host` of socket `addr` to be built again (a no-op when all of it will be,
/// as on a first load: copying the name only to drop it was an allocation per route).
fn mark(dirty: &mut Dirty, addr: SocketAddr, host: &str) {
    if let Some(set) = dirty.entry(addr).or_insert_with(|| Some(HashSet::new()))
        && !set.contains(host)
    {
        set.insert(host.into());
    }
}

impl Socket {
    /// Builds the virtual hosts of `hosts` (all when `None`) again, dropping those left
    /// without routes, and returns the socket's route table: the last one patched at
    /// those hostnames, or a new one. A hostname whose contributions carry the very
    /// actions of the same hostname in `old` shares its virtual host.
    fn rebuild(
        &mut self,
        hosts: Option<HashSet<Box<str>>>,
        old: Option<&HashMap<Arc<str>, Host>>,
    ) -> RouteTable {
        let build = |name: &str, h: &mut Host| {
            // Kept as long as the hostname's routes: pushes left room for eight where
            // five routes share a hostname.
            h.contributions.shrink_to_fit();
            let same = |o: &Host| {
                o.contributions.len() == h.contributions.len()
                    && o.contributions
                        .iter()
                        .zip(&h.contributions)
                        .all(|(a, b)| a.actions.same(&b.actions))
            };
            match old.and_then(|o| o.get(name)) {
                Some(o) if same(o) => h.vhost = Arc::clone(&o.vhost),
                _ => h.vhost = Arc::new(virtual_host(&h.contributions)),
            }
        };
        let (Some(names), Some(last)) = (hosts, &self.listener) else {
            self.hosts.retain(|_, h| !h.contributions.is_empty());
            for (name, h) in &mut self.hosts {
                build(name, h);
            }
            return RouteTable::from_hosts(
                self.hosts
                    .iter()
                    .map(|(h, e)| (named(h), Arc::clone(&e.vhost))),
            );
        };
        let mut changes: Vec<(Box<str>, Option<Arc<VirtualHost>>)> = Vec::new();
        for name in names {
            match self.hosts.get_mut(&*name) {
                Some(h) if h.contributions.is_empty() => {
                    self.hosts.remove(&*name);
                    changes.push((name, None));
                }
                Some(h) => {
                    build(&name, h);
                    changes.push((name, Some(Arc::clone(&h.vhost))));
                }
                None => changes.push((name, None)),
            }
        }
        last.routes
            .patched(changes.iter().map(|(h, v)| (named(h), v.clone())))
    }
}

/// A hostname as route tables take it: `""` is any host.
fn named(host: &str) -> Option<&str> {
    (!host.is_empty()).then_some(host)
}

/// The sockets the Gateways' HTTP and HTTPS listeners need, and which socket each
/// listener serves on.
fn plan_sockets<'g>(
    gateways: &'g BTreeMap<ObjectKey, GatewayModel<'_>>,
    internal_ports: Option<&BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
) -> (BTreeMap<SocketAddr, PortPlan>, ListenerSockets<'g>) {
    // Keyed by socket, not by Gateway: with a shared address (Kubernetes mode without
    // per-Gateway addressing) listeners of several Gateways on one port share a socket
    // and one table, told apart by hostname like listeners of one Gateway. Otherwise
    // every socket belongs to exactly one Gateway.
    let mut sockets: BTreeMap<SocketAddr, PortPlan> = BTreeMap::new();
    let mut serving = ListenerSockets::new();
    for (key, model) in gateways {
        let Ok(ip) = model.address else { continue };
        let gateway = model.key.joined();
        let client = model.backend_client.as_ref().map(|b| Arc::clone(&b.cert));
        let mut on = vec![None; model.listeners.len()];
        for (i, listener) in model.listeners.iter().enumerate() {
            if !listener.usable() || listener.is_l4() {
                continue;
            }
            let Some(port) = listener.port() else {
                continue;
            };
            // Kubernetes mode binds each listener port's internal port instead.
            let bind = match internal_ports {
                None => Some(port),
                Some(all) => all.get(&model.key).and_then(|m| m.get(&port)).copied(),
            };
            let Some(bind) = bind else { continue };
            let addr = SocketAddr::new(ip, bind);
            let plan = sockets
                .entry(addr)
                .or_insert_with(|| PortPlan::new(Arc::clone(&gateway), port));
            plan.sections.push(listener.section());
            if let Some(cert) = &listener.certificate {
                plan.tls
                    .get_or_insert_with(TlsCerts::default)
                    .add(listener.spec.hostname.as_deref(), Arc::clone(cert));
            }
            // Validation is per port, so every HTTPS listener on it carries the same.
            if let Some(auth) = &listener.client_auth {
                plan.client_auth.get_or_insert_with(|| Arc::clone(auth));
            }
            if let Some(slot) = on.get_mut(i) {
                *slot = Some((addr, Arc::clone(&gateway), client.clone()));
            }
        }
        serving.insert(key, on);
    }
    (sockets, serving)
}

/// One hostname's entries: every rule match of every route attached for it.
fn virtual_host(contributions: &[Contribution]) -> VirtualHost {
    // Sized exactly: the table lives as long as the hostname's routes stay, and an
    // entry is 150 bytes (pushes left 1.2 KiB for five entries per hostname).
    let count = contributions
        .iter()
        .flat_map(|c| c.route.rules.iter().zip(c.actions.rules.iter()))
        .map(|(rule, _)| rule.matches.len())
        .sum();
    let mut entries = Vec::with_capacity(count);
    for Contribution { route, actions, .. } in contributions {
        for (ri, (rule, action)) in route.rules.iter().zip(actions.rules.iter()).enumerate() {
            for (mi, m) in rule.matches.iter().enumerate() {
                entries.push(RouteEntry {
                    matcher: m.clone(),
                    order: RouteOrder {
                        created: route.created,
                        route: Arc::clone(action.route()),
                        rule: u32::try_from(ri).unwrap_or(u32::MAX),
                        index: u32::try_from(mi).unwrap_or(u32::MAX),
                    },
                    action: Arc::clone(action),
                });
            }
        }
    }
    VirtualHost::new(entries)
}

/// What the listeners sharing one socket make of it.
struct PortPlan {
    /// The Gateway that claimed the socket (with a shared address, the first by name
    /// of those sharing it): metrics and bind failures are reported under its name.
    gateway: Arc<str>,
    /// The listener port clients use.
    port: u16,
    sections: Vec<Arc<str>>,
    client_auth: Option<Arc<ClientAuth>>,
    /// Set when the port's listeners are HTTPS (a protocol conflict keeps them from
    /// mixing with HTTP ones).
    tls: Option<TlsCerts>,
}

impl PortPlan {
    fn new(gateway: Arc<str>, port: u16) -> Self {
        Self {
            gateway,
            port,
            sections: Vec::new(),
            client_auth: None,
            tls: None,
        }
    }

    /// The socket's listener, serving `table`.
    fn listener(self, addr: SocketAddr, table: RouteTable) -> Listener {
        let mut listener =
            Listener::new(addr, self.gateway, self.sections, table).with_public_port(self.port);
        if let Some(certs) = self.tls {
            listener = listener.with_tls(certs);
            if let Some(auth) = self.client_auth {
                listener = listener.with_client_auth(auth);
            }
        }
        listener
    }
}

fn rule_actions(gateway: &Arc<str>, client: &Client, route: &RouteModel) -> Actions {
    let name = route.key.joined();
    let stats = RouteStats::new(Arc::clone(gateway), route.kind, name);
    let kind = if route.kind == "GRPCRoute" {
        RouteKind::Grpc
    } else {
        RouteKind::Http
    };
    let rules = route
        .rules
        .iter()
        .map(|rule| {
            let (filters, backends) = match &rule.invalid {
                // An invalid rule answers 500 to the requests it matches rather than let
                // them fall through to a rule the author did not mean.
                Some(why) => (
                    Filters::default(),
                    BackendSet::new(vec![WeightedBackend {
                        weight: 1,
                        target: BackendTarget::Invalid {
                            reason: (**why).into(),
                        },
                        filters: Filters::default(),
                    }]),
                ),
                None => (
                    rule.filters.clone(),
                    BackendSet::new(Arc::clone(&rule.backends)),
                ),
            };
            let extras = RuleExtras {
                rule: rule.name.clone(),
                timeout: rule.timeout,
                retry: rule.retry.clone(),
                backend_client_cert: client.clone(),
            };
            Arc::new(RuleAction::new(
                kind,
                filters,
                backends,
                extras,
                stats.clone(),
            ))
        })
        .collect();
    Actions { rules }
}
