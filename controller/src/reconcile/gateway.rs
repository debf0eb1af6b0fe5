//! Gateway and listener validation: which listeners can serve, and why not.

use std::collections::BTreeMap;
use std::net::IpAddr;

use gateway_api::gateways::{
    Gateway, GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom,
    GatewayListenersAllowedRoutesNamespacesSelector, GatewayStatusListenersSupportedKinds,
};

use std::sync::Arc;

use aether_proxy::client_auth::ClientAuth;
use aether_proxy::tls::CertifiedKey;

use super::address::AddressError;
use super::certificates;
use super::frontend_tls;
use super::route::RouteAttachment;
use crate::store::{ObjectKey, Store};

pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// A problem as a condition reason and message.
pub type Problem = (&'static str, String);

pub struct GatewayModel<'a> {
    pub key: ObjectKey,
    pub generation: i64,
    /// Why the whole Gateway is refused (Accepted=False), as [`rejected`] says.
    pub rejected: Option<Problem>,
    pub address: Result<IpAddr, AddressError>,
    pub listeners: Vec<ListenerModel<'a>>,
    /// The certificate presented to TLS backends (`spec.tls.backend`), if any.
    pub backend_client: Option<super::backend_client_cert::BackendClient>,
}

pub struct ListenerModel<'a> {
    pub spec: &'a GatewayListeners,
    pub accepted: Result<(), Problem>,
    pub conflict: Option<Problem>,
    pub refs: Result<(), Problem>,
    pub supported_kinds: Vec<GatewayStatusListenersSupportedKinds>,
    /// How many HTTPRoutes and GRPCRoutes are attached here.
    pub routes: usize,
    /// The certificate an HTTPS listener terminates with.
    pub certificate: Option<Arc<CertifiedKey>>,
    /// Client-certificate validation on an HTTPS listener's port.
    pub client_auth: Option<Arc<ClientAuth>>,
    /// TCPRoutes, UDPRoutes or TLSRoutes attached here (indexes into the L4 routes).
    pub l4_attachments: Vec<RouteAttachment>,
    /// A port pool (`aether.io/port-range.<listener>`): the range this TCP/UDP listener hands out, one port per
    /// route, and the ports handed out (L4 route index -> port).
    pub pool: Option<super::ports::PortRange>,
    pub pool_ports: BTreeMap<usize, u16>,
    /// The ListenerSet this listener comes from; None for the Gateway's own.
    pub set: Option<ObjectKey>,
    /// The Gateway is refused as a whole: its listeners keep their own conditions
    /// but take no routes and serve nothing.
    pub gateway_rejected: bool,
}

impl ListenerModel<'_> {
    /// Can routes attach here and traffic be served?
    pub fn usable(&self) -> bool {
        self.attachable() && (!self.terminates_tls() || self.certificate.is_some())
    }

    /// Can routes attach here? Attachment is decided by allowedRoutes and parentRefs
    /// and counted in attachedRoutes even while the listener can't serve for want of
    /// a certificate (GatewayWithAttachedRoutes); a listener that is not accepted or
    /// is conflicted takes none.
    pub fn attachable(&self) -> bool {
        self.accepted.is_ok() && self.conflict.is_none() && !self.gateway_rejected
    }

    pub fn is_https(&self) -> bool {
        self.spec.protocol == "HTTPS"
    }

    /// Does this listener end TLS with its own certificate (HTTPS, or TLS in
    /// Terminate mode forwarding the decrypted stream to TLSRoute backends)?
    pub fn terminates_tls(&self) -> bool {
        self.is_https() || (self.spec.protocol == "TLS" && !is_passthrough(self.spec))
    }

    /// Listeners that share a port conflict only on the same transport: a UDP listener
    /// may share its port with a TCP-based one.
    pub fn is_udp(&self) -> bool {
        self.spec.protocol == "UDP"
    }

    /// Does this listener forward connections or datagrams rather than serve HTTP?
    pub fn is_l4(&self) -> bool {
        matches!(self.spec.protocol.as_str(), "TCP" | "UDP" | "TLS")
    }

    /// The listener's name in the Snapshot's `sections`: its own name on the Gateway,
    /// `namespace/set/name` for a ListenerSet's (listener names have no `/`), so that
    /// bind failures land on the right status.
    pub fn section(&self) -> Arc<str> {
        match &self.set {
            None => self.spec.name.as_str().into(),
            Some(set) => format!("{set}/{}", self.spec.name).into(),
        }
    }

    /// Routes attached here, of every kind.
    pub fn attached_routes(&self) -> usize {
        self.routes + self.l4_attachments.len()
    }

    pub fn port(&self) -> Option<u16> {
        u16::try_from(self.spec.port).ok().filter(|p| *p != 0)
    }

    /// Does this listener let a route of `kind` from `namespace` attach?
    pub fn allows(&self, store: &Store, gateway_ns: &str, namespace: &str, kind: &str) -> bool {
        // `Same` means the namespace of whatever declares the listener.
        let gateway_ns = self.set.as_ref().map_or(gateway_ns, |s| s.namespace());
        let kind_ok = self.supported_kinds.iter().any(|k| {
            k.kind == kind && k.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
        });
        if !kind_ok {
            return false;
        }
        let ns = self
            .spec
            .allowed_routes
            .as_ref()
            .and_then(|a| a.namespaces.as_ref());
        match ns.and_then(|n| n.from.as_ref()) {
            None | Some(GatewayListenersAllowedRoutesNamespacesFrom::Same) => {
                namespace == gateway_ns
            }
            Some(GatewayListenersAllowedRoutesNamespacesFrom::All) => true,
            Some(GatewayListenersAllowedRoutesNamespacesFrom::Selector) => ns
                .and_then(|n| n.selector.as_ref())
                .is_some_and(|sel| selector_matches(sel, &store.namespace_labels(namespace))),
        }
    }
}

pub(super) fn selector_matches(
    sel: &GatewayListenersAllowedRoutesNamespacesSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Route kinds a listener of `protocol` can carry.
fn protocol_kinds(protocol: &str) -> &'static [&'static str] {
    match protocol {
        // GRPCRoute: gRPC over h2c, or TLS with ALPN h2.
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TCP" => &["TCPRoute"],
        "UDP" => &["UDPRoute"],
        "TLS" => &["TLSRoute"],
        _ => &[],
    }
}

/// Validates the listeners of one Gateway (in namespace `gateway_ns`): its own, then
/// those of the ListenerSets attached to it, in the spec's precedence order, so every
/// conflict below keeps the earlier listener.
pub fn listeners<'g>(
    store: &Store,
    gateway_ns: &str,
    gateway: &'g Gateway,
    sets: &'g [super::listenerset::AttachedSet],
) -> Vec<ListenerModel<'g>> {
    let mut out: Vec<ListenerModel<'g>> = gateway.spec.listeners.iter().map(validate).collect();
    for set in sets {
        out.extend(set.listeners.iter().map(|spec| ListenerModel {
            set: Some(set.key.clone()),
            ..validate(spec)
        }));
    }
    if rejected(gateway).is_some() {
        for l in &mut out {
            l.gateway_rejected = true;
        }
    }
    for l in out
        .iter_mut()
        .filter(|l| l.accepted.is_ok() && l.terminates_tls())
    {
        // A ListenerSet's certificateRefs are resolved from its own namespace.
        let (owner, cert_ns) = match &l.set {
            Some(set) => ("ListenerSet", set.namespace()),
            None => ("Gateway", gateway_ns),
        };
        match certificates::resolve(store, owner, cert_ns, l.spec.tls.as_ref()) {
            Ok(cert) => l.certificate = Some(cert),
            Err(problem) => l.refs = Err(problem),
        }
        match frontend_tls::for_port(store, gateway_ns, gateway, l.spec.port) {
            frontend_tls::Outcome::None => {}
            frontend_tls::Outcome::Validate(auth, problem) => {
                l.client_auth = Some(auth);
                if let (Some(p), Ok(())) = (problem, &l.refs) {
                    l.refs = Err(p);
                }
            }
            // Failing closed: a port that must check client certificates and has no
            // CA to check them against serves nothing.
            frontend_tls::Outcome::NoValidCa(p) => {
                l.accepted = Err(("NoValidCACertificate", p.1.clone()));
                if l.refs.is_ok() {
                    l.refs = Err(p);
                }
            }
        }
    }
    // One socket speaks one protocol: a later listener on a port an earlier one holds
    // with another protocol is Conflicted.
    for i in 0..out.len() {
        if !out[i].usable() {
            continue;
        }
        let clash = (0..i).find(|&j| {
            out[j].usable()
                && out[j].spec.port == out[i].spec.port
                && out[j].is_udp() == out[i].is_udp()
                // TLS Terminate and Passthrough listeners may share a port (TLSRoute
                // mixed mode): the SNI read from the ClientHello picks the listener.
                && out[j].spec.protocol != out[i].spec.protocol
        });
        if let Some(j) = clash {
            let msg = format!(
                "listener {} uses port {} with protocol {}, which listener {} serves as {}",
                out[i].spec.name,
                out[i].spec.port,
                out[i].spec.protocol,
                out[j].spec.name,
                out[j].spec.protocol
            );
            out[i].conflict = Some(("ProtocolConflict", msg));
        }
    }
    // Two usable listeners on one port with the same hostname can't be told apart: the
    // first in spec order keeps serving, later ones are Conflicted.
    for i in 0..out.len() {
        if !out[i].usable() {
            continue;
        }
        let clash = (0..i).find(|&j| {
            out[j].usable()
                && out[j].spec.port == out[i].spec.port
                && out[j].is_udp() == out[i].is_udp()
                && out[j].spec.hostname.as_deref().map(str::to_ascii_lowercase)
                    == out[i].spec.hostname.as_deref().map(str::to_ascii_lowercase)
        });
        if let Some(j) = clash {
            let msg = format!(
                "listener {} has the same port and hostname as listener {}",
                out[i].spec.name, out[j].spec.name
            );
            out[i].conflict = Some(("HostnameConflict", msg));
        }
    }
    super::portpool::validate(gateway, &mut out);
    out
}

fn validate(spec: &GatewayListeners) -> ListenerModel<'_> {
    let mut model = ListenerModel {
        spec,
        accepted: Ok(()),
        conflict: None,
        refs: Ok(()),
        supported_kinds: Vec::new(),
        routes: 0,
        certificate: None,
        client_auth: None,
        l4_attachments: Vec::new(),
        pool: None,
        pool_ports: BTreeMap::new(),
        set: None,
        gateway_rejected: false,
    };
    let kinds = protocol_kinds(&spec.protocol);
    if kinds.is_empty() {
        model.accepted = Err((
            "UnsupportedProtocol",
            format!(
                "protocol {} is not supported; HTTP, HTTPS, TCP, UDP and TLS are",
                spec.protocol
            ),
        ));
        return model;
    }
    if !(1..=65535).contains(&spec.port) {
        model.accepted = Err((
            "PortUnavailable",
            format!("port {} is out of range", spec.port),
        ));
        return model;
    }
    let requested = spec.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref());
    match requested {
        None => {
            model.supported_kinds = kinds
                .iter()
                .map(|k| GatewayStatusListenersSupportedKinds {
                    group: Some(GATEWAY_GROUP.to_owned()),
                    kind: (*k).to_owned(),
                })
                .collect();
        }
        Some(requested) => {
            let mut invalid = Vec::new();
            for k in requested {
                let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
                if group == GATEWAY_GROUP && kinds.contains(&k.kind.as_str()) {
                    model
                        .supported_kinds
                        .push(GatewayStatusListenersSupportedKinds {
                            group: Some(GATEWAY_GROUP.to_owned()),
                            kind: k.kind.clone(),
                        });
                } else {
                    invalid.push(format!("{group}/{}", k.kind));
                }
            }
            if !invalid.is_empty() {
                model.refs = Err((
                    "InvalidRouteKinds",
                    format!(
                        "route kinds {} are not supported on a {} listener",
                        invalid.join(", "),
                        spec.protocol
                    ),
                ));
            }
        }
    }
    model
}

fn is_passthrough(spec: &GatewayListeners) -> bool {
    use gateway_api::gateways::GatewayListenersTlsMode;
    spec.tls
        .as_ref()
        .and_then(|t| t.mode.as_ref())
        .is_some_and(|m| *m == GatewayListenersTlsMode::Passthrough)
}

/// Why a Gateway must be refused as a whole. aether-edge defines no parameters
/// resource, so an `infrastructure.parametersRef` can never be resolved: the spec
/// asks for Accepted=False with reason InvalidParameters when the referent cannot be
/// found or is of an unsupported kind.
pub fn rejected(gateway: &Gateway) -> Option<Problem> {
    let r = gateway
        .spec
        .infrastructure
        .as_ref()?
        .parameters_ref
        .as_ref()?;
    Some((
        "InvalidParameters",
        format!(
            "infrastructure.parametersRef {}/{} {:?} cannot be resolved: aether-edge takes no Gateway parameters",
            r.group, r.kind, r.name
        ),
    ))
}
