//! The cells of routes and backends: `aether_requests_total`, the L4 routes'
//! counters, the per-backend counters and the opt-in per-route latency histogram.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::histogram::Histogram;
use super::text::Family;
use crate::telemetry::{
    MIRROR_REQUESTS_TOTAL, REQUESTS_TOTAL, ROUTE_REQUEST_DURATION_SECONDS, TCP_BYTES_TOTAL,
    TCP_CONNECTIONS_TOTAL, UDP_DATAGRAMS_TOTAL, UDP_FLOWS_TOTAL, UPSTREAM_CONNECT_ERRORS_TOTAL,
    UPSTREAM_RETRIES_TOTAL, UPSTREAM_TLS_ERRORS_TOTAL,
};

/// Status classes of `aether_requests_total`, by `status / 100 - 1`.
pub const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// `aether_requests_total` of one route (or `none`) on one Gateway. A class is rendered
/// once it counted something: idle routes cost no series.
#[derive(Debug)]
pub struct RouteCounters {
    gateway: Arc<str>,
    route: Arc<str>,
    by_class: [AtomicU64; 5],
}

impl RouteCounters {
    pub fn answered(&self, status: u16) {
        let idx = usize::from(status / 100).saturating_sub(1).min(4);
        if let Some(c) = self.by_class.get(idx) {
            c.fetch_add(1, Relaxed);
        }
    }
}

pub fn route(gateway: &Arc<str>, route: &Arc<str>) -> Arc<RouteCounters> {
    super::ROUTES.get((Arc::clone(gateway), Arc::clone(route)), || RouteCounters {
        gateway: Arc::clone(gateway),
        route: Arc::clone(route),
        by_class: Default::default(),
    })
}

/// The route's cell if a Snapshot still serving (or a request still in one) has it.
pub fn live_route(gateway: &Arc<str>, route: &Arc<str>) -> Option<Arc<RouteCounters>> {
    super::ROUTES.find(&(Arc::clone(gateway), Arc::clone(route)))
}

/// The counters of one TCPRoute, TLSRoute or UDPRoute on one Gateway, rendered from
/// the Snapshot that has the route on (at 0 before any traffic, as a dashboard expects).
#[derive(Debug)]
pub struct L4Counters {
    gateway: Arc<str>,
    route: Arc<str>,
    pub connections: Arc<AtomicU64>,
    /// "in": client to backend; "out": backend to client.
    pub bytes_in: Arc<AtomicU64>,
    pub bytes_out: Arc<AtomicU64>,
    pub flows: Arc<AtomicU64>,
    pub datagrams_in: Arc<AtomicU64>,
    pub datagrams_out: Arc<AtomicU64>,
}

pub fn l4_route(gateway: &Arc<str>, route: &Arc<str>) -> Arc<L4Counters> {
    super::L4_ROUTES.get((Arc::clone(gateway), Arc::clone(route)), || L4Counters {
        gateway: Arc::clone(gateway),
        route: Arc::clone(route),
        connections: Arc::default(),
        bytes_in: Arc::default(),
        bytes_out: Arc::default(),
        flows: Arc::default(),
        datagrams_in: Arc::default(),
        datagrams_out: Arc::default(),
    })
}

/// `reason` labels of `aether_upstream_retries_total`.
pub const RETRY_REASONS: [&str; 4] = [
    "connect_error",
    "status",
    "backend_timeout",
    "connection_closed",
];
/// `result` labels of `aether_mirror_requests_total`.
pub const MIRROR_RESULTS: [&str; 3] = ["ok", "error", "timeout"];

/// The per-backend counters (`namespace/name:port`), each rendered once it counted.
#[derive(Debug)]
pub struct BackendCounters {
    name: Arc<str>,
    connect_errors: AtomicU64,
    tls_errors: AtomicU64,
    retries: [AtomicU64; RETRY_REASONS.len()],
    mirrored: [AtomicU64; MIRROR_RESULTS.len()],
}

impl BackendCounters {
    pub fn connect_error(&self) {
        self.connect_errors.fetch_add(1, Relaxed);
    }

    pub fn tls_error(&self) {
        self.tls_errors.fetch_add(1, Relaxed);
    }

    /// A retry for `reason`, one of `RETRY_REASONS`.
    pub fn retried(&self, reason: &str) {
        bump(&self.retries, &RETRY_REASONS, reason);
    }

    /// A mirrored request's `result`, one of `MIRROR_RESULTS`.
    pub fn mirrored(&self, result: &str) {
        bump(&self.mirrored, &MIRROR_RESULTS, result);
    }
}

fn bump(counters: &[AtomicU64], labels: &[&str], label: &str) {
    match labels.iter().position(|l| *l == label) {
        Some(i) => {
            if let Some(c) = counters.get(i) {
                c.fetch_add(1, Relaxed);
            }
        }
        None => debug_assert!(false, "unknown label {label}"),
    }
}

pub fn backend(name: &Arc<str>) -> Arc<BackendCounters> {
    super::BACKENDS.get(Arc::clone(name), || BackendCounters {
        name: Arc::clone(name),
        connect_errors: AtomicU64::new(0),
        tls_errors: AtomicU64::new(0),
        retries: Default::default(),
        mirrored: Default::default(),
    })
}

/// `aether_route_request_duration_seconds` of one route on one Gateway
/// (`--route-latency-histogram`): 20 series per route once it answered, hence opt-in.
#[derive(Debug)]
pub struct RouteLatency {
    gateway: Arc<str>,
    kind: &'static str,
    route: Arc<str>,
    pub duration: Histogram,
}

/// The route's latency cell, or `None` while the histogram is off.
pub fn route_latency(
    gateway: &Arc<str>,
    kind: &'static str,
    route: &Arc<str>,
) -> Option<Arc<RouteLatency>> {
    if !super::route_latency_enabled() {
        return None;
    }
    let key = (Arc::clone(gateway), kind, Arc::clone(route));
    Some(super::ROUTE_LATENCY.get(key, || RouteLatency {
        gateway: Arc::clone(gateway),
        kind,
        route: Arc::clone(route),
        duration: Histogram::default(),
    }))
}

pub(super) fn render(out: &mut String) {
    let load = |a: &AtomicU64| a.load(Relaxed);
    let mut requests = Family::new(REQUESTS_TOTAL);
    for r in super::ROUTES.live() {
        for (class, n) in CLASSES.iter().zip(&r.by_class) {
            let labels = [
                ("gateway", &*r.gateway),
                ("route", &*r.route),
                ("code", class),
            ];
            requests.sample(&labels, load(n), false);
        }
    }
    requests.write(out);

    let mut latency = Family::new(ROUTE_REQUEST_DURATION_SECONDS);
    for r in super::ROUTE_LATENCY.live() {
        let labels = [
            ("gateway", &*r.gateway),
            ("route_kind", r.kind),
            ("route", &*r.route),
        ];
        latency.histogram(&labels, &r.duration.counts());
    }
    latency.write(out);

    let mut connect = Family::new(UPSTREAM_CONNECT_ERRORS_TOTAL);
    let mut tls = Family::new(UPSTREAM_TLS_ERRORS_TOTAL);
    let mut retries = Family::new(UPSTREAM_RETRIES_TOTAL);
    let mut mirror = Family::new(MIRROR_REQUESTS_TOTAL);
    for b in super::BACKENDS.live() {
        let name = [("backend", &*b.name)];
        connect.sample(&name, load(&b.connect_errors), false);
        tls.sample(&name, load(&b.tls_errors), false);
        for (reason, n) in RETRY_REASONS.iter().zip(&b.retries) {
            retries.sample(&[("backend", &*b.name), ("reason", reason)], load(n), false);
        }
        for (result, n) in MIRROR_RESULTS.iter().zip(&b.mirrored) {
            mirror.sample(&[("backend", &*b.name), ("result", result)], load(n), false);
        }
    }
    for f in [connect, tls, retries, mirror] {
        f.write(out);
    }

    let mut tcp = Family::new(TCP_CONNECTIONS_TOTAL);
    let mut tcp_bytes = Family::new(TCP_BYTES_TOTAL);
    let mut flows = Family::new(UDP_FLOWS_TOTAL);
    let mut datagrams = Family::new(UDP_DATAGRAMS_TOTAL);
    for r in super::L4_ROUTES.live() {
        let route = [("gateway", &*r.gateway), ("route", &*r.route)];
        let dir = |d: &'static str| {
            [
                ("gateway", &*r.gateway),
                ("route", &*r.route),
                ("direction", d),
            ]
        };
        tcp.sample(&route, load(&r.connections), true);
        tcp_bytes.sample(&dir("in"), load(&r.bytes_in), true);
        tcp_bytes.sample(&dir("out"), load(&r.bytes_out), true);
        flows.sample(&route, load(&r.flows), true);
        datagrams.sample(&dir("in"), load(&r.datagrams_in), true);
        datagrams.sample(&dir("out"), load(&r.datagrams_out), true);
    }
    for f in [tcp, tcp_bytes, flows, datagrams] {
        f.write(out);
    }
}
