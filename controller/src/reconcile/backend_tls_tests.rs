#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::*;
use crate::manifest;
use crate::reconcile::reconcile;

const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: apps}
spec:
  gatewayClassName: aether
  listeners: [{name: http, port: 8080, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: apps}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: secure, port: 443}]}]
---
apiVersion: v1
kind: Service
metadata: {name: secure, namespace: apps}
spec: {ports: [{name: https, port: 443}, {name: other, port: 8443}]}
"#;

fn ca_pem() -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

fn store(extra: &str) -> Store {
    let ca = ca_pem().replace('\n', "\\n");
    let cm = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca, namespace: apps}}\ndata: {{ca.crt: \"{ca}\"}}\n"
    );
    let text = format!("{BASE}---\n{cm}---\n{extra}");
    let parsed = manifest::parse(Path::new("t.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    Store::from_objects(parsed.objects)
}

fn policy(name: &str, created: &str, target: &str, validation: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: {name}, namespace: apps, creationTimestamp: \"{created}\"}}\nspec:\n  targetRefs: [{target}]\n  validation: {validation}\n---\n"
    )
}

const SVC: &str = "{group: \"\", kind: Service, name: secure}";
const GOOD: &str = "{hostname: backend.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}]}";

/// (Accepted reason, ResolvedRefs reason) of a policy's ancestor `apps/gw`.
fn reasons(store: &Store, policy: &str) -> (String, String) {
    let out = reconcile(store, &crate::testing::settings());
    let status = &out.statuses.backend_tls_policies[&ObjectKey::new("apps", policy)].status;
    assert_eq!(status.ancestors.len(), 1, "{status:?}");
    let a = &status.ancestors[0];
    assert_eq!(a.ancestor_ref.name, "gw");
    assert_eq!(a.controller_name, "aether.io/edge");
    let find = |t: &str| {
        let c = a.conditions.iter().find(|c| c.type_ == t).unwrap();
        format!("{}/{}", c.status, c.reason)
    };
    (find("Accepted"), find("ResolvedRefs"))
}

fn tls_of(store: &Store, port: &str) -> Option<Arc<BackendTls>> {
    PolicyIndex::new(store).lookup(&ObjectKey::new("apps", "secure"), Some(port), Alpn::Http1)
}

#[test]
fn valid_policy_is_accepted_and_gives_the_port_tls() {
    let s = store(&policy("p", "2024-01-01T00:00:00Z", SVC, GOOD));
    assert_eq!(
        reasons(&s, "p"),
        ("True/Accepted".into(), "True/ResolvedRefs".into())
    );
    let tls = tls_of(&s, "https").unwrap();
    assert_eq!(&*tls.hostname, "backend.example.com");
    assert!(tls.invalid.is_none());
}

#[test]
fn missing_or_malformed_ca_fails_closed_with_the_spec_reasons() {
    for v in [
        "{hostname: h.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: nope}]}",
        "{hostname: h.example.com, caCertificateRefs: [{group: \"\", kind: Secret, name: ca}]}",
    ] {
        let s = store(&policy("p", "2024-01-01T00:00:00Z", SVC, v));
        let (accepted, resolved) = reasons(&s, "p");
        assert_eq!(accepted, "False/NoValidCACertificate");
        assert!(
            resolved == "False/InvalidCACertificateRef" || resolved == "False/InvalidKind",
            "{resolved}"
        );
        assert!(tls_of(&s, "https").unwrap().invalid.is_some());
    }
    let s = store(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: bad, namespace: apps}}\ndata: {{ca.crt: \"not pem\"}}\n---\n{}",
        policy(
            "p",
            "2024-01-01T00:00:00Z",
            SVC,
            "{hostname: h.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: bad}, {group: \"\", kind: ConfigMap, name: ca}]}"
        )
    ));
    // One good reference keeps the policy in force; the bad one is still reported.
    assert_eq!(
        reasons(&s, "p"),
        (
            "True/Accepted".into(),
            "False/InvalidCACertificateRef".into()
        )
    );
}

#[test]
fn older_policy_wins_then_name_order() {
    let s = store(&format!(
        "{}{}{}",
        policy("b-new", "2024-01-02T00:00:00Z", SVC, GOOD),
        policy("z-old", "2024-01-01T00:00:00Z", SVC, GOOD),
        policy("a-new", "2024-01-02T00:00:00Z", SVC, GOOD),
    ));
    assert_eq!(reasons(&s, "z-old").0, "True/Accepted");
    assert_eq!(reasons(&s, "a-new").0, "False/Conflicted");
    assert_eq!(reasons(&s, "b-new").0, "False/Conflicted");
    assert_eq!(&*tls_of(&s, "https").unwrap().policy, "apps/z-old");
}

#[test]
fn section_name_targets_one_port_and_beats_the_whole_service() {
    let port = "{group: \"\", kind: Service, name: secure, sectionName: other}";
    let other = "{hostname: other.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}]}";
    let s = store(&format!(
        "{}{}",
        policy("whole", "2024-01-02T00:00:00Z", SVC, GOOD),
        policy("port", "2024-01-03T00:00:00Z", port, other),
    ));
    assert_eq!(&*tls_of(&s, "other").unwrap().hostname, "other.example.com");
    assert_eq!(
        &*tls_of(&s, "https").unwrap().hostname,
        "backend.example.com"
    );
    let missing = "{group: \"\", kind: Service, name: secure, sectionName: nope}";
    let s = store(&policy("p", "2024-01-01T00:00:00Z", missing, GOOD));
    assert!(tls_of(&s, "https").is_none());
}

#[test]
fn unsupported_well_known_set_is_invalid_and_system_is_accepted() {
    let s = store(&policy(
        "p",
        "2024-01-01T00:00:00Z",
        SVC,
        "{hostname: h.example.com, wellKnownCACertificates: Mine}",
    ));
    assert_eq!(reasons(&s, "p").0, "False/Invalid");
    assert!(tls_of(&s, "https").unwrap().invalid.is_some());
    let s = store(&policy(
        "p",
        "2024-01-01T00:00:00Z",
        SVC,
        "{hostname: h.example.com, wellKnownCACertificates: System}",
    ));
    assert_eq!(reasons(&s, "p").0, "True/Accepted");
}
