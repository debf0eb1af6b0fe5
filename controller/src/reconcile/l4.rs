//! TCPRoute, UDPRoute and TLSRoute: backends, attachment to TCP, UDP and TLS
//! (passthrough) listeners, and their status.
//!
//! Several routes may attach to one TCP or UDP listener; all are Accepted and counted,
//! and the oldest (creationTimestamp, then `namespace/name`) gets the traffic, as the
//! Gateway API v1.6 conformance suite expects (TCPRouteMultipleRoutesAttachment).
//! TLSRoutes share a TLS listener by SNI; the oldest route keeps a contested name.

use std::collections::BTreeMap;
use std::sync::Arc;

use aether_proxy::backend::Backend;
use gateway_api::httproutes::{HttpRouteParentRefs, HttpRouteStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::backend::{BackendRefSpec, BackendResolver, RefProblem};
use super::conditions as cond;
use super::gateway::GatewayModel;
use super::hostname;
use super::listenerset::ListenerSets;
use super::parent::{ParentTarget, parent_target};
use super::route::{RouteAttachment, refs_condition};
use super::route_status::parent_status;
use crate::l4route::{L4Kind, L4Route};
use crate::status::ObjectStatus;
use crate::store::{ObjectKey, Store};

/// An L4 route as the data plane needs it.
pub struct L4RouteModel {
    pub kind: L4Kind,
    pub key: ObjectKey,
    pub created: i64,
    pub generation: i64,
    pub backends: Vec<(u32, Result<Arc<Backend>, RefProblem>)>,
    /// The first backendRef problem, if any.
    pub refs: Result<(), Box<RefProblem>>,
}

pub fn compile(
    kind: L4Kind,
    key: ObjectKey,
    route: &L4Route,
    resolver: &mut BackendResolver<'_>,
) -> L4RouteModel {
    let mut model = L4RouteModel {
        kind,
        created: route
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        generation: route.metadata.generation.unwrap_or(1),
        backends: Vec::new(),
        refs: Ok(()),
        key,
    };
    // v1 allows one rule; older versions allowed several with nothing to choose
    // between them, so their backendRefs are pooled.
    for b in route
        .spec
        .rules
        .iter()
        .flat_map(|r| r.backend_refs.iter().flatten())
    {
        let spec = BackendRefSpec {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            name: &b.name,
            namespace: b.namespace.as_deref(),
            port: b.port,
        };
        let target = resolver.resolve(kind.as_str(), model.key.namespace(), &spec);
        if let (Err(p), Ok(())) = (&target, &model.refs) {
            model.refs = Err(Box::new(p.clone()));
        }
        let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
        model.backends.push((weight, target));
    }
    model
}

/// The listener protocol each kind attaches to.
fn listener_protocol(kind: L4Kind) -> &'static str {
    match kind {
        L4Kind::Tcp => "TCP",
        L4Kind::Udp => "UDP",
        L4Kind::Tls => "TLS",
    }
}

/// Attaches every L4 route to the listeners its parentRefs select and returns their
/// statuses (same shape as HTTPRoute's).
pub fn attach(
    store: &Store,
    sets: &ListenerSets,
    controller_name: &str,
    routes: &[(L4RouteModel, &L4Route)],
    gateways: &mut BTreeMap<ObjectKey, GatewayModel<'_>>,
) -> BTreeMap<(L4Kind, ObjectKey), ObjectStatus<HttpRouteStatus>> {
    let mut statuses = BTreeMap::new();
    for (index, (model, route)) in routes.iter().enumerate() {
        let mut parents = Vec::new();
        for parent in route.spec.parent_refs.iter().flatten() {
            let Some(target) = parent_target(sets, parent, model.key.namespace(), gateways) else {
                continue;
            };
            let Some(gateway) = gateways.get_mut(&target.gateway) else {
                continue;
            };
            let accepted = attach_one(store, index, model, route, parent, &target, gateway);
            let refs = refs_condition(model.generation, &model.refs);
            parents.push(parent_status(
                controller_name,
                parent,
                &target,
                vec![accepted, refs],
            ));
        }
        if !parents.is_empty() {
            statuses.insert(
                (model.kind, model.key.clone()),
                ObjectStatus::new(model.generation, HttpRouteStatus { parents }),
            );
        }
    }
    statuses
}

fn attach_one(
    store: &Store,
    index: usize,
    model: &L4RouteModel,
    route: &L4Route,
    parent: &HttpRouteParentRefs,
    target: &ParentTarget,
    gateway: &mut GatewayModel<'_>,
) -> Condition {
    let generation = model.generation;
    let kind = model.kind.as_str();
    let selected: Vec<usize> = gateway
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| target.selects(parent, l))
        .filter(|(_, l)| {
            // On a port pool, parentRefs[].port asks for one port of the range.
            parent.port.is_none_or(|p| {
                p == l.spec.port
                    || l.pool
                        .is_some_and(|r| u16::try_from(p).is_ok_and(|p| r.contains(p)))
            })
        })
        .map(|(i, _)| i)
        .collect();
    if selected.is_empty() {
        return cond::not_accepted(
            generation,
            "NoMatchingParent",
            target.no_listener_message(gateway),
        );
    }
    let gw_ns = gateway.key.namespace();
    let allowed: Vec<usize> = selected
        .into_iter()
        .filter(|&i| gateway.listeners[i].allows(store, gw_ns, model.key.namespace(), kind))
        .collect();
    if allowed.is_empty() {
        return cond::not_accepted(
            generation,
            "NotAllowedByListeners",
            format!(
                "no selected listener admits a {kind} from this namespace (a {kind} needs a {} listener)",
                listener_protocol(model.kind)
            ),
        );
    }
    let allowed: Vec<usize> = allowed
        .into_iter()
        .filter(|&i| gateway.listeners[i].attachable())
        .collect();
    if allowed.is_empty() {
        return cond::not_accepted(
            generation,
            "NoMatchingParent",
            "the listeners this parentRef selects are not valid; see the Gateway's listener conditions",
        );
    }
    let route_hosts = route.spec.hostnames.as_deref().unwrap_or_default();
    let mut attached = 0;
    for i in allowed {
        let listener = &mut gateway.listeners[i];
        // Only TLSRoutes have hostnames; TCP and UDP listeners take any host.
        let hostnames = if model.kind == L4Kind::Tls {
            hostname::effective(listener.spec.hostname.as_deref(), route_hosts)
        } else {
            Some(vec![None])
        };
        if let Some(hostnames) = hostnames {
            listener.l4_attachments.push(RouteAttachment {
                route: index,
                hostnames: hostnames.into(),
            });
            attached += 1;
        }
    }
    if attached == 0 {
        return cond::not_accepted(
            generation,
            "NoMatchingListenerHostname",
            "no listener hostname intersects the route's hostnames",
        );
    }
    cond::accepted(generation, kind)
}
