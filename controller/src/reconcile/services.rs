//! Kubernetes mode: the Service each Gateway gets (pure: the reconciler outputs it, an
//! effect applies it), and the addresses its load balancer reports.

use std::collections::{BTreeMap, BTreeSet};

use gateway_api::gateways::{Gateway, GatewayStatus};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::address::AddressError;
use super::conditions as cond;
use super::dedicated::{self, DedicatedObjects, DedicatedSettings};
use super::edge_slices;
use super::gateway::GatewayModel;
use super::ports::{self, PortError, PortRange, PortRequest};
use super::routability;
use crate::store::{ObjectKey, Store};

/// Kubernetes-mode placement of every Gateway: its internal ports and its Service.
pub struct Plan {
    /// Gateway -> listener port -> internal port, for the Gateways that are served.
    pub ports: BTreeMap<ObjectKey, BTreeMap<u16, u16>>,
    pub services: BTreeMap<ObjectKey, GatewayObjects>,
    /// Why a Gateway is not placed, as a Programmed=False reason and message.
    problems: BTreeMap<ObjectKey, (&'static str, String)>,
    /// What each Gateway's spec.addresses ask for (GEP-5093).
    addresses: BTreeMap<ObjectKey, routability::Request>,
    /// Gateways that ask for pods of their own: the Deployment serving them, or why
    /// they are served by the shared edge pods after all.
    dedicated: BTreeMap<ObjectKey, Result<String, String>>,
    /// Dedicated Gateways whose own pods have a ready endpoint: only these have left
    /// the shared pods (make before break).
    handed_over: BTreeSet<ObjectKey>,
}

/// Allocates internal ports (precedence as `ordered`) and builds each Gateway's Service.
/// A Gateway that can't be placed has its model's address set to an error, so no
/// listener of it is served; [`Plan::adjust_status`] says why.
pub(super) fn plan(
    store: &Store,
    ordered: &[(&ObjectKey, &Gateway)],
    models: &mut BTreeMap<ObjectKey, GatewayModel<'_>>,
    range: PortRange,
    settings: &ServiceSettings,
) -> Plan {
    let mut problems = BTreeMap::new();
    let mut requests = Vec::new();
    let mut protocols: BTreeMap<&ObjectKey, BTreeMap<u16, String>> = BTreeMap::new();
    let mut addresses = BTreeMap::new();
    for (key, gw) in ordered {
        let Some(model) = models.get(*key) else {
            continue;
        };
        let wanted = routability::request(gw, store.gateway_ext.get(*key));
        if let Some(why) = wanted.unsatisfiable() {
            problems.insert((*key).clone(), ("AddressNotAssigned", why));
            addresses.insert((*key).clone(), wanted);
            continue;
        }
        addresses.insert((*key).clone(), wanted);
        if let Some((_, false)) = existing(store, key) {
            problems.insert(
                (*key).clone(),
                (
                    "AddressNotUsable",
                    format!(
                        "Service {}/{} exists and is not managed by aether-edge for this Gateway",
                        key.namespace(),
                        service_name(key.name())
                    ),
                ),
            );
            continue;
        }
        let protos = protocols.entry(key).or_default();
        for l in model.listeners.iter().filter(|l| l.usable()) {
            // A port pool listener is served on the ports it handed to routes, each of
            // them a Service port with its own internal port.
            if l.pool.is_some() {
                for p in l.pool_ports.values() {
                    protos.entry(*p).or_insert_with(|| l.spec.protocol.clone());
                }
                continue;
            }
            if let Some(p) = l.port() {
                protos.entry(p).or_insert_with(|| l.spec.protocol.clone());
            }
        }
        requests.push(PortRequest {
            key: (*key).clone(),
            ports: protos.keys().copied().collect(),
            previous: previous_ports(store, key),
        });
    }
    let edge = edge_slices::edge_endpoints(store, &settings.edge_service);
    let mut allocated = BTreeMap::new();
    let mut services = BTreeMap::new();
    let mut dedicated_state = BTreeMap::new();
    let mut handed_over = BTreeSet::new();
    for (key, result) in ports::allocate(range, &requests) {
        match result {
            Ok(map) => {
                let gw = ordered.iter().find(|(k, _)| **k == key).map(|(_, g)| *g);
                let protos = protocols.get(&key).cloned().unwrap_or_default();
                if let (Some(gw), Some(wanted)) = (gw, addresses.get(&key)) {
                    let current = existing(store, &key).map(|(s, _)| s);
                    let service = desired(&key, gw, &map, &protos, wanted, current);
                    let own = dedicated_objects(settings.dedicated.as_ref(), &key, gw);
                    // A dedicated Gateway's Service names its own pods, not the edge's,
                    // once one of them is ready: until then the shared pods keep serving
                    // it and its Service keeps naming them, so moving a Gateway onto pods
                    // of its own drops nothing while they start.
                    let own_pods = match &own {
                        Some(Ok((pods_key, _))) => {
                            Some(edge_slices::edge_endpoints(store, pods_key))
                                .filter(edge_slices::any_ready)
                        }
                        _ => None,
                    };
                    if own_pods.is_some() {
                        handed_over.insert(key.clone());
                    }
                    let pods = own_pods.as_ref().unwrap_or(&edge);
                    let slices =
                        edge_slices::desired(&key, &service, owner(&key, gw).as_ref(), pods);
                    let (state, dedicated) = match own {
                        None => (None, None),
                        Some(Ok((pods_key, objects))) => {
                            (Some(Ok(pods_key.to_string())), Some(objects))
                        }
                        Some(Err(why)) => (Some(Err(why)), None),
                    };
                    if let Some(state) = state {
                        dedicated_state.insert(key.clone(), state);
                    }
                    services.insert(
                        key.clone(),
                        GatewayObjects {
                            service,
                            slices,
                            dedicated,
                        },
                    );
                }
                allocated.insert(key, map);
            }
            Err(e) => {
                let reason = match e {
                    PortError::TooMany { .. } => "NoResources",
                    PortError::Exhausted { .. } => "NoResources",
                };
                problems.insert(key, (reason, e.to_string()));
            }
        }
    }
    for key in problems.keys() {
        // Not placed; a Gateway already refused for its address type keeps saying so.
        if let Some(m) = models.get_mut(key)
            && !matches!(m.address, Err(AddressError::Unsupported(_)))
        {
            m.address = Err(AddressError::PoolExhausted);
        }
    }
    Plan {
        ports: allocated,
        services,
        problems,
        addresses,
        dedicated: dedicated_state,
        handed_over,
    }
}

/// A dedicated Gateway's own Deployment and pods Service, if it asks for them: with
/// the key of the Service whose endpoints are its pods, or why it can't have them.
fn dedicated_objects(
    settings: Option<&DedicatedSettings>,
    key: &ObjectKey,
    gw: &Gateway,
) -> Option<Result<(ObjectKey, DedicatedObjects), String>> {
    let replicas = match dedicated::requested(gw)? {
        Ok(n) => n,
        Err(why) => return Some(Err(why)),
    };
    let Some(settings) = settings else {
        return Some(Err(
            "this edge has no pod template for dedicated Gateways (--dedicated-pod-template)"
                .to_owned(),
        ));
    };
    let objects = dedicated::objects(settings, key, gw, replicas);
    Some(Ok((dedicated::pods_service_key(settings, key), objects)))
}

impl Plan {
    /// The internal ports this process binds: every Gateway's, except those served by
    /// pods of their own (once one of those is ready); on such a pod (`serve_only`),
    /// that one Gateway's.
    pub(super) fn served_ports(
        &self,
        settings: &ServiceSettings,
    ) -> BTreeMap<ObjectKey, BTreeMap<u16, u16>> {
        self.ports
            .iter()
            .filter(|(key, _)| match &settings.serve_only {
                Some(only) => *key == only,
                None => !self.handed_over.contains(*key),
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Kubernetes-mode Gateway status (GEP-5093): the addresses the Service provides
    /// for each requested scope, `AddressesAssigned`, and Programmed=False when the
    /// Gateway could not be placed or has no address at all. Returns the routability
    /// of each `status.addresses` entry, which the typed status can't hold.
    pub(super) fn adjust_status(
        &self,
        store: &Store,
        model: &GatewayModel<'_>,
        status: &mut GatewayStatus,
    ) -> Vec<String> {
        let generation = model.generation;
        // A write the API server refused (RBAC, say) counts like a placement problem:
        // without its Service the Gateway has no address we can vouch for.
        let refused = store
            .apply_failures
            .get(&model.key)
            .map(|m| ("AddressNotAssigned", m.clone()));
        let (assigned, problem) = match (
            self.problems.get(&model.key).or(refused.as_ref()),
            self.addresses.get(&model.key),
        ) {
            (Some(p), _) => (routability::Assigned::default(), Some(p.clone())),
            (None, Some(wanted)) => {
                let svc = existing(store, &model.key).map(|(s, _)| s);
                let assigned = routability::assign(wanted, svc);
                let none = assigned
                    .addresses
                    .is_empty()
                    .then(|| ("AddressNotAssigned", assigned.unsatisfied.join("; ")));
                (assigned, none)
            }
            (None, None) => (routability::Assigned::default(), None),
        };
        let placed_problem = self.problems.contains_key(&model.key) || refused.is_some();
        if let Some(state) = self.dedicated.get(&model.key) {
            let c = dedicated::condition(generation, state);
            replace(status.conditions.get_or_insert_with(Vec::new), c);
        }
        apply_assignment(generation, assigned, problem, placed_problem, status)
    }
}

/// Writes what a Service provides into a Gateway's status (GEP-5093): the addresses,
/// `AddressesAssigned`, and Programmed=False with `problem` when the Gateway could not
/// be placed (`forced`) or has no address at all. Returns each address's routability,
/// which the typed status can't hold.
pub(super) fn apply_assignment(
    generation: i64,
    assigned: routability::Assigned,
    problem: Option<(&'static str, String)>,
    forced: bool,
    status: &mut GatewayStatus,
) -> Vec<String> {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let addresses_assigned = match &problem {
        Some((_, msg)) => cond::condition(
            "AddressesAssigned",
            false,
            "NotAssigned",
            msg.clone(),
            generation,
        ),
        None if assigned.unsatisfied.is_empty() => cond::condition(
            "AddressesAssigned",
            true,
            "Assigned",
            "every requested address is assigned",
            generation,
        ),
        None => cond::condition(
            "AddressesAssigned",
            false,
            "PartiallyAssigned",
            format!("not assigned: {}", assigned.unsatisfied.join("; ")),
            generation,
        ),
    };
    replace(conditions, addresses_assigned);
    let still_programmed = conditions
        .iter()
        .any(|c| c.type_ == "Programmed" && c.status == "True");
    if let Some((reason, msg)) = problem
        && (still_programmed || forced)
    {
        replace(conditions, cond::not_programmed(generation, reason, msg));
    }
    let scopes = assigned
        .addresses
        .iter()
        .map(|(_, r)| (*r).to_owned())
        .collect();
    let addresses: Vec<_> = assigned.addresses.into_iter().map(|(a, _)| a).collect();
    status.addresses = (!addresses.is_empty()).then_some(addresses);
    scopes
}

fn replace(conditions: &mut Vec<Condition>, c: Condition) {
    match conditions.iter_mut().find(|x| x.type_ == c.type_) {
        Some(slot) => *slot = c,
        None => conditions.push(c),
    }
}

pub const LABEL_GATEWAY_NAME: &str = "aether.io/gateway-name";
/// The label GEP-1762 gives everything made for a Gateway (its name; the namespace is
/// the object's own). Users and the upstream GatewayInfrastructure test find a
/// Gateway's Service and pods by it; ownership is still read from our own labels.
pub const LABEL_GATEWAY_API_NAME: &str = "gateway.networking.k8s.io/gateway-name";
pub const LABEL_GATEWAY_NAMESPACE: &str = "aether.io/gateway-namespace";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "aether-edge";

/// Where the edge pods are found: the edge's own Service, whose EndpointSlices the
/// cluster keeps current. Gateway Services mirror its endpoints (see `edge_slices`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceSettings {
    pub edge_service: ObjectKey,
    /// What dedicated Gateways' pods look like; `None` turns the feature off.
    pub dedicated: Option<DedicatedSettings>,
    /// Set on a dedicated Gateway's own pods: serve this Gateway only.
    pub serve_only: Option<ObjectKey>,
}

impl ServiceSettings {
    /// No dedicated Gateways: every Gateway is served by the shared edge pods.
    pub fn shared(edge_service: ObjectKey) -> Self {
        Self {
            edge_service,
            dedicated: None,
            serve_only: None,
        }
    }
}

/// What the controller writes for one Gateway in Kubernetes mode.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayObjects {
    pub service: Service,
    /// The Service's endpoints: the edge pods (or the Gateway's own), at the internal
    /// ports.
    pub slices: Vec<EndpointSlice>,
    /// A dedicated Gateway's own Deployment and the Service selecting its pods.
    pub dedicated: Option<DedicatedObjects>,
}

/// The Service name for a Gateway: `<gateway>-aether`, shortened with a stable hash
/// when that exceeds a DNS label.
pub fn service_name(gateway: &str) -> String {
    let name = format!("{gateway}-aether");
    if name.len() <= 63 {
        return name;
    }
    let h = fnv1a_32(gateway.bytes());
    let head: String = gateway.chars().take(45).collect();
    format!("{}-{h:08x}-aether", head.trim_end_matches('-'))
}

/// 32-bit FNV-1a, for the hash that keeps shortened object names distinct. Stable
/// across Rust releases (unlike std's hasher): names of existing objects depend on it.
pub(super) fn fnv1a_32(bytes: impl IntoIterator<Item = u8>) -> u32 {
    bytes.into_iter().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Is this Service one we manage for the Gateway `key`?
pub fn is_ours(svc: &Service, key: &ObjectKey) -> bool {
    let labels = svc.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(LABEL_MANAGED_BY) == Some(MANAGED_BY)
        && get(LABEL_GATEWAY_NAME) == Some(key.name())
        && get(LABEL_GATEWAY_NAMESPACE) == Some(key.namespace())
}

/// The Service in the Gateway's namespace with our name, if any, and whether it's ours.
pub fn existing<'s>(store: &'s Store, key: &ObjectKey) -> Option<(&'s Service, bool)> {
    let svc = store
        .services
        .get(&ObjectKey::new(key.namespace(), service_name(key.name())))?;
    Some((svc, is_ours(svc, key)))
}

/// Listener port -> internal port, as our existing Service for `key` targets them.
pub fn previous_ports(store: &Store, key: &ObjectKey) -> BTreeMap<u16, u16> {
    let Some((svc, true)) = existing(store, key) else {
        return BTreeMap::new();
    };
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok()?;
            match &p.target_port {
                Some(IntOrString::Int(t)) => Some((port, u16::try_from(*t).ok()?)),
                _ => None,
            }
        })
        .collect()
}

/// The ClusterIP to ask for. A Service's ClusterIP can't change once allocated, so
/// asking for another one would only make every apply fail: then none is asked for,
/// and the entry stays unsatisfied with the Service's actual address in status.
fn cluster_ip(wanted: &routability::Request, current: Option<&Service>) -> Option<String> {
    let want = wanted.cluster_ip()?;
    let has = current
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.cluster_ip.as_deref())
        .filter(|c| !c.is_empty());
    match has {
        Some(c) if c.parse().ok() != Some(want) => None,
        _ => Some(want.to_string()),
    }
}

/// The owner reference that lets the garbage collector remove what we create for a
/// Gateway if we don't; none before the Gateway has a uid.
pub fn owner(key: &ObjectKey, gw: &Gateway) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "gateway.networking.k8s.io/v1".to_owned(),
        kind: "Gateway".to_owned(),
        name: key.name().to_string(),
        uid: gw.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// The Service a Gateway should have: type LoadBalancer, each listener port to its
/// internal port, owned by the Gateway, with `spec.infrastructure` labels and
/// annotations propagated. No selector: its endpoints are the edge pods in another
/// namespace, which only an EndpointSlice we write can name.
pub fn desired(
    key: &ObjectKey,
    gw: &Gateway,
    ports: &BTreeMap<u16, u16>,
    protocols: &BTreeMap<u16, String>,
    wanted: &routability::Request,
    current: Option<&Service>,
) -> Service {
    let infra = gw.spec.infrastructure.as_ref();
    let mut labels: BTreeMap<String, String> = infra
        .and_then(|i| i.labels.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(LABEL_GATEWAY_NAME.to_owned(), key.name().to_string());
    labels.insert(LABEL_GATEWAY_API_NAME.to_owned(), key.name().to_string());
    labels.insert(
        LABEL_GATEWAY_NAMESPACE.to_owned(),
        key.namespace().to_string(),
    );
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    let annotations: BTreeMap<String, String> = infra
        .and_then(|i| i.annotations.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let service_ports = ports
        .iter()
        .map(|(port, internal)| {
            let proto = protocols
                .get(port)
                .map_or("tcp".to_owned(), |p| p.to_ascii_lowercase());
            ServicePort {
                name: Some(format!("{proto}-{port}")),
                port: i32::from(*port),
                target_port: Some(IntOrString::Int(i32::from(*internal))),
                // UDP listeners need a UDP Service port; everything else rides TCP.
                protocol: Some(if proto == "udp" { "UDP" } else { "TCP" }.to_owned()),
                ..ServicePort::default()
            }
        })
        .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(key.name())),
            namespace: Some(key.namespace().to_string()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: owner(key, gw).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: wanted.service_type().map(str::to_owned),
            // Deprecated upstream but still what MetalLB and most clouds honour.
            load_balancer_ip: wanted.load_balancer_ip().map(|ip| ip.to_string()),
            cluster_ip: cluster_ip(wanted, current),
            ports: Some(service_ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_stay_dns_labels_and_distinct() {
        assert_eq!(service_name("gw"), "gw-aether");
        let a = service_name(&"a".repeat(70));
        let b = service_name(&format!("{}b", "a".repeat(69)));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
    }
}

#[cfg(test)]
#[path = "services_tests.rs"]
mod plan_tests;
