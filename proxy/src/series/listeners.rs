//! The cells of Gateways and listener sockets: `aether_request_duration_seconds{gateway}`,
//! `aether_downstream_connections_*{gateway,listener}` and
//! `aether_udp_flows_active{gateway,listener}`.
//!
//! A Gateway's cell is held by its routes' stats and its listeners' unrouted stats, a
//! listener's by the Snapshot's `Listener` and by the connections and UDP flows it
//! accepted: both leave `/metrics` when the Gateway or listener is gone from every
//! Snapshot still in use and its last connection has closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::histogram::Histogram;
use super::text::Family;
use crate::telemetry::{
    DOWNSTREAM_CONNECTIONS_ACTIVE, DOWNSTREAM_CONNECTIONS_TOTAL, REQUEST_DURATION_SECONDS,
    UDP_FLOWS_ACTIVE, listener_label,
};

/// One Gateway's request durations (routed or not), rendered once it recorded one.
#[derive(Debug)]
pub struct GatewaySeries {
    gateway: Arc<str>,
    pub duration: Histogram,
}

impl GatewaySeries {
    pub fn name(&self) -> &Arc<str> {
        &self.gateway
    }
}

pub fn gateway(name: &Arc<str>) -> Arc<GatewaySeries> {
    super::GATEWAYS.get(Arc::clone(name), || GatewaySeries {
        gateway: Arc::clone(name),
        duration: Histogram::default(),
    })
}

/// One socket's connection counts, labelled by its Gateway and the names of the
/// Gateway listeners it serves. TCP sockets render `aether_downstream_connections_*`
/// (at 0 before the first connection, as a dashboard expects), UDP sockets
/// `aether_udp_flows_active`.
#[derive(Debug)]
pub struct ListenerSeries {
    gateway: Arc<str>,
    listener: Arc<str>,
    udp: bool,
    accepted: AtomicU64,
    /// TCP: connections open; UDP: flows open. Only [`Open`] changes it, so it goes
    /// down exactly where it went up.
    open: AtomicU64,
}

/// The cell of `gateway`'s listeners `sections` (one socket; several names when they
/// share its address and port). Sockets with the same names share it, as their series
/// would be one.
pub fn listener(gateway: &Arc<str>, sections: &[Arc<str>], udp: bool) -> Arc<ListenerSeries> {
    let label: Arc<str> = listener_label(sections).into();
    let key = (Arc::clone(gateway), Arc::clone(&label), udp);
    super::LISTENERS.get(key, || ListenerSeries {
        gateway: Arc::clone(gateway),
        listener: label,
        udp,
        accepted: AtomicU64::new(0),
        open: AtomicU64::new(0),
    })
}

impl ListenerSeries {
    /// A TCP connection accepted: counted, and open until the returned guard drops.
    pub fn accepted(self: &Arc<Self>) -> Open {
        self.accepted.fetch_add(1, Relaxed);
        self.opened()
    }

    /// A UDP flow started: open until the returned guard drops.
    pub fn flow(self: &Arc<Self>) -> Open {
        self.opened()
    }

    fn opened(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Relaxed);
        Open(Arc::clone(self))
    }
}

/// An open connection or flow: keeps its listener's series on `/metrics` and counts
/// in its gauge until dropped, also when its task ends early.
#[derive(Debug)]
pub struct Open(Arc<ListenerSeries>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

pub(super) fn render(out: &mut String) {
    let mut duration = Family::new(REQUEST_DURATION_SECONDS);
    for g in super::GATEWAYS.live() {
        duration.histogram(&[("gateway", &g.gateway)], &g.duration.counts());
    }
    duration.write(out);

    let mut active = Family::new(DOWNSTREAM_CONNECTIONS_ACTIVE);
    let mut total = Family::new(DOWNSTREAM_CONNECTIONS_TOTAL);
    let mut flows = Family::new(UDP_FLOWS_ACTIVE);
    for l in super::LISTENERS.live() {
        let labels = [("gateway", &*l.gateway), ("listener", &*l.listener)];
        let open = l.open.load(Relaxed);
        if l.udp {
            flows.sample(&labels, open, true);
        } else {
            active.sample(&labels, open, true);
            total.sample(&labels, l.accepted.load(Relaxed), true);
        }
    }
    for f in [active, total, flows] {
        f.write(out);
    }
}
