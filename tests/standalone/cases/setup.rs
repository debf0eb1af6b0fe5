//! What a case starts from: the runner-made manifests (GatewayClass, a Service and an
//! EndpointSlice per backend), the placeholders a case's manifests may use, and the
//! Gateways they declare.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use super::*;

/// A Gateway of the case's manifests: its listeners' `(name, port)`.
#[derive(Debug, Clone)]
pub(super) struct GatewayInfo {
    pub(super) listeners: Vec<(String, u16)>,
}

pub(super) fn gateways_of(docs: &[Value]) -> BTreeMap<String, GatewayInfo> {
    let mut out = BTreeMap::new();
    for d in docs.iter().filter(|d| d["kind"] == "Gateway") {
        let key = format!(
            "{}/{}",
            d["metadata"]["namespace"].as_str().unwrap_or("default"),
            d["metadata"]["name"].as_str().unwrap_or("")
        );
        let listeners = d["spec"]["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                (
                    l["name"].as_str().unwrap_or("").to_owned(),
                    l["port"]
                        .as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .unwrap_or(0),
                )
            })
            .collect();
        out.insert(key, GatewayInfo { listeners });
    }
    out
}

pub(super) fn backend_ip(net: Net, i: usize) -> Result<IpAddr, BoxError> {
    let host = u8::try_from(200 + i).map_err(|_| err("too many backends"))?;
    Ok(IpAddr::V4(net.ip(host)))
}

/// `text` with what the runner makes at start filled in: every `{address:ns/name}` by
/// the address of that backend's echo (one of `backends`), for a case's own
/// EndpointSlices where the suite reads the IPs of a backend's pods; every
/// `{caPem:ns/name}` by that CA's PEM (one of `certificates.cas`), escaped for a
/// double-quoted YAML string, where the suite copies a CA bundle into a ConfigMap.
pub(super) fn fill_in(
    net: Net,
    backends: &[String],
    pki: &Pki,
    text: &str,
) -> Result<String, BoxError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some((kind, name)) = after
            .split_once('}')
            .and_then(|(inner, _)| inner.split_once(':'))
            .filter(|(k, _)| matches!(*k, "address" | "caPem"))
        else {
            // Not a placeholder: YAML flow syntax.
            out.push('{');
            rest = after;
            continue;
        };
        let value = match kind {
            "address" => {
                let i = backends.iter().position(|b| b == name).ok_or_else(|| {
                    err(format!("{{address:{name}}} names no backend of the case"))
                })?;
                backend_ip(net, i)?.to_string()
            }
            _ => pki
                .ca_pem(name)
                .ok_or_else(|| err(format!("{{caPem:{name}}} names no CA of the case")))?
                .replace('\n', "\\n"),
        };
        out.push_str(&value);
        rest = &after[kind.len() + name.len() + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The runner-made objects: the GatewayClass and a Service + EndpointSlice per backend.
pub(super) fn generated_manifests(
    net: Net,
    backends: &[String],
    app_protocols: &BTreeMap<String, String>,
) -> Result<String, BoxError> {
    let mut s = manifest::gateway_class(GATEWAY_CLASS, CONTROLLER).yaml();
    for (i, b) in backends.iter().enumerate() {
        let (ns, name) = split_ref(b);
        ensure!(!ns.is_empty(), "backend {b:?} is not namespace/name");
        let ip = backend_ip(net, i)?;
        let mut backend = Backend::test(name)
            .namespace(ns)
            .port("first-port", SERVICE_PORT, 3000);
        if let Some(p) = app_protocols.get(b) {
            backend = backend.app_protocol(p);
        }
        s.push_str(
            &backend
                .endpoint(SocketAddr::new(ip, ECHO_PORT), true)
                .yaml(),
        );
    }
    Ok(s)
}
