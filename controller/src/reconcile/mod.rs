//! The reconciler: a pure function from the Store to the Snapshot the proxy serves and
//! the status every object should carry. Same Store, same Outcome, on every replica.

pub mod address;
mod backend;
mod backend_tls;
mod certificates;
pub mod conditions;
pub mod dedicated;
pub mod edge_slices;
mod filters;
mod frontend_tls;
mod gateway;
pub mod hostname;
mod incremental;
mod l4;
mod l4_translate;
pub mod listenerset;
mod parent;
pub mod portpool;
pub mod ports;
mod retry;
pub mod routability;
mod route;
mod route_memo;
pub mod services;
mod shared;
mod translate;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use aether_proxy::Snapshot;
use gateway_api::gatewayclasses::GatewayClassStatus;
use gateway_api::gateways::{
    Gateway, GatewayStatus, GatewayStatusAddresses, GatewayStatusListeners,
};
use ipnet::IpNet;

pub use self::incremental::{Reconciler, Redone};

use self::address::{AddressError, AddressRequest};
use self::conditions as cond;
use self::gateway::GatewayModel;
use crate::status::{ObjectStatus, Statuses};
use crate::store::{ObjectKey, Store};

/// What the reconciler is told about its environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub controller_name: String,
    pub address_pool: IpNet,
}

/// Where Gateways' listeners are served.
#[derive(Debug, Clone)]
pub enum Addressing {
    /// Standalone: each Gateway gets a local address; listeners bind `address:port`.
    LocalPool(IpNet),
    /// Kubernetes: each (Gateway, listener port) gets an internal port from `range`;
    /// listeners bind `0.0.0.0:<internal port>` behind a Service per Gateway.
    InternalPorts {
        range: ports::PortRange,
        service: services::ServiceSettings,
        /// Usually `0.0.0.0`; tests running several instances use loopback addresses.
        bind: IpAddr,
    },
    /// Kubernetes without per-Gateway addressing: every listener binds
    /// `bind:<listener port>` behind the edge's own Service, whose addresses every
    /// Gateway reports; Gateways share sockets, told apart by hostname.
    SharedService {
        service: services::ServiceSettings,
        bind: IpAddr,
    },
}

pub struct Outcome {
    pub snapshot: Snapshot,
    pub statuses: Statuses,
    /// The Service and EndpointSlices each Gateway should have (Kubernetes mode;
    /// empty otherwise).
    pub services: BTreeMap<ObjectKey, services::GatewayObjects>,
    /// The Services whose EndpointSlices this outcome depends on: those backendRefs
    /// name, the edge's own, dedicated Gateways' pods Services, and the Gateway
    /// Services whose slices we write. A slice of any other Service can change without
    /// changing the outcome, so the Kubernetes source doesn't reconcile for it.
    pub endpoint_interest: BTreeSet<ObjectKey>,
    /// What this run did again rather than reuse.
    pub redone: Redone,
}

/// Standalone reconcile: addresses from `settings.address_pool`.
pub fn reconcile(store: &Store, settings: &Settings) -> Outcome {
    reconcile_with(
        store,
        settings,
        &Addressing::LocalPool(settings.address_pool),
    )
}

/// Reconcile with an explicit addressing mode (`settings.address_pool` is used only by
/// [`Addressing::LocalPool`]): the full reconcile, with nothing reused. A source that
/// reconciles again and again keeps a [`Reconciler`] instead.
pub fn reconcile_with(store: &Store, settings: &Settings, addressing: &Addressing) -> Outcome {
    run(
        store,
        settings,
        addressing,
        &mut incremental::Memo::default(),
    )
}

/// The phases of a reconcile; `memo` holds what earlier runs derived and may be reused.
fn run(
    store: &Store,
    settings: &Settings,
    addressing: &Addressing,
    memo: &mut incremental::Memo,
) -> Outcome {
    let mut statuses = Statuses::default();
    let mut ours: BTreeSet<&str> = BTreeSet::new();
    for (name, class) in &store.gateway_classes {
        if class.spec.controller_name != settings.controller_name {
            continue;
        }
        ours.insert(name);
        let generation = class.metadata.generation.unwrap_or(1);
        statuses.gateway_classes.insert(
            name.clone(),
            ObjectStatus::new(
                generation,
                GatewayClassStatus {
                    conditions: Some(vec![cond::class_accepted(generation)]),
                    supported_features: None,
                },
            ),
        );
    }

    let mut ordered: Vec<(&ObjectKey, &Gateway)> = store
        .gateways
        .iter()
        .filter(|(_, g)| ours.contains(g.spec.gateway_class_name.as_str()))
        .map(|(k, g)| (k, &**g))
        .collect();
    // Oldest first, so an established Gateway keeps an address a newcomer also asks for.
    ordered.sort_by_key(|(k, g)| {
        (
            g.metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            *k,
        )
    });
    let requests: Vec<(ObjectKey, AddressRequest)> = ordered
        .iter()
        .map(|(k, g)| ((*k).clone(), address_request(g)))
        .collect();
    let mut addresses = match addressing {
        Addressing::LocalPool(pool) => address::allocate(pool, &requests),
        // Every listener binds all interfaces; its port tells Gateways apart.
        Addressing::InternalPorts { bind, .. } | Addressing::SharedService { bind, .. } => requests
            .iter()
            .map(|(k, _)| (k.clone(), Ok(*bind)))
            .collect(),
    };
    let sets = listenerset::collect(store, &ordered);
    let mut models: BTreeMap<ObjectKey, GatewayModel<'_>> = ordered
        .iter()
        .map(|(key, gw)| {
            let model = GatewayModel {
                key: (*key).clone(),
                generation: gw.metadata.generation.unwrap_or(1),
                rejected: gateway::rejected(gw),
                address: addresses
                    .remove(*key)
                    .unwrap_or(Err(AddressError::PoolExhausted)),
                listeners: gateway::listeners(store, &key.namespace, gw, sets.for_gateway(key)),
            };
            ((*key).clone(), model)
        })
        .collect();
    listenerset::gate_on_parent(&mut models);

    if let Addressing::SharedService { .. } = addressing {
        let order: Vec<&ObjectKey> = ordered.iter().map(|(k, _)| *k).collect();
        shared::resolve_conflicts(&order, &mut models);
    }

    let changes = memo.observe(store);
    let mut resolver = backend::BackendResolver::with_cache(store, memo.take_backends(&changes));
    let [http_statuses, grpc_statuses] = memo.routes.attach(
        store,
        &changes,
        &mut resolver,
        route_memo::GatewaySideRefs {
            sets: &sets,
            controller_name: &settings.controller_name,
            gateways: &models,
        },
    );
    for ((gateway, index), n) in memo.routes.listener_routes() {
        if let Some(listener) = models
            .get_mut(gateway)
            .and_then(|g| g.listeners.get_mut(*index))
        {
            listener.routes = *n;
        }
    }
    statuses.http_routes = http_statuses;
    statuses.grpc_routes = grpc_statuses;
    let route_count = memo.routes.len();

    let l4_routes: Vec<_> = store
        .l4_routes
        .iter()
        .map(|((kind, k), r)| (l4::compile(*kind, k.clone(), r, &mut resolver), &**r))
        .collect();
    statuses.l4_routes = l4::attach(
        store,
        &sets,
        &settings.controller_name,
        &l4_routes,
        &mut models,
    );
    portpool::apply(&mut models, &l4_routes, &mut statuses.l4_routes);
    statuses.backend_tls_policies =
        resolver
            .policies()
            .statuses(store, &settings.controller_name, &models, &sets);

    // Kubernetes-mode placement comes after attachment: a port pool's listener needs an
    // internal port for each port it handed to a route.
    let plan = match addressing {
        Addressing::LocalPool(_) | Addressing::SharedService { .. } => None,
        Addressing::InternalPorts { range, service, .. } => Some(services::plan(
            store,
            &ordered,
            &mut models,
            *range,
            service,
        )),
    };

    let served = match (&plan, addressing) {
        (Some(plan), Addressing::InternalPorts { service, .. }) => Some(plan.served_ports(service)),
        _ => None,
    };
    let internal = served.as_ref();
    let mut snapshot = memo.translate.snapshot(&models, &mut memo.routes, internal);
    l4_translate::add_listeners(&mut snapshot, &models, &l4_routes, internal);
    let (set_statuses, attached_sets) = listenerset::statuses(&sets, &models);
    statuses.listener_sets = set_statuses;
    for model in models.values() {
        let mut status = gateway_status(model);
        let gw = ordered
            .iter()
            .find(|(k, _)| **k == model.key)
            .map(|(_, g)| *g);
        if let Some(gw) = gw {
            let counts = attached_sets.get(&model.key).copied();
            if let Some((n, c)) = listenerset::gateway_fields(gw, model.generation, counts) {
                status.attached_listener_sets = Some(n);
                status.conditions.get_or_insert_with(Vec::new).push(c);
            }
            if let Some(c) = frontend_tls::insecure_fallback_condition(gw, model.generation) {
                status.conditions.get_or_insert_with(Vec::new).push(c);
            }
        }
        let scopes = match (&plan, addressing) {
            (Some(plan), _) => plan.adjust_status(store, model, &mut status),
            (None, Addressing::SharedService { service, .. }) => gw
                .map(|gw| shared::adjust_status(store, service, gw, model, &mut status))
                .unwrap_or_default(),
            (None, _) => Vec::new(),
        };
        if !scopes.is_empty() {
            statuses
                .address_routability
                .insert(model.key.clone(), scopes);
        }
        statuses.gateways.insert(
            model.key.clone(),
            ObjectStatus::new(model.generation, status),
        );
    }
    let mut endpoint_interest = resolver.referenced().clone();
    endpoint_interest.extend(memo.routes.interest().cloned());
    match addressing {
        Addressing::InternalPorts { service, .. } | Addressing::SharedService { service, .. } => {
            endpoint_interest.insert(service.edge_service.clone());
        }
        Addressing::LocalPool(_) => {}
    }
    memo.keep_backends(resolver.into_cache());
    tracing::debug!(
        routes = route_count,
        compiled = memo.routes.redone.compiled,
        attached = memo.routes.redone.attached,
        all_stale = changes.all_stale,
        gateway_side = changes.gateway_side,
        services_changed = changes.services.len(),
        "reconciled"
    );
    let services = plan.map(|p| p.services).unwrap_or_default();
    for objects in services.values() {
        let owned = std::iter::once(&objects.service.metadata)
            .chain(objects.dedicated.iter().map(|d| &d.pods.metadata));
        for meta in owned {
            if let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) {
                endpoint_interest.insert(ObjectKey::new(ns.as_str(), name.as_str()));
            }
        }
    }
    Outcome {
        snapshot,
        statuses,
        services,
        endpoint_interest,
        redone: memo.routes.redone,
    }
}

/// What `spec.addresses` asks for. Every entry is read: one of a type or value the edge
/// can't serve makes the Gateway unaccepted; more than one address, not programmed (a
/// Gateway is served on one); entries without a value ask for any address.
fn address_request(gw: &Gateway) -> AddressRequest {
    let mut ips: Vec<IpAddr> = Vec::new();
    for entry in gw.spec.addresses.iter().flatten() {
        let kind = entry.r#type.as_deref().unwrap_or("IPAddress");
        if kind != "IPAddress" {
            return AddressRequest::Unsupported(format!(
                "address type {kind} is not supported; IPAddress is"
            ));
        }
        match entry.value.as_deref() {
            None | Some("") => {}
            Some(v) => match v.parse::<IpAddr>() {
                Ok(ip) if !ips.contains(&ip) => ips.push(ip),
                Ok(_) => {}
                Err(_) => {
                    return AddressRequest::Unsupported(format!("{v:?} is not an IP address"));
                }
            },
        }
    }
    match ips.as_slice() {
        [] => AddressRequest::Pool,
        [ip] => AddressRequest::Ip(*ip),
        many => AddressRequest::NotUsable(format!(
            "{} addresses were requested; a Gateway is served on one",
            many.len()
        )),
    }
}

fn gateway_status(m: &GatewayModel<'_>) -> GatewayStatus {
    let generation = m.generation;
    // ListenerSets' listeners are reported on their ListenerSets.
    let own: Vec<&gateway::ListenerModel<'_>> =
        m.listeners.iter().filter(|l| l.set.is_none()).collect();
    let listeners: Vec<GatewayStatusListeners> = own
        .iter()
        .map(|l| {
            let accepted = match &l.accepted {
                Ok(()) => cond::accepted(generation, "Listener"),
                Err((reason, msg)) => cond::not_accepted(generation, reason, msg.clone()),
            };
            let conflicted = match &l.conflict {
                None => cond::no_conflicts(generation),
                Some((reason, msg)) => cond::conflicted(generation, reason, msg.clone()),
            };
            let refs = match &l.refs {
                Ok(()) => cond::resolved_refs(generation),
                Err((reason, msg)) => cond::unresolved_refs(generation, reason, msg.clone()),
            };
            let programmed = if l.usable() && m.address.is_ok() {
                cond::programmed(generation, "Listener")
            } else {
                cond::not_programmed(
                    generation,
                    "Invalid",
                    "listener is not serving; see its other conditions",
                )
            };
            GatewayStatusListeners {
                attached_routes: i32::try_from(l.attached_routes()).unwrap_or(i32::MAX),
                conditions: vec![accepted, conflicted, refs, programmed],
                name: l.spec.name.clone(),
                supported_kinds: Some(l.supported_kinds.clone()),
            }
        })
        .collect();
    let usable = own.iter().filter(|l| l.usable()).count();
    let accepted = match &m.address {
        _ if m.rejected.is_some() => {
            let (reason, why) = m.rejected.clone().unwrap_or_default();
            cond::not_accepted(generation, reason, why)
        }
        Err(AddressError::Unsupported(why)) => {
            cond::not_accepted(generation, "UnsupportedAddress", why.clone())
        }
        _ if usable == 0 && !own.is_empty() => {
            cond::not_accepted(generation, "ListenersNotValid", "no listener is valid")
        }
        _ if usable < own.len() => cond::condition(
            "Accepted",
            true,
            "ListenersNotValid",
            "some listeners are not valid; the others are served",
            generation,
        ),
        _ => cond::accepted(generation, "Gateway"),
    };
    let programmed = match &m.address {
        _ if m.rejected.is_some() => {
            cond::not_programmed(generation, "Invalid", "the Gateway is not accepted")
        }
        Err(AddressError::Unsupported(why) | AddressError::NotUsable(why)) => {
            cond::not_programmed(generation, "AddressNotUsable", why.clone())
        }
        Err(AddressError::InUse { address, by }) => cond::not_programmed(
            generation,
            "AddressNotUsable",
            format!("address {address} is already used by Gateway {by}"),
        ),
        Err(AddressError::PoolExhausted) => cond::not_programmed(
            generation,
            "AddressNotAssigned",
            "the address pool has no free address",
        ),
        Ok(_) if usable == 0 && !m.listeners.iter().any(|l| l.usable()) => {
            cond::not_programmed(generation, "Invalid", "no listener can be served")
        }
        Ok(_) => cond::programmed(generation, "Gateway"),
    };
    GatewayStatus {
        addresses: m.address.as_ref().ok().map(|ip| {
            vec![GatewayStatusAddresses {
                r#type: Some("IPAddress".to_owned()),
                value: ip.to_string(),
            }]
        }),
        attached_listener_sets: None,
        conditions: Some(vec![accepted, programmed]),
        listeners: Some(listeners),
    }
}

#[cfg(test)]
mod tests;
