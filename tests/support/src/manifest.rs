//! Builders for the manifests tests write most: GatewayClass, Namespace, Gateway,
//! HTTPRoute, and a Service with its EndpointSlice. Each builds the object as JSON:
//! [`Manifest::json`] for a Kubernetes API, [`Manifest::yaml`] for a standalone
//! manifest file (JSON is YAML; one `---` document each, so they concatenate).
//!
//! ```
//! use aether_test_support::manifest::{Gateway, HttpRoute, Manifest};
//! let yaml = Gateway::test("edge").address("127.77.1.5").http("http", 8080).yaml()
//!     + &HttpRoute::test("r").parent("edge").path_prefix("/a").backend("svc", 80).yaml();
//! assert!(yaml.contains("\"PathPrefix\""));
//! ```

use std::net::SocketAddr;

use serde_json::{Value, json};

/// The controller name the edge answers to unless told otherwise.
pub const CONTROLLER: &str = "aether.io/edge";
/// The class every test Gateway uses unless it says otherwise.
pub const CLASS: &str = "aether";

/// An object a test writes or applies.
pub trait Manifest {
    fn json(&self) -> Value;

    /// One YAML document (`---` first), to concatenate with others.
    fn yaml(&self) -> String {
        format!(
            "---\n{}\n",
            serde_json::to_string_pretty(&self.json()).unwrap_or_default()
        )
    }
}

impl Manifest for Value {
    fn json(&self) -> Value {
        self.clone()
    }
}

/// GatewayClass `name` of `controller`.
pub fn gateway_class(name: &str, controller: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
           "metadata": {"name": name}, "spec": {"controllerName": controller}})
}

/// Namespace `name`.
pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// A `kubernetes.io/tls` Secret holding a PEM certificate chain and key.
pub fn tls_secret(ns: &str, name: &str, cert_pem: &str, key_pem: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
           "metadata": {"name": name, "namespace": ns},
           "stringData": {"tls.crt": cert_pem, "tls.key": key_pem}})
}

/// A ConfigMap with a PEM CA bundle under `ca.crt` (what BackendTLSPolicy and client
/// certificate validation name).
pub fn ca_config_map(ns: &str, name: &str, ca_pem: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": ns},
           "data": {"ca.crt": ca_pem}})
}

/// A Gateway of class [`CLASS`] in namespace `default`, until told otherwise.
#[derive(Debug, Clone)]
pub struct Gateway(Value);

impl Gateway {
    pub fn test(name: &str) -> Self {
        Gateway(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"gatewayClassName": CLASS, "listeners": []}}))
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.0["metadata"]["namespace"] = json!(ns);
        self
    }

    pub fn class(mut self, class: &str) -> Self {
        self.0["spec"]["gatewayClassName"] = json!(class);
        self
    }

    /// An explicit `spec.addresses` entry of type IPAddress.
    pub fn address(mut self, ip: &str) -> Self {
        push(
            &mut self.0["spec"]["addresses"],
            json!({"type": "IPAddress", "value": ip}),
        );
        self
    }

    /// A `metadata.annotations` entry.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0["metadata"]["annotations"][key] = json!(value);
        self
    }

    /// `spec.infrastructure` (labels and annotations for what the Gateway gets).
    pub fn infrastructure(self, infrastructure: Value) -> Self {
        self.spec("infrastructure", infrastructure)
    }

    /// Any `spec` field, as given.
    pub fn spec(mut self, key: &str, value: Value) -> Self {
        self.0["spec"][key] = value;
        self
    }

    /// A listener as given (for what the shorthands below do not say).
    pub fn listener(mut self, listener: Value) -> Self {
        push(&mut self.0["spec"]["listeners"], listener);
        self
    }

    /// An HTTP listener.
    pub fn http(self, name: &str, port: u16) -> Self {
        self.listener(json!({"name": name, "port": port, "protocol": "HTTP"}))
    }

    /// An HTTP listener for `hostname`.
    pub fn http_host(self, name: &str, port: u16, hostname: &str) -> Self {
        self.listener(json!({"name": name, "port": port, "protocol": "HTTP", "hostname": hostname}))
    }

    /// An HTTPS listener terminating TLS with the Secret `cert`.
    pub fn https(self, name: &str, port: u16, cert: &str) -> Self {
        self.listener(json!({"name": name, "port": port, "protocol": "HTTPS",
                             "tls": {"certificateRefs": [{"name": cert}]}}))
    }

    /// An HTTPS listener for `hostname`, terminating TLS with the Secret `cert`.
    pub fn https_host(self, name: &str, port: u16, hostname: &str, cert: &str) -> Self {
        self.listener(json!({"name": name, "port": port, "protocol": "HTTPS",
                             "hostname": hostname,
                             "tls": {"certificateRefs": [{"name": cert}]}}))
    }
}

impl Gateway {
    /// A TLS listener terminating with the Secret `cert` (for `hostname`, when given).
    pub fn tls_terminate(self, name: &str, port: u16, hostname: Option<&str>, cert: &str) -> Self {
        let mut l = json!({"name": name, "port": port, "protocol": "TLS",
                           "tls": {"mode": "Terminate", "certificateRefs": [{"name": cert}]}});
        if let Some(h) = hostname {
            l["hostname"] = json!(h);
        }
        self.listener(l)
    }

    /// A TLS listener passing connections through (for `hostname`, when given).
    pub fn tls_passthrough(self, name: &str, port: u16, hostname: Option<&str>) -> Self {
        let mut l = json!({"name": name, "port": port, "protocol": "TLS",
                           "tls": {"mode": "Passthrough"}});
        if let Some(h) = hostname {
            l["hostname"] = json!(h);
        }
        self.listener(l)
    }
}

impl Manifest for Gateway {
    fn json(&self) -> Value {
        self.0.clone()
    }
}

/// An HTTPRoute in namespace `default`: parents, hostnames, then rules, each begun by
/// a match ([`HttpRoute::path_prefix`], [`HttpRoute::exact`]) or [`HttpRoute::rule`]
/// and given backends by [`HttpRoute::backend`].
#[derive(Debug, Clone)]
pub struct HttpRoute(Value);

impl HttpRoute {
    pub fn test(name: &str) -> Self {
        HttpRoute(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"parentRefs": [], "rules": []}}))
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.0["metadata"]["namespace"] = json!(ns);
        self
    }

    /// Attached to Gateway `gateway` (of the route's namespace).
    pub fn parent(self, gateway: &str) -> Self {
        self.parent_ref(json!({"name": gateway}))
    }

    /// A parentRef as given (namespace, sectionName, port, kind...).
    pub fn parent_ref(mut self, parent: Value) -> Self {
        push(&mut self.0["spec"]["parentRefs"], parent);
        self
    }

    /// Attached to listener `section` of Gateway `gateway`.
    pub fn section(self, gateway: &str, section: &str) -> Self {
        self.parent_ref(json!({"name": gateway, "sectionName": section}))
    }

    pub fn hostname(mut self, hostname: &str) -> Self {
        push(&mut self.0["spec"]["hostnames"], json!(hostname));
        self
    }

    /// A new rule with no matches (it matches everything) and no backends yet.
    pub fn rule(mut self) -> Self {
        push(&mut self.0["spec"]["rules"], json!({}));
        self
    }

    /// A new rule matching paths of `kind` (PathPrefix, Exact, RegularExpression).
    pub fn path(mut self, kind: &str, value: &str) -> Self {
        push(
            &mut self.0["spec"]["rules"],
            json!({"matches": [{"path": {"type": kind, "value": value}}]}),
        );
        self
    }

    /// A new rule matching the path prefix `prefix`.
    pub fn path_prefix(self, prefix: &str) -> Self {
        self.path("PathPrefix", prefix)
    }

    /// A new rule matching the path `path` exactly.
    pub fn exact(self, path: &str) -> Self {
        self.path("Exact", path)
    }

    /// A backend of the last rule (of a new one, when there is none yet).
    pub fn backend(mut self, service: &str, port: u16) -> Self {
        let rule = self.last_rule();
        push(
            &mut rule["backendRefs"],
            json!({"name": service, "port": port}),
        );
        self
    }

    /// Any field of the last rule (of a new one, when there is none yet), as given:
    /// `retry`, `timeouts`, `name`...
    pub fn rule_field(mut self, key: &str, value: Value) -> Self {
        self.last_rule()[key] = value;
        self
    }

    /// A backendRef as given (namespace, kind, weight...) on the last rule (of a new
    /// one, when there is none yet).
    pub fn backend_ref(mut self, backend: Value) -> Self {
        push(&mut self.last_rule()["backendRefs"], backend);
        self
    }

    /// A filter of the last rule (of a new one, when there is none yet).
    pub fn filter(mut self, filter: Value) -> Self {
        push(&mut self.last_rule()["filters"], filter);
        self
    }

    /// A RequestRedirect filter to `hostname` with `status` on the last rule (answered
    /// at the edge: no backend needed).
    pub fn redirect(self, hostname: &str, status: u16) -> Self {
        self.filter(json!({"type": "RequestRedirect",
                           "requestRedirect": {"hostname": hostname, "statusCode": status}}))
    }

    fn last_rule(&mut self) -> &mut Value {
        let rules = &mut self.0["spec"]["rules"];
        if rules.as_array().is_none_or(Vec::is_empty) {
            push(rules, json!({}));
        }
        let n = rules.as_array().map_or(0, Vec::len);
        &mut rules[n - 1]
    }
}

impl Manifest for HttpRoute {
    fn json(&self) -> Value {
        self.0.clone()
    }
}

/// A Service with one port (80 -> 9000, named http, until told otherwise) and its
/// EndpointSlice `<svc>-abc12`, with one endpoint per [`Backend::endpoint`].
#[derive(Debug, Clone)]
pub struct Backend {
    service: Value,
    slice: Value,
}

impl Backend {
    pub fn test(name: &str) -> Self {
        Backend {
            service: json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9000}]}}),
            slice: json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-abc12"), "namespace": "default",
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4", "ports": [], "endpoints": []}),
        }
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.service["metadata"]["namespace"] = json!(ns);
        self.slice["metadata"]["namespace"] = json!(ns);
        self
    }

    /// The Service's port: `name`, `port` -> `target_port`.
    pub fn port(mut self, name: &str, port: u16, target_port: u16) -> Self {
        self.service["spec"]["ports"] =
            json!([{"name": name, "port": port, "targetPort": target_port}]);
        self
    }

    /// The Service port's `appProtocol` (`kubernetes.io/h2c`...).
    pub fn app_protocol(mut self, protocol: &str) -> Self {
        self.service["spec"]["ports"][0]["appProtocol"] = json!(protocol);
        self
    }

    /// An endpoint at `addr`. Its port is the slice's one port, named as the Service's
    /// (which is how a slice's port is matched to the Service's).
    pub fn endpoint(mut self, addr: SocketAddr, ready: bool) -> Self {
        let name = self.service["spec"]["ports"][0]["name"].clone();
        self.slice["ports"] = json!([{"name": name, "port": addr.port()}]);
        push(
            &mut self.slice["endpoints"],
            json!({"addresses": [addr.ip().to_string()], "conditions": {"ready": ready}}),
        );
        self
    }

    pub fn service(&self) -> Value {
        self.service.clone()
    }

    pub fn slice(&self) -> Value {
        self.slice.clone()
    }

    /// Both documents.
    pub fn yaml(&self) -> String {
        self.service.yaml() + &self.slice.yaml()
    }
}

/// Appends to an array, making one of a missing field.
fn push(array: &mut Value, item: Value) {
    if !array.is_array() {
        *array = json!([]);
    }
    if let Some(items) = array.as_array_mut() {
        items.push(item);
    }
}
