//! The state every listener, connection and request shares: the current Snapshot
//! (one atomic load per request), the process's flags, and the upstream pools.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::access_log::AccessLog;
use crate::snapshot::Snapshot;
use crate::upstream::{UpstreamSettings, Upstreams};

/// State shared by every listener and connection.
pub struct ProxyState {
    pub snapshot: ArcSwap<Snapshot>,
    pub draining: AtomicBool,
    /// Set while the process is over its memory budget: new work is refused.
    pub shedding: AtomicBool,
    pub(crate) upstreams: Upstreams,
    /// Proxies in front of the edge whose `x-forwarded-for` entries are trusted.
    pub trusted_hops: usize,
    /// Largest request body a client may announce with Content-Length; more is 413
    /// before anything reaches a backend. 0: no limit.
    pub max_request_body: AtomicU64,
    /// Where requests and L4 connections are logged; `None`: access logs are off.
    pub access_log: Option<&'static AccessLog>,
}

impl ProxyState {
    pub fn new(
        settings: &UpstreamSettings,
        trusted_hops: usize,
        access_log: Option<&'static AccessLog>,
    ) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            draining: AtomicBool::new(false),
            shedding: AtomicBool::new(false),
            upstreams: Upstreams::new(settings),
            trusted_hops,
            max_request_body: AtomicU64::new(0),
            access_log,
        })
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Why the process is not ready, if it is not: draining, or (mesh mode) no SVID.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.is_draining() {
            Some("draining\n")
        } else if !self.upstreams.is_ready() {
            Some("no mesh identity (SVID) yet\n")
        } else {
            None
        }
    }
}
