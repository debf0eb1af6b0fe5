//! Kubernetes-mode placement from YAML: Services, EndpointSlices, ports, addresses.

use super::*;
use crate::testing;

const YAML: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: a, namespace: one, uid: uid-a}
spec:
  gatewayClassName: aether
  infrastructure: {labels: {team: x}, annotations: {lb.example/pool: blue}}
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: http2, port: 80, protocol: HTTP, hostname: b.example.com}
  - {name: alt, port: 8080, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: b, namespace: two, uid: uid-b}
spec:
  gatewayClassName: aether
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata:
  name: b-aether
  namespace: two
  labels: {aether.io/gateway-name: b, aether.io/gateway-namespace: two, app.kubernetes.io/managed-by: aether-edge}
spec: {type: LoadBalancer, ports: [{port: 80, targetPort: 21234}]}
status: {loadBalancer: {ingress: [{ip: 192.0.2.7}]}}
---
# The edge's own Service's slices (written by the cluster): two pods in two slices,
# one of them listed twice, one not ready.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aether-edge-x1, namespace: edge-system, labels: {kubernetes.io/service-name: aether-edge}}
addressType: IPv4
endpoints:
- addresses: [10.0.0.2]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: edge-system, name: edge-2}
ports: [{name: admin, port: 9901}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aether-edge-x2, namespace: edge-system, labels: {kubernetes.io/service-name: aether-edge}}
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: false, terminating: true}
- addresses: [10.0.0.2]
  conditions: {ready: true}
---
# Same Service name in another namespace: not the edge.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aether-edge-y, namespace: one, labels: {kubernetes.io/service-name: aether-edge}}
addressType: IPv4
endpoints: [{addresses: [10.9.9.9]}]
"#;

fn outcome(range: &str) -> crate::reconcile::Outcome {
    testing::outcome_with(
        YAML,
        &testing::internal_ports(range, testing::shared_service()),
    )
}

fn programmed(out: &crate::reconcile::Outcome, ns: &str, name: &str) -> (String, String) {
    let (status, reason, _) = testing::gateway_condition(out, ns, name, "Programmed").unwrap();
    (status, reason)
}

#[test]
fn services_ports_listeners_and_addresses() {
    let out = outcome("20000-29999");
    let objects = &out.services[&ObjectKey::new("one", "a")];
    let a = &objects.service;
    let spec = a.spec.clone().unwrap_or_default();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(
        spec.selector, None,
        "a selector can't reach pods in edge-system"
    );
    let ports = spec.ports.unwrap_or_default();
    assert_eq!(ports.len(), 2, "listeners on one port share it");
    let labels = a.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["team"], "x");
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(labels["gateway.networking.k8s.io/gateway-name"], "a");
    let owner = &a.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Gateway", "uid-a")
    );
    // b keeps the internal port its Service already targets, and reports the LB IP.
    let b = out.services[&ObjectKey::new("two", "b")].service.clone();
    let bp = b.spec.and_then(|s| s.ports).unwrap_or_default();
    assert_eq!(bp[0].target_port, Some(IntOrString::Int(21234)));
    let binds: Vec<u16> = out.snapshot.listeners.keys().map(|a| a.port()).collect();
    assert_eq!(binds.len(), 3);
    assert!(binds.contains(&21234));
    assert!(
        out.snapshot
            .listeners
            .keys()
            .all(|a| a.ip().is_unspecified())
    );
    let bst = &out.statuses.gateways[&ObjectKey::new("two", "b")].status;
    assert_eq!(
        bst.addresses.clone().unwrap_or_default()[0].value,
        "192.0.2.7"
    );
    assert_eq!(
        programmed(&out, "two", "b"),
        ("True".into(), "Programmed".into())
    );
    assert_eq!(
        programmed(&out, "one", "a"),
        ("False".into(), "AddressNotAssigned".into())
    );
}

#[test]
fn a_range_too_small_is_a_condition() {
    // a (first in precedence) takes both ports; b's previous port is outside.
    let out = outcome("30000-30001");
    assert_eq!(programmed(&out, "one", "a").1, "AddressNotAssigned");
    assert_eq!(
        programmed(&out, "two", "b"),
        ("False".into(), "NoResources".into())
    );
    assert!(!out.services.contains_key(&ObjectKey::new("two", "b")));
    let tiny = outcome("30000-30000");
    assert_eq!(
        programmed(&tiny, "one", "a"),
        ("False".into(), "NoResources".into())
    );
    assert!(!tiny.services.contains_key(&ObjectKey::new("one", "a")));
}

#[test]
fn gateway_services_get_the_edge_pods_as_endpoints_at_internal_ports() {
    let out = outcome("20000-29999");
    let objects = &out.services[&ObjectKey::new("one", "a")];
    let [slice] = objects.slices.as_slice() else {
        panic!("one IPv4 slice expected: {:?}", objects.slices);
    };
    assert_eq!(slice.metadata.name.as_deref(), Some("a-aether"));
    assert_eq!(slice.metadata.namespace.as_deref(), Some("one"));
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["kubernetes.io/service-name"], "a-aether");
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "edge.aether.io"
    );
    let addrs: Vec<(&str, Option<bool>)> = slice
        .endpoints
        .iter()
        .map(|e| {
            (
                e.addresses[0].as_str(),
                e.conditions.as_ref().and_then(|c| c.ready),
            )
        })
        .collect();
    assert_eq!(
        addrs,
        vec![("10.0.0.1", Some(false)), ("10.0.0.2", Some(true))]
    );
    // Each Service port by name, at its internal port.
    let svc_ports = objects
        .service
        .spec
        .clone()
        .and_then(|s| s.ports)
        .unwrap_or_default();
    let slice_ports = slice.ports.clone().unwrap_or_default();
    assert_eq!(svc_ports.len(), slice_ports.len());
    for sp in &svc_ports {
        let ep = slice_ports
            .iter()
            .find(|p| p.name == sp.name)
            .unwrap_or_else(|| panic!("no slice port named {:?}", sp.name));
        assert_eq!(sp.target_port, ep.port.map(IntOrString::Int));
    }
    let owner = &slice.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(owner.uid, "uid-a");
}

/// GEP-5093 cases: Gateways asking for Cluster only, both scopes plus one unknown,
/// and nothing satisfiable, with the Services as the server would hold them.
const ROUTABILITY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: internal, namespace: r}
spec:
  gatewayClassName: aether
  addresses: [{type: IPAddress, routability: Cluster}]
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata:
  name: internal-aether
  namespace: r
  labels: {aether.io/gateway-name: internal, aether.io/gateway-namespace: r, app.kubernetes.io/managed-by: aether-edge}
spec: {type: ClusterIP, clusterIP: 10.96.0.42, ports: [{port: 80, targetPort: 20001}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: mixed, namespace: r}
spec:
  gatewayClassName: aether
  addresses:
  - {type: IPAddress, value: 192.0.2.9, routability: External}
  - {type: IPAddress, routability: Cluster}
  - {type: IPAddress, routability: example.com/CorpWan}
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata:
  name: mixed-aether
  namespace: r
  labels: {aether.io/gateway-name: mixed, aether.io/gateway-namespace: r, app.kubernetes.io/managed-by: aether-edge}
spec: {type: LoadBalancer, clusterIP: 10.96.0.43, ports: [{port: 80, targetPort: 20002}]}
status: {loadBalancer: {ingress: [{ip: 192.0.2.9}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: nowhere, namespace: r}
spec:
  gatewayClassName: aether
  addresses: [{type: IPAddress, routability: example.com/CorpWan}]
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: invalid-type, namespace: r}
spec:
  gatewayClassName: aether
  addresses: [{type: IPAddress, value: 192.0.2.10}, {type: test/fake-invalid-type, value: x}]
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: hostname, namespace: r}
spec:
  gatewayClassName: aether
  addresses: [{type: Hostname, value: gw.example.com}]
  listeners: [{name: http, port: 80, protocol: HTTP}]
"#;

fn condition(out: &crate::reconcile::Outcome, name: &str, ctype: &str) -> (String, String, String) {
    testing::gateway_condition(out, "r", name, ctype)
        .unwrap_or_else(|| panic!("{name}: no {ctype}"))
}

#[test]
fn routability_scopes_services_conditions_and_status() {
    let addressing = testing::internal_ports("20000-29999", testing::shared_service());
    let out = testing::outcome_with(ROUTABILITY, &addressing);
    let svc = |name: &str| {
        out.services
            .get(&ObjectKey::new("r", name))
            .and_then(|o| o.service.spec.clone())
    };
    let addrs = |name: &str| -> Vec<(String, String)> {
        let key = ObjectKey::new("r", name);
        let st = &out.statuses.gateways[&key].status;
        let scopes = out
            .statuses
            .address_routability
            .get(&key)
            .cloned()
            .unwrap_or_default();
        st.addresses
            .clone()
            .unwrap_or_default()
            .into_iter()
            .zip(scopes)
            .map(|(a, s)| (a.value, s))
            .collect()
    };

    // Cluster only: a ClusterIP Service, its cluster IP reported as Cluster.
    let internal = svc("internal").unwrap_or_else(|| panic!("no Service for internal"));
    assert_eq!(internal.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(
        addrs("internal"),
        vec![("10.96.0.42".into(), "Cluster".into())]
    );
    assert_eq!(
        condition(&out, "internal", "AddressesAssigned").1,
        "Assigned"
    );
    assert_eq!(condition(&out, "internal", "Programmed").0, "True");

    // External with a value, Cluster, and an unknown scope: one LoadBalancer Service
    // asking for the IP; both known scopes reported; the unknown one named; still
    // programmed.
    let mixed = svc("mixed").unwrap_or_else(|| panic!("no Service for mixed"));
    assert_eq!(mixed.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(mixed.load_balancer_ip.as_deref(), Some("192.0.2.9"));
    assert_eq!(
        addrs("mixed"),
        vec![
            ("192.0.2.9".into(), "External".into()),
            ("10.96.0.43".into(), "Cluster".into())
        ]
    );
    let (st, reason, msg) = condition(&out, "mixed", "AddressesAssigned");
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("False", "PartiallyAssigned")
    );
    assert!(msg.contains("example.com/CorpWan"), "{msg}");
    assert_eq!(condition(&out, "mixed", "Programmed").0, "True");

    // Nothing satisfiable: no Service, no listener, NotAssigned and AddressNotAssigned.
    assert!(svc("nowhere").is_none());
    assert!(addrs("nowhere").is_empty());
    let (st, reason, msg) = condition(&out, "nowhere", "AddressesAssigned");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "NotAssigned"));
    assert!(msg.contains("CorpWan"), "{msg}");
    let (st, reason, _) = condition(&out, "nowhere", "Programmed");
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("False", "AddressNotAssigned")
    );
    assert_eq!(condition(&out, "nowhere", "Accepted").0, "True");

    // An address type no Service can carry (the upstream GatewayStaticAddresses
    // test's test/fake-invalid-type, or Hostname) refuses the Gateway, as standalone
    // mode does: Accepted=False UnsupportedAddress, not served.
    for name in ["invalid-type", "hostname"] {
        let (st, reason, msg) = condition(&out, name, "Accepted");
        assert_eq!(
            (st.as_str(), reason.as_str()),
            ("False", "UnsupportedAddress"),
            "{name}: {msg}"
        );
        assert_eq!(condition(&out, name, "Programmed").0, "False", "{name}");
    }
    assert_eq!(
        out.snapshot.listeners.len(),
        2,
        "only internal and mixed are served"
    );
}
