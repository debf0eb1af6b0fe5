//! Criterion benchmark of an access-log line as a worker pays for it (issue 16: logging
//! within 5% of not logging): starting a request's record, and rendering its line in
//! text and JSON, for a forwarded HTTP/2 request with the fields a load generator
//! sends. The listener and rule come from a Snapshot the real reconciler built.
//!
//! `cargo bench --bench access_log`.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use aether_controller::{Settings, Store, manifest, reconcile};
use aether_proxy::access_log::{self, AccessLog, BenchLines, Format, HttpRecord};
use aether_proxy::http::ConnInfo;
use aether_proxy::upstream::{UpstreamSettings, Upstreams};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Method, Request, Version};

const MANIFESTS: &str = "\
apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: aether}\nspec: {controllerName: aether.io/edge}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: bench, namespace: default}\n\
spec: {gatewayClassName: aether, listeners: [{name: http, port: 8080, protocol: HTTP}]}\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: default}\nspec: {ports: [{name: http, port: 80}]}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: svc-1, namespace: default, labels: {kubernetes.io/service-name: svc}}\n\
addressType: IPv4\nports: [{name: http, port: 9000}]\nendpoints: [{addresses: [127.0.0.1]}]\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: bench, namespace: default}\n\
spec: {parentRefs: [{name: bench}], rules: [{backendRefs: [{name: svc, port: 80}]}]}\n";

/// The request h2load sends, as the edge has it after giving it a request ID.
fn request() -> Request<http_body_util::Empty<bytes::Bytes>> {
    let mut req = Request::builder()
        .version(Version::HTTP_2)
        .method(Method::GET)
        .uri("http://127.0.0.1:28401/bench")
        .header("user-agent", "h2load nghttp2/1.52.0")
        .body(http_body_util::Empty::new())
        .unwrap_or_else(|e| panic!("{e}"));
    aether_proxy::trace::ensure_request_id(req.headers_mut());
    req
}

fn lines(c: &mut Criterion) {
    let parsed = manifest::parse(Path::new("bench.yaml"), MANIFESTS);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    let settings = Settings {
        controller_name: "aether.io/edge".into(),
        address_pool: "127.0.1.0/24".parse().unwrap_or_else(|e| panic!("{e}")),
    };
    let snapshot = reconcile(&Store::from_objects(parsed.objects), &settings).snapshot;
    let listener = snapshot
        .listeners
        .values()
        .next()
        .cloned()
        .unwrap_or_else(|| panic!("no listener"));
    let rule = listener
        .routes
        .virtual_host("127.0.0.1:28401")
        .and_then(|vh| vh.find(&Method::GET, "/bench", None, &HeaderMap::new()))
        .map(|e| Arc::clone(&e.action))
        .unwrap_or_else(|| panic!("no rule"));
    let log = AccessLog::start(access_log::Settings::DEFAULT, Box::new(std::io::sink()))
        .unwrap_or_else(|e| panic!("{e}"));
    let conn = ConnInfo::new(
        "127.0.0.1:28401".parse().unwrap_or_else(|e| panic!("{e}")),
        "127.0.0.1:51234".parse().unwrap_or_else(|e| panic!("{e}")),
        Arc::new(Upstreams::new(&UpstreamSettings::default(), None)),
    );
    let req = request();
    let id = req
        .headers()
        .get("x-request-id")
        .map(HeaderValue::as_bytes)
        .unwrap_or_default()
        .to_vec();
    let upstream = "127.0.0.1:28400".parse().unwrap_or_else(|e| panic!("{e}"));
    let record = || -> Box<HttpRecord> {
        let mut r = access_log::begin_http(Some(log), &conn, &req, &id, 0, Instant::now())
            .unwrap_or_else(|| panic!("not sampled"));
        r.answered_for_bench(&listener, &rule, upstream, 24);
        r
    };

    let mut g = c.benchmark_group("access_log");
    g.throughput(Throughput::Elements(1));
    g.bench_function("record", |b| b.iter(|| drop(black_box(record()))));
    for (name, format) in [("text", Format::Text), ("json", Format::Json)] {
        let r = record();
        let mut out = BenchLines::new();
        g.bench_function(format!("render_{name}"), |b| {
            b.iter(|| black_box(out.render(black_box(&r), format)).len())
        });
    }
    g.finish();
}

criterion_group!(benches, lines);
criterion_main!(benches);
