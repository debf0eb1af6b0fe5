//! One reconcile, phase by phase. Each phase reads what the earlier ones produced:
//!
//! 1. [`accept_classes`]: the GatewayClasses this controller owns.
//! 2. [`gateway_models`]: their Gateways, oldest first, with addresses, ListenerSets and
//!    listeners.
//! 3. [`attach_routes`]: HTTP and gRPC routes, compiled and attached (reusing the memo).
//! 4. [`attach_l4`]: TCP, TLS and UDP routes, and port pools.
//! 5. [`Addressing::place`]: Kubernetes mode's internal ports and Services.
//! 6. translation into the Snapshot (`translate`, `l4_translate`).
//! 7. [`gateway_statuses`] and [`endpoint_interest`]: what to report and watch.
//!
//! The addressing mode is asked, not matched on, wherever it matters.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use gateway_api::gatewayclasses::GatewayClassStatus;
use gateway_api::gateways::Gateway;

use super::address::{self, AddressError, AddressRequest};
use super::backend::BackendResolver;
use super::conditions as cond;
use super::gateway::{self, GatewayModel};
use super::{
    Addressing, Outcome, Settings, address_request, backend_client_cert, gateway_status,
    incremental, l4, l4_translate, listenerset, portpool, route_memo, services, shared,
};
use crate::l4route::L4Route;
use crate::status::{ObjectStatus, Statuses};
use crate::store::{ObjectKey, Store};

/// A reconcile; `memo` holds what earlier runs derived and may be reused.
pub(super) fn run(
    store: &Store,
    settings: &Settings,
    addressing: &Addressing,
    memo: &mut incremental::Memo,
) -> Outcome {
    let mut statuses = Statuses::default();
    let ours = accept_classes(store, settings, &mut statuses);
    let ordered = our_gateways(store, &ours);
    let sets = listenerset::collect(store, &ordered);
    let mut models = gateway_models(store, &ordered, &sets, addressing);

    let changes = memo.observe(store);
    if changes.all_stale && changes.gateway_side {
        memo.restart();
    }
    let mut resolver = BackendResolver::with_cache(store, memo.take_backends(&changes));
    attach_routes(
        store,
        settings,
        memo,
        &changes,
        &mut resolver,
        &sets,
        &mut models,
        &mut statuses,
    );
    let route_count = memo.routes.len();
    let l4_routes = attach_l4(
        store,
        settings,
        &sets,
        &mut resolver,
        &mut models,
        &mut statuses,
    );
    statuses.backend_tls_policies =
        resolver
            .policies()
            .statuses(store, &settings.controller_name, &models, &sets);

    // Kubernetes-mode placement comes after attachment: a port pool's listener needs an
    // internal port for each port it handed to a route.
    let plan = addressing.place(store, &ordered, &mut models);
    let served = plan
        .as_ref()
        .zip(addressing.service())
        .map(|(p, s)| p.served_ports(s));
    let internal = served.as_ref();
    let mut snapshot = memo.translate.snapshot(&models, &mut memo.routes, internal);
    l4_translate::add_listeners(&mut snapshot, &models, &l4_routes, internal);

    gateway_statuses(
        store,
        addressing,
        &ordered,
        &models,
        &sets,
        plan.as_ref(),
        &mut statuses,
    );
    let services = plan.map(|p| p.services).unwrap_or_default();
    let endpoint_interest = endpoint_interest(&resolver, memo, addressing, &services);
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
    Outcome {
        snapshot,
        statuses,
        services,
        endpoint_interest,
        redone: memo.routes.redone,
    }
}

/// Phase 1: the GatewayClasses with our controller name, accepted; their names.
fn accept_classes<'s>(
    store: &'s Store,
    settings: &Settings,
    statuses: &mut Statuses,
) -> BTreeSet<&'s str> {
    let mut ours = BTreeSet::new();
    for (name, class) in &store.gateway_classes {
        if class.spec.controller_name != settings.controller_name {
            continue;
        }
        ours.insert(name.as_str());
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
    ours
}

/// The Gateways of `ours` classes, oldest first, so an established Gateway keeps an
/// address a newcomer also asks for.
fn our_gateways<'s>(store: &'s Store, ours: &BTreeSet<&str>) -> Vec<(&'s ObjectKey, &'s Gateway)> {
    let mut ordered: Vec<(&ObjectKey, &Gateway)> = store
        .gateways
        .iter()
        .filter(|(_, g)| ours.contains(g.spec.gateway_class_name.as_str()))
        .map(|(k, g)| (k, &**g))
        .collect();
    ordered.sort_by_key(|(k, g)| {
        (
            g.metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            *k,
        )
    });
    ordered
}

/// Phase 2: each Gateway's model: its address, whether it is rejected, and its
/// listeners (its own and its ListenerSets').
fn gateway_models<'s>(
    store: &'s Store,
    ordered: &[(&ObjectKey, &'s Gateway)],
    sets: &'s listenerset::ListenerSets,
    addressing: &Addressing,
) -> BTreeMap<ObjectKey, GatewayModel<'s>> {
    let requests: Vec<(ObjectKey, AddressRequest)> = ordered
        .iter()
        .map(|(k, g)| ((*k).clone(), address_request(g)))
        .collect();
    let mut addresses = addressing.addresses(&requests);
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
                listeners: gateway::listeners(store, key.namespace(), gw, sets.for_gateway(key)),
                backend_client: backend_client_cert::resolve(store, key.namespace(), gw),
            };
            ((*key).clone(), model)
        })
        .collect();
    listenerset::gate_on_parent(&mut models);
    if let Addressing::SharedService { .. } = addressing {
        let order: Vec<&ObjectKey> = ordered.iter().map(|(k, _)| *k).collect();
        shared::resolve_conflicts(&order, &mut models);
    }
    models
}

/// Phase 3: HTTP and gRPC routes attached to the listeners (compiled again only where
/// the memo says they changed); their statuses and the listeners' route counts.
#[allow(clippy::too_many_arguments)] // the phase's inputs, each used once
fn attach_routes<'s>(
    store: &'s Store,
    settings: &Settings,
    memo: &mut incremental::Memo,
    changes: &incremental::Changes,
    resolver: &mut BackendResolver<'s>,
    sets: &listenerset::ListenerSets,
    models: &mut BTreeMap<ObjectKey, GatewayModel<'_>>,
    statuses: &mut Statuses,
) {
    let [http_statuses, grpc_statuses] = memo.routes.attach(
        store,
        changes,
        resolver,
        route_memo::GatewaySideRefs {
            sets,
            controller_name: &settings.controller_name,
            gateways: models,
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
}

/// Phase 4: TCP, TLS and UDP routes, compiled and attached; port pools hand out their
/// ports.
fn attach_l4<'s>(
    store: &'s Store,
    settings: &Settings,
    sets: &listenerset::ListenerSets,
    resolver: &mut BackendResolver<'_>,
    models: &mut BTreeMap<ObjectKey, GatewayModel<'_>>,
    statuses: &mut Statuses,
) -> Vec<(l4::L4RouteModel, &'s L4Route)> {
    let l4_routes: Vec<_> = store
        .l4_routes
        .iter()
        .map(|((kind, k), r)| (l4::compile(*kind, k.clone(), r, resolver), &**r))
        .collect();
    statuses.l4_routes = l4::attach(store, sets, &settings.controller_name, &l4_routes, models);
    portpool::apply(models, &l4_routes, &mut statuses.l4_routes);
    l4_routes
}

/// Phase 7: each Gateway's status, adjusted by its addressing mode (Services, shared
/// address), and the routability of its addresses.
fn gateway_statuses(
    store: &Store,
    addressing: &Addressing,
    ordered: &[(&ObjectKey, &Gateway)],
    models: &BTreeMap<ObjectKey, GatewayModel<'_>>,
    sets: &listenerset::ListenerSets,
    plan: Option<&services::Plan>,
    statuses: &mut Statuses,
) {
    let (set_statuses, attached_sets) = listenerset::statuses(sets, models);
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
            if let Some(c) = super::frontend_tls::insecure_fallback_condition(gw, model.generation)
            {
                status.conditions.get_or_insert_with(Vec::new).push(c);
            }
            if let Some(c) = backend_client_cert::resolved_refs(model) {
                status.conditions.get_or_insert_with(Vec::new).push(c);
            }
        }
        let scopes = match (plan, addressing) {
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
}

/// The Services whose EndpointSlices the outcome depends on: backends, the edge's own
/// Service, and the Services (and dedicated pods Services) written for Gateways.
fn endpoint_interest(
    resolver: &BackendResolver<'_>,
    memo: &incremental::Memo,
    addressing: &Addressing,
    services: &BTreeMap<ObjectKey, services::GatewayObjects>,
) -> BTreeSet<ObjectKey> {
    let mut interest = resolver.referenced().clone();
    interest.extend(memo.routes.interest().cloned());
    if let Some(service) = addressing.service() {
        interest.insert(service.edge_service.clone());
    }
    for objects in services.values() {
        let owned = std::iter::once(&objects.service.metadata)
            .chain(objects.dedicated.iter().map(|d| &d.pods.metadata));
        for meta in owned {
            if let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) {
                interest.insert(ObjectKey::new(ns.as_str(), name.as_str()));
            }
        }
    }
    interest
}

impl Addressing {
    /// Where each Gateway's listeners bind: a pool or requested address in standalone
    /// mode; the configured bind address in Kubernetes mode, where ports tell Gateways
    /// apart and their Services carry the addresses.
    fn addresses(
        &self,
        requests: &[(ObjectKey, AddressRequest)],
    ) -> BTreeMap<ObjectKey, Result<IpAddr, AddressError>> {
        match self {
            Self::LocalPool(pool) => address::allocate(pool, requests),
            // A type or value no Service can carry refuses the Gateway here as in
            // standalone mode (Accepted=False UnsupportedAddress, as the upstream
            // GatewayStaticAddresses test asks); the rest is the Services' to place.
            Self::InternalPorts { bind, .. } | Self::SharedService { bind, .. } => requests
                .iter()
                .map(|(k, req)| match req {
                    AddressRequest::Unsupported(why) => {
                        (k.clone(), Err(AddressError::Unsupported(why.clone())))
                    }
                    _ => (k.clone(), Ok(*bind)),
                })
                .collect(),
        }
    }

    /// The edge's Service settings, in Kubernetes mode.
    fn service(&self) -> Option<&services::ServiceSettings> {
        match self {
            Self::LocalPool(_) => None,
            Self::InternalPorts { service, .. } | Self::SharedService { service, .. } => {
                Some(service)
            }
        }
    }

    /// Phase 5: per-Gateway addressing gives each (Gateway, listener port) an internal
    /// port and plans the Gateway's Service; the other modes place nothing.
    fn place<'s>(
        &self,
        store: &Store,
        ordered: &[(&ObjectKey, &'s Gateway)],
        models: &mut BTreeMap<ObjectKey, GatewayModel<'s>>,
    ) -> Option<services::Plan> {
        match self {
            Self::InternalPorts { range, service, .. } => {
                Some(services::plan(store, ordered, models, *range, service))
            }
            Self::LocalPool(_) | Self::SharedService { .. } => None,
        }
    }
}
