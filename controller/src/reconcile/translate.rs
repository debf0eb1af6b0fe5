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
    for model in gateways.values() {
        let Ok(ip) = model.address else { continue };
        let gateway: Arc<str> = model.key.to_string().into();
        // Several listeners on one port share a socket and one table; each listener's
        // hostname already scopes the entries it contributes.
        let mut ports: BTreeMap<u16, PortPlan> = BTreeMap::new();
        let mut actions: HashMap<usize, Vec<Arc<RuleAction>>> = HashMap::new();
        for listener in model.listeners.iter().filter(|l| l.usable() && !l.is_l4()) {
            let Some(port) = listener.port() else {
                continue;
            };
            let plan = ports.entry(port).or_default();
            plan.sections.push(listener.spec.name.as_str().into());
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
        for (port, plan) in ports {
            // Kubernetes mode binds each listener port's internal port instead.
            let bind = match internal_ports {
                None => Some(port),
                Some(all) => all.get(&model.key).and_then(|m| m.get(&port)).copied(),
            };
            let Some(bind) = bind else { continue };
            let addr = SocketAddr::new(ip, bind);
            let mut listener = Listener::new(
                addr,
                Arc::clone(&gateway),
                plan.sections,
                plan.routes.build(),
            )
            .with_public_port(port);
            if let Some(certs) = plan.tls {
                listener = listener.with_tls(certs);
                if let Some(auth) = plan.client_auth {
                    listener = listener.with_client_auth(auth);
                }
            }
            snapshot.listeners.insert(addr, Arc::new(listener));
        }
    }
    snapshot
}

/// What the listeners sharing one port contribute to its socket.
#[derive(Default)]
struct PortPlan {
    sections: Vec<Arc<str>>,
    client_auth: Option<Arc<ClientAuth>>,
    routes: RouteTableBuilder,
    /// Set when the port's listeners are HTTPS (a protocol conflict keeps them from
    /// mixing with HTTP ones).
    tls: Option<TlsCerts>,
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
