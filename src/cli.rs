//! The command line: `aether-edge run` and `aether-edge echo`.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use aether_proxy::ProxyConfig;
use aether_proxy::config::MeshConfig;
use aether_proxy::l4::udp::UdpSettings;
use aether_proxy::upstream::UpstreamSettings;
use aether_proxy::{Limits, access_log};
use clap::{Args, Parser, Subcommand};
use humantime::Duration;
use ipnet::IpNet;

#[derive(Debug, Parser)]
#[command(
    name = "aether-edge",
    version,
    about = "Kubernetes Gateway API edge proxy and reconciler in one process"
)]
pub struct Cli {
    /// Process logs on stderr: `text` (one human-readable line per event) or `json`
    /// (one JSON object per line: timestamp, level, target, message and the event's
    /// fields), for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--access-log`: the access log's format, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AccessLogFormat {
    Off,
    Json,
    Text,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Reconcile Gateway API manifests and serve them.
    Run(Box<RunArgs>),
    /// A small HTTP/1.1 + h2c backend that answers with JSON describing each request.
    Echo(EchoArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// A YAML file (multi-document) or a directory of *.yaml/*.yml files. Repeatable.
    /// Watched: edits are live within a second.
    #[arg(
        long = "manifests",
        required_unless_present = "kubernetes",
        conflicts_with = "kubernetes",
        value_name = "PATH"
    )]
    pub manifests: Vec<PathBuf>,

    /// Standalone: keep the L4 routes' statuses (the ports port pools assigned) in this
    /// file, so a restart gives every route the port it had.
    #[arg(long, conflicts_with = "kubernetes", value_name = "FILE")]
    pub port_state: Option<PathBuf>,

    /// Watch the cluster instead of files (in-cluster config, or the kubeconfig from
    /// KUBECONFIG / ~/.kube/config), write status, and give every Gateway a Service.
    #[arg(long)]
    pub kubernetes: bool,

    /// Kubernetes mode: internal ports for (Gateway, listener port) pairs; listeners
    /// bind 0.0.0.0:<internal port> and each Gateway's Service targets them.
    #[arg(long, default_value = "20000-29999", value_name = "FIRST-LAST")]
    pub internal_port_range: aether_controller::reconcile::ports::PortRange,

    /// Kubernetes mode: give every Gateway its own Service and address (the default).
    /// With `false`, every Gateway reports the edge Service's address and listeners
    /// bind their own ports, shared by Gateways and told apart by hostname.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub per_gateway_addressing: bool,

    /// Kubernetes mode: the edge's own Service. Its EndpointSlices list the edge pods,
    /// which every Gateway Service's EndpointSlice names at the internal ports.
    #[arg(long, default_value = "aether-system/aether-edge", value_parser = parse_object_key, value_name = "NAMESPACE/NAME")]
    pub edge_service: aether_controller::ObjectKey,

    /// Kubernetes mode: only the holder of this Lease (in the edge Service's namespace)
    /// writes status and Gateway Services; every replica serves traffic regardless.
    #[arg(long, default_value = "aether-edge-writer", value_name = "NAME")]
    pub writer_lease: String,

    /// Kubernetes mode: how long a writer holds the Lease without renewing it.
    #[arg(long, default_value = "15s", value_name = "DURATION")]
    pub lease_duration: Duration,

    /// Kubernetes mode: a Gateway annotated `aether.io/dedicated: "true"` gets a
    /// Deployment of its own, in the edge Service's namespace, built from this pod
    /// template (YAML, a PodTemplateSpec; the chart renders its own edge pod into it).
    /// Unset: such Gateways are served by the shared edge pods, with a condition.
    #[arg(long, value_name = "FILE")]
    pub dedicated_pod_template: Option<PathBuf>,

    /// Kubernetes mode: serve only this Gateway, and write nothing (no status, no
    /// Services; the shared edge does that). Set by the controller on a dedicated
    /// Gateway's pods.
    #[arg(long, value_parser = parse_object_key, value_name = "NAMESPACE/NAME")]
    pub serve_gateway: Option<aether_controller::ObjectKey>,

    /// Kubernetes mode: the address listeners bind their internal ports on.
    #[arg(long, default_value = "0.0.0.0", value_name = "IP")]
    pub listen_address: std::net::IpAddr,

    /// Serve only GatewayClasses with this spec.controllerName, and their Gateways.
    #[arg(long, default_value = "aether.io/edge", value_name = "NAME")]
    pub controller_name: String,

    /// Pool of local addresses for Gateways without spec.addresses.
    #[arg(long, default_value = "127.0.1.0/24", value_name = "CIDR")]
    pub address_pool: IpNet,

    /// Data-plane workers: single-threaded runtimes on threads of their own, each
    /// with its own socket on every TCP listener (SO_REUSEPORT: the kernel spreads
    /// connections over them) and its own upstream connections, like nginx's worker
    /// processes. The control plane (watches, reconcile, status, admin, metrics) runs
    /// on a thread of its own beside them. Default: the CPUs the process may run on.
    #[arg(long, value_name = "N")]
    pub workers: Option<NonZeroUsize>,

    /// Admin server: /readyz, /metrics, /config_dump, /status.
    #[arg(long, default_value = "127.0.0.1:9901", value_name = "ADDR")]
    pub admin: SocketAddr,

    /// On SIGTERM/SIGINT, and for removed listeners: how long in-flight requests may
    /// take to finish before their connections are closed.
    #[arg(long, default_value_t = ProxyConfig::DEFAULT.drain_timeout.into(), value_name = "DURATION")]
    pub drain_timeout: Duration,

    /// On SIGTERM/SIGINT: how long readiness reports 503 before listeners stop
    /// accepting, so load balancers notice first. In Kubernetes mode also how long a
    /// listener a change drops keeps serving, while kube-proxy moves its endpoints.
    #[arg(long, default_value = "0s", value_name = "DURATION")]
    pub drain_delay: Duration,

    /// Proxies in front of the edge (a cloud load balancer is one) whose
    /// x-forwarded-for entries are trusted: the upstream sees the last N entries the
    /// client sent plus the client's address; the rest, which the client could have
    /// invented, is dropped. 0: the edge faces clients directly.
    #[arg(long, default_value_t = ProxyConfig::DEFAULT.trusted_hops, value_name = "N")]
    pub xff_trusted_hops: usize,

    /// Access log on stdout, one line per HTTP request, TCP/TLS connection and UDP flow:
    /// `json` (one object per line), `text` (logfmt: key=value) or `off`. Default:
    /// the format of --log-format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub access_log: Option<AccessLogFormat>,

    /// Share of HTTP requests and L4 connections written to the access log, from 0
    /// to 1 (0.01: one in a hundred, chosen at random).
    #[arg(long, default_value_t = access_log::Settings::DEFAULT.sample, value_parser = parse_share, value_name = "SHARE")]
    pub access_log_sample: f64,

    /// HTTP status classes written to the access log, comma-separated (`4xx,5xx`:
    /// only errors). L4 connections are always written.
    #[arg(long, default_value_t = access_log::Settings::DEFAULT.statuses, value_parser = access_log::StatusClasses::parse, value_name = "CLASSES")]
    pub access_log_status: access_log::StatusClasses,

    /// Export one server span per traced request over OTLP/gRPC to this collector
    /// (`http://collector:4317`; `https://` verifies it against the system's roots, or
    /// SSL_CERT_FILE). Off when unset: `traceparent` then passes through
    /// untouched. On: the edge continues or starts each request's W3C trace and
    /// forwards `traceparent` with its own span as the parent.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// Share of requests traced when the client's `traceparent` does not decide it
    /// (parent-based: a client's sampled flag is followed either way), from 0 to 1.
    #[arg(long, default_value_t = aether_proxy::trace::Settings::DEFAULT_SAMPLE, value_parser = parse_share, value_name = "RATIO")]
    pub trace_sample: f64,

    /// Also record each route's request durations in a histogram of its own,
    /// `aether_route_request_duration_seconds` (labels gateway, route_kind, route).
    /// Off by default: it adds 20 series (18 buckets, sum, count) for every route that answered, beside the
    /// per-Gateway `aether_request_duration_seconds`.
    #[arg(long)]
    pub route_latency_histogram: bool,

    /// Largest request body a client may announce (Content-Length); more gets 413
    /// before anything reaches a backend. 0: no limit.
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    pub max_request_body_bytes: u64,

    /// Resident memory above which new requests get 503 + Retry-After and new
    /// connections are refused. Default: 90% of the cgroup memory limit, if any; 0 off.
    #[arg(long, value_name = "BYTES")]
    pub memory_budget: Option<u64>,

    /// Relay plain HTTP/1.1 GET and HEAD requests as bytes, without hyper, where the
    /// full request path would do nothing more (no filters or retry on the rule, a
    /// plain HTTP/1.1 backend, no tracing, no trusted x-forwarded-for hops); every other
    /// request, and the rest of its connection, takes the full path. HTTP and HTTPS
    /// (HTTP/1.1 by ALPN) listeners. On by default; `--http1-relay=false` sends every
    /// request through the full path.
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub http1_relay: bool,

    /// Time to open a connection to a backend endpoint (TCP, and TLS or the mesh's
    /// mTLS where used); beyond it the attempt is a connect failure (503, or another
    /// endpoint: docs/http.md, retries).
    #[arg(long, default_value_t = UpstreamSettings::DEFAULT.connect_timeout.into(), value_name = "DURATION")]
    pub upstream_connect_timeout: Duration,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Mesh mode: upstream requests go over mTLS HTTP/2 to each pod's inbound listener.
#[derive(Debug, Clone, Args)]
pub struct MeshArgs {
    /// Reach backends as a mesh client: mTLS HTTP/2 to pod_ip:<mesh-port>, peer
    /// SPIFFE ID pinned to the pod's service account. Not ready until an SVID is held.
    #[arg(long)]
    pub mesh: bool,

    /// SPIFFE Workload API socket (unix:///path or a path). Default: the
    /// SPIFFE_ENDPOINT_SOCKET environment variable.
    #[arg(long, value_name = "SOCKET", requires = "mesh")]
    pub spiffe_socket: Option<String>,

    /// Instead of the Workload API: the SVID certificate chain (PEM), watched.
    #[arg(long, value_name = "FILE", requires_all = ["mesh", "mesh_svid_key", "mesh_bundle"], conflicts_with = "spiffe_socket")]
    pub mesh_svid_cert: Option<PathBuf>,

    /// The SVID's private key (PEM), watched.
    #[arg(long, value_name = "FILE", requires = "mesh_svid_cert")]
    pub mesh_svid_key: Option<PathBuf>,

    /// The trust domain's CA bundle (PEM), watched.
    #[arg(long, value_name = "FILE", requires = "mesh_svid_cert")]
    pub mesh_bundle: Option<PathBuf>,

    /// The port of every pod's inbound mesh listener.
    #[arg(long, default_value_t = MeshConfig::DEFAULT_PORT, value_name = "PORT")]
    pub mesh_port: u16,

    /// Streams per upstream connection at most (the peer's limit applies if lower);
    /// a full connection makes the pool open another.
    #[arg(long, default_value_t = MeshConfig::DEFAULT_MAX_STREAMS, value_name = "N")]
    pub mesh_max_streams: NonZeroUsize,
}

/// Client limits; each breach gets a clean answer (408/431) or a refused connection.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Time to send a request's headers; also the idle timeout of keep-alive HTTP/1.1.
    #[arg(long, default_value_t = Limits::DEFAULT.header_read_timeout.into(), value_name = "DURATION")]
    pub header_read_timeout: Duration,

    /// Largest request head in bytes (431 beyond; at least 8192).
    #[arg(long, default_value_t = Limits::DEFAULT.max_header_bytes, value_name = "BYTES")]
    pub max_header_bytes: usize,

    /// Most request headers (431 beyond).
    #[arg(long, default_value_t = Limits::DEFAULT.max_headers, value_name = "N")]
    pub max_headers: usize,

    /// Concurrent streams per HTTP/2 connection.
    #[arg(long, default_value_t = Limits::DEFAULT.max_concurrent_streams, value_name = "N")]
    pub max_concurrent_streams: u32,

    /// Connections per listener socket; more are refused at accept.
    #[arg(long, default_value_t = Limits::DEFAULT.max_connections_per_listener, value_name = "N")]
    pub max_connections_per_listener: usize,

    /// Connections across all listeners.
    #[arg(long, default_value_t = Limits::DEFAULT.max_connections, value_name = "N")]
    pub max_connections: usize,

    /// A UDP flow (one client address) ends after this long without a datagram.
    #[arg(long, default_value_t = UdpSettings::DEFAULT.idle_timeout.into(), value_name = "DURATION")]
    pub udp_idle_timeout: Duration,

    /// UDP flows per UDP listener; datagrams that would open more are dropped.
    #[arg(long, default_value_t = UdpSettings::DEFAULT.max_flows, value_name = "N")]
    pub udp_max_flows: usize,

    /// UDP flows per client IP address on one listener.
    #[arg(long, default_value_t = UdpSettings::DEFAULT.max_flows_per_source, value_name = "N")]
    pub udp_max_flows_per_source: usize,
}

#[derive(Debug, Clone, Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Name reported in every answer, to tell backends apart.
    #[arg(long, default_value = "echo")]
    pub name: String,

    /// Append every request received, as one JSON line, to this file (tests read it
    /// to see traffic that gets no answer back, such as mirrored requests).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,

    /// Serve TLS with this PEM certificate chain (and --tls-key); answers then report
    /// the client's SNI (`sni`), as a BackendTLSPolicy or TLS passthrough test needs.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// With --tls-cert: refuse clients without a certificate from these PEM CAs (a
    /// backend that authenticates the Gateway, `spec.tls.backend`).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Also answer UDP datagrams on the same address: each gets one datagram back,
    /// `{"name", "request"}` (the datagram as text), as the suite's UDP echo does.
    #[arg(long)]
    pub udp: bool,
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number from 0 to 1")),
    }
}

fn parse_object_key(s: &str) -> Result<aether_controller::ObjectKey, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(aether_controller::ObjectKey::new(ns, name))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}
