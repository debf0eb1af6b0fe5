//! Port pools (an aether-edge extension): a TCP or UDP listener that hands
//! each attached TCPRoute/UDPRoute a port of its own from a range, reported in the
//! route's `status.parents[].parentRef.port`.
//!
//! Declared with a Gateway annotation, `aether.io/port-range.<listener>: "FIRST-LAST"`,
//! rather than a domain-prefixed protocol: the listener stays a plain, valid `TCP` or
//! `UDP` listener (supportedKinds, allowedRoutes and every other tool keep working, and
//! an implementation that ignores the annotation serves it as an ordinary listener),
//! and the range is the only new thing to say. The listener's own `port` must lie in
//! the range; it is served only if a route is assigned that port.
//!
//! Assignment (see [`assign`]) is deterministic and stable:
//! 1. a route keeps the port it already has (its current status), oldest route first;
//! 2. then routes asking for a port with `parentRefs[].port` get it if it is free;
//! 3. then every other route, oldest first (creationTimestamp, kind, namespace/name),
//!    takes the first free port at or after a stable hash of its identity.
//!
//! Rule 1 is what makes removal safe: no pure function of the current set of routes
//! can keep every survivor's port when a route it once collided with goes away, so the
//! current assignment is read back from status, which Kubernetes stores for every
//! replica. Without any status (a first start), rules 2 and 3 alone decide, and the
//! same set of routes gets the same ports everywhere.

use std::collections::{BTreeMap, BTreeSet};

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::{HttpRouteParentRefs, HttpRouteStatus};

use super::conditions as cond;
use super::gateway::{GatewayModel, ListenerModel, Problem};
use super::l4::L4RouteModel;
use super::ports::{PortRange, stable_hash};
use crate::l4route::{L4Kind, L4Route};
use crate::status::ObjectStatus;
use crate::store::ObjectKey;

pub const ANNOTATION_PREFIX: &str = "aether.io/port-range.";
/// The largest pool: each port is a socket (and, for UDP, a flow table).
pub const MAX_POOL: usize = 1024;

/// Reads the Gateway's pool annotations and marks each named listener as a pool, or
/// not accepted when the range is unusable.
pub fn validate(gateway: &Gateway, listeners: &mut [ListenerModel<'_>]) {
    let annotations = gateway.metadata.annotations.iter().flatten();
    let declared: BTreeMap<&str, &str> = annotations
        .filter_map(|(k, v)| Some((k.strip_prefix(ANNOTATION_PREFIX)?, v.as_str())))
        .collect();
    for i in 0..listeners.len() {
        // The annotations name the Gateway's own listeners, not a ListenerSet's.
        if listeners[i].set.is_some() {
            continue;
        }
        let Some(value) = declared.get(listeners[i].spec.name.as_str()) else {
            continue;
        };
        if !listeners[i].usable() {
            continue;
        }
        match check(listeners, i, value) {
            Ok(range) => listeners[i].pool = Some(range),
            Err(p) => listeners[i].accepted = Err(p),
        }
    }
}

fn check(listeners: &[ListenerModel<'_>], i: usize, value: &str) -> Result<PortRange, Problem> {
    let l = &listeners[i];
    if !matches!(l.spec.protocol.as_str(), "TCP" | "UDP") {
        return Err((
            "UnsupportedValue",
            format!(
                "a port range needs a TCP or UDP listener, not {}",
                l.spec.protocol
            ),
        ));
    }
    let range: PortRange = value
        .parse()
        .map_err(|e| ("UnsupportedValue", format!("port range {e}")))?;
    if range.len() > MAX_POOL {
        return Err((
            "UnsupportedValue",
            format!(
                "port range {range} holds {} ports; at most {MAX_POOL}",
                range.len()
            ),
        ));
    }
    if !l.port().is_some_and(|p| range.contains(p)) {
        return Err((
            "UnsupportedValue",
            format!(
                "the listener's port {} is outside its port range {range}",
                l.spec.port
            ),
        ));
    }
    // Other listeners of the same transport: their ports, and earlier pools' ranges.
    for (j, other) in listeners.iter().enumerate() {
        if j == i || !other.usable() || other.is_udp() != l.is_udp() {
            continue;
        }
        let clash = match other.pool {
            Some(r) if j < i => r.first <= range.last && range.first <= r.last,
            _ => other.port().is_some_and(|p| range.contains(p)),
        };
        if clash {
            return Err((
                "PortUnavailable",
                format!(
                    "port range {range} overlaps listener {} of this Gateway",
                    other.spec.name
                ),
            ));
        }
    }
    Ok(range)
}

/// One route asking a pool for a port.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub route: usize,
    /// Precedence: creationTimestamp, kind, `namespace/name`.
    pub order: (i64, L4Kind, ObjectKey),
    /// `parentRefs[].port`.
    pub requested: Option<u16>,
    /// The port its status holds now.
    pub previous: Option<u16>,
}

/// Why a route got no port: a condition reason and message.
pub type PoolProblem = (&'static str, String);

/// Assigns ports of `range` to `candidates` (rules in the module docs).
pub fn assign(
    range: PortRange,
    candidates: &[Candidate],
) -> BTreeMap<usize, Result<u16, PoolProblem>> {
    let mut ordered: Vec<&Candidate> = candidates.iter().collect();
    ordered.sort_by(|a, b| a.order.cmp(&b.order));
    let mut holder: BTreeMap<u16, &Candidate> = BTreeMap::new();
    let mut out: BTreeMap<usize, Result<u16, PoolProblem>> = BTreeMap::new();
    // 1. Keep what is held, unless the route now asks for another port.
    for c in &ordered {
        if let Some(p) = c.previous
            && range.contains(p)
            && c.requested.is_none_or(|r| r == p)
            && !holder.contains_key(&p)
        {
            holder.insert(p, c);
            out.insert(c.route, Ok(p));
        }
    }
    // 2. Requests.
    for c in &ordered {
        let Some(r) = c.requested else { continue };
        if out.contains_key(&c.route) {
            continue;
        }
        let result = if !range.contains(r) {
            Err((
                "PortUnavailable",
                format!("port {r} is outside the listener's port range {range}"),
            ))
        } else if let Some(h) = holder.get(&r) {
            Err((
                "PortUnavailable",
                format!(
                    "port {r} is already assigned to {} {}",
                    h.order.1.as_str(),
                    h.order.2
                ),
            ))
        } else {
            holder.insert(r, c);
            Ok(r)
        };
        out.insert(c.route, result);
    }
    // 3. Everyone else: stable hash, then the first free port.
    let size = range.len();
    for c in &ordered {
        if out.contains_key(&c.route) {
            continue;
        }
        let start = stable_hash(&format!("{}/{}", c.order.1.as_str(), c.order.2)) % size;
        let free = (0..size)
            .filter_map(|k| u16::try_from((start + k) % size).ok())
            .map(|k| range.first.saturating_add(k))
            .find(|p| !holder.contains_key(p));
        let result = match free {
            Some(p) => {
                holder.insert(p, c);
                Ok(p)
            }
            None => Err((
                "PortUnavailable",
                format!("every port of the range {range} is assigned"),
            )),
        };
        out.insert(c.route, result);
    }
    out
}

/// The parentRef of `route` that names Gateway `gw` and this listener (or no section).
fn parent_for<'r>(
    route: &'r L4Route,
    key: &ObjectKey,
    gw: &ObjectKey,
    listener: &str,
) -> Option<&'r HttpRouteParentRefs> {
    route.spec.parent_refs.iter().flatten().find(|p| {
        *p.name == *gw.name()
            && p.namespace.as_deref().unwrap_or(key.namespace()) == gw.namespace()
            && p.section_name.as_deref().is_none_or(|s| s == listener)
    })
}

/// Assigns the ports of every pool listener, drops the attachments that got none, and
/// reports the outcome in the routes' statuses.
pub fn apply(
    gateways: &mut BTreeMap<ObjectKey, GatewayModel<'_>>,
    routes: &[(L4RouteModel, &L4Route)],
    statuses: &mut BTreeMap<(L4Kind, ObjectKey), ObjectStatus<HttpRouteStatus>>,
) {
    for gw in gateways.values_mut() {
        let gw_key = gw.key.clone();
        for listener in gw.listeners.iter_mut() {
            let Some(range) = listener.pool else { continue };
            let name = listener.spec.name.clone();
            let attached: BTreeSet<usize> =
                listener.l4_attachments.iter().map(|a| a.route).collect();
            let candidates: Vec<Candidate> = attached
                .iter()
                .filter_map(|&i| {
                    let (model, route) = routes.get(i)?;
                    let parent = parent_for(route, &model.key, &gw_key, &name);
                    let requested = parent
                        .and_then(|p| p.port)
                        .and_then(|p| u16::try_from(p).ok());
                    Some(Candidate {
                        route: i,
                        order: (model.created, model.kind, model.key.clone()),
                        requested,
                        previous: previous_port(route, &gw_key, &name, range),
                    })
                })
                .collect();
            let assigned = assign(range, &candidates);
            listener
                .l4_attachments
                .retain(|a| matches!(assigned.get(&a.route), Some(Ok(_))));
            for (i, result) in assigned {
                let Some((model, _)) = routes.get(i) else {
                    continue;
                };
                if let Ok(p) = result {
                    listener.pool_ports.insert(i, p);
                }
                let Some(st) = statuses.get_mut(&(model.kind, model.key.clone())) else {
                    continue;
                };
                for parent in std::sync::Arc::make_mut(&mut st.status)
                    .parents
                    .iter_mut()
                    .filter(|p| {
                        *p.parent_ref.name == *gw_key.name()
                            && p.parent_ref.namespace.as_deref() == Some(gw_key.namespace())
                            && p.parent_ref
                                .section_name
                                .as_deref()
                                .is_none_or(|s| s == name)
                    })
                {
                    match &result {
                        Ok(port) => parent.parent_ref.port = Some(i32::from(*port)),
                        Err((reason, msg)) => {
                            let c = cond::not_accepted(model.generation, reason, msg.clone());
                            if let Some(slot) =
                                parent.conditions.iter_mut().find(|c| c.type_ == "Accepted")
                            {
                                *slot = c;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The port the route's current status reports for this pool listener.
fn previous_port(route: &L4Route, gw: &ObjectKey, listener: &str, range: PortRange) -> Option<u16> {
    route.status.as_ref()?.parents.iter().find_map(|p| {
        let r = &p.parent_ref;
        let ours = *r.name == *gw.name()
            && r.namespace.as_deref().is_none_or(|n| n == gw.namespace())
            && r.section_name.as_deref().is_none_or(|s| s == listener);
        // A refused request echoes its port too; only an accepted parent holds one.
        let held = p
            .conditions
            .iter()
            .any(|c| c.type_ == "Accepted" && c.status == "True");
        let port = u16::try_from(r.port?).ok()?;
        (ours && held && range.contains(port)).then_some(port)
    })
}

#[cfg(test)]
mod tests;
