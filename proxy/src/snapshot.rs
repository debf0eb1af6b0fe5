//! The data plane's whole world, built by the controller and swapped in atomically.
//!
//! A `Snapshot` is immutable once published: the proxy loads it once per request and
//! holds that `Arc` for the request's life, so a reload never changes a request mid-flight.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::client_auth::ClientAuth;
use crate::l4::L4Routes;
use crate::routing::RouteTable;
use crate::series::ListenerSeries;
use crate::telemetry::RouteStats;
use crate::tls::{HandshakeConfigs, TlsCerts};

/// Everything the proxy serves at one moment.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Snapshot {
    /// Increases by one with every reconcile that produced a new snapshot.
    pub generation: u64,
    /// One entry per socket the proxy binds. Several Gateway listeners that share an
    /// (address, port) share one socket and one route table.
    pub listeners: BTreeMap<SocketAddr, Arc<Listener>>,
    /// UDP sockets (protocol `Udp`). Their own map: a TCP and a UDP listener may share
    /// an address and port.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub udp: BTreeMap<SocketAddr, Arc<Listener>>,
}

impl Snapshot {
    pub fn listener(&self, local: &SocketAddr) -> Option<&Listener> {
        self.listeners.get(local).map(Arc::as_ref)
    }
}

/// A bound socket and what it serves. Belongs to exactly one Gateway: a listener serves
/// only its own Gateway's routes.
#[derive(Debug, Serialize)]
pub struct Listener {
    pub bind: SocketAddr,
    /// The Gateway listener port clients connect to. It differs from `bind`'s port in
    /// Kubernetes mode, where a Service maps it to an internal port; redirects that
    /// keep the port must use this one.
    pub port: u16,
    /// `namespace/name` of the owning Gateway.
    pub gateway: Arc<str>,
    /// Names of the Gateway listeners (sections) folded into this socket.
    pub sections: Vec<Arc<str>>,
    pub protocol: Protocol,
    pub routes: RouteTable,
    /// Certificates by SNI when this socket terminates TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsCerts>,
    /// Client-certificate validation on this TLS socket (frontend validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<Arc<ClientAuth>>,
    /// What a TCP, UDP or TLS-passthrough socket forwards to (`routes` is then empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l4: Option<Arc<L4Routes>>,
    /// Counts requests that matched no route on this listener.
    #[serde(skip)]
    pub unrouted: Arc<RouteStats>,
    /// This socket's connection (or UDP flow) counts, taken when the Snapshot is
    /// built so an accept only bumps atomics; they leave `/metrics` with the listener.
    #[serde(skip)]
    pub series: Arc<ListenerSeries>,
    /// The TLS handshake configurations made from `tls` and `client_auth`.
    #[serde(skip)]
    pub(crate) handshakes: HandshakeConfigs,
}

impl Listener {
    pub fn new(
        bind: SocketAddr,
        gateway: Arc<str>,
        sections: Vec<Arc<str>>,
        routes: RouteTable,
    ) -> Self {
        Self::build(bind, gateway, sections, Protocol::Http, routes)
    }

    fn build(
        bind: SocketAddr,
        gateway: Arc<str>,
        sections: Vec<Arc<str>>,
        protocol: Protocol,
        routes: RouteTable,
    ) -> Self {
        let unrouted = RouteStats::unrouted(Arc::clone(&gateway));
        let series = crate::series::listener(&gateway, &sections, protocol == Protocol::Udp);
        Self {
            bind,
            port: bind.port(),
            gateway,
            sections,
            protocol,
            routes,
            tls: None,
            client_auth: None,
            l4: None,
            unrouted,
            series,
            handshakes: HandshakeConfigs::default(),
        }
    }

    /// A socket that forwards connections or datagrams (`protocol` Tcp, Udp or
    /// TlsPassthrough) instead of serving HTTP.
    pub fn l4(
        bind: SocketAddr,
        gateway: Arc<str>,
        sections: Vec<Arc<str>>,
        protocol: Protocol,
        routes: L4Routes,
    ) -> Self {
        let mut l = Self::build(bind, gateway, sections, protocol, RouteTable::default());
        l.l4 = Some(Arc::new(routes));
        l
    }

    /// Sets the port clients see when it is not the bound one.
    pub fn with_public_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Makes this TLS socket validate client certificates.
    pub fn with_client_auth(mut self, auth: Arc<ClientAuth>) -> Self {
        self.client_auth = Some(auth);
        self
    }

    /// Makes this socket terminate TLS with `certs` before serving HTTP.
    pub fn with_tls(mut self, certs: TlsCerts) -> Self {
        self.protocol = Protocol::Https;
        self.tls = Some(certs);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Protocol {
    Http,
    Https,
    /// Bytes forwarded to the backends of the listener's TCPRoute.
    Tcp,
    /// Datagrams forwarded per client flow to the backends of the UDPRoute.
    Udp,
    /// TLS left untouched, routed by the ClientHello's SNI to TLSRoute backends.
    TlsPassthrough,
    /// TLS ended here with the listener's certificate (by SNI); the decrypted stream
    /// goes to the TLSRoute backends for that name.
    TlsTerminate,
    /// TLS listeners of both modes on one port: the ClientHello's SNI picks the
    /// listener, whose mode says whether the edge terminates or passes through.
    TlsMixed,
}
