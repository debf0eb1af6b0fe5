//! Backends: the weighted choice among a rule's backendRefs, and load balancing among a
//! Service's ready endpoints.
//!
//! Endpoint choice is round robin over one atomic counter per backend: it spreads
//! requests evenly with no lock and no per-request allocation, and it is predictable
//! in tests. Passive health and least-request come with outlier detection later.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::uri::Authority;
use serde::{Serialize, Serializer};

use crate::filters::Filters;

/// One upstream endpoint, with its authority pre-rendered so a request never formats it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub authority: Authority,
    /// Mesh mode: `/ns/<ns>/sa/<serviceAccount>` of the pod behind this address (from
    /// the EndpointSlice's targetRef); `None` when it is not known.
    pub peer: Option<Arc<str>>,
    /// Passive health, shared by every endpoint for this address.
    pub health: Arc<crate::health::Health>,
}

impl Endpoint {
    pub fn new(addr: SocketAddr) -> Self {
        // A SocketAddr always renders as a valid authority.
        let authority = Authority::try_from(addr.to_string().as_str())
            .unwrap_or_else(|_| Authority::from_static("invalid.endpoint"));
        Self {
            addr,
            authority,
            peer: None,
            health: crate::health::Health::for_addr(addr),
        }
    }

    /// The same endpoint, with its pod's workload identity path.
    pub fn with_peer(mut self, peer: Option<Arc<str>>) -> Self {
        self.peer = peer;
        self
    }
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.addr.serialize(s)
    }
}

/// How the proxy speaks to a backend's endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum UpstreamProtocol {
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (Service `appProtocol: kubernetes.io/h2c`).
    H2c,
    /// Mesh mode: mTLS HTTP/2 to the pod's inbound listener. Chosen by the proxy at
    /// request time, never by the controller.
    Mesh,
    /// BackendTLSPolicy: HTTP/1.1 over TLS (chosen by the proxy when `Backend::tls` is set).
    Tls,
    /// BackendTLSPolicy on an HTTP/2 backend: HTTP/2 over TLS (ALPN h2).
    H2Tls,
}

/// A resolved Service port: its ready endpoints and the round-robin cursor.
#[derive(Debug, Serialize)]
pub struct Backend {
    /// `namespace/name:port` of the Service, for logs and config dumps.
    pub name: Arc<str>,
    pub protocol: UpstreamProtocol,
    pub endpoints: Vec<Endpoint>,
    /// The Service opted out of mesh mode (`aether.io/mesh: disabled`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mesh_disabled: bool,
    /// The BackendTLSPolicy this Service port is reached with, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<Arc<crate::backend_tls::BackendTls>>,
    /// Connect, TLS, retry and mirror counters: shared with this backend's copies in
    /// other Snapshots, gone from `/metrics` with the last of them.
    #[serde(skip)]
    pub stats: Arc<crate::series::BackendCounters>,
    #[serde(skip)]
    cursor: AtomicUsize,
}

impl Backend {
    pub fn new(name: Arc<str>, protocol: UpstreamProtocol, endpoints: Vec<Endpoint>) -> Self {
        Self {
            stats: crate::series::backend(&name),
            name,
            protocol,
            endpoints,
            mesh_disabled: false,
            tls: None,
            cursor: AtomicUsize::new(0),
        }
    }

    /// Marks the Service as reached directly even in mesh mode.
    pub fn with_mesh_disabled(mut self, disabled: bool) -> Self {
        self.mesh_disabled = disabled;
        self
    }

    /// Reaches the endpoints over TLS as a BackendTLSPolicy says.
    pub fn with_tls(mut self, tls: Option<Arc<crate::backend_tls::BackendTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// The next endpoint in round-robin order, skipping ejected ones (unless all
    /// are), or `None` when the Service has no ready endpoints.
    pub fn pick(&self) -> Option<&Endpoint> {
        if self.endpoints.is_empty() {
            return None;
        }
        let n = self.cursor.fetch_add(1, Ordering::Relaxed);
        self.pick_from(n, &[])
            .or_else(|| self.endpoints.get(n % self.endpoints.len()))
    }

    /// An available endpoint other than those in `tried`, for a retry.
    pub fn pick_other(&self, tried: &[SocketAddr]) -> Option<&Endpoint> {
        let n = self.cursor.fetch_add(1, Ordering::Relaxed);
        self.pick_from(n, tried)
    }

    fn pick_from(&self, start: usize, tried: &[SocketAddr]) -> Option<&Endpoint> {
        let len = self.endpoints.len();
        (0..len)
            .filter_map(|i| self.endpoints.get((start + i) % len))
            .find(|e| !tried.contains(&e.addr) && e.health.is_available())
    }
}

/// What a backendRef turned into.
#[derive(Debug, Serialize)]
pub enum BackendTarget {
    Service(Arc<Backend>),
    /// A backendRef that could not be resolved. The spec asks that the share of
    /// requests it would have received answers 500.
    Invalid {
        reason: Arc<str>,
    },
}

#[derive(Debug, Serialize)]
pub struct WeightedBackend {
    pub weight: u32,
    pub target: BackendTarget,
    /// Filters of this backendRef, applied after the rule's.
    #[serde(skip_serializing_if = "Filters::is_empty")]
    pub filters: Filters,
}

/// A rule's backendRefs with their weights. The list is shared, so the Snapshot's
/// action and the route model it was built from hold one copy (two per route were
/// 0.4 MiB at 5,000 routes), as `Filters` are.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackendSet {
    backends: Arc<[WeightedBackend]>,
    total_weight: u32,
}

/// The outcome of choosing among a rule's backends.
#[derive(Debug)]
pub enum Pick<'a> {
    Endpoint(&'a WeightedBackend, &'a Backend, &'a Endpoint),
    /// The chosen Service has no ready endpoint.
    NoEndpoints(&'a Backend),
    /// The chosen backendRef is invalid, or every weight is zero.
    Invalid,
}

impl BackendSet {
    pub fn new(backends: impl Into<Arc<[WeightedBackend]>>) -> Self {
        let backends = backends.into();
        let total_weight = backends.iter().map(|b| b.weight).sum();
        Self {
            backends,
            total_weight,
        }
    }

    pub fn backends(&self) -> &[WeightedBackend] {
        &self.backends
    }

    /// A weighted random choice among backendRefs, then an endpoint of the chosen one.
    pub fn pick(&self) -> Pick<'_> {
        let chosen = match &*self.backends {
            [] => return Pick::Invalid,
            [only] if only.weight > 0 => only,
            _ if self.total_weight == 0 => return Pick::Invalid,
            many => {
                let mut roll = fastrand::u32(0..self.total_weight);
                let mut chosen = None;
                for b in many {
                    if roll < b.weight {
                        chosen = Some(b);
                        break;
                    }
                    roll -= b.weight;
                }
                match chosen {
                    Some(b) => b,
                    None => return Pick::Invalid,
                }
            }
        };
        match &chosen.target {
            BackendTarget::Invalid { .. } => Pick::Invalid,
            BackendTarget::Service(backend) => match backend.pick() {
                Some(ep) => Pick::Endpoint(chosen, backend, ep),
                None => Pick::NoEndpoints(backend),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn backend(name: &str, ports: &[u16]) -> Arc<Backend> {
        backend_at([127, 0, 0, 1], name, ports)
    }

    /// Passive health is shared per address across the process, so a test that
    /// ejects endpoints uses addresses no other test does.
    fn backend_at(ip: [u8; 4], name: &str, ports: &[u16]) -> Arc<Backend> {
        let eps = ports
            .iter()
            .map(|p| Endpoint::new(SocketAddr::from((ip, *p))))
            .collect();
        Arc::new(Backend::new(name.into(), UpstreamProtocol::Http1, eps))
    }

    #[test]
    fn round_robin_visits_every_endpoint_in_turn() {
        let b = backend("a", &[1, 2, 3]);
        let seen: Vec<u16> = (0..6)
            .filter_map(|_| b.pick())
            .map(|e| e.addr.port())
            .collect();
        assert_eq!(seen, vec![1, 2, 3, 1, 2, 3]);
    }

    #[test]
    fn ejected_endpoints_are_skipped_unless_all_are() {
        let b = backend_at([127, 0, 9, 1], "a", &[1, 2, 3]);
        let ep2 = b.endpoints.iter().find(|e| e.addr.port() == 2).unwrap();
        while !ep2.health.failure() {}
        let seen: Vec<u16> = (0..4)
            .filter_map(|_| b.pick())
            .map(|e| e.addr.port())
            .collect();
        assert!(!seen.contains(&2), "{seen:?}");
        let other = b.pick_other(&[ep2.addr, SocketAddr::from(([127, 0, 9, 1], 1))]);
        assert_eq!(other.map(|e| e.addr.port()), Some(3));
        for e in &b.endpoints {
            while !e.health.failure() {}
        }
        assert!(
            b.pick().is_some(),
            "all ejected: still spread rather than fail"
        );
        assert!(b.pick_other(&[]).is_none());
    }

    #[test]
    fn weights_split_traffic_and_zero_weight_gets_none() {
        let set = BackendSet::new(vec![
            WeightedBackend {
                weight: 3,
                target: BackendTarget::Service(backend("a", &[1])),
                filters: Filters::default(),
            },
            WeightedBackend {
                weight: 1,
                target: BackendTarget::Service(backend("b", &[2])),
                filters: Filters::default(),
            },
            WeightedBackend {
                weight: 0,
                target: BackendTarget::Service(backend("c", &[3])),
                filters: Filters::default(),
            },
        ]);
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            if let Pick::Endpoint(_, _, ep) = set.pick() {
                counts[ep.addr.port() as usize] += 1;
            }
        }
        assert_eq!(counts[3], 0);
        // 3:1 split; generous bounds keep this deterministic enough to never flake.
        assert!(counts[1] > 2600 && counts[1] < 3400, "{counts:?}");
        assert_eq!(counts[1] + counts[2], 4000);
    }

    #[test]
    fn invalid_and_empty_backends_are_reported() {
        let set = BackendSet::new(vec![WeightedBackend {
            weight: 1,
            target: BackendTarget::Invalid {
                reason: "missing".into(),
            },
            filters: Filters::default(),
        }]);
        assert!(matches!(set.pick(), Pick::Invalid));
        let set = BackendSet::new(vec![WeightedBackend {
            weight: 1,
            target: BackendTarget::Service(backend("a", &[])),
            filters: Filters::default(),
        }]);
        assert!(matches!(set.pick(), Pick::NoEndpoints(_)));
        assert!(matches!(BackendSet::default().pick(), Pick::Invalid));
    }
}
