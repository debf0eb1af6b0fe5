//! Series labelled by something of the configuration (a Gateway, a listener, a route,
//! a backend), kept by the objects of the Snapshot instead of the metrics registry, so
//! that they leave `/metrics` with it.
//!
//! The Prometheus exporter never forgets a series, and its only way to drop one is an
//! idle timeout. That would also drop a live route that was quiet for a while: its
//! counter would come back from 0 (a reset a scraper reads as a restart), and a handle
//! the route kept from before the timeout would count into a series nobody renders.
//! Here the counters are atomics in a cell the Snapshot's objects hold (a route's rules,
//! a backend, a listener; a Gateway's cell is held by its routes and listeners, a
//! listener's also by its open connections and UDP flows); the tables below keep only a
//! weak reference, so the cell and its series go once the last holder is dropped (after
//! the reload that removed it and the requests still in it). An object built again by a
//! reload finds the cell of the Snapshot still serving and keeps counting in it: no
//! reset while it exists; one removed and added back later starts from 0.
//! A request bumps an atomic in a cell it already holds: no lookup, no label set.
//! Histograms are fixed-bucket atomics of our own (`histogram.rs`), for the same reason.

mod histogram;
mod listeners;
mod routes;
mod text;

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use foldhash::{HashMap, HashMapExt};

pub use histogram::Histogram;

use crate::telemetry;
pub use listeners::{GatewaySeries, ListenerSeries, Open, gateway, listener};
pub use routes::{
    BackendCounters, CLASSES, L4Counters, MIRROR_RESULTS, RETRY_REASONS, RouteCounters,
    RouteLatency, backend, l4_route, live_route, route, route_latency,
};

/// Cells by key, held weakly: a key maps to the cell of whoever still holds one.
struct Cells<K, T> {
    map: Mutex<Table<K, T>>,
}

struct Table<K, T> {
    /// foldhash rather than SipHash: a reload looks up three cells per route (a
    /// tenth of a 10,000-route first load went to hashing and comparing their names),
    /// and the names come from the configuration, not from peers.
    cells: HashMap<K, Weak<T>>,
    /// Dead entries are swept when the table reaches this size (and on every render),
    /// so churn without scrapes cannot grow it without bound.
    sweep_at: usize,
}

impl<K: Hash + Eq, T> Cells<K, T> {
    fn new() -> Self {
        Self {
            map: Mutex::new(Table {
                cells: HashMap::new(),
                sweep_at: 64,
            }),
        }
    }

    fn get(&self, key: K, make: impl FnOnce() -> T) -> Arc<T> {
        let mut t = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cell) = t.cells.get(&key).and_then(Weak::upgrade) {
            return cell;
        }
        if t.cells.len() >= t.sweep_at {
            t.cells.retain(|_, w| w.strong_count() > 0);
            t.sweep_at = (t.cells.len() * 2).max(64);
        }
        let cell = Arc::new(make());
        t.cells.insert(key, Arc::downgrade(&cell));
        cell
    }

    /// The cell of `key` if someone still holds it; makes none.
    fn find(&self, key: &K) -> Option<Arc<T>> {
        let t = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        t.cells.get(key).and_then(Weak::upgrade)
    }

    /// The cells someone still holds; forgets the others.
    fn live(&self) -> Vec<Arc<T>> {
        let mut t = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        t.cells.retain(|_, w| w.strong_count() > 0);
        t.cells.values().filter_map(Weak::upgrade).collect()
    }
}

type RouteKey = (Arc<str>, Arc<str>);

static ROUTES: LazyLock<Cells<RouteKey, RouteCounters>> = LazyLock::new(Cells::new);
static L4_ROUTES: LazyLock<Cells<RouteKey, L4Counters>> = LazyLock::new(Cells::new);
static BACKENDS: LazyLock<Cells<Arc<str>, BackendCounters>> = LazyLock::new(Cells::new);
/// Gateway, route kind, route.
type RouteLatencyKey = (Arc<str>, &'static str, Arc<str>);
/// Gateway, listener label, whether the socket is UDP.
type ListenerKey = (Arc<str>, Arc<str>, bool);

static ROUTE_LATENCY: LazyLock<Cells<RouteLatencyKey, RouteLatency>> = LazyLock::new(Cells::new);
static GATEWAYS: LazyLock<Cells<Arc<str>, GatewaySeries>> = LazyLock::new(Cells::new);
static LISTENERS: LazyLock<Cells<ListenerKey, ListenerSeries>> = LazyLock::new(Cells::new);

/// The families rendered from these cells. The recorder must never see them, or
/// `/metrics` would have two `# HELP` and `# TYPE` for one family.
pub const FAMILIES: &[&str] = &[
    telemetry::REQUEST_DURATION_SECONDS,
    telemetry::DOWNSTREAM_CONNECTIONS_ACTIVE,
    telemetry::DOWNSTREAM_CONNECTIONS_TOTAL,
    telemetry::UDP_FLOWS_ACTIVE,
    telemetry::REQUESTS_TOTAL,
    telemetry::ROUTE_REQUEST_DURATION_SECONDS,
    telemetry::UPSTREAM_CONNECT_ERRORS_TOTAL,
    telemetry::UPSTREAM_TLS_ERRORS_TOTAL,
    telemetry::UPSTREAM_RETRIES_TOTAL,
    telemetry::MIRROR_REQUESTS_TOTAL,
    telemetry::TCP_CONNECTIONS_TOTAL,
    telemetry::TCP_BYTES_TOTAL,
    telemetry::UDP_FLOWS_TOTAL,
    telemetry::UDP_DATAGRAMS_TOTAL,
];

/// `--route-latency-histogram`: off by default, since it costs 20 series per route.
/// Process-wide like the tables above; set once at start, before the first Snapshot is
/// built, and read only while building one (never per request).
static ROUTE_LATENCY_ON: AtomicBool = AtomicBool::new(false);

pub fn enable_route_latency(on: bool) {
    ROUTE_LATENCY_ON.store(on, Relaxed);
}

fn route_latency_enabled() -> bool {
    ROUTE_LATENCY_ON.load(Relaxed)
}

/// Appends, in Prometheus text, the series of every Gateway, listener, route and
/// backend some Snapshot (or open connection) still has. These families are never
/// registered with the recorder, so each appears once.
pub fn render(out: &mut String) {
    listeners::render(out);
    routes::render(out);
}

#[cfg(test)]
mod tests;
