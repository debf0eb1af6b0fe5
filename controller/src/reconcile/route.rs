//! HTTPRoute compilation (backends, filters, timeouts; the matches come compiled from
//! the Store, see `route_match`) and attachment to Gateway listeners.
//! GRPCRoutes arrive in their HTTPRoute form (see `grpc_route`) and take the same
//! path under their own kind name.

use std::collections::BTreeMap;
use std::sync::Arc;

use aether_proxy::backend::{Backend, BackendTarget, WeightedBackend};
use aether_proxy::routing::{PathMatch, RequestMatch};
use gateway_api::httproutes::{HttpRouteParentRefs, HttpRouteRulesTimeouts, HttpRouteStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use aether_proxy::filters::Filters;

use super::backend::{BackendRefSpec, BackendResolver, RefProblem};
use super::conditions::Decided;
use super::filters;
use super::gateway::GatewayModel;
use super::hostname;
use super::listenerset::ListenerSets;
use super::parent::{ParentTarget, parent_target};
use super::route_status::{ParentDecision, SharedStatuses, refs_decided};
use crate::compact::StoredRoute;
use crate::route_ext::HttpRouteExt;
use crate::store::{ObjectKey, Store};

/// An HTTPRoute as the data plane will need it, independent of its parents.
pub struct RouteModel {
    pub key: ObjectKey,
    /// `HTTPRoute` or `GRPCRoute`: what allowedRoutes, ReferenceGrants and status see.
    pub kind: &'static str,
    pub created: i64,
    pub generation: i64,
    /// Boxed slices here and in each rule: kept as long as the route, at their exact
    /// length, a pointer shorter than a `Vec`.
    pub rules: Box<[RuleModel]>,
    /// The first backendRef problem, if any (boxed: rare, and 40 bytes kept per route).
    pub refs: Result<(), Box<RefProblem>>,
}

impl RouteModel {
    /// The first reason a rule can't be served, and whether every rule has one.
    fn rule_problem(&self) -> Option<(&str, bool)> {
        let first = self.rules.iter().find_map(|r| r.invalid.as_deref())?;
        Some((first, self.rules.iter().all(|r| r.invalid.is_some())))
    }
}

pub struct RuleModel {
    /// The rule's `name`, for access logs.
    pub name: Option<Arc<str>>,
    /// Shared with the rule's spec in the Store, which keeps them compiled.
    pub matches: Arc<[RequestMatch]>,
    pub timeout: Option<std::time::Duration>,
    pub retry: Option<Box<aether_proxy::retry::RetryPolicy>>,
    pub filters: Filters,
    /// In the Snapshot's form, shared with the rule actions made from this model.
    pub backends: Arc<[WeightedBackend]>,
    /// Why this rule can't be served as written; its requests then answer 500.
    pub invalid: Option<Box<str>>,
}

/// A route attached to a listener, with the hostnames it serves there.
pub struct RouteAttachment {
    pub route: usize,
    /// Shared with the attachment decision it came from, which a later run may reuse.
    pub hostnames: Arc<[Option<String>]>,
}

pub fn compile(
    key: ObjectKey,
    kind: &'static str,
    route: &StoredRoute,
    ext: Option<&HttpRouteExt>,
    resolver: &mut BackendResolver<'_>,
) -> RouteModel {
    let mut model = RouteModel {
        kind,
        created: route.created,
        generation: route.generation.unwrap_or(1),
        rules: Box::default(),
        refs: Ok(()),
        key,
    };
    // Sized exactly, so the boxed slices take the lists as they are.
    let mut rules = Vec::with_capacity(route.spec.rules.len());
    for (index, rule) in route.spec.rules.iter().enumerate() {
        let mut invalid = rule.match_problem.as_deref().map(str::to_owned);
        let matches = Arc::clone(&rule.matches);
        let prefix_only = matches
            .iter()
            .all(|m| matches!(m.path, PathMatch::Prefix(_)));
        let namespace = model.key.namespace();
        let mut mirror_problem = None;
        let filters = filters::compile(
            &rule.filters,
            prefix_only,
            &mut mirror_resolver(resolver, kind, namespace, &mut mirror_problem),
        )
        .unwrap_or_else(|why| {
            invalid.get_or_insert(why);
            Filters::default()
        });
        let mut backends = Vec::with_capacity(rule.backend_refs.len());
        for b in &rule.backend_refs {
            let spec = BackendRefSpec {
                group: b.group.as_deref(),
                kind: b.kind.as_deref(),
                name: &b.name,
                namespace: b.namespace.as_deref(),
                port: b.port,
            };
            let target = resolver.resolve(kind, model.key.namespace(), &spec);
            if let (Err(p), Ok(())) = (&target, &model.refs) {
                model.refs = Err(Box::new(p.clone()));
            }
            let filters = filters::compile_backend(
                &b.filters,
                prefix_only,
                &mut mirror_resolver(resolver, kind, namespace, &mut mirror_problem),
            )
            .unwrap_or_else(|why| {
                invalid.get_or_insert(why);
                Filters::default()
            });
            backends.push(WeightedBackend {
                weight: u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0),
                target: match target {
                    Ok(backend) => BackendTarget::Service(backend),
                    Err(p) => BackendTarget::Invalid {
                        reason: p.message.as_str().into(),
                    },
                },
                filters,
            });
        }
        let retry_spec = ext.and_then(|e| e.retry(index));
        let (timeout, retry) = rule_timeouts(rule.timeouts.as_deref())
            .and_then(|(request, backend)| super::retry::compile(retry_spec, request, backend))
            .unwrap_or_else(|why| {
                invalid.get_or_insert(why);
                (None, None)
            });
        if let (Some(p), Ok(())) = (mirror_problem, &model.refs) {
            model.refs = Err(Box::new(p));
        }
        rules.push(RuleModel {
            name: rule.name.clone(),
            matches,
            timeout,
            retry,
            filters,
            backends: backends.into(),
            invalid: invalid.map(String::into_boxed_str),
        });
    }
    model.rules = rules.into_boxed_slice();
    model
}

/// Resolves mirror backendRefs; one that can't be resolved is left out and its problem
/// kept for ResolvedRefs, like any other backendRef's.
fn mirror_resolver<'a>(
    resolver: &'a mut BackendResolver<'_>,
    kind: &'static str,
    namespace: &'a str,
    problem: &'a mut Option<RefProblem>,
) -> impl FnMut(&BackendRefSpec<'_>) -> Option<Arc<Backend>> + 'a {
    move |spec| {
        resolver
            .resolve(kind, namespace, spec)
            .map_err(|p| *problem = Some(p))
            .ok()
    }
}

/// A rule's `request` and `backendRequest` timeouts; zero means none, as the spec
/// says. How they bound attempts is `retry::compile`'s business.
fn rule_timeouts(
    t: Option<&HttpRouteRulesTimeouts>,
) -> Result<(Option<std::time::Duration>, Option<std::time::Duration>), String> {
    let Some(t) = t else { return Ok((None, None)) };
    let parse = |v: Option<&str>| -> Result<Option<std::time::Duration>, String> {
        let Some(v) = v else { return Ok(None) };
        let d: gateway_api::Duration = v
            .parse()
            .map_err(|e| format!("invalid timeout {v:?}: {e}"))?;
        Ok((!d.is_zero()).then(|| {
            std::time::Duration::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        }))
    };
    let request = parse(t.request.as_deref())?;
    let backend = parse(t.backend_request.as_deref())?;
    if let (Some(r), Some(b)) = (request, backend)
        && b > r
    {
        return Err(format!(
            "backendRequest timeout {b:?} exceeds the request timeout {r:?}"
        ));
    }
    Ok((request, backend))
}

/// Where a route attached: a listener of one Gateway, and the hostnames it serves there.
#[derive(Clone)]
pub struct Placement {
    pub gateway: ObjectKey,
    pub listener: usize,
    /// Usually one, kept inline (a shared list of one was an allocation per route).
    pub hostnames: smallvec::SmallVec<[Option<String>; 1]>,
}

/// What attaching one route decided: its status and where it serves.
#[derive(Clone)]
pub struct Attached {
    pub status: Arc<HttpRouteStatus>,
    /// Usually one, kept inline.
    pub placements: Placements,
}

/// Where a route serves: usually on one listener, so one is kept inline (a list of one
/// was an allocation per route).
pub type Placements = smallvec::SmallVec<[Placement; 1]>;

/// Decides where one route attaches. Reads the listeners only, so routes can be
/// attached in any order and a route's decision reused while its inputs stand. Its
/// status is one of `shared` when an equal one is kept there.
pub(super) fn attach_route(
    store: &Store,
    sets: &ListenerSets,
    controller_name: &str,
    model: &RouteModel,
    route: &StoredRoute,
    gateways: &BTreeMap<ObjectKey, GatewayModel<'_>>,
    shared: &mut SharedStatuses,
) -> Attached {
    let mut parents = Vec::with_capacity(route.spec.parent_refs.len());
    let mut placements = Placements::new();
    let generation = model.generation;
    for parent in route.spec.parent_refs.iter() {
        let Some(target) = parent_target(sets, parent, model.key.namespace(), gateways) else {
            continue;
        };
        let Some(gateway) = gateways.get(&target.gateway) else {
            continue;
        };
        let accepted = attach_one(
            store,
            model,
            route,
            parent,
            &target,
            gateway,
            &mut placements,
        );
        let partially_invalid = match model.rule_problem() {
            Some((why, false)) => Some(Decided::partially_invalid(generation, why)),
            _ => None,
        };
        parents.push(ParentDecision {
            parent,
            target,
            accepted,
            refs: refs_decided(generation, &model.refs),
            partially_invalid,
        });
    }
    // Kept while the decision stands; pushes past the inline one reserved room for four.
    placements.shrink_to_fit();
    Attached {
        status: shared.share(&parents, controller_name),
        placements,
    }
}

/// Records route `index`'s placements on the listeners.
/// Listener isolation: a request belongs to the most specific listener on its port
/// whose hostname matches it, and only that listener's routes may answer it. The route
/// hostnames that a more specific listener of the same port covers entirely (the
/// hostname-less listener's `*.example.com` when a `*.example.com` listener exists) are
/// not served by the less specific listener `i`. Partial overlaps need nothing here:
/// the route table picks the most specific host entry and never falls back to a
/// broader one. Decided from the listeners alone, so the attachment it is part of can
/// be reused while the Gateway stands.
fn isolated(
    gateway: &GatewayModel<'_>,
    i: usize,
    hostnames: Vec<Option<String>>,
) -> Vec<Option<String>> {
    let l = &gateway.listeners[i];
    if l.is_l4() {
        return hostnames;
    }
    let own = l.spec.hostname.as_deref();
    let (port, https) = (l.spec.port, l.is_https());
    let narrower: Vec<&str> = gateway
        .listeners
        .iter()
        .filter(|o| o.usable() && !o.is_l4() && o.spec.port == port && o.is_https() == https)
        .filter_map(|o| o.spec.hostname.as_deref())
        .filter(|h| hostname::more_specific(Some(h), own))
        .collect();
    if narrower.is_empty() {
        return hostnames;
    }
    hostnames
        .into_iter()
        .filter(|h| {
            h.as_deref()
                .is_none_or(|h| !narrower.iter().any(|n| hostname::within(h, n)))
        })
        .collect()
}

/// ResolvedRefs from a route's first backendRef problem.
pub(super) fn refs_condition(generation: i64, refs: &Result<(), Box<RefProblem>>) -> Condition {
    refs_decided(generation, refs).build()
}

/// Attaches `route` to the listeners of `gateway` that `parent` selects and allow it;
/// returns the parent's Accepted condition.
fn attach_one<'a>(
    store: &Store,
    model: &'a RouteModel,
    route: &StoredRoute,
    parent: &HttpRouteParentRefs,
    target: &ParentTarget,
    gateway: &GatewayModel<'_>,
    placements: &mut Placements,
) -> Decided<'a> {
    use super::conditions::Message::{Owned, Text};
    let generation = model.generation;
    if let Some((why, true)) = model.rule_problem() {
        return Decided::not_accepted(generation, "UnsupportedValue", Text(why));
    }
    // Each step filters the last one lazily: a parentRef usually selects one listener,
    // and collecting each step allocated three lists per route.
    let selected = || {
        let listeners = gateway.listeners.iter().enumerate();
        listeners
            .filter(|(_, l)| target.selects(parent, l))
            .filter(|(_, l)| parent.port.is_none_or(|p| p == l.spec.port))
    };
    if selected().next().is_none() {
        let message = Owned(target.no_listener_message(gateway));
        return Decided::not_accepted(generation, "NoMatchingParent", message);
    }
    let gw_ns = gateway.key.namespace();
    let allowed =
        || selected().filter(|(_, l)| l.allows(store, gw_ns, model.key.namespace(), model.kind));
    if allowed().next().is_none() {
        let message = Text("the listeners' allowedRoutes do not admit this route");
        return Decided::not_accepted(generation, "NotAllowedByListeners", message);
    }
    // A conflicted or invalid listener keeps its own conditions and takes no routes;
    // one only missing its certificate takes them (counted, not served).
    let attachable = || allowed().filter(|(_, l)| l.attachable());
    if attachable().next().is_none() {
        let message = Text(
            "the listeners this parentRef selects are not valid; see the Gateway's listener conditions",
        );
        return Decided::not_accepted(generation, "NoMatchingParent", message);
    }
    let route_hosts = &route.spec.hostnames;
    let mut attached = 0;
    for (i, listener) in attachable() {
        // Lower-case, as virtual hosts are keyed.
        if let Some(hostnames) = hostname::effective(listener.spec.hostname.as_deref(), route_hosts)
        {
            placements.push(Placement {
                gateway: gateway.key.clone(),
                listener: i,
                hostnames: smallvec::SmallVec::from_vec(isolated(gateway, i, hostnames)),
            });
            attached += 1;
        }
    }
    if attached == 0 {
        let message = Text("no listener hostname intersects the route's hostnames");
        return Decided::not_accepted(generation, "NoMatchingListenerHostname", message);
    }
    Decided::accepted(generation, model.kind)
}
