//! Translation of the validated model into the proxy's Snapshot.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use aether_proxy::backend::{BackendSet, BackendTarget, WeightedBackend};
use aether_proxy::client_auth::ClientAuth;
use aether_proxy::filters::Filters;
use aether_proxy::routing::{RouteEntry, RouteOrder, RouteTable, RuleAction, VirtualHost};
use aether_proxy::telemetry::RouteStats;
use aether_proxy::tls::TlsCerts;
use aether_proxy::{Listener, Snapshot};
use gateway_api::httproutes::HttpRoute;

use super::gateway::GatewayModel;
use super::route::RouteModel;
use crate::store::ObjectKey;

/// What translation keeps from one Snapshot to the next: a rebuilt Snapshot shares the
/// rule actions of every route whose model is unchanged and the virtual host of every
/// hostname whose routes are unchanged. An empty memo builds everything.
#[derive(Default)]
pub struct TranslateMemo {
    /// Per Gateway, per route: the actions built for the route model held.
    actions: HashMap<ObjectKey, RouteActions>,
    /// Per socket, per hostname (`""` for any host): the virtual host and the actions
    /// it was built from, in order.
    vhosts: HashMap<SocketAddr, HostTables>,
}

/// Per route of one Gateway, the model its actions were built for, and the actions.
type RouteActions = HashMap<ObjectKey, (Arc<RouteModel>, Arc<Actions>)>;
/// Per hostname of one socket, the actions its virtual host was built from, and it.
type HostTables = HashMap<Box<str>, (Vec<Arc<Actions>>, Arc<VirtualHost>)>;
/// A route attached for a hostname, with its actions there.
type Contribution = (Arc<RouteModel>, Arc<Actions>);

/// One route's rule actions on one Gateway.
pub struct Actions {
    name: Arc<str>,
    rules: Vec<Arc<RuleAction>>,
}

impl TranslateMemo {
    pub fn snapshot(
        &mut self,
        gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
        routes: &[(Arc<RouteModel>, &HttpRoute)],
        internal_ports: Option<&BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
    ) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let mut old_actions = std::mem::take(&mut self.actions);
        // Keyed by socket, not by Gateway: with a shared address (Kubernetes mode without
        // per-Gateway addressing) listeners of several Gateways on one port share a socket
        // and one table, told apart by hostname like listeners of one Gateway. Otherwise
        // every socket belongs to exactly one Gateway.
        let mut sockets: BTreeMap<SocketAddr, PortPlan<'_>> = BTreeMap::new();
        for model in gateways.values() {
            let Ok(ip) = model.address else { continue };
            let gateway: Arc<str> = model.key.to_string().into();
            let mut old = old_actions.remove(&model.key).unwrap_or_default();
            let mut actions = RouteActions::new();
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
                    let Some((route, _)) = routes.get(att.route) else {
                        continue;
                    };
                    let acts = match actions.get(&route.key) {
                        Some((_, acts)) => Arc::clone(acts),
                        None => {
                            // Moved with its key from the last run's map when it stands.
                            let (key, acts) = match old.remove_entry(&route.key) {
                                Some((key, (built_for, acts)))
                                    if Arc::ptr_eq(&built_for, route) =>
                                {
                                    (key, acts)
                                }
                                _ => (route.key.clone(), Arc::new(rule_actions(&gateway, route))),
                            };
                            actions.insert(key, (Arc::clone(route), Arc::clone(&acts)));
                            acts
                        }
                    };
                    for host in att.hostnames.iter() {
                        plan.hosts
                            .entry(host.as_deref().unwrap_or(""))
                            .or_default()
                            .push((Arc::clone(route), Arc::clone(&acts)));
                    }
                }
            }
            self.actions.insert(model.key.clone(), actions);
        }
        let mut old_vhosts = std::mem::take(&mut self.vhosts);
        for (addr, plan) in sockets {
            let mut old = old_vhosts.remove(&addr).unwrap_or_default();
            let mut kept = HostTables::with_capacity(plan.hosts.len());
            for (host, contributions) in plan.hosts {
                let built_from: Vec<Arc<Actions>> =
                    contributions.iter().map(|(_, a)| Arc::clone(a)).collect();
                let (key, vhost) = match old.remove_entry(host) {
                    Some((key, (from, vhost)))
                        if from.len() == built_from.len()
                            && from.iter().zip(&built_from).all(|(a, b)| Arc::ptr_eq(a, b)) =>
                    {
                        (key, vhost)
                    }
                    Some((key, _)) => (key, Arc::new(virtual_host(&contributions))),
                    None => (host.into(), Arc::new(virtual_host(&contributions))),
                };
                kept.insert(key, (built_from, vhost));
            }
            let table = RouteTable::from_hosts(
                kept.iter()
                    .map(|(h, (_, v))| ((!h.is_empty()).then_some(&**h), Arc::clone(v))),
            );
            self.vhosts.insert(addr, kept);
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
        snapshot
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
