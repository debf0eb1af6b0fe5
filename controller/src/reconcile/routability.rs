//! GEP-5093 in Kubernetes mode: the reachability scope each `spec.addresses` entry
//! asks for, what the Gateway Service must be to provide it, and which entries the
//! Service satisfies.
//!
//! One Service serves both well-known scopes: a LoadBalancer Service's load-balancer
//! ingress is the `External` address and its ClusterIP (from the service network by
//! definition) the `Cluster` one; a Gateway asking only for `Cluster` gets a ClusterIP
//! Service. One Service per Gateway means one set of ports and one EndpointSlice,
//! rather than two that must be kept in step. A scope is never substituted for
//! another: an entry is satisfied only by an address of its own scope.

use std::net::IpAddr;

use gateway_api::gateways::{Gateway, GatewayStatusAddresses};
use k8s_openapi::api::core::v1::Service;

use crate::gateway_ext::GatewayExt;

pub const EXTERNAL: &str = "External";
pub const CLUSTER: &str = "Cluster";

/// What one `spec.addresses` entry asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// An External address, optionally this IP.
    External(Option<IpAddr>),
    /// A Cluster address, optionally this IP.
    Cluster(Option<IpAddr>),
    /// Nothing this implementation can provide, and why.
    Unsatisfiable(String),
}

/// Every entry of a Gateway's `spec.addresses`, described for messages. A Gateway
/// without entries gets one implicit External entry: the GEP lets an implementation
/// choose, and a LoadBalancer address is what users of an edge expect.
#[derive(Debug, Clone)]
pub struct Request {
    pub entries: Vec<(String, Want)>,
}

pub fn request(gw: &Gateway, ext: Option<&GatewayExt>) -> Request {
    let addresses = gw.spec.addresses.as_deref().unwrap_or_default();
    if addresses.is_empty() {
        return Request {
            entries: vec![("(default)".to_owned(), Want::External(None))],
        };
    }
    let entries = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let kind = a.r#type.as_deref().unwrap_or("IPAddress");
            let routability = ext.and_then(|e| e.spec(i));
            let value = a.value.as_deref().filter(|v| !v.is_empty());
            let describe = format!(
                "addresses[{i}] ({kind}{}{})",
                value.map(|v| format!(" {v}")).unwrap_or_default(),
                routability.map(|r| format!(", {r}")).unwrap_or_default()
            );
            (describe, want(kind, value, routability))
        })
        .collect();
    Request { entries }
}

fn want(kind: &str, value: Option<&str>, routability: Option<&str>) -> Want {
    if kind != "IPAddress" {
        return Want::Unsatisfiable(format!(
            "address type {kind} can't be requested from a Service; IPAddress can"
        ));
    }
    let ip = match value.map(str::parse::<IpAddr>) {
        None => None,
        Some(Ok(ip)) => Some(ip),
        Some(Err(_)) => {
            return Want::Unsatisfiable(format!("{} is not an IP address", value.unwrap_or("")));
        }
    };
    match routability {
        None | Some(EXTERNAL) => Want::External(ip),
        Some(CLUSTER) => Want::Cluster(ip),
        Some(other) => Want::Unsatisfiable(format!(
            "routability {other} is not supported; External and Cluster are"
        )),
    }
}

impl Request {
    /// The Service type that provides every satisfiable entry, or None when no entry
    /// is satisfiable (then there is no Service at all).
    pub fn service_type(&self) -> Option<&'static str> {
        let wants = || self.entries.iter().map(|(_, w)| w);
        if wants().any(|w| matches!(w, Want::External(_))) {
            Some("LoadBalancer")
        } else if wants().any(|w| matches!(w, Want::Cluster(_))) {
            Some("ClusterIP")
        } else {
            None
        }
    }

    /// The load-balancer IP to ask for: the first External entry's value.
    pub fn load_balancer_ip(&self) -> Option<IpAddr> {
        self.entries.iter().find_map(|(_, w)| match w {
            Want::External(ip) => *ip,
            _ => None,
        })
    }

    /// The ClusterIP to ask for: the first Cluster entry's value.
    pub fn cluster_ip(&self) -> Option<IpAddr> {
        self.entries.iter().find_map(|(_, w)| match w {
            Want::Cluster(ip) => *ip,
            _ => None,
        })
    }

    /// Why nothing can be assigned, when no entry is satisfiable.
    pub fn unsatisfiable(&self) -> Option<String> {
        self.service_type().is_none().then(|| {
            self.entries
                .iter()
                .map(|(d, w)| match w {
                    Want::Unsatisfiable(why) => format!("{d}: {why}"),
                    _ => d.clone(),
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

/// What the Gateway's Service provides against what was asked.
#[derive(Debug, Default, PartialEq)]
pub struct Assigned {
    /// Satisfied addresses with their routability, in entry order, without repeats.
    pub addresses: Vec<(GatewayStatusAddresses, &'static str)>,
    /// Unsatisfied entries, each with why.
    pub unsatisfied: Vec<String>,
}

pub fn assign(req: &Request, svc: Option<&Service>) -> Assigned {
    let spec = svc.and_then(|s| s.spec.as_ref());
    let is_lb = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    let external: Vec<GatewayStatusAddresses> = if is_lb {
        svc.and_then(|s| s.status.as_ref())
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| match (&i.ip, &i.hostname) {
                (Some(ip), _) if !ip.is_empty() => Some(address("IPAddress", ip)),
                (_, Some(h)) if !h.is_empty() => Some(address("Hostname", h)),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let cluster: Vec<GatewayStatusAddresses> = spec
        .and_then(|s| {
            s.cluster_ips
                .clone()
                .or_else(|| s.cluster_ip.clone().map(|c| vec![c]))
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| ip.parse::<IpAddr>().is_ok())
        .map(|ip| address("IPAddress", &ip))
        .collect();
    let mut out = Assigned::default();
    for (describe, want) in &req.entries {
        let (found, scope, waiting): (Vec<&GatewayStatusAddresses>, _, _) = match want {
            Want::External(ip) => (
                pick(&external, *ip, usize::MAX),
                EXTERNAL,
                "a load-balancer address",
            ),
            Want::Cluster(ip) => (pick(&cluster, *ip, 1), CLUSTER, "a cluster IP"),
            Want::Unsatisfiable(why) => {
                out.unsatisfied.push(format!("{describe}: {why}"));
                continue;
            }
        };
        if found.is_empty() {
            let name = svc
                .and_then(|s| s.metadata.name.as_deref())
                .unwrap_or("(not created yet)");
            out.unsatisfied.push(format!(
                "{describe}: waiting for {waiting} on Service {name}"
            ));
        }
        for a in found {
            if !out.addresses.iter().any(|(x, _)| x.value == a.value) {
                out.addresses.push((a.clone(), scope));
            }
        }
    }
    out
}

/// The addresses of one scope an entry gets: the requested IP if present, else up to
/// `limit` of them.
fn pick(
    available: &[GatewayStatusAddresses],
    ip: Option<IpAddr>,
    limit: usize,
) -> Vec<&GatewayStatusAddresses> {
    match ip {
        Some(ip) => available
            .iter()
            .filter(|a| a.value.parse::<IpAddr>().ok() == Some(ip))
            .collect(),
        None => available.iter().take(limit).collect(),
    }
}

fn address(kind: &str, value: &str) -> GatewayStatusAddresses {
    GatewayStatusAddresses {
        r#type: Some(kind.to_owned()),
        value: value.to_owned(),
    }
}
