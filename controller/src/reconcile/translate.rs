//! Translation of the validated model into the proxy's Snapshot.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use aether_proxy::backend::{BackendSet, BackendTarget, WeightedBackend};
use aether_proxy::client_auth::ClientAuth;
use aether_proxy::filters::Filters;
use aether_proxy::routing::{RouteEntry, RouteOrder, RouteTable, RuleAction, VirtualHost};
use aether_proxy::telemetry::RouteStats;
use aether_proxy::tls::TlsCerts;
use aether_proxy::{Listener, Snapshot};
use foldhash::{HashMap, HashMapExt};

use super::gateway::GatewayModel;
use super::route::RouteModel;
use crate::store::ObjectKey;

/// What translation keeps from one Snapshot to the next: a rebuilt Snapshot shares the
/// virtual host of every hostname whose routes' actions are unchanged (the actions
/// themselves are kept per route, in [`RouteActions`]). An empty memo builds everything.
///
/// Entries are updated where they stand and marked with the run that used them; only a
/// run that used fewer entries than a map holds sweeps it. A hostname that stays costs
/// one lookup per run.
#[derive(Default)]
pub struct TranslateMemo {
    run: u64,
    /// Per socket, per hostname (`""` for any host): the virtual host and the actions
    /// it was built from, in order.
    vhosts: HashMap<SocketAddr, HostTables>,
}

/// A route as translation sees it: its model, and the actions built for it, which
/// translation fills for the Gateways it serves on and later runs reuse.
pub struct RouteView<'r> {
    pub model: &'r Arc<RouteModel>,
    pub actions: &'r mut RouteActions,
}

/// Per Gateway a route serves on (usually one), its rule actions there. Kept with the
/// route, so they go when the route is compiled again or removed.
#[derive(Default)]
pub struct RouteActions(Vec<(ObjectKey, Arc<Actions>)>);

impl RouteActions {
    /// Keeps the actions of the Gateways `keep` names.
    pub fn retain(&mut self, keep: impl Fn(&ObjectKey) -> bool) {
        self.0.retain(|(gw, _)| keep(gw));
    }

    /// The actions on Gateway `key` (named `gateway` in metrics), built if missing.
    fn on(&mut self, key: &ObjectKey, gateway: &str, route: &RouteModel) -> Arc<Actions> {
        if let Some((_, acts)) = self.0.iter().find(|(gw, _)| gw == key) {
            return Arc::clone(acts);
        }
        let acts = Arc::new(rule_actions(gateway, route));
        self.0.push((key.clone(), Arc::clone(&acts)));
        acts
    }
}

/// Per hostname of one socket, its virtual host.
type HostTables = HashMap<Box<str>, Host>;
/// A route attached for a hostname, with its actions there.
type Contribution = (Arc<RouteModel>, Arc<Actions>);

struct Host {
    /// The actions the virtual host was built from, in order.
    from: Vec<Arc<Actions>>,
    vhost: Arc<VirtualHost>,
    used: u64,
}

/// One route's rule actions on one Gateway.
pub struct Actions {
    name: Arc<str>,
    rules: Vec<Arc<RuleAction>>,
}

impl TranslateMemo {
    pub fn snapshot(
        &mut self,
        gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
        routes: &mut [RouteView<'_>],
        internal_ports: Option<&BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
    ) -> Snapshot {
        self.run += 1;
        let run = self.run;
        let mut snapshot = Snapshot::default();
        // Keyed by socket, not by Gateway: with a shared address (Kubernetes mode without
        // per-Gateway addressing) listeners of several Gateways on one port share a socket
        // and one table, told apart by hostname like listeners of one Gateway. Otherwise
        // every socket belongs to exactly one Gateway.
        let mut sockets: BTreeMap<SocketAddr, PortPlan<'_>> = BTreeMap::new();
        for model in gateways.values() {
            let Ok(ip) = model.address else { continue };
            let gateway: Arc<str> = model.key.to_string().into();
            for listener in model.listeners.iter().filter(|l| l.usable() && !l.is_l4()) {
                let Some(port) = listener.port() else {
                    continue;
                };
                // Kubernetes mode binds each listener port's internal port instead.
                let bind = match internal_ports {
                    None => Some(port),
                    Some(all) => all.get(&model.key).and_then(|m| m.get(&port)).copied(),
                };
                let Some(bind) = bind else { continue };
                let plan = sockets
                    .entry(SocketAddr::new(ip, bind))
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
                for att in &listener.attachments {
                    let Some(view) = routes.get_mut(att.route) else {
                        continue;
                    };
                    let acts = view.actions.on(&model.key, &gateway, view.model);
                    for host in att.hostnames.iter() {
                        plan.hosts
                            .entry(host.as_deref().unwrap_or(""))
                            .or_default()
                            .push((Arc::clone(view.model), Arc::clone(&acts)));
                    }
                }
            }
        }
        for (addr, plan) in sockets {
            let tables = self.vhosts.entry(addr).or_default();
            let mut used = 0;
            for (host, contributions) in &plan.hosts {
                used += 1;
                let same = |h: &Host| {
                    h.from.len() == contributions.len()
                        && h.from
                            .iter()
                            .zip(contributions)
                            .all(|(a, (_, b))| Arc::ptr_eq(a, b))
                };
                match tables.get_mut(*host) {
                    Some(h) if same(h) => h.used = run,
                    Some(h) => {
                        h.from.clear();
                        h.from
                            .extend(contributions.iter().map(|(_, a)| Arc::clone(a)));
                        h.vhost = Arc::new(virtual_host(contributions));
                        h.used = run;
                    }
                    None => {
                        let h = Host {
                            from: contributions.iter().map(|(_, a)| Arc::clone(a)).collect(),
                            vhost: Arc::new(virtual_host(contributions)),
                            used: run,
                        };
                        tables.insert((*host).into(), h);
                    }
                }
            }
            sweep(tables, used, |h| h.used == run);
            let table = RouteTable::from_hosts(
                tables
                    .iter()
                    .map(|(h, e)| ((!h.is_empty()).then_some(&**h), Arc::clone(&e.vhost))),
            );
            let mut listener =
                Listener::new(addr, plan.gateway, plan.sections, table).with_public_port(plan.port);
            if let Some(certs) = plan.tls {
                listener = listener.with_tls(certs);
                if let Some(auth) = plan.client_auth {
                    listener = listener.with_client_auth(auth);
                }
            }
            snapshot.listeners.insert(addr, Arc::new(listener));
        }
        self.vhosts
            .retain(|addr, _| snapshot.listeners.contains_key(addr));
        snapshot
    }
}

/// Drops the entries this run did not use; `used` of them were, so a map of that size
/// needs no sweep.
fn sweep<V>(
    map: &mut HashMap<impl Eq + std::hash::Hash, V>,
    used: usize,
    kept: impl Fn(&V) -> bool,
) {
    if map.len() > used {
        map.retain(|_, v| kept(v));
    }
}

/// One hostname's entries: every rule match of every route attached for it.
fn virtual_host(contributions: &[Contribution]) -> VirtualHost {
    let mut entries = Vec::new();
    for (route, acts) in contributions {
        for (ri, (rule, action)) in route.rules.iter().zip(acts.rules.iter()).enumerate() {
            for (mi, m) in rule.matches.iter().enumerate() {
                entries.push(RouteEntry {
                    matcher: m.clone(),
                    order: RouteOrder {
                        created: route.created,
                        route: Arc::clone(&acts.name),
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

/// What the listeners sharing one socket contribute to it.
struct PortPlan<'r> {
    /// The Gateway that claimed the socket (with a shared address, the first by name
    /// of those sharing it): metrics and bind failures are reported under its name.
    gateway: Arc<str>,
    /// The listener port clients use.
    port: u16,
    sections: Vec<Arc<str>>,
    client_auth: Option<Arc<ClientAuth>>,
    /// Per hostname (`""` for any host), the routes attached for it, in order.
    hosts: HashMap<&'r str, Vec<Contribution>>,
    /// Set when the port's listeners are HTTPS (a protocol conflict keeps them from
    /// mixing with HTTP ones).
    tls: Option<TlsCerts>,
}

impl PortPlan<'_> {
    fn new(gateway: Arc<str>, port: u16) -> Self {
        Self {
            gateway,
            port,
            sections: Vec::new(),
            client_auth: None,
            hosts: HashMap::new(),
            tls: None,
        }
    }
}

fn rule_actions(gateway: &str, route: &RouteModel) -> Actions {
    let name: Arc<str> = route.key.to_string().into();
    let stats = RouteStats::new(gateway, &name);
    let rules = route
        .rules
        .iter()
        .map(|rule| {
            let (filters, backends) = match &rule.invalid {
                // An invalid rule answers 500 to the requests it matches rather than let
                // them fall through to a rule the author did not mean.
                Some(why) => (
                    Filters::default(),
                    vec![WeightedBackend {
                        weight: 1,
                        target: BackendTarget::Invalid {
                            reason: why.as_str().into(),
                        },
                        filters: Filters::default(),
                    }],
                ),
                None => (
                    rule.filters.clone(),
                    rule.backends
                        .iter()
                        .map(|b| WeightedBackend {
                            weight: b.weight,
                            target: match &b.target {
                                Ok(backend) => BackendTarget::Service(Arc::clone(backend)),
                                Err(p) => BackendTarget::Invalid {
                                    reason: p.message.as_str().into(),
                                },
                            },
                            filters: b.filters.clone(),
                        })
                        .collect(),
                ),
            };
            Arc::new(RuleAction {
                route: Arc::clone(&name),
                kind: route.kind,
                rule: rule.name.clone(),
                filters,
                backends: BackendSet::new(backends),
                timeout: rule.timeout,
                retry: rule.retry.clone(),
                stats: stats.clone(),
            })
        })
        .collect();
    Actions { name, rules }
}
