//! The case format (`case.yaml`) and loading the case directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::*;

// ---------------------------------------------------------------------------------------
// The case format
// ---------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Case {
    /// Conformance feature names this case covers.
    pub(super) features: Vec<String>,
    /// The conformance test (ShortName) this case re-expresses, if any.
    #[serde(default)]
    pub(super) conformance_test: Option<String>,
    #[serde(default)]
    pub(super) description: String,
    /// Load `tests/cases/base.yaml` (namespaces and the three base Gateways).
    #[serde(default = "yes")]
    pub(super) base: bool,
    /// Echo backends to start, `namespace/name`; each gets a Service (port 8080) and an
    /// EndpointSlice pointing at its echo, whose `name` is the Service name.
    #[serde(default)]
    pub(super) backends: Vec<String>,
    /// `appProtocol` of a backend's Service port, by `namespace/name`.
    #[serde(default)]
    pub(super) app_protocols: BTreeMap<String, String>,
    /// Default Gateway for requests (`namespace/name`).
    #[serde(default)]
    pub(super) gateway: Option<String>,
    /// More `aether-edge run` flags: configuration the suite's traffic needs that the
    /// defaults do not give (the case's description says why).
    #[serde(default)]
    pub(super) edge_args: Vec<String>,
    /// The case's listeners are on the suite's real ports 80 and 443 (on the case's own
    /// loopback addresses), not the base's 8080 and 8443: the runner runs it only when
    /// this process may bind ports below 1024 (root or CAP_NET_BIND_SERVICE), and
    /// otherwise skips it saying why (fails instead under AETHER_REQUIRE_K8S=1).
    #[serde(default)]
    pub(super) well_known_ports: bool,
    #[serde(default)]
    pub(super) requests: Vec<RequestCase>,
    #[serde(default)]
    pub(super) distributions: Vec<Distribution>,
    #[serde(default)]
    pub(super) status: Vec<StatusExpect>,
    /// Certificates made at start-up, as the suite makes its own.
    #[serde(default)]
    pub(super) certificates: Certificates,
    /// Later steps, in order, after every check above: each replaces the case's
    /// manifests with another file of the case directory, as the suite patches an
    /// object midway, and checks the status again.
    #[serde(default)]
    pub(super) updates: Vec<Update>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Update {
    /// A file of the case directory that replaces `manifests.yaml`.
    pub(super) manifests: String,
    pub(super) status: Vec<StatusExpect>,
}

/// Test PKI the runner makes before the edge starts: CAs written as ConfigMaps
/// (`ca.crt`), server certificates signed by one of them written as
/// `kubernetes.io/tls` Secrets, and client certificates requests can present.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Certificates {
    /// `namespace/name` of each CA's ConfigMap.
    #[serde(default)]
    pub(super) cas: Vec<String>,
    #[serde(default)]
    pub(super) servers: Vec<ServerCertificate>,
    #[serde(default)]
    pub(super) clients: Vec<ClientCertificate>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ServerCertificate {
    /// `namespace/name` of the Secret.
    pub(super) secret: String,
    /// DNS names (subjectAltName).
    pub(super) hosts: Vec<String>,
    /// The CA (one of `cas`) that signs it.
    pub(super) ca: String,
    /// Backends (of `backends`) whose echoes serve TLS with it, as the suite's TLS
    /// backends mount their Secret.
    #[serde(default)]
    pub(super) backends: Vec<String>,
    /// A CA (one of `cas`) those echoes require client certificates from, as the
    /// suite's echo with `TLS_CLIENT_CACERTS`.
    #[serde(default)]
    pub(super) client_ca: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ClientCertificate {
    /// What requests call it (`tls.client`).
    pub(super) name: String,
    /// The CA (one of `cas`) that signs it.
    pub(super) ca: String,
}

/// A request over TLS (HTTP/1.1 inside).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TlsRequest {
    /// The CA (one of `certificates.cas`) the client trusts.
    pub(super) trust: String,
    /// SNI (default: the request's host).
    #[serde(default)]
    pub(super) sni: Option<String>,
    /// A client certificate (one of `certificates.clients`) to present.
    #[serde(default)]
    pub(super) client: Option<String>,
    /// HTTP/2 (ALPN `h2`) instead of HTTP/1.1, as the suite sends some of its requests.
    #[serde(default)]
    pub(super) http2: bool,
}

pub(super) fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Request {
    /// `namespace/name` of the Gateway to send to (default: the case's `gateway`).
    #[serde(default)]
    pub(super) gateway: Option<String>,
    /// Listener port (default: the Gateway's first listener's port).
    #[serde(default)]
    pub(super) port: Option<u16>,
    #[serde(default)]
    pub(super) method: Option<String>,
    /// Host header (default: the Gateway's `address:port`).
    #[serde(default)]
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) path: Option<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    /// Over TLS instead of plain HTTP.
    #[serde(default)]
    pub(super) tls: Option<TlsRequest>,
    /// One UDP datagram instead (to a UDP listener): the echo that answers it must be
    /// `expect.backend`; `expect.status` is not used.
    #[serde(default)]
    pub(super) udp: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RequestCase {
    #[serde(flatten)]
    pub(super) request: Request,
    pub(super) expect: Expect,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Expect {
    /// Response status (default 200).
    #[serde(default)]
    pub(super) status: Option<u16>,
    /// The echo `name` that must answer; with it, the backend must have seen the
    /// request's method, path and host unless `backendRequest` says otherwise.
    #[serde(default)]
    pub(super) backend: Option<String>,
    #[serde(default)]
    pub(super) backend_request: Option<BackendRequest>,
    /// Response headers (comma-separated values compare element-wise).
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) absent_headers: Vec<String>,
    /// Echo backends that must also have received this request (RequestMirror): a
    /// request with the path the main backend saw shows up in their request logs.
    #[serde(default)]
    pub(super) mirrored_to: Vec<String>,
    /// The TLS handshake fails (or, in TLS 1.3, the first read after it): no answer.
    #[serde(default)]
    pub(super) tls_refused: bool,
    /// An upgrade (WebSocket): the answer must switch protocols (`status` defaults to
    /// 101 here), then each of these must come back through the upgraded connection.
    #[serde(default)]
    pub(super) upgraded_echo: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct BackendRequest {
    #[serde(default)]
    pub(super) method: Option<String>,
    /// Path with query.
    #[serde(default)]
    pub(super) path: Option<String>,
    #[serde(default)]
    pub(super) host: Option<String>,
    /// The HTTP version the backend saw: `HTTP/1.1` or `HTTP/2.0`.
    #[serde(default)]
    pub(super) protocol: Option<String>,
    /// The SNI a TLS backend was sent (a backend of `certificates.servers`).
    #[serde(default)]
    pub(super) sni: Option<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) absent_headers: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Distribution {
    #[serde(flatten)]
    pub(super) request: Request,
    /// Requests sent (on one keep-alive connection).
    pub(super) count: u32,
    /// Expected share of each backend (weights are normalised).
    pub(super) backends: BTreeMap<String, f64>,
    /// Allowed absolute difference of each share.
    pub(super) tolerance: f64,
    /// Each request on a connection of its own (a TCPRoute picks its backend per
    /// connection); otherwise all on one keep-alive connection.
    #[serde(default)]
    pub(super) connection_per_request: bool,
    /// A request header (lower-case) that each backend's own filter sets to its name:
    /// every answer's backend must have seen its own name there.
    #[serde(default)]
    pub(super) backend_header: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct StatusExpect {
    pub(super) kind: String,
    #[serde(default)]
    pub(super) namespace: String,
    pub(super) name: String,
    #[serde(default)]
    pub(super) conditions: Vec<CondExpect>,
    /// Gateway listeners.
    #[serde(default)]
    pub(super) listeners: Vec<ListenerExpect>,
    /// HTTPRoute parents.
    #[serde(default)]
    pub(super) parents: Vec<ParentExpect>,
    /// BackendTLSPolicy `status.ancestors`, found by Gateway like `parents`.
    #[serde(default)]
    pub(super) ancestors: Vec<ParentExpect>,
    /// HTTPRoute: Gateways (`namespace/name`) that must have no parent status.
    #[serde(default)]
    pub(super) no_parents: Vec<String>,
    /// Gateway: `status.attachedListenerSets`.
    #[serde(default)]
    pub(super) attached_listener_sets: Option<u64>,
    /// The status lists exactly the `listeners` above, no others (a removed listener
    /// is gone).
    #[serde(default)]
    pub(super) only_listed_listeners: bool,
    /// Gateway: exactly these `status.addresses` values, in order.
    #[serde(default)]
    pub(super) addresses: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CondExpect {
    #[serde(rename = "type")]
    pub(super) ctype: String,
    pub(super) status: CondStatus,
    #[serde(default)]
    pub(super) reason: Option<String>,
    /// The generation of the object the condition was computed for.
    #[serde(default)]
    pub(super) observed_generation: Option<i64>,
}

/// "True"/"False", also written unquoted.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum CondStatus {
    Bool(bool),
    Str(String),
}

impl CondStatus {
    pub(super) fn as_str(&self) -> &str {
        match self {
            CondStatus::Bool(true) => "True",
            CondStatus::Bool(false) => "False",
            CondStatus::Str(s) => s,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ListenerExpect {
    pub(super) name: String,
    #[serde(default)]
    pub(super) attached_routes: Option<u64>,
    /// Kinds of `supportedKinds`, in any order.
    #[serde(default)]
    pub(super) supported_kinds: Option<Vec<String>>,
    #[serde(default)]
    pub(super) conditions: Vec<CondExpect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ParentExpect {
    /// `namespace/name` of the parent Gateway (or, with `kind: ListenerSet`, of the
    /// parent ListenerSet).
    pub(super) gateway: String,
    /// The parentRef's kind: `Gateway` (default) or `ListenerSet`.
    #[serde(default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) section_name: Option<String>,
    #[serde(default)]
    pub(super) port: Option<u16>,
    #[serde(default)]
    pub(super) conditions: Vec<CondExpect>,
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

pub(super) fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases")
}

pub(super) struct LoadedCase {
    pub(super) name: String,
    pub(super) case: Case,
    pub(super) manifests: String,
    /// The text of each of `case.updates`' manifests, in order.
    pub(super) updates: Vec<String>,
}

pub(super) fn load_cases() -> Result<Vec<LoadedCase>, BoxError> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cases_dir())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_owned();
        let case_text = std::fs::read_to_string(dir.join("case.yaml"))
            .map_err(|e| err(format!("{name}/case.yaml: {e}")))?;
        let case: Case = serde_saphyr::from_str(&case_text)
            .map_err(|e| err(format!("{name}/case.yaml: {e}")))?;
        let manifests = std::fs::read_to_string(dir.join("manifests.yaml"))
            .map_err(|e| err(format!("{name}/manifests.yaml: {e}")))?;
        let updates = case
            .updates
            .iter()
            .map(|u| {
                std::fs::read_to_string(dir.join(&u.manifests))
                    .map_err(|e| err(format!("{name}/{}: {e}", u.manifests)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push(LoadedCase {
            name,
            case,
            manifests,
            updates,
        });
    }
    Ok(out)
}

/// The documents of a multi-document YAML text, as JSON values (empty ones skipped).
pub(super) fn yaml_docs(text: &str) -> Result<Vec<Value>, BoxError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

pub(super) fn split_ref(r: &str) -> (&str, &str) {
    r.split_once('/').unwrap_or(("", r))
}
