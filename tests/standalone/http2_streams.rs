//! HTTP/2 from clients: flow control on an upload larger than the edge's windows,
//! and a stream the client resets while its answer is pending, which must not cost
//! the connection's other streams.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::common::*;

/// Three times the edge's per-stream window (1 MiB): the upload stalls unless the edge
/// gives window back as the upstream reads.
const UPLOAD: usize = 3 << 20;

fn manifests(env: &TestEnv) -> TestResult {
    env.write_manifest("infra.yaml", &standard_infra(env.net))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "web",
            "edge",
            &["app.example.com"],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    Ok(())
}

async fn client(env: &TestEnv) -> Result<http2::SendRequest<Full<Bytes>>, BoxError> {
    let tcp = connect_from(env.net.client_ip(), env.net.gw()).await?;
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn request(
    path: &str,
    body: Bytes,
    delay_ms: Option<u64>,
) -> Result<http::Request<Full<Bytes>>, BoxError> {
    let mut b = http::Request::builder()
        .method(if body.is_empty() { "GET" } else { "POST" })
        .version(http::Version::HTTP_2)
        .uri(format!("http://app.example.com{path}"));
    if let Some(ms) = delay_ms {
        b = b.header("x-echo-delay-ms", ms.to_string());
    }
    Ok(b.body(Full::new(body))?)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_larger_than_the_window_arrives_whole() -> TestResult {
    let env = TestEnv::new()?;
    manifests(&env)?;
    let _echo = env.spawn_echo(env.net.echo_a(), "a").await?;
    let edge = env.spawn_edge("edge").await?;
    env.wait_listener(env.net.gw()).await?;

    let mut h2 = client(&env).await?;
    h2.ready().await?;
    let body = Bytes::from(vec![b'x'; UPLOAD]);
    let sent = h2.send_request(request("/upload", body, None)?);
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, sent)
        .await
        .map_err(|_| err("the upload stalled: no answer"))??;
    ensure!(resp.status() == 200, "status {}", resp.status());
    let answer = resp.into_body().collect().await?.to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&answer)?;
    ensure!(echo["method"] == "POST", "{echo}");
    // The access log counts what the upstream read of the client's body.
    let want = format!("request_bytes={UPLOAD}");
    eventually("the upload's access-log line", EVENTUALLY, || {
        let out = edge.stdout();
        let want = want.clone();
        async move {
            ensure!(
                out.lines()
                    .any(|l| l.contains("path=/upload") && l.contains(&want)),
                "no line with path=/upload and {want}:\n{out}"
            );
            Ok(())
        }
    })
    .await?;
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_reset_while_pending_leaves_the_connection_serving() -> TestResult {
    let env = TestEnv::new()?;
    manifests(&env)?;
    let _echo = env.spawn_echo(env.net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(env.net.gw()).await?;

    let mut h2 = client(&env).await?;
    h2.ready().await?;
    // Dropping the response future resets the stream (RST_STREAM CANCEL) while the
    // edge waits on the slow upstream.
    let slow = h2.send_request(request("/slow", Bytes::new(), Some(3_000))?);
    let _ = tokio::time::timeout(Duration::from_millis(300), slow).await;

    h2.ready().await?;
    let fast = h2.send_request(request("/after", Bytes::new(), None)?);
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, fast)
        .await
        .map_err(|_| err("no answer after the reset"))??;
    ensure!(resp.status() == 200, "status {}", resp.status());
    let answer = resp.into_body().collect().await?.to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&answer)?;
    ensure!(echo["path"] == "/after", "{echo}");
    env.pass()
}
