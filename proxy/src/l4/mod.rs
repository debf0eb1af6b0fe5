//! Layer-4 forwarding: TCPRoute (bytes), UDPRoute (datagrams per client flow) and
//! TLSRoute (passthrough: bytes routed by the ClientHello's SNI without terminating;
//! terminate: the decrypted stream; mixed: either, by the listener owning the SNI).
//!
//! An L4 socket carries an [`L4Routes`] instead of an HTTP route table; the HTTP path
//! never looks at it.

mod mixed;
pub mod passthrough;
mod rewind;
pub mod sni;
pub mod tcp;
mod terminate;
pub mod udp;

use std::sync::Arc;

use metrics::{Counter, counter};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::access_log::L4Record;
use crate::backend::BackendSet;
use crate::backend_client_cert::ClientCertificate;
use crate::hostmap::HostMap;

pub use crate::telemetry::{
    TCP_BYTES_TOTAL, TCP_CONNECTIONS_TOTAL, TCP_REFUSED_TOTAL, UDP_DATAGRAMS_TOTAL,
    UDP_DROPPED_TOTAL, UDP_FLOWS_ACTIVE, UDP_FLOWS_TOTAL,
};

/// One route's backends on one L4 socket.
#[derive(Debug, Serialize)]
pub struct L4Target {
    /// `namespace/name` of the route.
    pub route: Arc<str>,
    /// `TCPRoute`, `TLSRoute` or `UDPRoute`, for access logs.
    #[serde(skip)]
    pub kind: &'static str,
    pub backends: BackendSet,
    /// The certificate the Gateway presents when it originates TLS (TLSRoute Terminate
    /// to a backend with a BackendTLSPolicy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_client_cert: Option<Arc<ClientCertificate>>,
    #[serde(skip)]
    pub stats: L4Stats,
}

impl L4Target {
    pub fn new(gateway: &str, kind: &'static str, route: Arc<str>, backends: BackendSet) -> Self {
        let stats = L4Stats::new(gateway, &route);
        Self {
            route,
            kind,
            backends,
            backend_client_cert: None,
            stats,
        }
    }

    /// Presents `cert` on the TLS this target's connections originate.
    pub fn with_backend_client_cert(mut self, cert: Option<Arc<ClientCertificate>>) -> Self {
        self.backend_client_cert = cert;
        self
    }
}

/// Counters of one route on one Gateway, taken when the Snapshot is built; they leave
/// `/metrics` with the route (`crate::series`).
#[derive(Clone)]
pub struct L4Stats {
    pub connections: Counter,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub flows: Counter,
    pub datagrams_in: Counter,
    pub datagrams_out: Counter,
    /// Keeps the series rendered while this route is in a Snapshot.
    _cell: Arc<crate::series::L4Counters>,
}

impl L4Stats {
    fn new(gateway: &str, route: &Arc<str>) -> Self {
        let cell = crate::series::l4_route(&Arc::from(gateway), route);
        let c = |a: &Arc<std::sync::atomic::AtomicU64>| Counter::from_arc(Arc::clone(a));
        Self {
            connections: c(&cell.connections),
            bytes_in: c(&cell.bytes_in),
            bytes_out: c(&cell.bytes_out),
            flows: c(&cell.flows),
            datagrams_in: c(&cell.datagrams_in),
            datagrams_out: c(&cell.datagrams_out),
            _cell: cell,
        }
    }
}

impl std::fmt::Debug for L4Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("L4Stats")
    }
}

/// One connection's access-log record, when it is logged; the forwarding code notes
/// in it what happened.
pub type Record = Option<Box<L4Record>>;

/// Adds to the record, if there is one.
pub(crate) fn note(record: &mut Record, f: impl FnOnce(&mut L4Record)) {
    if let Some(r) = record.as_deref_mut() {
        f(r);
    }
}

/// How a socket of `protocol` is named in the access log (a mixed socket's
/// connections are named once the ClientHello picks their mode).
pub fn log_protocol(protocol: crate::Protocol) -> &'static str {
    match protocol {
        crate::Protocol::TlsPassthrough => "tls-passthrough",
        crate::Protocol::TlsTerminate => "tls-terminate",
        crate::Protocol::TlsMixed => "tls",
        _ => "tcp",
    }
}

/// Serves one accepted connection of a TCP or TLS (passthrough or terminate) socket.
/// `tls` terminates TLS for the socket.
pub async fn serve_stream(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    protocol: crate::Protocol,
    routes: &L4Routes,
    tls: &crate::tls::Handshakes,
    force_close: &crate::drain::Signal,
    record: &mut Record,
) {
    if protocol == crate::Protocol::TlsPassthrough {
        return passthrough::serve(stream, peer, routes, force_close, record).await;
    }
    // The terminating paths (a TLS session and its handshake, 11-12 KB) boxed: inline
    // they would size the future of every L4 connection, plain TCP (4.4 KB) and
    // passthrough (4.7 KB) included, for its whole life.
    if protocol == crate::Protocol::TlsTerminate {
        return Box::pin(terminate::serve(
            stream,
            peer,
            routes,
            tls,
            force_close,
            record,
        ))
        .await;
    }
    if protocol == crate::Protocol::TlsMixed {
        return Box::pin(mixed::serve(stream, peer, routes, tls, force_close, record)).await;
    }
    match routes.lookup(None) {
        Some(target) => tcp::forward(stream, peer, target, &[], force_close, record).await,
        None => refused(record, "no_route"),
    }
}

/// Counts a connection the edge could not forward, by reason, and notes why.
pub fn refused(record: &mut Record, reason: &'static str) {
    counter!(TCP_REFUSED_TOTAL, "reason" => reason).increment(1);
    note(record, |r| r.refused(reason));
}

/// What an L4 socket forwards to: TCP and UDP sockets have one target (any host);
/// TLS passthrough sockets pick by SNI with the spec's precedence (exact name, then
/// the longest wildcard).
#[derive(Debug, Default)]
pub struct L4Routes {
    targets: HostMap<Arc<L4Target>>,
    /// Set on a socket with TLS listeners of both modes; `targets` then holds the
    /// Passthrough listeners' routes.
    mixed: Option<Box<Mixed>>,
}

/// What a mixed TLS socket needs besides its passthrough targets.
#[derive(Debug, Default)]
struct Mixed {
    /// By listener hostname: does the listener owning a server name terminate? The
    /// owner is the most specific listener hostname matching it, as for HTTP
    /// listener isolation, so a route of one mode never serves the other's names.
    terminates: HostMap<bool>,
    /// The Terminate listeners' routes.
    terminated: L4Routes,
}

/// How a mixed TLS socket treats one connection.
pub enum Mode<'a> {
    Passthrough,
    /// Terminate, then route by SNI among these.
    Terminate(&'a L4Routes),
}

impl L4Routes {
    /// A socket with one target for every connection.
    pub fn single(target: L4Target) -> Self {
        let mut r = Self::default();
        r.add(None, Arc::new(target));
        r
    }

    /// Adds `target` for `hostname` (`None`: any); the first target for a name keeps it.
    pub fn add(&mut self, hostname: Option<&str>, target: Arc<L4Target>) {
        self.targets.insert_first(hostname, target);
    }

    /// Adds a Terminate listener's `target` on a mixed socket (see [`Self::add`]).
    pub fn add_terminated(&mut self, hostname: Option<&str>, target: Arc<L4Target>) {
        self.mixed
            .get_or_insert_default()
            .terminated
            .add(hostname, target);
    }

    /// Makes this a mixed socket and records the mode of the listener with
    /// `hostname` (`None`: no hostname); the first listener for a name keeps it.
    pub fn add_listener(&mut self, hostname: Option<&str>, terminates: bool) {
        self.mixed
            .get_or_insert_default()
            .terminates
            .insert_first(hostname, terminates);
    }

    /// On a mixed socket, the mode of the listener owning `server_name`; `None` when
    /// no listener's hostname matches it (or this is not a mixed socket).
    pub fn mode(&self, server_name: Option<&str>) -> Option<Mode<'_>> {
        let mixed = self.mixed.as_deref()?;
        let terminates = host_lookup(&mixed.terminates, server_name)?;
        Some(if *terminates {
            Mode::Terminate(&mixed.terminated)
        } else {
            Mode::Passthrough
        })
    }

    /// The target for a server name (any-host target for `None`).
    pub fn lookup(&self, server_name: Option<&str>) -> Option<&Arc<L4Target>> {
        host_lookup(&self.targets, server_name)
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty() && self.mixed.as_ref().is_none_or(|m| m.terminated.is_empty())
    }
}

/// SNI is case-insensitive and may carry the root's trailing dot.
fn host_lookup<'a, T>(map: &'a HostMap<T>, server_name: Option<&str>) -> Option<&'a T> {
    match server_name.map(|n| n.trim_end_matches('.')) {
        Some(n) if n.bytes().any(|b| b.is_ascii_uppercase()) => {
            map.get(Some(&n.to_ascii_lowercase()))
        }
        n => map.get(n),
    }
}

impl Serialize for L4Routes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if let Some(mixed) = &self.mixed {
            let mut m = s.serialize_map(Some(2))?;
            m.serialize_entry("passthrough", &Targets(&self.targets))?;
            m.serialize_entry("terminate", &Targets(&mixed.terminated.targets))?;
            return m.end();
        }
        Targets(&self.targets).serialize(s)
    }
}

struct Targets<'a>(&'a HostMap<Arc<L4Target>>);

impl Serialize for Targets<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Targets(targets) = self;
        let named = targets.named();
        let mut m = s.serialize_map(Some(named.len() + 1))?;
        for (name, t) in named {
            m.serialize_entry(&name, t)?;
        }
        if let Some(any) = targets.any() {
            m.serialize_entry("*", any)?;
        }
        m.end()
    }
}
