//! backendRef resolution: Service -> port -> EndpointSlices -> ready endpoints.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use aether_proxy::backend::{Backend, Endpoint, UpstreamProtocol};
use aether_proxy::backend_tls::Alpn;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::backend_tls::PolicyIndex;
use crate::store::{KeyParts, ObjectKey, Store};

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// `aether.io/mesh: disabled` on a Service: reach it directly even in mesh mode.
const MESH_ANNOTATION: &str = "aether.io/mesh";

/// Why a backendRef can't be used, as a ResolvedRefs reason and message.
#[derive(Debug, Clone)]
pub struct RefProblem {
    pub reason: &'static str,
    pub message: String,
}

/// The Services one route resolved: usually one, kept inline (a boxed list of one was
/// an allocation per route).
pub type Referenced = smallvec::SmallVec<[ObjectKey; 1]>;

/// The `Backend` of each Service port, as built.
pub type BackendCache = BTreeMap<(ObjectKey, i32, UpstreamProtocol, Alpn), Arc<Backend>>;

/// Resolves backendRefs against the Store, sharing one `Backend` (and so one
/// round-robin cursor) per Service port across all routes: within a reconcile, and
/// across reconciles for Services the incremental reconciler knows are unchanged.
pub struct BackendResolver<'s> {
    store: &'s Store,
    /// EndpointSlices by Service, indexed on the first Backend built.
    slices: Option<HashMap<ObjectKey, Vec<&'s EndpointSlice>>>,
    cache: BackendCache,
    policies: PolicyIndex,
    /// Every Service a backendRef named, resolvable or not: their EndpointSlices are
    /// what this reconcile depends on (see `Outcome::endpoint_interest`).
    referenced: BTreeSet<ObjectKey>,
    /// The Services named since [`BackendResolver::record`], while `recording`: what
    /// one route depends on.
    recording: bool,
    recorded: Vec<ObjectKey>,
}

/// The fields of a backendRef, whatever route kind it came from.
pub struct BackendRefSpec<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub port: Option<i32>,
}

impl<'s> BackendResolver<'s> {
    /// A resolver that reuses `cache`'s Backends: every entry must still be what this
    /// Store would build.
    pub fn with_cache(store: &'s Store, cache: BackendCache) -> Self {
        Self {
            store,
            slices: None,
            cache,
            policies: PolicyIndex::new(store),
            referenced: BTreeSet::new(),
            recording: false,
            recorded: Vec::new(),
        }
    }

    /// The Backends built or reused, for the next reconcile.
    pub fn into_cache(self) -> BackendCache {
        self.cache
    }

    /// Starts recording the Services resolved from here on.
    pub fn record(&mut self) {
        self.recording = true;
        self.recorded.clear();
    }

    /// The Services resolved since [`BackendResolver::record`], sorted, at their exact
    /// size (kept per route), and stops recording. The list recorded into is reused by
    /// the next route.
    pub fn recorded(&mut self) -> Referenced {
        self.recording = false;
        self.recorded.sort_unstable();
        let mut out = Referenced::from(self.recorded.as_slice());
        out.shrink_to_fit();
        self.recorded.clear();
        out
    }

    /// The Service an EndpointSlice belongs to, by its well-known label.
    pub fn service_of(slice_key: &ObjectKey, slice: &EndpointSlice) -> Option<ObjectKey> {
        let svc = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
        Some(ObjectKey::new(slice_key.namespace(), svc.clone()))
    }

    fn slices_of(&mut self, service: &ObjectKey) -> &[&'s EndpointSlice] {
        let store = self.store;
        let slices = self.slices.get_or_insert_with(|| {
            let mut slices: HashMap<ObjectKey, Vec<&EndpointSlice>> = HashMap::new();
            for (key, slice) in &store.endpoint_slices {
                if let Some(svc) = Self::service_of(key, slice) {
                    slices.entry(svc).or_default().push(slice);
                }
            }
            slices
        });
        slices.get(service).map_or(&[], Vec::as_slice)
    }

    /// The Services backendRefs named so far.
    pub fn referenced(&self) -> &BTreeSet<ObjectKey> {
        &self.referenced
    }

    /// The BackendTLSPolicies as this reconcile weighed them (for their status).
    pub fn policies(&self) -> &PolicyIndex {
        &self.policies
    }

    /// Resolves a backendRef of a `from_kind` route (e.g. `HTTPRoute`) in
    /// `route_namespace`. Cross-namespace references need a ReferenceGrant.
    pub fn resolve(
        &mut self,
        from_kind: &str,
        route_namespace: &str,
        r: &BackendRefSpec<'_>,
    ) -> Result<Arc<Backend>, RefProblem> {
        let group = r.group.unwrap_or("");
        let kind = r.kind.unwrap_or("Service");
        if !(group.is_empty() || group == "core") || kind != "Service" {
            return Err(RefProblem {
                reason: "InvalidKind",
                message: format!("backendRef {group}/{kind} {} is not a Service", r.name),
            });
        }
        let namespace = r.namespace.unwrap_or(route_namespace);
        // Every route keeps the keys of the Services it resolved: one copy of each key
        // (the Store's, when it knows the Service) shared by them all, not a copy of
        // its strings per route.
        let probe: &dyn KeyParts = &(namespace, r.name);
        let key = match self.referenced.get(probe) {
            Some(known) => known.clone(),
            None => {
                let key = match self.store.services.get_key_value(probe) {
                    Some((known, _)) => known.clone(),
                    None => ObjectKey::new(namespace, r.name),
                };
                self.referenced.insert(key.clone());
                key
            }
        };
        if self.recording && !self.recorded.contains(&key) {
            self.recorded.push(key.clone());
        }
        if namespace != route_namespace
            && !self.store.reference_granted(
                from_kind,
                route_namespace,
                "",
                "Service",
                namespace,
                r.name,
            )
        {
            return Err(RefProblem {
                reason: "RefNotPermitted",
                message: format!(
                    "backendRef to Service {namespace}/{} crosses namespaces without a ReferenceGrant",
                    r.name
                ),
            });
        }
        let Some(service) = self.store.services.get(&key) else {
            return Err(RefProblem {
                reason: "BackendNotFound",
                message: format!("Service {key} not found"),
            });
        };
        let Some(port) = r.port else {
            return Err(RefProblem {
                reason: "BackendNotFound",
                message: format!("backendRef to Service {key} has no port"),
            });
        };
        let service_port = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|ports| ports.iter().find(|p| p.port == port));
        let Some(service_port) = service_port else {
            return Err(RefProblem {
                reason: "BackendNotFound",
                message: format!("Service {key} has no port {port}"),
            });
        };
        // The spec's appProtocol values (GEP-1911) that change how the proxy talks to
        // the backend. gRPC exists only over HTTP/2, so GRPCRoute backends are h2c
        // whatever else the port says (TLS to backends comes with BackendTLSPolicy).
        // `kubernetes.io/ws` and `wss` are HTTP/1.1, whose Upgrade is how a WebSocket
        // starts; `wss` is that over TLS. Other values stay HTTP/1.1 (upgrades pass
        // through there too).
        let app_protocol = service_port.app_protocol.as_deref();
        let http_route = matches!(from_kind, "HTTPRoute" | "GRPCRoute");
        if let Some(ws @ ("kubernetes.io/ws" | "kubernetes.io/wss")) = app_protocol
            && from_kind == "GRPCRoute"
        {
            return Err(RefProblem {
                reason: "UnsupportedProtocol",
                message: format!(
                    "Service {key} port {port} has appProtocol {ws}: gRPC does not run over WebSocket"
                ),
            });
        }
        let protocol = match app_protocol {
            Some("kubernetes.io/h2c") => UpstreamProtocol::H2c,
            _ if from_kind == "GRPCRoute" => UpstreamProtocol::H2c,
            _ => UpstreamProtocol::Http1,
        };
        // WebSocket over TLS needs to know whom to trust: GEP-1911 supports `wss` for
        // HTTPRoute only with a BackendTLSPolicy for the port; without one the backend
        // is unusable (UnsupportedProtocol), never reached in plaintext.
        let needs_policy = http_route && app_protocol == Some("kubernetes.io/wss");
        // L4 routes carry opaque streams: their TLS (TLSRoute Terminate) offers no ALPN.
        let alpn = match (from_kind, protocol) {
            ("TLSRoute" | "TCPRoute" | "UDPRoute", _) => Alpn::None,
            (_, UpstreamProtocol::H2c) => Alpn::H2,
            _ => Alpn::Http1,
        };
        let no_policy = || RefProblem {
            reason: "UnsupportedProtocol",
            message: format!(
                "Service {key} port {port} has appProtocol kubernetes.io/wss (WebSocket over TLS) and no BackendTLSPolicy"
            ),
        };
        if let Some(b) = self.cache.get(&(key.clone(), port, protocol, alpn)) {
            if needs_policy && b.tls.is_none() {
                return Err(no_policy());
            }
            return Ok(Arc::clone(b));
        }
        let port_name = service_port.name.as_deref().unwrap_or("");
        let tls = self
            .policies
            .lookup(&key, service_port.name.as_deref(), alpn);
        if needs_policy && tls.is_none() {
            return Err(no_policy());
        }
        let mut endpoints: Vec<(SocketAddr, Option<Arc<str>>)> = Vec::new();
        let slices: Vec<&EndpointSlice> = self.slices_of(&key).to_vec();
        for slice in slices {
            let target = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().unwrap_or("") == port_name);
            let Some(target) = target
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
            else {
                continue;
            };
            for ep in &slice.endpoints {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                let peer = self.pod_identity(key.namespace(), ep.target_ref.as_ref());
                endpoints.extend(
                    ep.addresses
                        .iter()
                        .filter_map(|a| a.parse::<IpAddr>().ok())
                        .map(|ip| (SocketAddr::new(ip, target), peer.clone())),
                );
            }
        }
        endpoints.sort();
        endpoints.dedup_by(|a, b| a.0 == b.0);
        let mesh_disabled = service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MESH_ANNOTATION))
            .is_some_and(|v| v == "disabled");
        let backend = Arc::new(
            Backend::new(
                format!("{key}:{port}").into(),
                protocol,
                endpoints
                    .into_iter()
                    .map(|(addr, peer)| Endpoint::new(addr).with_peer(peer))
                    .collect(),
            )
            .with_mesh_disabled(mesh_disabled)
            .with_tls(tls),
        );
        self.cache
            .insert((key, port, protocol, alpn), Arc::clone(&backend));
        Ok(backend)
    }

    /// The mesh identity of the Pod an endpoint's targetRef names, if the Store knows
    /// it. An endpoint without one is refused in mesh mode.
    fn pod_identity(
        &self,
        slice_namespace: &str,
        target: Option<&k8s_openapi::api::core::v1::ObjectReference>,
    ) -> Option<Arc<str>> {
        let target = target.filter(|t| t.kind.as_deref() == Some("Pod"))?;
        let key = ObjectKey::new(
            target.namespace.as_deref().unwrap_or(slice_namespace),
            target.name.as_deref()?,
        );
        self.store.pod_identity(&key).map(Into::into)
    }
}
