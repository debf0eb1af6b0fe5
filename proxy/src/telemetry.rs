//! Metric names and the per-route handles the hot path increments.
//!
//! Handles are registered when a Snapshot is built, or at a route's first answer in a
//! status class; after that a request bumps a counter without building a label set or
//! looking anything up in the registry.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

pub const REQUESTS_TOTAL: &str = "aether_requests_total";
pub const REQUEST_DURATION_SECONDS: &str = "aether_request_duration_seconds";
pub const UPSTREAM_CONNECT_ERRORS_TOTAL: &str = "aether_upstream_connect_errors_total";
/// TLS handshakes to BackendTLSPolicy backends that failed (unknown CA, wrong name).
pub const UPSTREAM_TLS_ERRORS_TOTAL: &str = "aether_upstream_tls_errors_total";
pub const DOWNSTREAM_CONNECTIONS_ACTIVE: &str = "aether_downstream_connections_active";
pub const DOWNSTREAM_CONNECTIONS_TOTAL: &str = "aether_downstream_connections_total";
pub const LISTENER_BIND_ERRORS_TOTAL: &str = "aether_listener_bind_errors_total";
pub const TLS_HANDSHAKE_ERRORS_TOTAL: &str = "aether_tls_handshake_errors_total";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "aether_connections_refused_total";
pub const REQUESTS_REFUSED_TOTAL: &str = "aether_requests_refused_total";
pub const OVERLOAD_ACTIVE: &str = "aether_overload_active";
pub const OVERLOAD_SHED_TOTAL: &str = "aether_overload_shed_total";
pub const MIRROR_REQUESTS_TOTAL: &str = "aether_mirror_requests_total";
pub const MIRROR_SKIPPED_TOTAL: &str = "aether_mirror_skipped_total";
pub const CLIENT_CERT_REJECTED_TOTAL: &str = "aether_client_cert_rejected_total";
pub const CLIENT_CERT_FALLBACK_TOTAL: &str = "aether_client_cert_fallback_total";
pub const UPSTREAM_RETRIES_TOTAL: &str = "aether_upstream_retries_total";
pub const MESH_SVID_EXPIRY_SECONDS: &str = "aether_mesh_svid_expiry_seconds";
pub const MESH_SVID_UPDATES_TOTAL: &str = "aether_mesh_svid_updates_total";
pub const MESH_IDENTITY_SOURCE_ERRORS_TOTAL: &str = "aether_mesh_identity_source_errors_total";
pub const MESH_PEER_IDENTITY_MISMATCH_TOTAL: &str = "aether_mesh_peer_identity_mismatch_total";
pub const MESH_PEER_IDENTITY_UNKNOWN_TOTAL: &str = "aether_mesh_peer_identity_unknown_total";
pub const MESH_UPSTREAM_CONNECTIONS_TOTAL: &str = "aether_mesh_upstream_connections_total";

/// Buckets for request durations: 100 µs to 30 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Counters by status class of one route on one Gateway, and that Gateway's duration
/// histogram.
///
/// Series cost memory in the edge and in every scraper, so they exist only once there
/// is something to count: a counter is registered on the route's first answer in its
/// class, and durations are kept per Gateway, not per route (a histogram is 19 series;
/// per route it made 5,000 idle routes cost 120,000 series).
#[derive(Clone)]
pub struct RouteStats(Arc<RouteStatsInner>);

struct RouteStatsInner {
    gateway: Arc<str>,
    route: Arc<str>,
    by_class: [OnceLock<Counter>; 5],
    duration: Histogram,
}

impl RouteStats {
    pub fn new(gateway: &str, route: &str) -> Self {
        let duration = histogram!(REQUEST_DURATION_SECONDS, "gateway" => gateway.to_owned());
        Self(Arc::new(RouteStatsInner {
            gateway: gateway.into(),
            route: route.into(),
            by_class: Default::default(),
            duration,
        }))
    }

    pub fn record(&self, status: u16, elapsed: Duration) {
        let s = &self.0;
        let idx = usize::from(status / 100).saturating_sub(1).min(4);
        if let (Some(slot), Some(class)) = (s.by_class.get(idx), CLASSES.get(idx)) {
            slot.get_or_init(|| {
                counter!(REQUESTS_TOTAL, "gateway" => s.gateway.to_string(), "route" => s.route.to_string(), "code" => *class)
            })
            .increment(1);
        }
        s.duration.record(elapsed.as_secs_f64());
    }
}

impl std::fmt::Debug for RouteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteStats")
    }
}

/// Requests that matched no route (or no listener) are counted under `route="none"`.
pub fn unrouted(gateway: &str) -> RouteStats {
    RouteStats::new(gateway, "none")
}

pub fn active_connections(listener: &str) -> Gauge {
    gauge!(DOWNSTREAM_CONNECTIONS_ACTIVE, "listener" => listener.to_owned())
}

pub fn connections_total(listener: &str) -> Counter {
    counter!(DOWNSTREAM_CONNECTIONS_TOTAL, "listener" => listener.to_owned())
}

pub fn upstream_connect_errors(backend: &str) -> Counter {
    counter!(UPSTREAM_CONNECT_ERRORS_TOTAL, "backend" => backend.to_owned())
}

pub fn upstream_tls_errors(backend: &str) -> Counter {
    counter!(UPSTREAM_TLS_ERRORS_TOTAL, "backend" => backend.to_owned())
}
