//! HTTP/2 from clients: flow control on an upload larger than the edge's windows,
//! and a stream the client resets while its answer is pending, which must not cost
//! the connection's other streams.

use std::time::Duration;

use bytes::Bytes;

use crate::common::*;

/// Three times the edge's per-stream window (1 MiB): the upload stalls unless the edge
/// gives window back as the upstream reads.
const UPLOAD: usize = 3 << 20;

const HOST: &str = "app.example.com";

async fn served(env: &TestEnv) -> Result<(Proc, Proc), BoxError> {
    env.write_manifest("m.yaml", &single_route(env.net, &[HOST]))?;
    let echo = env.spawn_echo(env.net.echo_a(), "a").await?;
    let edge = env.spawn_edge("edge").await?;
    env.wait_listener(env.net.gw()).await?;
    Ok((echo, edge))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_larger_than_the_window_arrives_whole() -> TestResult {
    let env = TestEnv::new()?;
    let (_echo, edge) = served(&env).await?;

    let mut h2 = H2Conn::connect(env.net.client_ip(), env.net.gw()).await?;
    let body = Bytes::from(vec![b'x'; UPLOAD]);
    let r = h2.send_body("POST", HOST, "/upload", &[], body).await?;
    ensure!(r.status == 200, "status {}", r.status);
    let echo = r.echo()?;
    ensure!(echo.method() == "POST", "{}", echo.0);
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
    let (_echo, _edge) = served(&env).await?;

    let mut h2 = H2Conn::connect(env.net.client_ip(), env.net.gw()).await?;
    // Dropping the pending request resets its stream (RST_STREAM CANCEL) while the
    // edge waits on the slow upstream.
    let slow = h2.send("GET", HOST, "/slow", &[("x-echo-delay-ms", "3000")]);
    let _ = tokio::time::timeout(Duration::from_millis(300), slow).await;

    let r = h2.get(HOST, "/after").await?;
    ensure!(r.status == 200, "status {}", r.status);
    let echo = r.echo()?;
    ensure!(echo.path() == "/after", "{}", echo.0);
    env.pass()
}
