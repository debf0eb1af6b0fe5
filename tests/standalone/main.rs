//! End-to-end tests of the `aether-edge` binary: each test starts the real binary (and
//! echo backends) on a loopback network of its own (127.77.k.0/24, `Net::allocate`) and talks real HTTP/1.1 and
//! h2c to it.

// clippy.toml's allow-unwrap-in-tests covers #[test] functions only; this crate's
// helpers (outside them) may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

mod access_log;
mod backend_client_cert;
mod backend_tls;
mod backend_tls_grpc;
mod body_limit;
mod cases;
mod chaos;
mod client_certs;
mod conflicts;
mod dashboard;
mod forwarded;
mod gateways;
mod grpc;
mod h2spec;
mod http2_streams;
mod https;
mod image;
mod l4_pool;
mod l4_tcp;
mod l4_udp;
mod limits;
mod listenerset;
mod mesh;
mod mesh_health;
mod mesh_pool;
mod mesh_rotation;
mod metrics;
mod metrics_gateways;
mod metrics_lint;
mod metrics_route_latency;
mod ops;
mod readiness;
mod relay;
mod reload;
mod resumption;
mod retry;
mod retry_body;
mod routing;
mod shutdown;
mod stale_connection;
mod status;
mod takeover;
mod tls_mixed;
mod tls_passthrough;
mod tls_terminate;
mod traces;
mod upgrade;
mod upstream_connect;
mod websocket;
mod websocket_h2;
mod workers;
