//! Metric names and the per-route handles the hot path increments.
//!
//! Handles are taken when a Snapshot is built; after that a request bumps a counter
//! without building a label set or looking anything up in the registry. Series labelled
//! by Gateway, listener, route or backend live in `crate::series`, which drops them
//! with what they name.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{KeyName, SharedString, Unit, counter, gauge};

// Every metric the edge exports is named here and described in `DESCRIPTIONS` below
// (its `# HELP` and unit). A name used in a `counter!`/`gauge!`/`histogram!` anywhere in
// the workspace without a description fails `every_metric_is_described` in
// `src/metrics.rs`, and a family on `/metrics` without `# HELP` fails the standalone
// test `metrics_lint`.

pub const REQUESTS_TOTAL: &str = "aether_requests_total";
pub const REQUEST_DURATION_SECONDS: &str = "aether_request_duration_seconds";
/// Per route, opt-in (`--route-latency-histogram`).
pub const ROUTE_REQUEST_DURATION_SECONDS: &str = "aether_route_request_duration_seconds";
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
pub const TCP_CONNECTIONS_TOTAL: &str = "aether_tcp_connections_total";
pub const TCP_BYTES_TOTAL: &str = "aether_tcp_bytes_total";
pub const TCP_REFUSED_TOTAL: &str = "aether_tcp_refused_total";
pub const UDP_DATAGRAMS_TOTAL: &str = "aether_udp_datagrams_total";
pub const UDP_FLOWS_TOTAL: &str = "aether_udp_flows_total";
pub const UDP_FLOWS_ACTIVE: &str = "aether_udp_flows_active";
pub const UDP_DROPPED_TOTAL: &str = "aether_udp_dropped_total";
pub const CONFIG_GENERATION: &str = "aether_config_generation";
pub const CONFIG_RELOADS_TOTAL: &str = "aether_config_reloads_total";
pub const RECONCILE_ROUTES_COMPILED_TOTAL: &str = "aether_reconcile_routes_compiled_total";
pub const RECONCILE_ROUTES_ATTACHED_TOTAL: &str = "aether_reconcile_routes_attached_total";
pub const STATUS_WRITES_TOTAL: &str = "aether_status_writes_total";
pub const SERVICE_WRITES_TOTAL: &str = "aether_service_writes_total";
pub const WRITER_LEASE_HELD: &str = "aether_writer_lease_held";
pub const ENDPOINT_EVENTS_IGNORED_TOTAL: &str = "aether_endpoint_events_ignored_total";
/// Watch events that left the Store as it was (see `aether_controller::kube::watch`).
pub const WATCH_EVENTS_UNCHANGED_TOTAL: &str = "aether_watch_events_unchanged_total";
pub const BUILD_INFO: &str = "aether_build_info";
/// Access-log lines lost because the writer fell behind (see `crate::access_log`).
pub const ACCESS_LOG_DROPPED_TOTAL: &str = "aether_access_log_dropped_total";
/// Spans sent to the OTLP collector, and those lost (see `crate::trace`).
pub const TRACE_SPANS_EXPORTED_TOTAL: &str = "aether_trace_spans_exported_total";
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "aether_trace_spans_dropped_total";
/// `--http1-relay` (`crate::relay`): requests it answered, and connections it handed to
/// the full request path.
pub const HTTP1_RELAYED_REQUESTS_TOTAL: &str = "aether_http1_relayed_requests_total";
pub const HTTP1_RELAY_HANDOFFS_TOTAL: &str = "aether_http1_relay_handoffs_total";
pub const HTTP1_BYTE_EXCHANGES_TOTAL: &str = "aether_http1_byte_exchanges_total";

/// What a metric is: its `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric's `# HELP` text, type and unit.
#[derive(Debug, Clone, Copy)]
pub struct Description {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
}

const fn d(name: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Description {
    Description {
        name,
        kind,
        unit,
        help,
    }
}

use Kind::{Counter as C, Gauge as G, Histogram as H};
const COUNT: Option<Unit> = Some(Unit::Count);
const SECONDS: Option<Unit> = Some(Unit::Seconds);
const BYTES: Option<Unit> = Some(Unit::Bytes);

/// Every `aether_*` metric, described once at start by `describe`.
pub const DESCRIPTIONS: &[Description] = &[
    d(
        REQUESTS_TOTAL,
        C,
        COUNT,
        "HTTP and gRPC requests answered, by Gateway, route (namespace/name, or none when no route matched) and status class.",
    ),
    d(
        REQUEST_DURATION_SECONDS,
        H,
        SECONDS,
        "Time from a request's arrival to its response headers, per Gateway.",
    ),
    d(
        ROUTE_REQUEST_DURATION_SECONDS,
        H,
        SECONDS,
        "Time from a request's arrival to its response headers, per Gateway and route (kind, namespace/name); on with --route-latency-histogram.",
    ),
    d(
        UPSTREAM_CONNECT_ERRORS_TOTAL,
        C,
        COUNT,
        "Connections to a backend endpoint that failed, by backend.",
    ),
    d(
        UPSTREAM_TLS_ERRORS_TOTAL,
        C,
        COUNT,
        "TLS handshakes to BackendTLSPolicy backends that failed (unknown CA, wrong name), by backend.",
    ),
    d(
        UPSTREAM_RETRIES_TOTAL,
        C,
        COUNT,
        "Requests retried on another attempt, by backend and reason.",
    ),
    d(
        DOWNSTREAM_CONNECTIONS_ACTIVE,
        G,
        COUNT,
        "Client connections open now, by Gateway and listener names.",
    ),
    d(
        DOWNSTREAM_CONNECTIONS_TOTAL,
        C,
        COUNT,
        "Client connections accepted, by Gateway and listener names.",
    ),
    d(
        LISTENER_BIND_ERRORS_TOTAL,
        C,
        COUNT,
        "Attempts to bind a listener's socket that failed.",
    ),
    d(
        TLS_HANDSHAKE_ERRORS_TOTAL,
        C,
        COUNT,
        "TLS handshakes with clients that failed or timed out.",
    ),
    d(
        CONNECTIONS_REFUSED_TOTAL,
        C,
        COUNT,
        "Client connections closed at accept by a limit, by reason.",
    ),
    d(
        REQUESTS_REFUSED_TOTAL,
        C,
        COUNT,
        "Requests refused before routing (body too large, framing), by reason.",
    ),
    d(
        OVERLOAD_ACTIVE,
        G,
        None,
        "1 while resident memory is above the budget and load is shed, else 0.",
    ),
    d(
        OVERLOAD_SHED_TOTAL,
        C,
        COUNT,
        "Connections and requests refused while overloaded, by what was shed.",
    ),
    d(
        MIRROR_REQUESTS_TOTAL,
        C,
        COUNT,
        "Mirrored requests sent, by backend and result.",
    ),
    d(
        MIRROR_SKIPPED_TOTAL,
        C,
        COUNT,
        "Requests not mirrored, by reason.",
    ),
    d(
        CLIENT_CERT_REJECTED_TOTAL,
        C,
        COUNT,
        "Client certificates rejected by a listener's client certificate validation.",
    ),
    d(
        CLIENT_CERT_FALLBACK_TOTAL,
        C,
        COUNT,
        "Connections let through without a valid client certificate (AllowInsecureFallback).",
    ),
    d(
        MESH_SVID_EXPIRY_SECONDS,
        G,
        SECONDS,
        "Seconds until the edge's own SVID expires (mesh mode).",
    ),
    d(
        MESH_SVID_UPDATES_TOTAL,
        C,
        COUNT,
        "SVIDs received, by identity source (mesh mode).",
    ),
    d(
        MESH_IDENTITY_SOURCE_ERRORS_TOTAL,
        C,
        COUNT,
        "Errors reading the identity source, by source and kind (mesh mode).",
    ),
    d(
        MESH_PEER_IDENTITY_MISMATCH_TOTAL,
        C,
        COUNT,
        "Upstream mTLS handshakes whose peer identity was not the expected one, by reason (mesh mode).",
    ),
    d(
        MESH_PEER_IDENTITY_UNKNOWN_TOTAL,
        C,
        COUNT,
        "Mesh upstream connections to an endpoint whose identity is unknown (mesh mode).",
    ),
    d(
        MESH_UPSTREAM_CONNECTIONS_TOTAL,
        C,
        COUNT,
        "Upstream mTLS connections opened (mesh mode).",
    ),
    d(
        TCP_CONNECTIONS_TOTAL,
        C,
        COUNT,
        "TCP connections proxied by TCPRoutes and TLSRoutes, by Gateway and route.",
    ),
    d(
        TCP_BYTES_TOTAL,
        C,
        BYTES,
        "Bytes proxied by TCPRoutes and TLSRoutes, by Gateway, route and direction.",
    ),
    d(
        TCP_REFUSED_TOTAL,
        C,
        COUNT,
        "TCP connections refused (no route, no endpoint), by reason.",
    ),
    d(
        UDP_DATAGRAMS_TOTAL,
        C,
        COUNT,
        "UDP datagrams proxied by UDPRoutes, by Gateway, route and direction.",
    ),
    d(
        UDP_FLOWS_TOTAL,
        C,
        COUNT,
        "UDP flows (client address and port) started, by Gateway and route.",
    ),
    d(
        UDP_FLOWS_ACTIVE,
        G,
        COUNT,
        "UDP flows open now, by Gateway and listener names.",
    ),
    d(
        UDP_DROPPED_TOTAL,
        C,
        COUNT,
        "UDP datagrams dropped, by reason.",
    ),
    d(
        CONFIG_GENERATION,
        G,
        None,
        "Generation of the configuration being served; it grows by one with every publish.",
    ),
    d(
        CONFIG_RELOADS_TOTAL,
        C,
        COUNT,
        "Configurations published, by result (ok, or partial when some input had errors).",
    ),
    d(
        RECONCILE_ROUTES_COMPILED_TOTAL,
        C,
        COUNT,
        "Routes compiled by reconciles: every route on a full reconcile, only the routes a change touched otherwise.",
    ),
    d(
        RECONCILE_ROUTES_ATTACHED_TOTAL,
        C,
        COUNT,
        "Routes attached to their Gateways' listeners again by reconciles.",
    ),
    d(
        STATUS_WRITES_TOTAL,
        C,
        COUNT,
        "Status writes to the Kubernetes API, by kind and result.",
    ),
    d(
        SERVICE_WRITES_TOTAL,
        C,
        COUNT,
        "Service writes to the Kubernetes API, by operation, kind and result.",
    ),
    d(
        WRITER_LEASE_HELD,
        G,
        None,
        "1 while this replica holds the writer lease (writes status), else 0.",
    ),
    d(
        ENDPOINT_EVENTS_IGNORED_TOTAL,
        C,
        COUNT,
        "EndpointSlice events ignored (no matching Service).",
    ),
    d(
        WATCH_EVENTS_UNCHANGED_TOTAL,
        C,
        COUNT,
        "Kubernetes watch events that changed nothing the edge keeps (a new resourceVersion, a label, data it never reads); not reconciled.",
    ),
    d(
        ACCESS_LOG_DROPPED_TOTAL,
        C,
        COUNT,
        "Access-log lines dropped because the writer fell behind (stdout slow or blocked); requests are never held for the log.",
    ),
    d(
        TRACE_SPANS_EXPORTED_TOTAL,
        C,
        COUNT,
        "Request spans the OTLP collector accepted (--otlp-endpoint).",
    ),
    d(
        TRACE_SPANS_DROPPED_TOTAL,
        C,
        COUNT,
        "Request spans lost, by reason: queue_full (the exporter fell behind; requests never wait for it) or export_failed (the collector refused or could not be reached).",
    ),
    d(
        HTTP1_RELAYED_REQUESTS_TOTAL,
        C,
        COUNT,
        "HTTP/1.1 requests the relay (--http1-relay) answered without the full request path; they count in aether_requests_total too.",
    ),
    d(
        HTTP1_RELAY_HANDOFFS_TOTAL,
        C,
        COUNT,
        "Connections the relay (--http1-relay) handed to the full request path at a request it does not take.",
    ),
    d(
        HTTP1_BYTE_EXCHANGES_TOTAL,
        C,
        COUNT,
        "Requests of the full request path (HTTP/2, or HTTP/1.1 the relay does not take) whose bodiless GET or HEAD went to a plain HTTP/1.1 upstream as bytes (--http1-relay) rather than through hyper's client.",
    ),
    d(
        BUILD_INFO,
        G,
        None,
        "Always 1; labelled with the version (and the commit, when the build recorded one).",
    ),
];

/// Registers every description with the installed recorder: call once, after the
/// recorder is installed. The exporter then writes each family's `# HELP`.
pub fn describe() {
    metrics::with_recorder(|recorder| {
        for m in DESCRIPTIONS {
            let (name, help) = (
                KeyName::from_const_str(m.name),
                SharedString::const_str(m.help),
            );
            match m.kind {
                Kind::Counter => recorder.describe_counter(name, m.unit, help),
                Kind::Gauge => recorder.describe_gauge(name, m.unit, help),
                Kind::Histogram => recorder.describe_histogram(name, m.unit, help),
            }
        }
    });
}

/// Sets `aether_build_info` to 1, labelled with the version and, when the build had
/// `AETHER_GIT_COMMIT` in its environment, the commit (no build script: a source
/// tarball builds the same).
pub fn build_info() {
    let version = env!("CARGO_PKG_VERSION");
    match option_env!("AETHER_GIT_COMMIT").filter(|c| !c.is_empty()) {
        Some(commit) => gauge!(BUILD_INFO, "version" => version, "commit" => commit).set(1.0),
        None => gauge!(BUILD_INFO, "version" => version).set(1.0),
    }
}

/// Registers at 0 the label-less counters the chart's dashboard graphs, so a scrape has
/// them (a rate of 0, not "no data") before the first event: call once at start.
pub fn register_at_zero() {
    counter!(TLS_HANDSHAKE_ERRORS_TOTAL).increment(0);
}

/// Buckets for request durations: 100 µs to 30 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// What a request of one route on one Gateway records into (see `crate::series`: it
/// all leaves `/metrics` with the route, or the Gateway): its `aether_requests_total`
/// counters, the Gateway's duration histogram and, with `--route-latency-histogram`,
/// the route's own.
///
/// Series cost memory in the edge and in every scraper, so a status class is rendered
/// only once it counted something, and durations are kept per Gateway unless asked for
/// per route (a histogram is 20 series; per route it made 5,000 idle routes cost
/// 120,000 series). A route's counter cell is made by its first answer, not when the
/// Snapshot is built: at 5,000 idle routes the cells and their table's entries were
/// 0.8 MiB. The cells are held inline by each rule (an `Arc` of them was an allocation
/// per route): a route's rules hold copies of one `new` (handles cloned, no registry
/// lookup), and find the same counter cell, as it is kept by (Gateway, route). A
/// listener holds its unrouted stats in an `Arc`, which a request that matched no route
/// clones.
#[derive(Clone)]
pub struct RouteStats(Cells);

#[derive(Clone)]
struct Cells {
    gateway: Arc<crate::series::GatewaySeries>,
    route: Arc<str>,
    /// Set by the first answer, or when built while a Snapshot still serving has the
    /// route's cell (a reload keeps counting in it: no reset).
    counters: OnceLock<Arc<crate::series::RouteCounters>>,
    latency: Option<Arc<crate::series::RouteLatency>>,
}

impl RouteStats {
    /// `kind` is the route's (`HTTPRoute`, `GRPCRoute`). Takes the names as shared
    /// strings: the caller has them so, and one route's stats are kept per route
    /// (copies were 0.4 MiB at 5,000 routes).
    pub fn new(
        gateway: impl Into<Arc<str>>,
        kind: &'static str,
        route: impl Into<Arc<str>>,
    ) -> Self {
        let (gateway, route) = (gateway.into(), route.into());
        let counters = OnceLock::new();
        if let Some(live) = crate::series::live_route(&gateway, &route) {
            let _ = counters.set(live);
        }
        Self(Cells {
            latency: crate::series::route_latency(&gateway, kind, &route),
            gateway: crate::series::gateway(&gateway),
            route,
            counters,
        })
    }

    /// `namespace/name` of the route (`none` for requests that matched none).
    pub fn route(&self) -> &Arc<str> {
        &self.0.route
    }

    /// Requests that matched no route (or no listener), counted under `route="none"`;
    /// no per-route histogram.
    pub fn unrouted(gateway: impl Into<Arc<str>>) -> Arc<Self> {
        let gateway = gateway.into();
        let route: Arc<str> = Arc::from("none");
        let counters = OnceLock::new();
        let _ = counters.set(crate::series::route(&gateway, &route));
        Arc::new(Self(Cells {
            gateway: crate::series::gateway(&gateway),
            route,
            counters,
            latency: None,
        }))
    }

    /// Atomic adds only, once the route has its cell: one counter, the Gateway
    /// histogram's bucket and sum, and the route's when it has one.
    pub fn record(&self, status: u16, elapsed: Duration) {
        let cells = &self.0;
        cells
            .counters
            .get_or_init(|| crate::series::route(cells.gateway.name(), &cells.route))
            .answered(status);
        cells.gateway.duration.record(elapsed);
        if let Some(route) = &cells.latency {
            route.duration.record(elapsed);
        }
    }
}

impl std::fmt::Debug for RouteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteStats")
    }
}

/// The `listener` label of a socket: the names of the Gateway listeners it serves,
/// joined by "," when several share the address and port (they then share one socket,
/// so their connections cannot be told apart), or "none" for a socket no longer in the
/// Snapshot.
pub fn listener_label(sections: &[Arc<str>]) -> String {
    if sections.is_empty() {
        return "none".to_owned();
    }
    sections.iter().map(|s| &**s).collect::<Vec<_>>().join(",")
}
