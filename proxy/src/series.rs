//! Series labelled by a route or a backend of the configuration, kept by the objects of
//! the Snapshot instead of the metrics registry, so that they leave `/metrics` with the
//! route or backend.
//!
//! The Prometheus exporter never forgets a series, and its only way to drop one is an
//! idle timeout. That would also drop a live route that was quiet for a while: its
//! counter would come back from 0 (a reset a scraper reads as a restart), and a handle
//! the route kept from before the timeout would count into a series nobody renders.
//! Here a route's or backend's counters are atomics in a cell its Snapshot objects hold;
//! the table below keeps only a weak reference, so the cell and its series go once the
//! last Snapshot that has the route is dropped (after the reload that removed it and the
//! requests still in it). A route compiled again by a reload finds the cell of the
//! Snapshot still serving and keeps counting in it: no reset while the route exists.
//! A request bumps an atomic in a cell it already holds: no lookup, no label set.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use crate::telemetry::{
    self, MIRROR_REQUESTS_TOTAL, REQUESTS_TOTAL, TCP_BYTES_TOTAL, TCP_CONNECTIONS_TOTAL,
    UDP_DATAGRAMS_TOTAL, UDP_FLOWS_TOTAL, UPSTREAM_CONNECT_ERRORS_TOTAL, UPSTREAM_RETRIES_TOTAL,
    UPSTREAM_TLS_ERRORS_TOTAL,
};

/// Cells by key, held weakly: a key maps to the cell of whoever still holds one.
struct Cells<K, T> {
    map: Mutex<Table<K, T>>,
}

struct Table<K, T> {
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
    ROUTES.get((Arc::clone(gateway), Arc::clone(route)), || RouteCounters {
        gateway: Arc::clone(gateway),
        route: Arc::clone(route),
        by_class: Default::default(),
    })
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
    L4_ROUTES.get((Arc::clone(gateway), Arc::clone(route)), || L4Counters {
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
    BACKENDS.get(Arc::clone(name), || BackendCounters {
        name: Arc::clone(name),
        connect_errors: AtomicU64::new(0),
        tls_errors: AtomicU64::new(0),
        retries: Default::default(),
        mirrored: Default::default(),
    })
}

/// One family's sample lines, sorted so scrapes diff cleanly.
struct Family {
    name: &'static str,
    lines: Vec<String>,
}

impl Family {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            lines: Vec::new(),
        }
    }

    /// A sample with `labels`; skipped at 0 unless `always`.
    fn sample(&mut self, labels: &[(&str, &str)], value: u64, always: bool) {
        if value == 0 && !always {
            return;
        }
        let mut line = format!("{}{{", self.name);
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            let _ = write!(line, "{k}=\"{}\"", escape(v));
        }
        let _ = write!(line, "}} {value}");
        self.lines.push(line);
    }

    fn write(mut self, out: &mut String) {
        if self.lines.is_empty() {
            return;
        }
        self.lines.sort_unstable();
        let help = telemetry::DESCRIPTIONS
            .iter()
            .find(|d| d.name == self.name)
            .map_or("", |d| d.help);
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(help));
        let _ = writeln!(out, "# TYPE {} counter", self.name);
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Appends, in Prometheus text, the series of every route and backend some Snapshot
/// still has. These families are never registered with the recorder, so they appear
/// once.
pub fn render(out: &mut String) {
    let load = |a: &AtomicU64| a.load(Relaxed);
    let mut requests = Family::new(REQUESTS_TOTAL);
    for r in ROUTES.live() {
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

    let mut connect = Family::new(UPSTREAM_CONNECT_ERRORS_TOTAL);
    let mut tls = Family::new(UPSTREAM_TLS_ERRORS_TOTAL);
    let mut retries = Family::new(UPSTREAM_RETRIES_TOTAL);
    let mut mirror = Family::new(MIRROR_REQUESTS_TOTAL);
    for b in BACKENDS.live() {
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
    for r in L4_ROUTES.live() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered() -> String {
        let mut s = String::new();
        render(&mut s);
        s
    }

    #[test]
    fn a_series_lives_as_long_as_its_holders() {
        let (gw, a) = (Arc::from("ns/series-gw"), Arc::from("ns/series-a"));
        let first = route(&gw, &a);
        first.answered(200);
        // A reload compiles the route again while the old Snapshot still serves.
        let second = route(&gw, &a);
        drop(first);
        second.answered(204);
        let line =
            "aether_requests_total{gateway=\"ns/series-gw\",route=\"ns/series-a\",code=\"2xx\"} 2";
        assert!(rendered().contains(line), "{}", rendered());
        assert!(!rendered().contains("code=\"5xx\"} 0"));
        drop(second);
        assert!(!rendered().contains("ns/series-a"), "{}", rendered());

        let b = backend(&Arc::from("ns/series-svc:80"));
        b.retried("status");
        b.connect_error();
        let text = rendered();
        assert!(
            text.contains(
                "aether_upstream_retries_total{backend=\"ns/series-svc:80\",reason=\"status\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("# HELP aether_upstream_connect_errors_total "),
            "{text}"
        );
        drop(b);
        assert!(!rendered().contains("ns/series-svc:80"));

        // L4 routes' series are there at 0 from the start, and go with the route.
        let l4 = l4_route(&gw, &Arc::from("ns/series-tcp"));
        let line =
            "aether_tcp_connections_total{gateway=\"ns/series-gw\",route=\"ns/series-tcp\"} 0";
        assert!(rendered().contains(line), "{}", rendered());
        drop(l4);
        assert!(!rendered().contains("ns/series-tcp"));
    }
}
