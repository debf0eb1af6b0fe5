//! `--workers N`: every worker has its own socket on each listener (SO_REUSEPORT, the
//! kernel spreads connections over them) and its own upstream pool. Seen from the
//! backend: sequential requests, each on a new client connection from its own source
//! port, arrive over exactly one upstream connection per worker, since a worker
//! reuses its own idle connection and no other worker can take it. With one worker,
//! that is one connection; with two, two (all forty client connections hashing to the
//! same socket has a chance of 2^-39).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::common::*;

const REQUESTS: usize = 40;
const HOST: &str = "workers.example.com";

/// An HTTP/1.1 keep-alive backend that records the source address of every
/// connection it accepts: one per upstream connection the edge opened.
async fn counting_backend(
    addr: SocketAddr,
) -> Result<(Arc<Mutex<HashSet<SocketAddr>>>, JoinHandle<()>), BoxError> {
    let listener = TcpListener::bind(addr).await?;
    let peers: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
    let seen = Arc::clone(&peers);
    let task = tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            if let Ok(mut p) = seen.lock() {
                p.insert(peer);
            }
            tokio::spawn(async move {
                let service = service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"counted"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Ok((peers, task))
}

/// Upstream connections the backend saw for `REQUESTS` sequential requests, each on a
/// new client connection, through an edge run with `--workers workers`.
async fn upstream_connections(workers: &str) -> Result<usize, BoxError> {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &single_route(net, &[HOST]))?;
    let (peers, backend) = counting_backend(net.echo_a()).await?;
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--workers", workers])
        .await?;
    // Its probes are answered by the edge itself (/aether/readyz), never upstream.
    env.wait_listener(net.gw()).await?;
    for i in 0..REQUESTS {
        let r = h1_get_from(net.client_ip(), net.gw(), HOST, &format!("/{i}")).await?;
        ensure!(
            r.status == 200 && r.text() == "counted",
            "request {i}: {} {:?}",
            r.status,
            r.text()
        );
    }
    let seen = peers.lock().map(|p| p.len()).unwrap_or_default();
    backend.abort();
    env.pass()?;
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_worker_reuses_one_upstream_connection() -> TestResult {
    let n = upstream_connections("1").await?;
    ensure!(n == 1, "{n} upstream connections for one worker");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_workers_keep_one_upstream_connection_each() -> TestResult {
    let n = upstream_connections("2").await?;
    ensure!(n == 2, "{n} upstream connections for two workers");
    Ok(())
}
