//! The state every worker, listener, connection and request shares: the current
//! Snapshot (one atomic load per request), the process's flags, and what the workers'
//! upstream pools are built from. The pools themselves are per worker
//! ([`crate::workers`]); only mesh mode's client, which holds the SVID, is shared.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::access_log::AccessLog;
use crate::config::ProxyConfig;
use crate::mesh::{MeshClient, MeshSettings};
use crate::snapshot::Snapshot;
use crate::trace::Tracer;
use crate::upstream::{UpstreamSettings, Upstreams};

/// State shared by every listener and connection.
pub struct ProxyState {
    pub snapshot: ArcSwap<Snapshot>,
    pub draining: AtomicBool,
    /// Set while the process is over its memory budget: new work is refused.
    pub shedding: AtomicBool,
    upstream_settings: UpstreamSettings,
    /// Mesh mode's client: one SVID and one pool of mTLS HTTP/2 connections for every
    /// worker, as each connection carries many streams.
    mesh: Option<Arc<MeshClient>>,
    /// Proxies in front of the edge whose `x-forwarded-for` entries are trusted.
    pub trusted_hops: usize,
    /// Largest request body a client may announce with Content-Length; more is 413
    /// before anything reaches a backend.
    pub max_request_body: Option<u64>,
    /// Where requests and L4 connections are logged; `None`: access logs are off.
    pub access_log: Option<&'static AccessLog>,
    /// Where sampled requests' spans go; `None`: tracing is off and `traceparent`
    /// passes through untouched.
    pub tracer: Option<&'static Tracer>,
    /// `--http1-relay`: plain HTTP/1.1 listeners relay the requests they can as bytes
    /// (`crate::relay`).
    pub http1_relay: bool,
}

impl ProxyState {
    /// `mesh`: mesh mode's identity, already being fetched, when `config.mesh` is
    /// set; `access_log`: the started writer, when `config.access_log` is set.
    pub fn new(
        config: &ProxyConfig,
        mesh: Option<MeshSettings>,
        access_log: Option<&'static AccessLog>,
        tracer: Option<&'static Tracer>,
    ) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            draining: AtomicBool::new(false),
            shedding: AtomicBool::new(false),
            upstream_settings: config.upstream.clone(),
            mesh: mesh
                .as_ref()
                .map(|m| Arc::new(MeshClient::new(m, config.upstream.connect_timeout))),
            trusted_hops: config.trusted_hops,
            max_request_body: config.max_request_body,
            access_log,
            tracer,
            http1_relay: config.http1_relay,
        })
    }

    /// A worker's own upstream pools. Call it on that worker's runtime: the pools'
    /// idle reaper runs on the runtime current at creation.
    pub(crate) fn worker_upstreams(&self) -> Upstreams {
        Upstreams::new(&self.upstream_settings, self.mesh.clone())
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Why the process is not ready, if it is not: draining, or (mesh mode) no SVID.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.is_draining() {
            Some("draining\n")
        } else if !self.mesh.as_ref().is_none_or(|m| m.identity().is_ready()) {
            Some("no mesh identity (SVID) yet\n")
        } else {
            None
        }
    }
}
