//! The edge's admin server: GETs, `/status` items and their conditions, metrics.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use http::StatusCode;
use serde_json::Value;

use crate::{BoxError, Net, Resp, TestResult, ensure, err, h1_get_from};

/// Where an admin server is, and the address to ask it from.
pub trait AdminAt: Copy {
    fn admin_addr(&self) -> SocketAddr;
    fn source(&self) -> IpAddr;
}

/// A test network's edge: admin at .250, asked from the test's client address.
impl AdminAt for Net {
    fn admin_addr(&self) -> SocketAddr {
        self.admin()
    }
    fn source(&self) -> IpAddr {
        self.client_ip()
    }
}

/// An admin server at this address, asked from 127.0.0.1.
impl AdminAt for SocketAddr {
    fn admin_addr(&self) -> SocketAddr {
        *self
    }
    fn source(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

/// One GET from the admin server, whatever its status.
pub async fn admin_get(at: impl AdminAt, path: &str) -> Result<Resp, BoxError> {
    let admin = at.admin_addr();
    h1_get_from(at.source(), admin, &admin.to_string(), path).await
}

/// The admin server's `/status` (200 required).
pub async fn status_json(at: impl AdminAt) -> Result<Value, BoxError> {
    let r = admin_get(at, "/status").await?;
    ensure!(
        r.status == StatusCode::OK,
        "admin /status answered {}: {}",
        r.status,
        r.text()
    );
    r.json()
}

/// The admin server's `/config_dump` (200 required).
pub async fn config_dump(at: impl AdminAt) -> Result<Value, BoxError> {
    let r = admin_get(at, "/config_dump").await?;
    ensure!(
        r.status == StatusCode::OK,
        "admin /config_dump answered {}",
        r.status
    );
    r.json()
}

/// The admin server's `/metrics` text (200 required).
pub async fn metrics_text(at: impl AdminAt) -> Result<String, BoxError> {
    let r = admin_get(at, "/metrics").await?;
    ensure!(
        r.status == StatusCode::OK,
        "admin /metrics answered {}",
        r.status
    );
    Ok(r.text())
}

/// The sum over every series of metric `name` (any labels) in Prometheus text: 0
/// when there is none.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum over the series of metric `name` whose labels contain `label` (such as
/// `route="default/dns"`; empty: every series).
pub fn metric_sum_where(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// [`metric_sum`] of the admin server's `/metrics` now.
pub async fn metric(at: impl AdminAt, name: &str) -> Result<f64, BoxError> {
    Ok(metric_sum(&metrics_text(at).await?, name))
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
