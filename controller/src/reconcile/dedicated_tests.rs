//! Dedicated Gateways from YAML: which Gateways get pods of their own, what is written for them,
//! and which process binds which internal ports.

use super::*;
use crate::reconcile::Outcome;
use crate::reconcile::services::{self};
use crate::testing;

const YAML: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shared, namespace: one, uid: uid-s}
spec:
  gatewayClassName: aether
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: own
  namespace: two
  uid: uid-o
  annotations: {aether.io/dedicated: "true", aether.io/dedicated-replicas: "3"}
spec:
  gatewayClassName: aether
  infrastructure: {labels: {team: x}, annotations: {lb.example/pool: blue}}
  listeners: [{name: http, port: 80, protocol: HTTP}, {name: alt, port: 8080, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: typo
  namespace: two
  annotations: {aether.io/dedicated: "yes"}
spec:
  gatewayClassName: aether
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
# The cluster's slice for the own Gateway's pods Service.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aether-two-own-x, namespace: edge-system, labels: {kubernetes.io/service-name: aether-two-own}}
addressType: IPv4
endpoints: [{addresses: [10.0.5.1], conditions: {ready: true}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aether-edge-x, namespace: edge-system, labels: {kubernetes.io/service-name: aether-edge}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1], conditions: {ready: true}}]
"#;

const TEMPLATE: &str = r#"
metadata:
  labels: {app.kubernetes.io/name: aether-edge, app.kubernetes.io/instance: edge, extra: kept}
spec:
  serviceAccountName: aether-edge
  containers:
  - name: edge
    image: example/aether-edge:1
    args: [run, --kubernetes]
    ports: [{name: admin, containerPort: 9911}]
"#;

fn outcome(template: bool, serve_only: Option<ObjectKey>) -> Outcome {
    outcome_of(YAML, template, serve_only)
}

fn outcome_of(yaml: &str, template: bool, serve_only: Option<ObjectKey>) -> Outcome {
    let mut service = testing::shared_service();
    service.serve_only = serve_only;
    if template {
        service.dedicated = Some(DedicatedSettings {
            namespace: "edge-system".into(),
            template: parse_template(TEMPLATE).unwrap(),
        });
    }
    testing::outcome_with(yaml, &testing::internal_ports("20000-29999", service))
}

fn condition(out: &Outcome, ns: &str, name: &str) -> Option<(String, String)> {
    testing::gateway_condition(out, ns, name, CONDITION).map(|(s, r, _)| (s, r))
}

fn internal_ports(out: &Outcome, ns: &str, name: &str) -> Vec<u16> {
    out.services[&ObjectKey::new(ns, name)]
        .service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|p| match p.target_port {
            Some(IntOrString::Int(t)) => u16::try_from(t).ok(),
            _ => None,
        })
        .collect()
}

fn bound(out: &Outcome) -> Vec<u16> {
    let mut ports: Vec<u16> = out.snapshot.listeners.keys().map(|a| a.port()).collect();
    ports.sort_unstable();
    ports
}

#[test]
fn a_dedicated_gateway_gets_a_deployment_and_its_pods_behind_its_service() {
    let out = outcome(true, None);
    let own = &out.services[&ObjectKey::new("two", "own")];
    let objects = own
        .dedicated
        .as_ref()
        .unwrap_or_else(|| panic!("no Deployment"));
    let d = &objects.deployment;
    assert_eq!(d.metadata.name.as_deref(), Some("aether-two-own"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("edge-system"));
    let labels = d.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["team"], "x", "infrastructure labels propagate");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "aether-edge");
    let spec = d.spec.clone().unwrap_or_default();
    assert_eq!(spec.replicas, Some(3));
    let pod_labels = spec.template.metadata.clone().unwrap_or_default().labels;
    let pod_labels = pod_labels.unwrap_or_default();
    assert_eq!(pod_labels[LABEL_POD], "aether-two-own");
    assert_eq!(pod_labels["extra"], "kept");
    assert_eq!(pod_labels["gateway.networking.k8s.io/gateway-name"], "own");
    assert_eq!(
        pod_labels["team"], "x",
        "infrastructure labels reach the pods"
    );
    assert!(
        !pod_labels.contains_key("app.kubernetes.io/name"),
        "the shared edge Deployment would adopt these pods: {pod_labels:?}"
    );
    assert_eq!(
        spec.selector.match_labels.clone().unwrap_or_default(),
        BTreeMap::from([(LABEL_POD.to_owned(), "aether-two-own".to_owned())])
    );
    let pod = spec.template.spec.clone().unwrap_or_default();
    assert_eq!(
        pod.containers[0].args.clone().unwrap_or_default(),
        vec!["run", "--kubernetes", "--serve-gateway=two/own"]
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("aether-edge"));
    let budget = objects.budget.spec.clone().unwrap_or_default();
    assert_eq!(budget.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(budget.selector, Some(spec.selector.clone()));
    let pods = objects.pods.spec.clone().unwrap_or_default();
    assert_eq!(pods.cluster_ip.as_deref(), Some("None"));
    assert_eq!(pods.ports.unwrap_or_default()[0].port, 9911);
    assert_eq!(
        condition(&out, "two", "own"),
        Some(("True".into(), "Provisioned".into()))
    );

    // The Gateway's Service points at its own pods, the other at the shared edge.
    let addresses = |objects: &services::GatewayObjects| -> Vec<String> {
        objects
            .slices
            .iter()
            .flat_map(|s| &s.endpoints)
            .map(|e| e.addresses[0].clone())
            .collect()
    };
    assert_eq!(addresses(own), vec!["10.0.5.1"]);
    assert_eq!(
        addresses(&out.services[&ObjectKey::new("one", "shared")]),
        vec!["10.0.0.1"]
    );
    // The shared edge doesn't bind the dedicated Gateway's ports.
    let own_ports = internal_ports(&out, "two", "own");
    assert_eq!(own_ports.len(), 2);
    assert!(
        bound(&out).iter().all(|p| !own_ports.contains(p)),
        "{:?}",
        bound(&out)
    );
    assert_eq!(bound(&out).len(), 2, "shared and typo");
}

#[test]
fn the_shared_edge_keeps_a_dedicated_gateway_until_one_of_its_pods_is_ready() {
    let addresses = |out: &Outcome| -> Vec<String> {
        out.services[&ObjectKey::new("two", "own")]
            .slices
            .iter()
            .flat_map(|s| &s.endpoints)
            .map(|e| e.addresses[0].clone())
            .collect()
    };
    // The Deployment is written at once, its pods not ready yet (or not listed at
    // all): the shared pods keep serving the Gateway, which still names them.
    let starting = YAML.replace(
        "endpoints: [{addresses: [10.0.5.1], conditions: {ready: true}}]",
        "endpoints: [{addresses: [10.0.5.1], conditions: {ready: false}}]",
    );
    let none = YAML.replace(
        "endpoints: [{addresses: [10.0.5.1], conditions: {ready: true}}]",
        "endpoints: []",
    );
    for yaml in [&starting, &none] {
        let out = outcome_of(yaml, true, None);
        assert!(
            out.services[&ObjectKey::new("two", "own")]
                .dedicated
                .is_some()
        );
        assert_eq!(addresses(&out), vec!["10.0.0.1"]);
        let own_ports = internal_ports(&out, "two", "own");
        assert!(own_ports.iter().all(|p| bound(&out).contains(p)));
        assert_eq!(
            bound(&out).len(),
            4,
            "every Gateway still on the shared edge"
        );
    }
    // One ready: handed over (the first test's case).
    let ready = outcome(true, None);
    assert_eq!(addresses(&ready), vec!["10.0.5.1"]);
    assert_eq!(bound(&ready).len(), 2);
}

#[test]
fn a_dedicated_pod_binds_its_gateway_only_at_the_same_ports() {
    let controller = outcome(true, None);
    let pod = outcome(false, Some(ObjectKey::new("two", "own")));
    let mut own_ports = internal_ports(&controller, "two", "own");
    own_ports.sort_unstable();
    assert_eq!(bound(&pod), own_ports);
}

#[test]
fn bad_annotations_or_no_template_keep_the_gateway_on_the_shared_edge() {
    let out = outcome(true, None);
    assert_eq!(
        condition(&out, "two", "typo"),
        Some(("False".into(), "NotProvisioned".into()))
    );
    assert!(
        out.services[&ObjectKey::new("two", "typo")]
            .dedicated
            .is_none()
    );
    assert_eq!(condition(&out, "one", "shared"), None);

    let off = outcome(false, None);
    assert_eq!(
        condition(&off, "two", "own"),
        Some(("False".into(), "NotProvisioned".into()))
    );
    assert!(
        off.services[&ObjectKey::new("two", "own")]
            .dedicated
            .is_none()
    );
    assert_eq!(
        bound(&off).len(),
        4,
        "every Gateway served by the shared edge"
    );
}

#[test]
fn a_template_without_the_edge_container_is_refused() {
    let err = parse_template("spec: {containers: [{name: other, image: x}]}");
    assert!(
        matches!(err, Err(TemplateError::NoEdgeContainer)),
        "{err:?}"
    );
}
