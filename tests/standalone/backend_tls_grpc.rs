//! BackendTLSPolicy on a GRPCRoute backend: a real gRPC client (tonic) calls through
//! the edge (h2c) to a real gRPC server (tonic-health) that serves only TLS; the edge
//! originates TLS with ALPN h2 and the policy's SNI, and status and trailers come back.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::codegen::Service as _;
use tonic::transport::Endpoint;
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::*;

/// A gRPC health server speaking only TLS (ALPN h2); records the SNI of each session.
async fn tls_health_server(
    addr: SocketAddr,
    leaf: &Leaf,
) -> Result<(JoinHandle<()>, Arc<Mutex<Vec<String>>>), BoxError> {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("aether.Test", ServingStatus::Serving)
        .await;
    let acceptor = leaf.acceptor(&[b"h2"])?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let snis: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&snis);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, service, seen) = (acceptor.clone(), service.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let (Some(sni), Ok(mut s)) = (tls.get_ref().1.server_name(), seen.lock()) {
                    s.push(sni.to_owned());
                }
                let svc = service_fn(move |req| {
                    let mut service = service.clone();
                    async move { service.call(req).await }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .http2_only()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok((task, snis))
}

fn manifests(net: Net, backend_addr: SocketAddr, ca: &TestCa) -> String {
    let mut m = edge_gateway(net);
    // No appProtocol: GRPCRoute backends are HTTP/2 regardless, so ALPN h2.
    m.push_str(&backend("default", "health", backend_addr, true));
    m.push_str(&ca_config_map("default", "grpc-ca", ca));
    m.push_str(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: health-tls, namespace: default}
spec:
  targetRefs: [{group: \"\", kind: Service, name: health}]
  validation:
    hostname: grpc.internal.example
    caCertificateRefs: [{group: \"\", kind: ConfigMap, name: grpc-ca}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: health, namespace: default}
spec:
  parentRefs: [{name: edge}]
  hostnames: [grpc.example.com]
  rules:
  - backendRefs: [{name: health, port: 80}]
",
    );
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_route_backend_is_reached_over_policy_tls_with_h2() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let ca = TestCa::new("grpc-ca")?;
    let backend_addr = net.addr(30, 50051);
    let (server, snis) =
        tls_health_server(backend_addr, &ca.leaf(&["grpc.internal.example"])?).await?;
    env.write_manifest("m.yaml", &manifests(net, backend_addr, &ca))?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let channel = Endpoint::from_shared(format!("http://{gw}"))?
        .origin("http://grpc.example.com".parse()?)
        .connect()
        .await?;
    let mut c = HealthClient::new(channel);
    let ok = eventually(
        "the call goes through",
        std::time::Duration::from_secs(10),
        || {
            let mut c = c.clone();
            async move {
                let r = c
                    .check(HealthCheckRequest {
                        service: "aether.Test".into(),
                    })
                    .await?;
                Ok(r.into_inner())
            }
        },
    )
    .await?;
    ensure!(ok.status == WireStatus::Serving as i32, "{ok:?}");
    // The server's error status (in trailers) arrives intact over the TLS hop.
    let missing = c
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .err()
        .ok_or("an unknown service was reported healthy")?;
    ensure!(missing.code() == Code::NotFound, "{missing:?}");
    let snis = snis.lock().map(|s| s.clone()).unwrap_or_default();
    ensure!(
        !snis.is_empty() && snis.iter().all(|s| s == "grpc.internal.example"),
        "SNIs the server saw: {snis:?}"
    );
    server.abort();
    env.pass()
}
