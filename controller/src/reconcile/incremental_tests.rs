//! The incremental reconciler against the full one: random sequences of adds, edits and
//! deletes over a small world with every kind the reconciler reads; after every step a
//! long-lived [`Reconciler`] must give exactly what a fresh one (the full reconcile)
//! gives: the same Snapshot, statuses, Gateway Services and endpoint interest.

use std::path::Path;

use super::*;
use crate::manifest;
use crate::reconcile::services::ServiceSettings;
use crate::reconcile::{Outcome, reconcile_with};
use crate::store::{Object, ObjectId};

/// One object of the world: its identity and the versions it can take.
struct Slot {
    variants: Vec<Object>,
}

fn parse(text: &str) -> Object {
    let parsed = manifest::parse(Path::new("world.yaml"), text);
    assert!(parsed.errors.is_empty(), "{:?}\n{text}", parsed.errors);
    assert_eq!(parsed.objects.len(), 1, "{text}");
    parsed.objects.into_iter().next().unwrap()
}

fn pem_pair(ca: bool) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![
        "gw.example.com".to_owned(),
        "*.example.com".to_owned(),
    ])
    .unwrap();
    if ca {
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    }
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn b64(data: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = data.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n =
            chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

const GW: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n";
const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n";

fn world() -> Vec<Slot> {
    let (crt, key) = pem_pair(false);
    // Another certificate for the same names: only its fingerprint tells them apart.
    let (crt2, key2) = pem_pair(false);
    let (ca, _) = pem_pair(true);
    let ca = ca.replace('\n', "\\n");
    let (other_ca, _) = pem_pair(true);
    let other_ca = other_ca.replace('\n', "\\n");
    let slot = |variants: Vec<String>| Slot {
        variants: variants.iter().map(|t| parse(t)).collect(),
    };
    let mut slots = vec![
        slot(vec![
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: aether}\nspec: {controllerName: aether.io/edge}\n".into(),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: aether, generation: 2}\nspec: {controllerName: example.com/other}\n".into(),
        ]),
        slot(vec![
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps, labels: {team: a}}\n".into(),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps, labels: {team: b}}\n".into(),
        ]),
        slot(vec![
            format!("{GW}metadata: {{name: gw1, namespace: edge}}\nspec:\n  gatewayClassName: aether\n  tls: {{frontend: {{default: {{}}, perPort: [{{port: 8443, tls: {{validation: {{caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: client-ca}}]}}}}}}]}}}}\n  allowedListeners: {{namespaces: {{from: Same}}}}\n  listeners:\n  - {{name: http, port: 8080, protocol: HTTP, allowedRoutes: {{namespaces: {{from: All}}}}}}\n  - {{name: https, port: 8443, protocol: HTTPS, hostname: \"*.example.com\", tls: {{certificateRefs: [{{name: cert}}]}}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n  - {{name: tcp, port: 9000, protocol: TCP, allowedRoutes: {{namespaces: {{from: All}}}}}}\n"),
            format!("{GW}metadata: {{name: gw1, namespace: edge, generation: 2}}\nspec:\n  gatewayClassName: aether\n  allowedListeners: {{namespaces: {{from: All}}}}\n  listeners:\n  - {{name: http, port: 8080, protocol: HTTP, hostname: \"*.example.com\", allowedRoutes: {{namespaces: {{from: Selector, selector: {{matchLabels: {{team: a}}}}}}}}}}\n  - {{name: other, port: 8081, protocol: HTTP, allowedRoutes: {{namespaces: {{from: All}}}}}}\n"),
        ]),
        slot(vec![
            format!("{GW}metadata: {{name: gw2, namespace: apps}}\nspec:\n  gatewayClassName: aether\n  tls: {{backend: {{clientCertificateRef: {{name: client}}}}}}\n  listeners:\n  - {{name: http, port: 8080, protocol: HTTP, hostname: foo.example.com}}\n"),
            format!("{GW}metadata: {{name: gw2, namespace: apps, generation: 3}}\nspec:\n  gatewayClassName: aether\n  listeners:\n  - {{name: http, port: 8080, protocol: HTTP}}\n  - {{name: http2, port: 8080, protocol: HTTP, hostname: a.example.com}}\n"),
        ]),
        slot(vec![
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {name: ls1, namespace: edge}\nspec:\n  parentRef: {name: gw1}\n  listeners:\n  - {name: extra, port: 8090, protocol: HTTP, hostname: ls.example.com, allowedRoutes: {namespaces: {from: All}}}\n".into(),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {name: ls1, namespace: edge, generation: 2}\nspec:\n  parentRef: {name: gw1}\n  listeners:\n  - {name: extra, port: 8444, protocol: HTTPS, hostname: ls.example.com, tls: {certificateRefs: [{name: ls-cert}]}, allowedRoutes: {namespaces: {from: All}}}\n".into(),
        ]),
        slot(vec![
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: cert, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64(&crt), b64(&key)),
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: cert, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64("not a certificate"), b64(&key)),
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: cert, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64(&crt2), b64(&key2)),
        ]),
        // Named by ListenerSet ls1's HTTPS listener, gw2's backend client certificate
        // and nothing, in turn.
        slot(vec![
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: ls-cert, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64(&crt), b64(&key)),
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: ls-cert, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64(&crt2), b64(&key2)),
        ]),
        slot(vec![
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: client, namespace: apps}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64(&crt), b64(&key)),
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: client, namespace: apps}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64("not a certificate"), b64(&key)),
        ]),
        slot(vec![
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: unrelated, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64(&crt), b64(&key)),
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: unrelated, namespace: edge}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n", b64("not a certificate"), b64(&key)),
        ]),
        slot(vec![
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca, namespace: apps}}\ndata: {{ca.crt: \"{ca}\"}}\n"),
            // Unusable: the policy's backends then refuse to connect (which the
            // Snapshot shows; which roots a usable one trusts, it does not).
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ca, namespace: apps}\ndata: {ca.crt: not a certificate}\n".into(),
        ]),
        // Gateway gw1's frontend validation names it.
        slot(vec![
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: client-ca, namespace: edge}}\ndata: {{ca.crt: \"{ca}\"}}\n"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: client-ca, namespace: edge}\ndata: {ca.crt: not a certificate}\n".into(),
        ]),
        // Named by nothing: its changes must change nothing.
        slot(vec![
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: unrelated, namespace: apps}}\ndata: {{ca.crt: \"{ca}\"}}\n"),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: unrelated, namespace: apps, labels: {{v: \"2\"}}}}\ndata: {{ca.crt: \"{other_ca}\", other: x}}\n"),
        ]),
        slot(vec![
            "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: tls-b, namespace: apps}\nspec:\n  targetRefs: [{group: \"\", kind: Service, name: svc-b}]\n  validation: {hostname: b.example.com, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}]}\n".into(),
        ]),
        slot(vec![
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: allow-apps, namespace: other}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps}]\n  to: [{group: \"\", kind: Service}]\n".into(),
        ]),
        slot(vec![
            "apiVersion: v1\nkind: Pod\nmetadata: {name: pod-a, namespace: apps}\nspec: {serviceAccountName: sa-a, containers: []}\n".into(),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: pod-a, namespace: apps}\nspec: {serviceAccountName: sa-b, containers: []}\n".into(),
        ]),
    ];
    for (ns, svc) in [("apps", "svc-a"), ("apps", "svc-b"), ("other", "svc-c")] {
        slots.push(slot(vec![
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n"),
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: 80, appProtocol: kubernetes.io/h2c}}, {{name: alt, port: 81}}]}}\n"),
        ]));
        slots.push(slot(vec![
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {svc}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: IPv4\nports: [{{name: http, port: 9000}}]\nendpoints: [{{addresses: [\"127.0.0.5\"], targetRef: {{kind: Pod, name: pod-a}}}}]\n"),
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {svc}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: IPv4\nports: [{{name: http, port: 9001}}, {{name: alt, port: 9002}}]\nendpoints: [{{addresses: [\"127.0.0.6\", \"127.0.0.7\"]}}, {{addresses: [\"127.0.0.8\"], conditions: {{ready: false}}}}]\n"),
            // The same slice moved to another Service.
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {svc}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: svc-a}}}}\naddressType: IPv4\nports: [{{name: http, port: 9003}}]\nendpoints: [{{addresses: [\"127.0.0.9\"]}}]\n"),
        ]));
    }
    let parents = [
        "[{name: gw1, namespace: edge}]",
        "[{name: gw2}]",
        "[{name: gw1, namespace: edge, sectionName: https}, {name: gw2}]",
        "[{kind: ListenerSet, name: ls1, namespace: edge}]",
        "[{name: gw1, namespace: edge, port: 8081}]",
    ];
    let hostnames = [
        "[]",
        "[a.example.com]",
        "[foo.example.com, X.example.com]",
        "[\"*.example.com\"]",
    ];
    let backends = [
        "[{name: svc-a, port: 80}]",
        "[{name: svc-b, port: 80, weight: 2}, {name: svc-a, port: 80}]",
        "[{name: svc-c, namespace: other, port: 80}]",
        "[{name: missing, port: 80}]",
        "[{name: svc-a, port: 81}]",
    ];
    for r in 0..6 {
        let ns = if r % 3 == 2 { "edge" } else { "apps" };
        let mut variants = Vec::new();
        for v in 0..5 {
            let p = parents[(r + v) % parents.len()];
            let h = hostnames[(r * 3 + v) % hostnames.len()];
            let b = backends[(r + 2 * v) % backends.len()];
            let invalid = if (r + v) % 7 == 3 {
                ", {path: {type: PathPrefix, value: nope}}"
            } else {
                ""
            };
            variants.push(format!(
                "{ROUTE}metadata: {{name: r{r}, namespace: {ns}, generation: {v}, creationTimestamp: \"2026-01-0{}T00:00:00Z\"}}\nspec:\n  parentRefs: {p}\n  hostnames: {h}\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: /r{r}}}}}{invalid}]\n    backendRefs: {b}\n  - matches: [{{path: {{type: Exact, value: /exact}}, headers: [{{name: x-v, value: \"{v}\"}}]}}]\n    backendRefs: {b}\n",
                1 + (r + v) % 3
            ));
        }
        slots.push(slot(variants));
    }
    slots.push(slot(vec![
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g0, namespace: apps}\nspec:\n  parentRefs: [{name: gw1, namespace: edge}]\n  rules: [{matches: [{method: {service: echo.Echo}}], backendRefs: [{name: svc-a, port: 80}]}]\n".into(),
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g0, namespace: apps}\nspec:\n  parentRefs: [{name: gw2}]\n  hostnames: [foo.example.com]\n  rules: [{backendRefs: [{name: svc-b, port: 80}]}]\n".into(),
    ]));
    slots.push(slot(vec![
        "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {name: t0, namespace: apps}\nspec:\n  parentRefs: [{name: gw1, namespace: edge, sectionName: tcp}]\n  rules: [{backendRefs: [{name: svc-a, port: 80}]}]\n".into(),
    ]));
    slots
}

use crate::testing::settings;

fn addressings() -> Vec<Addressing> {
    vec![
        Addressing::LocalPool(settings().address_pool),
        Addressing::InternalPorts {
            range: "20000-20099".parse().unwrap(),
            service: ServiceSettings::shared(crate::ObjectKey::new("edge-system", "aether-edge")),
            bind: std::net::Ipv4Addr::UNSPECIFIED.into(),
        },
    ]
}

fn assert_same(incremental: &Outcome, full: &Outcome, context: &str) {
    let a = serde_json::to_value(&incremental.snapshot).unwrap();
    let b = serde_json::to_value(&full.snapshot).unwrap();
    assert!(
        a == b,
        "{context}: Snapshots differ\nincremental: {a:#}\nfull: {b:#}"
    );
    assert!(
        incremental.statuses == full.statuses,
        "{context}: statuses differ\nincremental: {:#?}\nfull: {:#?}",
        incremental.statuses.items(),
        full.statuses.items()
    );
    assert!(
        incremental.services == full.services,
        "{context}: Gateway Services differ"
    );
    assert_eq!(
        incremental.endpoint_interest, full.endpoint_interest,
        "{context}: endpoint interest differs"
    );
}

#[test]
fn incremental_equals_full_after_every_random_change() {
    let world = world();
    for addressing in addressings() {
        for seed in 0..24u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut store = Store::default();
            let mut present: Vec<Option<usize>> = vec![None; world.len()];
            // Start from a random half of the world, as a source's first load would.
            for (i, slot) in world.iter().enumerate() {
                if rng.bool() {
                    let v = rng.usize(..slot.variants.len());
                    store.apply(slot.variants[v].clone());
                    present[i] = Some(v);
                }
            }
            let mut reconciler = Reconciler::new(settings(), addressing.clone());
            for step in 0..60 {
                let i = rng.usize(..world.len());
                let slot = &world[i];
                let what = match present[i] {
                    Some(_) if rng.u8(..4) == 0 => {
                        let id: ObjectId = slot.variants[0].id();
                        store.remove(&id);
                        present[i] = None;
                        format!("delete {id}")
                    }
                    _ => {
                        let v = rng.usize(..slot.variants.len());
                        // Re-applying the same version replaces the Arc with an equal
                        // object: the reconciler must treat it as unchanged or changed,
                        // never as something else.
                        store.apply(slot.variants[v].clone());
                        present[i] = Some(v);
                        format!("apply {} v{v}", slot.variants[v].id())
                    }
                };
                let incremental = reconciler.reconcile(&store);
                let full = reconcile_with(&store, &settings(), &addressing);
                assert_same(
                    &incremental,
                    &full,
                    &format!("seed {seed} step {step} ({what})"),
                );
            }
        }
    }
}

/// A ConfigMap or TLS Secret nothing names, or a Namespace while no selector reads
/// labels, costs no route work, and a ConfigMap a BackendTLSPolicy names makes every
/// route compile again; an update that leaves what is read as it was is no change to
/// the Store at all (Kubernetes mode watches every ConfigMap, TLS Secret and Namespace
/// in the cluster).
#[test]
fn only_what_is_read_makes_routes_stale() {
    let world = world();
    let mut store = Store::default();
    for slot in &world {
        store.apply(slot.variants[0].clone());
    }
    let mut reconciler = Reconciler::new(settings(), addressings().remove(0));
    let first = reconciler.reconcile(&store);
    assert!(first.redone.compiled > 5, "{:?}", first.redone);
    let cm = |name: &str, extra: &str| {
        parse(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: apps{extra}}}\ndata: {{ca.crt: changed}}\n"
        ))
    };

    assert!(store.apply(cm("unrelated", "")));
    let outcome = reconciler.reconcile(&store);
    assert_eq!(
        (outcome.redone.compiled, outcome.redone.attached),
        (0, 0),
        "a ConfigMap nothing names"
    );
    assert!(
        !store.apply(cm("unrelated", ", resourceVersion: \"7\", labels: {a: b}")),
        "only the metadata changed"
    );

    let secret = world
        .iter()
        .find(|s| {
            s.variants[0]
                .id()
                .to_string()
                .contains("Secret edge/unrelated")
        })
        .expect("the world has a Secret nothing names");
    assert!(store.apply(secret.variants[1].clone()));
    let outcome = reconciler.reconcile(&store);
    assert_eq!(
        (outcome.redone.compiled, outcome.redone.attached),
        (0, 0),
        "a Secret nothing names"
    );

    let relabelled = "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps, labels: {team: b}}\n";
    assert!(store.apply(parse(relabelled)));
    let outcome = reconciler.reconcile(&store);
    assert_eq!(
        (outcome.redone.compiled, outcome.redone.attached),
        (0, 0),
        "a Namespace's labels while no listener selects by them"
    );
    let annotated = "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps, labels: {team: b}, annotations: {a: b}, resourceVersion: \"9\"}\nstatus: {phase: Active}\n";
    assert!(
        !store.apply(parse(annotated)),
        "only what is not read changed"
    );

    assert!(store.apply(cm("ca", "")));
    let outcome = reconciler.reconcile(&store);
    assert_eq!(
        outcome.redone.compiled, first.redone.compiled,
        "the policy's ConfigMap"
    );
}
