//! The reconciler: a function from the Store to the Snapshot the proxy serves and the
//! status every object should carry. Same Store, same Outcome, on every replica (its one
//! question to the host: whether a standalone Gateway's requested address is local).
//! `phases.rs` runs it phase by phase; this module holds its types and entry points.

pub mod address;
mod backend;
mod backend_client_cert;
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
mod phases;
pub mod portpool;
pub mod ports;
mod retry;
pub mod routability;
mod route;
mod route_memo;
mod route_status;
pub mod services;
mod shared;
mod translate;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use aether_proxy::Snapshot;
use gateway_api::gateways::{
    Gateway, GatewayStatus, GatewayStatusAddresses, GatewayStatusListeners,
};
use ipnet::IpNet;

pub use self::incremental::{Reconciler, Redone};

use self::address::{AddressError, AddressRequest};
use self::conditions as cond;
use self::gateway::GatewayModel;
use crate::status::Statuses;
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
    phases::run(
        store,
        settings,
        addressing,
        &mut incremental::Memo::default(),
    )
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
