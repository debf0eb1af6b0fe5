//! The admin server's answers: /status items, conditions, metrics.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use http::StatusCode;
use serde_json::Value;

use super::*;

pub async fn admin_get(net: Net, path: &str) -> Result<Resp, BoxError> {
    let admin = net.admin();
    h1_get_from(net.client_ip(), admin, &admin.to_string(), path).await
}

pub async fn status_json(net: Net) -> Result<Value, BoxError> {
    let r = admin_get(net, "/status").await?;
    ensure!(
        r.status == StatusCode::OK,
        "admin /status answered {}: {}",
        r.status,
        r.text()
    );
    r.json()
}

pub async fn metrics_text(net: Net) -> Result<String, BoxError> {
    let r = admin_get(net, "/metrics").await?;
    ensure!(
        r.status == StatusCode::OK,
        "admin /metrics answered {}",
        r.status
    );
    Ok(r.text())
}

/// Finds the `/status` item of `kind` named `namespace/name` (namespace ignored for
/// cluster-scoped kinds when `namespace` is empty).
pub fn status_item<'a>(
    status: &'a Value,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<&'a Value, BoxError> {
    let items = status
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| err(format!("/status has no items array: {status}")))?;
    items
        .iter()
        .find(|it| {
            let md = &it["metadata"];
            it["kind"] == kind
                && md["name"] == name
                && (namespace.is_empty() || md["namespace"] == namespace)
        })
        .ok_or_else(|| {
            err(format!(
                "/status has no {kind} {namespace}/{name}; items: {}",
                summarize_items(status)
            ))
        })
}

/// kind/namespace/name of every status item, for error messages.
pub fn summarize_items(status: &Value) -> String {
    let mut out = String::new();
    for it in status["items"].as_array().into_iter().flatten() {
        let _ = write!(
            out,
            "[{} {}/{}] ",
            it["kind"].as_str().unwrap_or("?"),
            it["metadata"]["namespace"].as_str().unwrap_or(""),
            it["metadata"]["name"].as_str().unwrap_or("?")
        );
    }
    out
}

/// The condition of `ctype` in a `conditions` array.
pub fn condition<'a>(conditions: &'a Value, ctype: &str) -> Result<&'a Value, BoxError> {
    conditions
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == ctype))
        .ok_or_else(|| err(format!("no {ctype} condition in {conditions}")))
}

/// Asserts that condition `ctype` has `status` (and `reason`, if given).
pub fn expect_condition(
    conditions: &Value,
    ctype: &str,
    status: &str,
    reason: Option<&str>,
) -> TestResult {
    let c = condition(conditions, ctype)?;
    ensure!(
        c["status"] == status,
        "condition {ctype}: expected status {status}, got {c}"
    );
    if let Some(reason) = reason {
        ensure!(
            c["reason"] == reason,
            "condition {ctype}: expected reason {reason}, got {c}"
        );
    }
    Ok(())
}

/// The `status.parents` entry of an HTTPRoute status item for Gateway `gateway`
/// (and `section`, when given).
pub fn route_parent<'a>(
    route: &'a Value,
    gateway: &str,
    section: Option<&str>,
) -> Result<&'a Value, BoxError> {
    route["status"]["parents"]
        .as_array()
        .and_then(|ps| {
            ps.iter().find(|p| {
                p["parentRef"]["name"] == gateway
                    && section.is_none_or(|s| p["parentRef"]["sectionName"] == s)
            })
        })
        .ok_or_else(|| {
            err(format!(
                "route {} has no parent status for {gateway}/{section:?}: {}",
                route["metadata"]["name"], route["status"]
            ))
        })
}

/// The value of Gateway status listener `name`.
pub fn gateway_listener<'a>(gateway: &'a Value, name: &str) -> Result<&'a Value, BoxError> {
    gateway["status"]["listeners"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .ok_or_else(|| {
            err(format!(
                "gateway has no listener status {name}: {}",
                gateway["status"]
            ))
        })
}

/// The IPAddress values in a Gateway status.
pub fn gateway_addresses(gateway: &Value) -> Vec<String> {
    gateway["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["type"] == "IPAddress")
        .filter_map(|a| a["value"].as_str().map(str::to_owned))
        .collect()
}

/// Whether a path names the file (by its final component).
pub fn names_file(reported: &str, file: &Path) -> bool {
    let Some(base) = file.file_name().and_then(|f| f.to_str()) else {
        return false;
    };
    reported.ends_with(base)
}

// ---------------------------------------------------------------------------------------
// Manifests
// ---------------------------------------------------------------------------------------

pub const CONTROLLER: &str = "aether.io/edge";

pub fn gateway_class(name: &str, controller: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: {name}
spec:
  controllerName: {controller}
"
    )
}

/// A Gateway of class `aether` with HTTP listeners `(name, port)`; `address` set means
/// an explicit `spec.addresses` entry.
pub fn gateway(ns: &str, name: &str, address: Option<&str>, listeners: &[(&str, u16)]) -> String {
    let mut s = format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: {name}
  namespace: {ns}
spec:
  gatewayClassName: aether
"
    );
    if let Some(a) = address {
        let _ = write!(s, "  addresses:\n  - type: IPAddress\n    value: {a}\n");
    }
    s.push_str("  listeners:\n");
    for (lname, port) in listeners {
        let _ = write!(
            s,
            "  - name: {lname}\n    port: {port}\n    protocol: HTTP\n"
        );
    }
    s
}

/// A Service (port 80 -> 9000) plus an EndpointSlice with one endpoint `ip:port`.
pub fn backend(ns: &str, svc: &str, endpoint: SocketAddr, ready: bool) -> String {
    let ip = endpoint.ip();
    let port = endpoint.port();
    format!(
        "---
apiVersion: v1
kind: Service
metadata:
  name: {svc}
  namespace: {ns}
spec:
  ports:
  - name: http
    port: 80
    targetPort: 9000
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {svc}-abc12
  namespace: {ns}
  labels:
    kubernetes.io/service-name: {svc}
addressType: IPv4
ports:
- name: http
  port: {port}
endpoints:
- addresses: [\"{ip}\"]
  conditions:
    ready: {ready}
"
    )
}

/// An HTTPRoute in `ns` attached to Gateway `default/gateway`, with `hostnames`, and one
/// rule per `(path type, path value, service)`.
pub fn route(
    ns: &str,
    name: &str,
    gateway: &str,
    hostnames: &[&str],
    rules: &[(&str, &str, &str)],
) -> String {
    let mut s = format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
  namespace: {ns}
spec:
  parentRefs:
  - name: {gateway}
"
    );
    if !hostnames.is_empty() {
        s.push_str("  hostnames:\n");
        for h in hostnames {
            let _ = writeln!(s, "  - \"{h}\"");
        }
    }
    s.push_str("  rules:\n");
    for (ptype, pvalue, svc) in rules {
        let _ = write!(
            s,
            "  - matches:\n    - path:\n        type: {ptype}\n        value: {pvalue}\n    backendRefs:\n    - name: {svc}\n      port: 80\n"
        );
    }
    s
}

/// The smallest serving setup: Gateway `default/edge` at .5 with one HTTP listener, and
/// a route `default/r` for `hostnames` (any when empty) sending everything to echo "a".
pub fn single_route(net: Net, hostnames: &[&str]) -> String {
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&gateway(
        "default",
        "edge",
        Some(&net.ip_str(5)),
        &[("http", LISTENER_PORT)],
    ));
    m.push_str(&backend("default", "svc", net.echo_a(), true));
    m.push_str(&route(
        "default",
        "r",
        "edge",
        hostnames,
        &[("PathPrefix", "/", "svc")],
    ));
    m
}

pub fn namespace(name: &str) -> String {
    format!("---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
}

/// The usual infrastructure: class `aether`, Gateway `default/edge` at `.5` with listener
/// `http` on 8080, Services `svc-a` -> echo a and `svc-b` -> echo b.
pub fn standard_infra(net: Net) -> String {
    let mut s = gateway_class("aether", CONTROLLER);
    s.push_str(&gateway(
        "default",
        "edge",
        Some(&net.ip_str(5)),
        &[("http", LISTENER_PORT)],
    ));
    s.push_str(&backend("default", "svc-a", net.echo_a(), true));
    s.push_str(&backend("default", "svc-b", net.echo_b(), true));
    s
}
