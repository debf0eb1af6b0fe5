//! Plain mode (no mesh), rules without a `retry`: a request whose upstream connect
//! fails before any byte was sent goes to another endpoint once, so a
//! refusing or dying endpoint costs clients nothing but the requests in flight on it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;

/// `svc` with two endpoints: echo "a" and `dead`, where nothing listens.
fn two_endpoints(net: Net, second: SocketAddr) -> String {
    let mut m = single_route(net, &["retry.example"]);
    m.push_str(&format!(
        "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-second
  namespace: default
  labels:
    kubernetes.io/service-name: svc
addressType: IPv4
ports:
- name: http
  port: {}
endpoints:
- addresses: [\"{}\"]
  conditions:
    ready: true
",
        second.port(),
        second.ip()
    ));
    m
}

/// `clients` keep-alive clients sending `per_client` GETs each; returns (ok, failures).
async fn load(
    net: Net,
    clients: usize,
    per_client: usize,
) -> Result<(usize, Vec<String>), BoxError> {
    let mut workers = Vec::new();
    for _ in 0..clients {
        let mut c = H1Conn::connect(net.client_ip(), net.gw()).await?;
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0usize, Vec::new());
            for _ in 0..per_client {
                match c.get("retry.example", "/").await {
                    Ok(r) if r.status == http::StatusCode::OK => ok += 1,
                    Ok(r) => failed.push(format!("{} {}", r.status, r.text())),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        }));
    }
    let (mut ok, mut failed) = (0, Vec::new());
    for w in workers {
        let (o, f) = w.await?;
        ok += o;
        failed.extend(f);
    }
    Ok((ok, failed))
}

fn retries(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("aether_upstream_retries_total{")
                && l.contains("reason=\"connect_error\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_mode_retries_a_refused_connect_on_another_endpoint() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &two_endpoints(net, net.addr(253, ECHO_PORT)))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mut edge = env.spawn_edge("edge").await?;
    env.wait_listener(net.gw()).await?;

    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 250;
    let started = Instant::now();
    let (ok, failed) = load(net, CLIENTS, PER_CLIENT).await?;
    eprintln!(
        "{} requests in {:?}, {} failed",
        ok + failed.len(),
        started.elapsed(),
        failed.len()
    );
    ensure!(
        failed.is_empty() && ok == CLIENTS * PER_CLIENT,
        "{} of {} requests failed: {:?}",
        failed.len(),
        CLIENTS * PER_CLIENT,
        failed.iter().take(5).collect::<Vec<_>>()
    );
    let seen = env
        .echo_requests("a")?
        .iter()
        .filter(|e| e.host() == "retry.example")
        .count();
    ensure!(seen == ok, "echo a saw {seen} requests for {ok} answers");
    let n = retries(&metrics_text(net).await?);
    // Round robin sends every other request to the refusing endpoint until passive
    // health ejects it after 5 consecutive failures.
    ensure!(
        n >= 5,
        "aether_upstream_retries_total{{reason=connect_error}} is {n}"
    );
    ensure!(edge.log().contains("endpoint ejected"), "not ejected");
    edge.check_alive()?;
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_mode_endpoint_killed_under_load_costs_only_requests_in_flight() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &two_endpoints(net, net.echo_b()))?;
    let _echo_a = env.spawn_echo(net.echo_a(), "a").await?;
    let echo_b = env.spawn_echo(net.echo_b(), "b").await?;
    // Two workers: each has its own pool, so a pooled connection to b may still look
    // open to one of them when b is gone. Such a request is sent again on a new
    // connection (stale_connection.rs), so the bound below holds with any worker count.
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--workers", "2"])
        .await?;
    env.wait_listener(net.gw()).await?;

    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 1500;
    let started = Instant::now();
    let run = tokio::spawn(load(net, CLIENTS, PER_CLIENT));
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(echo_b);
    let (ok, failed) = run.await??;
    let total = ok + failed.len();
    eprintln!(
        "{total} requests in {:?}, {} failed: {:?}",
        started.elapsed(),
        failed.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    ensure!(total == CLIENTS * PER_CLIENT, "{total} requests");
    // Each client has one request in flight when b dies: only those may fail, and
    // only those on a connection b never answered on (a GET that was sent on a reused
    // one is sent again; a new connection's failure is not a stale pool's).
    ensure!(
        failed.len() <= CLIENTS,
        "{} of {total} requests failed: {:?}",
        failed.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    let b_seen = env.echo_requests("b")?.len();
    ensure!(b_seen > 10, "b saw only {b_seen} requests before the kill");
    env.pass()
}

/// A chunked request body (no length known up front), so the edge cannot buffer it
/// for replay: `n` frames of 1 KiB.
struct Chunked(usize);

impl hyper::body::Body for Chunked {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        let chunk = bytes::Bytes::from(vec![b'x'; 1024]);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
    }
}

/// Connecting consumes no request, so a refused connect is retried on the other
/// endpoint even for a request whose body streams.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connect_is_retried_for_a_streamed_body_too() -> TestResult {
    use http_body_util::BodyExt;

    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &two_endpoints(net, net.addr(253, ECHO_PORT)))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(net.gw()).await?;

    const REQUESTS: usize = 6;
    let stream = connect_from(net.client_ip(), net.gw()).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    for i in 0..REQUESTS {
        // The echo's simulated answer (201 on the first request of a uuid) reads the
        // whole body first, and counts the requests of the uuid it received.
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("/?uuid=stream-{i}&responseCode=201&succeedAfter=1"))
            .header("host", "retry.example")
            .body(Chunked(4))?;
        sender.ready().await?;
        let resp =
            tokio::time::timeout(Duration::from_secs(10), sender.send_request(req)).await??;
        let status = resp.status();
        let attempt = resp
            .headers()
            .get("x-echo-attempt")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let text = resp.into_body().collect().await?.to_bytes();
        ensure!(
            (status.as_u16(), attempt.as_str()) == (201, "1"),
            "POST {i}: {status}, attempt {attempt:?}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    let n = retries(&metrics_text(net).await?);
    // Round robin sends every other request to the refusing endpoint first.
    ensure!(
        n >= 2,
        "aether_upstream_retries_total{{reason=connect_error}} is {n}"
    );
    env.pass()
}
