//! Kubernetes mode without per-Gateway addressing (`--per-gateway-addressing=false`):
//! every Gateway is served on the edge's own Service, each listener on its
//! own port of every edge pod. Gateways then share sockets, told apart by hostname
//! (and SNI), so two Gateways may not claim the same (port, hostname) or speak two
//! protocols on one port: the older Gateway keeps it, the newer one's listener is
//! Conflicted and says with whom.

use std::collections::BTreeMap;

use gateway_api::gateways::{Gateway, GatewayStatus};

use super::gateway::GatewayModel;
use super::routability;
use super::services::{ServiceSettings, apply_assignment};
use crate::store::{ObjectKey, Store};

/// One served listener's claim on a shared socket.
struct Claim {
    gateway: ObjectKey,
    listener: String,
    port: i32,
    udp: bool,
    protocol: String,
    hostname: Option<String>,
}

/// Marks listeners that collide with an older Gateway's (`order`: oldest first).
/// Conflicts inside one Gateway were already resolved by `gateway::listeners`.
pub(super) fn resolve_conflicts(
    order: &[&ObjectKey],
    models: &mut BTreeMap<ObjectKey, GatewayModel<'_>>,
) {
    let mut claims: Vec<Claim> = Vec::new();
    for key in order {
        let Some(model) = models.get_mut(*key) else {
            continue;
        };
        let mut mine = Vec::new();
        for l in &mut model.listeners {
            if l.pool.is_some() && l.accepted.is_ok() {
                // A pool's ports would be bound on every edge pod for every Gateway,
                // with nothing to keep two Gateways' pools apart.
                l.accepted = Err((
                    "UnsupportedValue",
                    format!(
                        "listener {} is a port pool; pools need per-Gateway addressing (--per-gateway-addressing=true)",
                        l.spec.name
                    ),
                ));
                continue;
            }
            if !l.usable() {
                continue;
            }
            let hostname = l.spec.hostname.as_deref().map(str::to_ascii_lowercase);
            let (port, udp) = (l.spec.port, l.is_udp());
            let same_socket = |c: &&Claim| c.port == port && c.udp == udp;
            let protocol_clash = claims
                .iter()
                .filter(same_socket)
                .find(|c| c.protocol != l.spec.protocol);
            if let Some(c) = protocol_clash {
                l.conflict = Some((
                    "ProtocolConflict",
                    format!(
                        "port {port} is served as {} for listener {} of Gateway {} (older), on the edge's shared address",
                        c.protocol, c.listener, c.gateway
                    ),
                ));
                continue;
            }
            if let Some(c) = claims
                .iter()
                .filter(same_socket)
                .find(|c| c.hostname == hostname)
            {
                l.conflict = Some((
                    "HostnameConflict",
                    format!(
                        "port {port} with hostname {} is served for listener {} of Gateway {} (older), on the edge's shared address",
                        hostname.as_deref().unwrap_or("(any)"),
                        c.listener,
                        c.gateway
                    ),
                ));
                continue;
            }
            mine.push(Claim {
                gateway: (*key).clone(),
                listener: l.spec.name.clone(),
                port,
                udp,
                protocol: l.spec.protocol.clone(),
                hostname,
            });
        }
        claims.extend(mine);
    }
}

/// Every Gateway reports the edge Service's addresses (GEP-5093 conditions as with
/// per-Gateway Services: a scope the edge Service doesn't provide is not substituted).
pub(super) fn adjust_status(
    store: &Store,
    settings: &ServiceSettings,
    gw: &Gateway,
    model: &GatewayModel<'_>,
    status: &mut GatewayStatus,
) -> Vec<String> {
    let wanted = routability::request(gw, store.gateway_ext.get(&model.key));
    let edge = store.services.get(&settings.edge_service).map(|s| &**s);
    let assigned = routability::assign(&wanted, edge);
    let unsatisfiable = wanted.unsatisfiable();
    let forced = unsatisfiable.is_some();
    let problem = match unsatisfiable {
        Some(why) => Some(("AddressNotAssigned", why)),
        None => assigned
            .addresses
            .is_empty()
            .then(|| ("AddressNotAssigned", assigned.unsatisfied.join("; "))),
    };
    apply_assignment(model.generation, assigned, problem, forced, status)
}

#[cfg(test)]
#[path = "shared_tests.rs"]
mod tests;
