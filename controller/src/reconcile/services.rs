//! Kubernetes mode: the Service each Gateway gets (pure: the reconciler outputs it, an
//! effect applies it), and the addresses its load balancer reports.

use std::collections::BTreeMap;

use gateway_api::gateways::{Gateway, GatewayStatus, GatewayStatusAddresses};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::address::AddressError;
use super::conditions as cond;
use super::edge_slices;
use super::gateway::GatewayModel;
use super::ports::{self, PortError, PortRange, PortRequest};
use crate::store::{ObjectKey, Store};

/// Kubernetes-mode placement of every Gateway: its internal ports and its Service.
pub struct Plan {
    /// Gateway -> listener port -> internal port, for the Gateways that are served.
    pub ports: BTreeMap<ObjectKey, BTreeMap<u16, u16>>,
    pub services: BTreeMap<ObjectKey, GatewayObjects>,
    /// Why a Gateway is not placed, as a Programmed=False reason and message.
    problems: BTreeMap<ObjectKey, (&'static str, String)>,
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
    for (key, _) in ordered {
        let Some(model) = models.get(*key) else {
            continue;
        };
        if let Some((_, false)) = existing(store, key) {
            problems.insert(
                (*key).clone(),
                (
                    "AddressNotUsable",
                    format!(
                        "Service {}/{} exists and is not managed by aether-edge for this Gateway",
                        key.namespace,
                        service_name(&key.name)
                    ),
                ),
            );
            continue;
        }
        let protos = protocols.entry(key).or_default();
        for l in model.listeners.iter().filter(|l| l.usable()) {
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
    for (key, result) in ports::allocate(range, &requests) {
        match result {
            Ok(map) => {
                let gw = ordered.iter().find(|(k, _)| **k == key).map(|(_, g)| *g);
                let protos = protocols.get(&key).cloned().unwrap_or_default();
                if let Some(gw) = gw {
                    let service = desired(&key, gw, &map, &protos);
                    let slices =
                        edge_slices::desired(&key, &service, owner(&key, gw).as_ref(), &edge);
                    services.insert(key.clone(), GatewayObjects { service, slices });
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
        if let Some(m) = models.get_mut(key) {
            m.address = Err(AddressError::PoolExhausted);
        }
    }
    Plan {
        ports: allocated,
        services,
        problems,
    }
}

impl Plan {
    /// Kubernetes-mode Gateway status: addresses from the Service's load balancer, and
    /// Programmed=False when the Gateway could not be placed or has no address yet.
    pub(super) fn adjust_status(
        &self,
        store: &Store,
        model: &GatewayModel<'_>,
        status: &mut GatewayStatus,
    ) {
        let generation = model.generation;
        let addresses = lb_addresses(store, &model.key);
        let programmed = if let Some((reason, msg)) = self.problems.get(&model.key) {
            Some(cond::not_programmed(generation, reason, msg.clone()))
        } else if addresses.is_empty() {
            Some(cond::not_programmed(
                generation,
                "AddressNotAssigned",
                format!(
                    "waiting for a load-balancer address on Service {}/{}",
                    model.key.namespace,
                    service_name(&model.key.name)
                ),
            ))
        } else {
            None
        };
        let still_programmed = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Programmed" && c.status == "True");
        if let Some(c) = programmed
            && (still_programmed || self.problems.contains_key(&model.key))
        {
            replace(status.conditions.get_or_insert_with(Vec::new), c);
        }
        status.addresses = (!addresses.is_empty()).then_some(addresses);
    }
}

fn replace(conditions: &mut Vec<Condition>, c: Condition) {
    match conditions.iter_mut().find(|x| x.type_ == c.type_) {
        Some(slot) => *slot = c,
        None => conditions.push(c),
    }
}

pub const LABEL_GATEWAY_NAME: &str = "aether.io/gateway-name";
pub const LABEL_GATEWAY_NAMESPACE: &str = "aether.io/gateway-namespace";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "aether-edge";

/// Where the edge pods are found: the edge's own Service, whose EndpointSlices the
/// cluster keeps current. Gateway Services mirror its endpoints (see `edge_slices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSettings {
    pub edge_service: ObjectKey,
}

/// What the controller writes for one Gateway in Kubernetes mode.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayObjects {
    pub service: Service,
    /// The Service's endpoints: the edge pods, at the internal ports.
    pub slices: Vec<EndpointSlice>,
}

/// The Service name for a Gateway: `<gateway>-aether`, shortened with a stable hash
/// when that exceeds a DNS label.
pub fn service_name(gateway: &str) -> String {
    let name = format!("{gateway}-aether");
    if name.len() <= 63 {
        return name;
    }
    let mut h: u32 = 0x811c_9dc5;
    for b in gateway.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let head: String = gateway.chars().take(45).collect();
    format!("{}-{h:08x}-aether", head.trim_end_matches('-'))
}

/// Is this Service one we manage for the Gateway `key`?
pub fn is_ours(svc: &Service, key: &ObjectKey) -> bool {
    let labels = svc.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(LABEL_MANAGED_BY) == Some(MANAGED_BY)
        && get(LABEL_GATEWAY_NAME) == Some(key.name.as_str())
        && get(LABEL_GATEWAY_NAMESPACE) == Some(key.namespace.as_str())
}

/// The Service in the Gateway's namespace with our name, if any, and whether it's ours.
pub fn existing<'s>(store: &'s Store, key: &ObjectKey) -> Option<(&'s Service, bool)> {
    let svc = store
        .services
        .get(&ObjectKey::new(&key.namespace, service_name(&key.name)))?;
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

/// The addresses the load balancer assigned to our Service for `key`.
pub fn lb_addresses(store: &Store, key: &ObjectKey) -> Vec<GatewayStatusAddresses> {
    let Some((svc, true)) = existing(store, key) else {
        return Vec::new();
    };
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) if !ip.is_empty() => Some(GatewayStatusAddresses {
                r#type: Some("IPAddress".to_owned()),
                value: ip.clone(),
            }),
            (_, Some(h)) if !h.is_empty() => Some(GatewayStatusAddresses {
                r#type: Some("Hostname".to_owned()),
                value: h.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The owner reference that lets the garbage collector remove what we create for a
/// Gateway if we don't; none before the Gateway has a uid.
pub fn owner(key: &ObjectKey, gw: &Gateway) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "gateway.networking.k8s.io/v1".to_owned(),
        kind: "Gateway".to_owned(),
        name: key.name.clone(),
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
) -> Service {
    let infra = gw.spec.infrastructure.as_ref();
    let mut labels: BTreeMap<String, String> = infra
        .and_then(|i| i.labels.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(LABEL_GATEWAY_NAME.to_owned(), key.name.clone());
    labels.insert(LABEL_GATEWAY_NAMESPACE.to_owned(), key.namespace.clone());
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
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }
        })
        .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&key.name)),
            namespace: Some(key.namespace.clone()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: owner(key, gw).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".to_owned()),
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
