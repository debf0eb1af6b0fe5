//! Translation of the validated model into the proxy's Snapshot.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use aether_proxy::backend::{BackendSet, BackendTarget, WeightedBackend};
use aether_proxy::client_auth::ClientAuth;
use aether_proxy::filters::Filters;
use aether_proxy::routing::{RouteEntry, RouteOrder, RouteTableBuilder, RuleAction};
use aether_proxy::telemetry::RouteStats;
use aether_proxy::tls::TlsCerts;
use aether_proxy::{Listener, Snapshot};
use gateway_api::httproutes::HttpRoute;

use super::gateway::GatewayModel;
use super::route::RouteModel;
use crate::store::ObjectKey;

pub fn snapshot(
    gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
    routes: &[(RouteModel, &HttpRoute)],
    internal_ports: Option<&BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
) -> Snapshot {
    let mut snapshot = Snapshot::default();
    // Keyed by socket, not by Gateway: with a shared address (Kubernetes mode without
    // per-Gateway addressing) listeners of several Gateways on one port share a socket
    // and one table, told apart by hostname like listeners of one Gateway. Otherwise
    // every socket belongs to exactly one Gateway.
    let mut sockets: BTreeMap<SocketAddr, PortPlan> = BTreeMap::new();
    for model in gateways.values() {
        let Ok(ip) = model.address else { continue };
        let gateway: Arc<str> = model.key.to_string().into();
        let mut actions: HashMap<usize, Vec<Arc<RuleAction>>> = HashMap::new();
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
            let builder = &mut plan.routes;
            for att in &listener.attachments {
                let Some((route, _)) = routes.get(att.route) else {
                    continue;
                };
                let acts = actions
                    .entry(att.route)
                    .or_insert_with(|| rule_actions(&gateway, route));
                let name: Arc<str> = route.key.to_string().into();
                for host in &att.hostnames {
                    for (ri, (rule, action)) in route.rules.iter().zip(acts.iter()).enumerate() {
                        for (mi, m) in rule.matches.iter().enumerate() {
                            builder.add(
                                host.as_deref(),
                                RouteEntry {
                                    matcher: m.clone(),
                                    order: RouteOrder {
                                        created: route.created,
                                        route: Arc::clone(&name),
                                        rule: u32::try_from(ri).unwrap_or(u32::MAX),
                                        index: u32::try_from(mi).unwrap_or(u32::MAX),
                                    },
                                    action: Arc::clone(action),
                                },
                            );
                        }
                    }
                }
            }
        }
    }
    for (addr, plan) in sockets {
        let mut listener = Listener::new(addr, plan.gateway, plan.sections, plan.routes.build())
            .with_public_port(plan.port);
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

/// What the listeners sharing one socket contribute to it.
struct PortPlan {
    /// The Gateway that claimed the socket (with a shared address, the first by name
    /// of those sharing it): metrics and bind failures are reported under its name.
    gateway: Arc<str>,
    /// The listener port clients use.
    port: u16,
    sections: Vec<Arc<str>>,
    client_auth: Option<Arc<ClientAuth>>,
    routes: RouteTableBuilder,
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
            routes: RouteTableBuilder::default(),
            tls: None,
        }
    }
}

fn rule_actions(gateway: &str, route: &RouteModel) -> Vec<Arc<RuleAction>> {
    let name: Arc<str> = route.key.to_string().into();
    let stats = RouteStats::new(gateway, &name);
    route
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
        .collect()
}
