//! Criterion benchmarks of the hot and warm paths: route lookup at 100, 1,000 and
//! 10,000 HTTPRoutes over up to 1,000 hostnames; a full reconcile + Snapshot build of
//! 10,000 routes; the incremental reconcile of a one-route change at 100, 1,000 and
//! 10,000 routes (flat is the goal); header filter application; the Snapshot swap.
//!
//! `cargo bench --bench routing`. Routes are built through the real reconciler from
//! generated manifests, so the tables measured are the ones the proxy serves.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use aether_controller::{Object, Reconciler, Settings, Store, manifest, reconcile};
use aether_proxy::Snapshot;
use aether_proxy::filters::HeaderModifier;
use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName, HeaderValue, Method};

const HOSTS: usize = 1_000;

/// `routes` HTTPRoutes over `min(routes, HOSTS)` hostnames; a third each of Exact,
/// PathPrefix, and PathPrefix + header matches.
fn manifests(routes: usize) -> String {
    let mut y = String::from(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: aether}\nspec: {controllerName: aether.io/edge}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: default}\n\
         spec: {gatewayClassName: aether, listeners: [{name: http, port: 8080, protocol: HTTP}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: default}\nspec: {ports: [{name: http, port: 80}]}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: svc-1, namespace: default, labels: {kubernetes.io/service-name: svc}}\n\
         addressType: IPv4\nports: [{name: http, port: 9000}]\nendpoints: [{addresses: [127.0.0.1]}]\n",
    );
    for i in 0..routes {
        let host = i % HOSTS.min(routes);
        let m = match i % 3 {
            0 => format!("{{path: {{type: Exact, value: /svc{i}/exact}}}}"),
            1 => format!("{{path: {{type: PathPrefix, value: /svc{i}}}}}"),
            _ => format!(
                "{{path: {{type: PathPrefix, value: /svc{i}}}, headers: [{{name: x-tenant, value: t{i}}}]}}"
            ),
        };
        y.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{i}, namespace: default}}\n\
             spec: {{parentRefs: [{{name: gw}}], hostnames: [h{host}.example.com], rules: [{{matches: [{m}], backendRefs: [{{name: svc, port: 80}}]}}]}}\n"
        ));
    }
    y
}

fn store(routes: usize) -> Store {
    let parsed = manifest::parse(Path::new("bench.yaml"), &manifests(routes));
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    Store::from_objects(parsed.objects)
}

fn settings() -> Settings {
    Settings {
        controller_name: "aether.io/edge".into(),
        address_pool: "127.0.1.0/24".parse().unwrap_or_else(|e| panic!("{e}")),
    }
}

/// Requests spread over every route: (host, path, headers).
fn requests(routes: usize) -> Vec<(String, String, HeaderMap)> {
    (0..routes)
        .step_by((routes / 256).max(1))
        .map(|i| {
            let host = format!("h{}.example.com", i % HOSTS.min(routes));
            let mut headers = HeaderMap::new();
            let path = match i % 3 {
                0 => format!("/svc{i}/exact"),
                1 => format!("/svc{i}/some/deeper/path"),
                _ => {
                    headers.insert(
                        "x-tenant",
                        HeaderValue::try_from(format!("t{i}")).unwrap_or_else(|e| panic!("{e}")),
                    );
                    format!("/svc{i}/x")
                }
            };
            (host, path, headers)
        })
        .collect()
}

fn route_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_lookup");
    for routes in [100usize, 1_000, 10_000] {
        let snapshot = reconcile(&store(routes), &settings()).snapshot;
        let listener = snapshot
            .listeners
            .values()
            .next()
            .unwrap_or_else(|| panic!("no listener"));
        let reqs = requests(routes);
        // Every generated request must find its route, or the bench measures misses.
        for (h, p, hd) in &reqs {
            let found = listener
                .routes
                .virtual_host(h)
                .and_then(|vh| vh.find(&Method::GET, p, None, hd));
            assert!(found.is_some(), "{h}{p} did not match");
        }
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(BenchmarkId::from_parameter(routes), &reqs, |b, reqs| {
            let mut i = 0usize;
            b.iter(|| {
                let (h, p, hd) = &reqs[i % reqs.len()];
                i += 1;
                black_box(
                    listener
                        .routes
                        .virtual_host(black_box(h))
                        .and_then(|vh| vh.find(&Method::GET, p, None, hd))
                        .is_some(),
                )
            });
        });
    }
    group.finish();
}

fn reconcile_10k(c: &mut Criterion) {
    let store = store(10_000);
    let settings = settings();
    let mut group = c.benchmark_group("reconcile");
    group.sample_size(10);
    // The reference function: build everything, then free the memo and the Snapshot.
    group.bench_function("10000_routes", |b| {
        b.iter(|| black_box(reconcile(&store, &settings).snapshot.listeners.len()))
    });
    // What the first load pays: a fresh Reconciler builds everything and keeps its
    // memo; freeing it (a quarter of the above, glibc coalescing 10,000 routes' worth
    // of chunks) is left outside the timing, as a running edge never pays it. Criterion
    // black-boxes what the routine returns.
    group.bench_function("10000_routes_first_load", |b| {
        b.iter_with_large_drop(|| {
            let mut reconciler = Reconciler::standalone(settings.clone());
            let outcome = reconciler.reconcile(&store);
            (reconciler, outcome)
        })
    });
    // A change that compiles every route again in a running edge (a ReferenceGrant:
    // routes and listeners read them; Pods, BackendTLSPolicies and the ConfigMaps
    // those name alike): the old routes are replaced, and what that costs before the
    // new Snapshot is out counts.
    let mut store = store;
    let mut reconciler = Reconciler::standalone(settings.clone());
    drop(reconciler.reconcile(&store));
    let versions = [grant("a"), grant("b")];
    let mut flip = 0;
    group.bench_function("10000_routes_recompile", |b| {
        b.iter_with_large_drop(|| {
            flip ^= 1;
            store.apply(versions[flip].clone());
            reconciler.reconcile(&store)
        })
    });
    // A ConfigMap nothing names (Kubernetes mode watches every one in the cluster):
    // no route is compiled again.
    let versions = [config_map("a"), config_map("b")];
    group.bench_function("10000_routes_unnamed_config_map", |b| {
        b.iter_with_large_drop(|| {
            flip ^= 1;
            store.apply(versions[flip].clone());
            reconciler.reconcile(&store)
        })
    });
    group.finish();
}

/// A ReferenceGrant whose `from` namespace a change flips.
fn grant(namespace: &str) -> Object {
    let text = format!(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{name: g, namespace: default}}\n\
         spec: {{from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {namespace}}}], to: [{{group: \"\", kind: Service}}]}}\n"
    );
    let mut parsed = manifest::parse(Path::new("grant.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    parsed.objects.remove(0)
}

/// A ConfigMap whose content a change flips.
fn config_map(value: &str) -> Object {
    let text = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca, namespace: default}}\ndata: {{ca.crt: {value}}}\n"
    );
    let mut parsed = manifest::parse(Path::new("ca.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    parsed.objects.remove(0)
}

/// One HTTPRoute that a change flips between two paths.
fn changing_route(path: &str) -> Object {
    let text = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: changing, namespace: default}}\n\
         spec: {{parentRefs: [{{name: gw}}], hostnames: [changing.example.com], rules: [{{matches: [{{path: {{type: PathPrefix, value: {path}}}}}], backendRefs: [{{name: svc, port: 80}}]}}]}}\n"
    );
    let mut parsed = manifest::parse(Path::new("change.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    parsed.objects.remove(0)
}

/// A one-route change through a long-lived Reconciler: the cost of what the change
/// touches, which should not grow with the routes it leaves alone.
fn route_change(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_change");
    group.sample_size(20);
    for routes in [100, 1_000, 10_000] {
        let mut store = store(routes);
        let mut reconciler = Reconciler::standalone(settings());
        let versions = [changing_route("/a"), changing_route("/b")];
        store.apply(versions[0].clone());
        drop(reconciler.reconcile(&store));
        let mut flip = 0;
        group.bench_function(BenchmarkId::from_parameter(routes), |b| {
            b.iter(|| {
                flip ^= 1;
                store.apply(versions[flip].clone());
                black_box(reconciler.reconcile(&store).snapshot.listeners.len())
            })
        });
    }
    group.finish();
}

fn header_filter(c: &mut Criterion) {
    let m = HeaderModifier {
        set: vec![(
            HeaderName::from_static("x-env"),
            HeaderValue::from_static("prod"),
        )],
        add: vec![(
            HeaderName::from_static("x-trace"),
            HeaderValue::from_static("edge"),
        )],
        remove: vec![HeaderName::from_static("x-internal")],
    };
    let mut base = HeaderMap::new();
    for (k, v) in [
        ("host", "a.example.com"),
        ("user-agent", "bench"),
        ("accept", "*/*"),
        ("x-internal", "1"),
    ] {
        base.insert(k, HeaderValue::from_static(v));
    }
    c.bench_function("header_filter_apply", |b| {
        b.iter_batched_ref(
            || base.clone(),
            |h| m.apply(h),
            criterion::BatchSize::SmallInput,
        )
    });
}

fn snapshot_swap(c: &mut Criterion) {
    let swap = ArcSwap::from_pointee(Snapshot::default());
    let next = Arc::new(Snapshot::default());
    c.bench_function("snapshot_load", |b| {
        b.iter(|| black_box(swap.load().generation))
    });
    c.bench_function("snapshot_store", |b| {
        b.iter(|| swap.store(Arc::clone(&next)))
    });
}

criterion_group!(
    benches,
    route_lookup,
    reconcile_10k,
    route_change,
    header_filter,
    snapshot_swap
);
criterion_main!(benches);
