//! Translation of TCP, UDP and TLS listeners into the proxy's L4 sockets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use aether_proxy::backend::{BackendSet, BackendTarget, WeightedBackend};
use aether_proxy::backend_client_cert::ClientCertificate;
use aether_proxy::filters::Filters;
use aether_proxy::l4::{L4Routes, L4Target};
use aether_proxy::tls::TlsCerts;
use aether_proxy::{Listener, Protocol, Snapshot};

use super::gateway::GatewayModel;
use super::l4::L4RouteModel;
use crate::l4route::L4Route;
use crate::store::ObjectKey;

/// What the L4 listeners sharing one (transport, socket) contribute to it.
struct Plan {
    /// The Gateway that claimed the socket (see `translate::PortPlan`).
    gateway: Arc<str>,
    /// The listener port clients use.
    port: u16,
    protocol: Protocol,
    /// Certificates by SNI of TLS-terminating listeners.
    tls: Option<TlsCerts>,
    sections: Vec<Arc<str>>,
    /// (route index, hostname, terminated, the Gateway's backend client certificate)
    /// in listener order.
    entries: Vec<(usize, Option<String>, bool, Client)>,
    /// TLS listeners' (hostname, terminates), for a port with both modes.
    tls_listeners: Vec<(Option<String>, bool)>,
}

/// Adds every usable L4 listener of `gateways` to `snapshot`.
pub fn add_listeners(
    snapshot: &mut Snapshot,
    gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
    routes: &[(L4RouteModel, &L4Route)],
    internal_ports: Option<&BTreeMap<ObjectKey, BTreeMap<u16, u16>>>,
) {
    // Keyed by socket across Gateways, as HTTP sockets are (a shared address lets
    // several Gateways' TLS listeners on one port be told apart by SNI).
    let mut plans: BTreeMap<(bool, SocketAddr), Plan> = BTreeMap::new();
    let mut targets: BTreeMap<TargetKey, Arc<L4Target>> = BTreeMap::new();
    for model in gateways.values() {
        let Ok(ip) = model.address else { continue };
        let gateway = model.key.joined();
        let client: Client = model.backend_client.as_ref().map(|b| Arc::clone(&b.cert));
        for listener in model.listeners.iter().filter(|l| l.usable() && l.is_l4()) {
            let Some(port) = listener.port() else {
                continue;
            };
            let protocol = match listener.spec.protocol.as_str() {
                "UDP" => Protocol::Udp,
                "TLS" if listener.terminates_tls() => Protocol::TlsTerminate,
                "TLS" => Protocol::TlsPassthrough,
                _ => Protocol::Tcp,
            };
            if listener.pool.is_some() {
                // A pool serves each assigned port, for its route alone; in Kubernetes
                // mode on that port's internal port behind the Gateway Service.
                for (&index, &p) in &listener.pool_ports {
                    let Some((route, _)) = routes.get(index) else {
                        continue;
                    };
                    let bind = match internal_ports {
                        None => Some(p),
                        Some(all) => all.get(&model.key).and_then(|m| m.get(&p)).copied(),
                    };
                    let Some(bind) = bind else { continue };
                    let addr = SocketAddr::new(ip, bind);
                    let l = Listener::l4(
                        addr,
                        Arc::clone(&gateway),
                        vec![listener.section()],
                        protocol,
                        L4Routes::single(target(&gateway, route, client.clone())),
                    )
                    .with_public_port(p);
                    let map = if listener.is_udp() {
                        &mut snapshot.udp
                    } else {
                        &mut snapshot.listeners
                    };
                    map.insert(addr, Arc::new(l));
                }
                continue;
            }
            let bind = match internal_ports {
                None => Some(port),
                Some(all) => all.get(&model.key).and_then(|m| m.get(&port)).copied(),
            };
            let Some(bind) = bind else { continue };
            let plan = plans
                .entry((listener.is_udp(), SocketAddr::new(ip, bind)))
                .or_insert_with(|| Plan {
                    gateway: Arc::clone(&gateway),
                    port,
                    protocol,
                    tls: None,
                    sections: Vec::new(),
                    entries: Vec::new(),
                    tls_listeners: Vec::new(),
                });
            // Terminate and Passthrough listeners on one port: mixed mode.
            if matches!(
                (plan.protocol, protocol),
                (Protocol::TlsTerminate, Protocol::TlsPassthrough)
                    | (Protocol::TlsPassthrough, Protocol::TlsTerminate)
            ) {
                plan.protocol = Protocol::TlsMixed;
            }
            let terminates = protocol == Protocol::TlsTerminate;
            if protocol == Protocol::TlsTerminate || protocol == Protocol::TlsPassthrough {
                plan.tls_listeners
                    .push((listener.spec.hostname.clone(), terminates));
            }
            plan.sections.push(listener.section());
            if let Some(cert) = &listener.certificate {
                plan.tls
                    .get_or_insert_with(TlsCerts::default)
                    .add(listener.spec.hostname.as_deref(), Arc::clone(cert));
            }
            for att in &listener.l4_attachments {
                for host in att.hostnames.iter() {
                    plan.entries
                        .push((att.route, host.clone(), terminates, client.clone()));
                }
            }
        }
    }
    for ((udp, addr), mut plan) in plans {
        // Oldest route first: it keeps a contested hostname (or the whole socket).
        plan.entries.sort_by(|a, b| {
            let (ra, rb) = (&routes[a.0].0, &routes[b.0].0);
            (ra.created, &ra.key).cmp(&(rb.created, &rb.key))
        });
        let mixed = plan.protocol == Protocol::TlsMixed;
        let mut l4 = L4Routes::default();
        for (index, host, terminated, client) in plan.entries {
            let Some((route, _)) = routes.get(index) else {
                continue;
            };
            let by = client.as_ref().map(|c| Arc::as_ptr(c) as usize);
            let target = targets
                .entry((Arc::clone(&plan.gateway), index, by))
                .or_insert_with(|| Arc::new(target(&plan.gateway, route, client)));
            if mixed && terminated {
                l4.add_terminated(host.as_deref(), Arc::clone(target));
            } else {
                l4.add(host.as_deref(), Arc::clone(target));
            }
        }
        if mixed {
            for (hostname, terminates) in &plan.tls_listeners {
                l4.add_listener(hostname.as_deref(), *terminates);
            }
        }
        let mut listener = Listener::l4(addr, plan.gateway, plan.sections, plan.protocol, l4)
            .with_public_port(plan.port);
        listener.tls = plan.tls;
        let map = if udp {
            &mut snapshot.udp
        } else {
            &mut snapshot.listeners
        };
        map.insert(addr, Arc::new(listener));
    }
}

/// A Gateway's backend client certificate (`spec.tls.backend`), if it has one.
type Client = Option<Arc<ClientCertificate>>;

/// (Gateway, route index, client certificate by address): by the certificate too, as
/// Gateways sharing a socket may each present their own (one Arc per Gateway).
type TargetKey = (Arc<str>, usize, Option<usize>);

fn target(gateway: &str, route: &L4RouteModel, client: Client) -> L4Target {
    let backends: Arc<[_]> = route
        .backends
        .iter()
        .map(|(weight, b)| WeightedBackend {
            weight: *weight,
            target: match b {
                Ok(backend) => BackendTarget::Service(Arc::clone(backend)),
                // The spec: a share of connections as large as an invalid backendRef's
                // weight must be rejected.
                Err(p) => BackendTarget::Invalid {
                    reason: p.message.as_str().into(),
                },
            },
            filters: Filters::default(),
        })
        .collect();
    L4Target::new(
        gateway,
        route.kind.as_str(),
        route.key.joined(),
        BackendSet::new(backends),
    )
    .with_backend_client_cert(client)
}
