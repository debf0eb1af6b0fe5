//! GRPCRoute end to end: a real gRPC client (tonic) calls a real gRPC server (the
//! standard grpc.health.v1 service, tonic-health) through the edge over h2c, routed by
//! service and method; gRPC status, message and trailers arrive as the server sent
//! them, and what the edge itself refuses reaches the client as a gRPC status.

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::*;

/// A gRPC health server on `addr` reporting `aether.Test` as SERVING; stops when the
/// returned sender is dropped.
async fn health_server(addr: SocketAddr) -> Result<oneshot::Sender<()>, BoxError> {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("aether.Test", ServingStatus::Serving)
        .await;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await;
    });
    Ok(stop)
}

/// A client that connects to the edge at `gw` and says `host` in `:authority`.
async fn client(gw: SocketAddr, host: &str) -> Result<HealthClient<Channel>, BoxError> {
    let channel = Endpoint::from_shared(format!("http://{gw}"))?
        .origin(format!("http://{host}").parse()?)
        .connect()
        .await?;
    Ok(HealthClient::new(channel))
}

fn manifests(net: Net, grpc_backend: SocketAddr) -> String {
    let mut m = edge_gateway(net);
    // No appProtocol: GRPCRoute backends are HTTP/2 regardless.
    m.push_str(&backend("default", "health", grpc_backend, true));
    m.push_str(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: health
  namespace: default
spec:
  parentRefs: [{name: edge}]
  hostnames: [grpc.example.com]
  rules:
  - matches:
    - method: {service: grpc.health.v1.Health, method: Check}
    backendRefs: [{name: health, port: 80}]
",
    );
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_calls_are_routed_by_method_with_status_and_trailers_intact() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let backend_addr = net.addr(30, 50051);
    let _server = health_server(backend_addr).await?;
    env.write_manifest("m.yaml", &manifests(net, backend_addr))?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    // The routed method reaches the server; its answer comes back whole.
    let mut c = client(gw, "grpc.example.com").await?;
    let ok = c
        .check(HealthCheckRequest {
            service: "aether.Test".into(),
        })
        .await?;
    ensure!(
        ok.get_ref().status == WireStatus::Serving as i32,
        "health status {:?}",
        ok.get_ref()
    );
    // An error status the server sends in its trailers arrives as sent.
    let missing = c
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await;
    let status = missing
        .err()
        .ok_or("an unknown service was reported healthy")?;
    ensure!(
        status.code() == Code::NotFound,
        "expected the server's NOT_FOUND, got {status:?}"
    );
    // A method no rule matches: the edge answers in gRPC terms (UNIMPLEMENTED).
    let watch = c
        .watch(HealthCheckRequest {
            service: "aether.Test".into(),
        })
        .await;
    let status = watch
        .err()
        .ok_or("Watch was routed though no rule matches it")?;
    // gRPC clients map a bare HTTP 404 to UNIMPLEMENTED too; the message shows the
    // edge answered with a real grpc-status.
    ensure!(
        status.code() == Code::Unimplemented && status.message() == "no route",
        "expected UNIMPLEMENTED \"no route\" from the edge, got {status:?}"
    );
    // So is a host no route serves.
    let mut other = client(gw, "other.example.com").await?;
    let status = other
        .check(HealthCheckRequest::default())
        .await
        .err()
        .ok_or("a call for another host was routed")?;
    ensure!(
        status.code() == Code::Unimplemented && status.message() == "no route",
        "got {status:?}"
    );

    // Status: the route is accepted as a GRPCRoute; HTTP listeners list the kind.
    let st = env.status().await?;
    let route = status_item(&st, "GRPCRoute", "default", "health")?;
    let parent = route_parent(route, "edge", None)?;
    expect_condition(&parent["conditions"], "Accepted", "True", Some("Accepted"))?;
    expect_condition(&parent["conditions"], "ResolvedRefs", "True", None)?;
    let gateway = status_item(&st, "Gateway", "default", "edge")?;
    let listener = gateway_listener(gateway, "http")?;
    ensure!(
        listener["attachedRoutes"] == 1,
        "attachedRoutes {}",
        listener["attachedRoutes"]
    );
    let kinds: Vec<&str> = listener["supportedKinds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k["kind"].as_str())
        .collect();
    ensure!(
        kinds == ["HTTPRoute", "GRPCRoute"],
        "supportedKinds {kinds:?}"
    );
    env.pass()
}
