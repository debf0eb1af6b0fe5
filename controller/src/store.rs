//! The typed objects the reconciler reads. Both sources (manifest files, and later the
//! Kubernetes watches) fill the same Store, so everything downstream is identical.

use std::collections::BTreeMap;
use std::fmt;

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use gateway_api::listenersets::ListenerSet;
use gateway_api::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, PodSpec, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gateway_ext::GatewayExt;
use crate::l4route::{L4Kind, L4Route};
use crate::route_ext::HttpRouteExt;

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a namespaced object; objects without a namespace live in `default`,
    /// as `kubectl apply` would put them.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub const DEFAULT_NAMESPACE: &str = "default";

/// The ConfigMap key holding a PEM CA bundle, as the Gateway API names it.
pub const CA_BUNDLE_KEY: &str = "ca.crt";

/// One object of a kind the reconciler understands.
#[derive(Debug, Clone)]
pub enum Object {
    GatewayClass(Box<GatewayClass>),
    /// The typed Gateway and the fields its type lacks.
    Gateway(Box<Gateway>, GatewayExt),
    /// The typed HTTPRoute and the experimental fields its type lacks.
    HttpRoute(Box<HttpRoute>, HttpRouteExt),
    /// A GRPCRoute in its HTTPRoute form (see `grpc_route`).
    GrpcRoute(Box<HttpRoute>),
    ReferenceGrant(Box<ReferenceGrant>),
    ListenerSet(Box<ListenerSet>),
    Secret(Box<Secret>),
    ConfigMap(Box<ConfigMap>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Namespace(Box<Namespace>),
    /// TCPRoute, UDPRoute or TLSRoute.
    L4Route(Box<L4Route>),
    /// Kept trimmed to name, namespace and service account: mesh mode needs only a
    /// pod's workload identity.
    Pod(Box<Pod>),
    BackendTlsPolicy(Box<BackendTlsPolicy>),
    /// An object the controller makes for dedicated Gateways, kept as metadata only:
    /// it needs to know which exist (to delete those no longer wanted), not their specs.
    Owned(OwnedKind, Box<ObjectMeta>),
}

/// Kinds of [`Object::Owned`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnedKind {
    Deployment,
    PodDisruptionBudget,
}

impl OwnedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnedKind::Deployment => "Deployment",
            OwnedKind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }
}

impl Object {
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Object::GatewayClass(o) => &o.metadata,
            Object::Gateway(o, _) => &o.metadata,
            Object::HttpRoute(o, _) => &o.metadata,
            Object::GrpcRoute(o) => &o.metadata,
            Object::ReferenceGrant(o) => &o.metadata,
            Object::ListenerSet(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::L4Route(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::BackendTlsPolicy(o) => &o.metadata,
            Object::Owned(_, meta) => meta,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Object::GatewayClass(_) => "GatewayClass",
            Object::Gateway(..) => "Gateway",
            Object::HttpRoute(..) => "HTTPRoute",
            Object::GrpcRoute(_) => "GRPCRoute",
            Object::ReferenceGrant(_) => "ReferenceGrant",
            Object::ListenerSet(_) => "ListenerSet",
            Object::Secret(_) => "Secret",
            Object::ConfigMap(_) => "ConfigMap",
            Object::Service(_) => "Service",
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::Namespace(_) => "Namespace",
            Object::L4Route(o) => o.kind.as_str(),
            Object::Pod(_) => "Pod",
            Object::BackendTlsPolicy(_) => "BackendTLSPolicy",
            Object::Owned(kind, _) => kind.as_str(),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct Store {
    pub gateway_classes: BTreeMap<String, GatewayClass>,
    pub gateways: BTreeMap<ObjectKey, Gateway>,
    /// Per Gateway, what its typed form can't hold (see `gateway_ext`).
    pub gateway_ext: BTreeMap<ObjectKey, GatewayExt>,
    pub http_routes: BTreeMap<ObjectKey, HttpRoute>,
    /// Per HTTPRoute that has any, its experimental fields (see `route_ext`).
    pub http_route_ext: BTreeMap<ObjectKey, HttpRouteExt>,
    /// GRPCRoutes, in their HTTPRoute form.
    pub grpc_routes: BTreeMap<ObjectKey, HttpRoute>,
    pub reference_grants: BTreeMap<ObjectKey, ReferenceGrant>,
    /// Extra listeners for Gateways that allow them (GEP-1713).
    pub listener_sets: BTreeMap<ObjectKey, ListenerSet>,
    /// Secrets trimmed to their TLS fields (see `tls_secret`).
    pub secrets: BTreeMap<ObjectKey, Secret>,
    /// Secrets whose TLS fields were over the size cap (kept without data), and why.
    pub oversized_secrets: BTreeMap<ObjectKey, String>,
    /// ConfigMaps, holding only their `ca.crt` (frontend TLS validation CA bundles).
    pub config_maps: BTreeMap<ObjectKey, ConfigMap>,
    pub services: BTreeMap<ObjectKey, Service>,
    pub endpoint_slices: BTreeMap<ObjectKey, EndpointSlice>,
    pub namespaces: BTreeMap<String, Namespace>,
    /// TCPRoutes, UDPRoutes and TLSRoutes, by kind then `namespace/name`.
    pub l4_routes: BTreeMap<(L4Kind, ObjectKey), L4Route>,
    pub pods: BTreeMap<ObjectKey, Pod>,
    pub backend_tls_policies: BTreeMap<ObjectKey, BackendTlsPolicy>,
    /// Dedicated Gateways' Deployments and PodDisruptionBudgets (metadata only:
    /// name, namespace, labels), in Kubernetes mode.
    pub owned: BTreeMap<(OwnedKind, ObjectKey), ObjectMeta>,
    /// Per Gateway, why the API server refused to write what the controller creates for
    /// it (Kubernetes mode: set by the Service applier, not by a watch; see
    /// `kube::apply_errors`). The reconcile reports it in the Gateway's status.
    pub apply_failures: BTreeMap<ObjectKey, String>,
}

impl Store {
    pub fn from_objects(objects: impl IntoIterator<Item = Object>) -> Self {
        let mut store = Self::default();
        for o in objects {
            store.apply(o);
        }
        store
    }

    /// Inserts or replaces an object. Namespaced objects without a namespace are put
    /// in `default`, so later lookups never see a missing namespace.
    pub fn apply(&mut self, object: Object) {
        fn defaulted(meta: &mut ObjectMeta) -> ObjectKey {
            if meta.namespace.is_none() {
                meta.namespace = Some(DEFAULT_NAMESPACE.to_owned());
            }
            ObjectKey::of(meta)
        }
        match object {
            Object::GatewayClass(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                self.gateway_classes.insert(name, *o);
            }
            Object::Gateway(mut o, ext) => {
                let key = defaulted(&mut o.metadata);
                self.gateway_ext.insert(key.clone(), ext);
                self.gateways.insert(key, *o);
            }
            Object::HttpRoute(mut o, ext) => {
                let key = defaulted(&mut o.metadata);
                if ext.is_empty() {
                    self.http_route_ext.remove(&key);
                } else {
                    self.http_route_ext.insert(key.clone(), ext);
                }
                self.http_routes.insert(key, *o);
            }
            Object::GrpcRoute(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.grpc_routes.insert(key, *o);
            }
            Object::ReferenceGrant(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.reference_grants.insert(key, *o);
            }
            Object::ListenerSet(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.listener_sets.insert(key, *o);
            }
            Object::Secret(mut o) => {
                let key = defaulted(&mut o.metadata);
                let (kept, too_large) = crate::tls_secret::trim(*o);
                match too_large {
                    Some(why) => self.oversized_secrets.insert(key.clone(), why),
                    None => self.oversized_secrets.remove(&key),
                };
                self.secrets.insert(key, kept);
            }
            Object::ConfigMap(mut o) => {
                let key = defaulted(&mut o.metadata);
                // Only CA bundles are ever read; the cluster's other ConfigMap data is
                // not kept.
                if let Some(data) = o.data.as_mut() {
                    data.retain(|k, _| k == CA_BUNDLE_KEY);
                }
                o.binary_data = None;
                self.config_maps.insert(key, *o);
            }
            Object::Service(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.services.insert(key, *o);
            }
            Object::EndpointSlice(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.endpoint_slices.insert(key, *o);
            }
            Object::Namespace(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                self.namespaces.insert(name, *o);
            }
            Object::L4Route(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.l4_routes.insert((o.kind, key), *o);
            }
            Object::Pod(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.pods.insert(key, trimmed(*o));
            }
            Object::Owned(kind, mut meta) => {
                let key = defaulted(&mut meta);
                let kept = ObjectMeta {
                    name: meta.name.take(),
                    namespace: meta.namespace.take(),
                    labels: meta.labels.take(),
                    ..ObjectMeta::default()
                };
                self.owned.insert((kind, key), kept);
            }
            Object::BackendTlsPolicy(mut o) => {
                let key = defaulted(&mut o.metadata);
                self.backend_tls_policies.insert(key, *o);
            }
        }
    }

    /// Removes a Secret and what is known about it.
    pub fn remove_secret(&mut self, key: &ObjectKey) {
        self.secrets.remove(key);
        self.oversized_secrets.remove(key);
    }

    /// Does a ReferenceGrant in `to_namespace` let a `from_kind` in `from_namespace`
    /// refer to the `to_group`/`to_kind` object named `to_name`?
    pub fn reference_granted(
        &self,
        from_kind: &str,
        from_namespace: &str,
        to_group: &str,
        to_kind: &str,
        to_namespace: &str,
        to_name: &str,
    ) -> bool {
        self.reference_grants
            .range(ObjectKey::new(to_namespace, "")..)
            .take_while(|(k, _)| k.namespace == to_namespace)
            .any(|(_, grant)| {
                let from_ok = grant.spec.from.iter().any(|f| {
                    f.group == "gateway.networking.k8s.io"
                        && f.kind == from_kind
                        && f.namespace == from_namespace
                });
                let to_ok = grant.spec.to.iter().any(|t| {
                    t.group == to_group
                        && t.kind == to_kind
                        && t.name.as_deref().is_none_or(|n| n == to_name)
                });
                from_ok && to_ok
            })
    }

    /// The mesh identity path `/ns/<ns>/sa/<serviceAccount>` of a known Pod.
    pub fn pod_identity(&self, key: &ObjectKey) -> Option<String> {
        let spec = self.pods.get(key)?.spec.as_ref();
        // The API server defaults an unset service account to `default`.
        let sa = spec
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        Some(format!("/ns/{}/sa/{sa}", key.namespace))
    }

    /// Labels of a namespace; a namespace the Store has never seen has none except the
    /// well-known `kubernetes.io/metadata.name`, which the API server always sets.
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        let mut labels = self
            .namespaces
            .get(name)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        labels.insert("kubernetes.io/metadata.name".to_owned(), name.to_owned());
        labels
    }
}

/// What the Store keeps of a Pod: identity only, not the cluster's pod specs.
fn trimmed(pod: Pod) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name,
            namespace: pod.metadata.namespace,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            service_account_name: pod.spec.and_then(|s| s.service_account_name),
            ..PodSpec::default()
        }),
        status: None,
    }
}
