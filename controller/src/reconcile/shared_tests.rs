//! Shared addressing (`--per-gateway-addressing=false`) from YAML: Gateways share the
//! edge's sockets, collisions are Conflicted on the newer Gateway, and every Gateway
//! reports the edge Service's address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::reconcile::{Addressing, Outcome};
use crate::store::ObjectKey;
use crate::testing;

const YAML: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: old, namespace: one, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  gatewayClassName: aether
  listeners:
  - {name: web, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: raw, port: 9000, protocol: TCP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: new, namespace: two, creationTimestamp: "2026-02-01T00:00:00Z"}
spec:
  gatewayClassName: aether
  listeners:
  - {name: web, port: 80, protocol: HTTP, hostname: b.example.com}
  - {name: same, port: 80, protocol: HTTP, hostname: A.example.com}
  - {name: clash, port: 9000, protocol: HTTP}
---
apiVersion: v1
kind: Service
metadata: {name: aether-edge, namespace: edge-system}
spec: {type: LoadBalancer, ports: [{name: http, port: 80}]}
status: {loadBalancer: {ingress: [{ip: 192.0.2.9}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: two}
spec:
  parentRefs: [{name: new, namespace: two, sectionName: web}]
  rules: [{backendRefs: []}]
"#;

fn outcome() -> Outcome {
    let addressing = Addressing::SharedService {
        service: testing::shared_service(),
        bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    testing::outcome_with(YAML, &addressing)
}

fn listener_condition(
    out: &Outcome,
    ns: &str,
    gw: &str,
    listener: &str,
    ctype: &str,
) -> (String, String) {
    let st = &out.statuses.gateways[&ObjectKey::new(ns, gw)].status;
    let l = st
        .listeners
        .iter()
        .flatten()
        .find(|l| l.name == listener)
        .unwrap_or_else(|| panic!("no listener {listener}"));
    let c = l
        .conditions
        .iter()
        .find(|c| c.type_ == ctype)
        .unwrap_or_else(|| panic!("no {ctype} on {listener}"));
    (c.status.clone(), c.reason.clone())
}

#[test]
fn gateways_share_sockets_and_the_newer_one_loses_collisions() {
    let out = outcome();
    assert!(out.services.is_empty(), "no per-Gateway Service is wanted");
    let web = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 80);
    let socket = out
        .snapshot
        .listeners
        .get(&web)
        .unwrap_or_else(|| panic!("no socket on :80"));
    let sections: Vec<&str> = socket.sections.iter().map(|s| &**s).collect();
    assert_eq!(
        sections,
        ["web", "web"],
        "both Gateways' web listeners share :80"
    );
    assert_eq!(
        listener_condition(&out, "two", "new", "web", "Programmed").0,
        "True"
    );
    assert_eq!(
        listener_condition(&out, "two", "new", "same", "Conflicted"),
        ("True".to_owned(), "HostnameConflict".to_owned()),
        "hostnames compare case-insensitively, and the older Gateway keeps a.example.com"
    );
    assert_eq!(
        listener_condition(&out, "one", "old", "web", "Conflicted").0,
        "False"
    );
    assert_eq!(
        listener_condition(&out, "two", "new", "clash", "Conflicted"),
        ("True".to_owned(), "ProtocolConflict".to_owned())
    );
    assert!(
        out.snapshot
            .listeners
            .get(&SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 9000))
            .is_some_and(|l| l.sections.len() == 1),
        "the older Gateway's TCP listener keeps :9000 alone"
    );
}

#[test]
fn every_gateway_reports_the_edge_service_address() {
    let out = outcome();
    for (ns, name) in [("one", "old"), ("two", "new")] {
        let st = &out.statuses.gateways[&ObjectKey::new(ns, name)].status;
        let addresses: Vec<&str> = st
            .addresses
            .iter()
            .flatten()
            .map(|a| a.value.as_str())
            .collect();
        assert_eq!(addresses, ["192.0.2.9"], "{ns}/{name}");
        let assigned = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "AddressesAssigned")
            .unwrap_or_else(|| panic!("no AddressesAssigned"));
        assert_eq!(assigned.reason, "Assigned");
    }
}
