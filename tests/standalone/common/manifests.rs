//! Manifests the standalone tests write.

use std::net::SocketAddr;

use super::*;

use aether_test_support::manifest;
pub use aether_test_support::manifest::{Backend, Gateway, HttpRoute};
pub use aether_test_support::manifest::{CONTROLLER, Manifest};

pub fn gateway_class(name: &str, controller: &str) -> String {
    manifest::gateway_class(name, controller).yaml()
}

/// A Gateway of class `aether` with HTTP listeners `(name, port)`; `address` set means
/// an explicit `spec.addresses` entry.
pub fn gateway(ns: &str, name: &str, address: Option<&str>, listeners: &[(&str, u16)]) -> String {
    let mut gw = Gateway::test(name).namespace(ns);
    if let Some(a) = address {
        gw = gw.address(a);
    }
    for (lname, port) in listeners {
        gw = gw.http(lname, *port);
    }
    gw.yaml()
}

/// A Service (port 80 -> 9000) plus an EndpointSlice with one endpoint `ip:port`.
pub fn backend(ns: &str, svc: &str, endpoint: SocketAddr, ready: bool) -> String {
    Backend::test(svc)
        .namespace(ns)
        .endpoint(endpoint, ready)
        .yaml()
}

/// An HTTPRoute in `ns` attached to Gateway `gateway`, with `hostnames`, and one rule
/// per `(path type, path value, service)` (service port 80).
pub fn route(
    ns: &str,
    name: &str,
    gateway: &str,
    hostnames: &[&str],
    rules: &[(&str, &str, &str)],
) -> String {
    http_route(ns, name, gateway, hostnames, rules).yaml()
}

/// [`route`] as a builder, to add to.
pub fn http_route(
    ns: &str,
    name: &str,
    gateway: &str,
    hostnames: &[&str],
    rules: &[(&str, &str, &str)],
) -> HttpRoute {
    let mut r = HttpRoute::test(name).namespace(ns).parent(gateway);
    for h in hostnames {
        r = r.hostname(h);
    }
    for (ptype, pvalue, svc) in rules {
        r = r.path(ptype, pvalue).backend(svc, 80);
    }
    r
}

/// The smallest serving setup: Gateway `default/edge` at .5 with one HTTP listener, and
/// a route `default/r` for `hostnames` (any when empty) sending everything to echo "a".
pub fn single_route(net: Net, hostnames: &[&str]) -> String {
    let mut m = serving_infra(net);
    m.push_str(&route(
        "default",
        "r",
        "edge",
        hostnames,
        &[("PathPrefix", "/", "svc")],
    ));
    m
}

/// The class `aether` and Gateway `default/edge` at .5 with listener `http` on 8080:
/// what most tests serve on.
pub fn edge_gateway(net: Net) -> String {
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(&gateway(
        "default",
        "edge",
        Some(&net.ip_str(5)),
        &[("http", LISTENER_PORT)],
    ));
    m
}

/// [`single_route`] without its route: class, Gateway `default/edge` at .5 with one
/// HTTP listener, Service `svc` -> echo a.
pub fn serving_infra(net: Net) -> String {
    let mut m = edge_gateway(net);
    m.push_str(&backend("default", "svc", net.echo_a(), true));
    m
}

pub fn namespace(name: &str) -> String {
    manifest::namespace(name).yaml()
}

/// The usual infrastructure: class `aether`, Gateway `default/edge` at `.5` with listener
/// `http` on 8080, Services `svc-a` -> echo a and `svc-b` -> echo b.
pub fn standard_infra(net: Net) -> String {
    let mut s = edge_gateway(net);
    s.push_str(&backend("default", "svc-a", net.echo_a(), true));
    s.push_str(&backend("default", "svc-b", net.echo_b(), true));
    s
}
