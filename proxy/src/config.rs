//! The proxy's part of the process configuration: everything the data plane is told
//! at start, validated by the binary before any of it runs.
//!
//! The defaults are the `DEFAULT` constants here and in the types they hold
//! ([`Limits::DEFAULT`], [`UpstreamSettings::DEFAULT`]): the command line shows them as
//! its own defaults, so there is one place to change one.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use crate::limits::Limits;
use crate::upstream::UpstreamSettings;
use crate::{access_log, trace};

#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// What a client may hold: timeouts, header and connection limits.
    pub limits: Limits,
    pub upstream: UpstreamSettings,
    /// Mesh mode, when set: backends are reached over mTLS HTTP/2 to each pod.
    pub mesh: Option<MeshConfig>,
    /// Proxies in front of the edge whose `x-forwarded-for` entries are trusted.
    pub trusted_hops: usize,
    /// Largest request body a client may announce with Content-Length; more is 413
    /// before anything reaches a backend. `None`: no limit.
    pub max_request_body: Option<u64>,
    /// How long in-flight requests may take to finish when their listener goes away
    /// (a reload removed it, or the process is stopping).
    pub drain_timeout: Duration,
    /// `None`: access logs are off.
    pub access_log: Option<access_log::Settings>,
    /// `None`: no spans are exported and `traceparent` passes through untouched.
    pub tracing: Option<trace::Settings>,
    pub memory_budget: MemoryBudget,
    /// Relay plain HTTP/1.1 `GET`/`HEAD` requests as bytes where the full request path
    /// would do nothing more (`crate::relay`). On by default, as the flag is.
    pub http1_relay: bool,
    /// `aether_route_request_duration_seconds`, a histogram per route: off by default,
    /// as it costs 20 series for every route that answered.
    pub route_latency_histogram: bool,
}

impl ProxyConfig {
    pub const DEFAULT: Self = Self {
        limits: Limits::DEFAULT,
        upstream: UpstreamSettings::DEFAULT,
        mesh: None,
        trusted_hops: 0,
        max_request_body: None,
        drain_timeout: Duration::from_secs(30),
        access_log: Some(access_log::Settings::DEFAULT),
        tracing: None,
        memory_budget: MemoryBudget::FromCgroup,
        http1_relay: true,
        route_latency_histogram: false,
    };
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Resident memory above which new work is refused (see [`crate::overload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBudget {
    /// 90% of the cgroup's memory limit, if there is one; else no budget.
    FromCgroup,
    Off,
    Bytes(u64),
}

/// Mesh mode: where every pod's inbound listener is, and where the edge's own SPIFFE
/// identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig {
    /// The port of every pod's inbound mesh listener.
    pub port: u16,
    /// Streams per upstream connection at most (the peer's limit applies if lower).
    pub max_streams: NonZeroUsize,
    pub identity: IdentitySource,
}

impl MeshConfig {
    pub const DEFAULT_PORT: u16 = 15008;
    pub const DEFAULT_MAX_STREAMS: NonZeroUsize = NonZeroUsize::MIN.saturating_add(99);
}

/// Where the SVID comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// The SPIFFE Workload API at this socket (`unix:///path` or a path).
    WorkloadApi(String),
    /// PEM files, watched: for development and for meshes without an agent.
    Files {
        cert: PathBuf,
        key: PathBuf,
        bundle: PathBuf,
    },
}
