//! `--upstream-connect-timeout`: a backend whose TCP handshake never completes costs a
//! request the configured time, not the default 5 s.

use std::time::{Duration, Instant};

use tokio::net::{TcpSocket, TcpStream};

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_that_never_accepts_costs_the_configured_connect_timeout() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    // The only endpoint listens with a backlog of 0 and never accepts: once the test's
    // own connections fill its accept queue, the kernel drops every further SYN, so a
    // connect neither succeeds nor is refused.
    let socket = TcpSocket::new_v4()?;
    // As std's and tokio's listeners do: without it the bind fails while an earlier
    // test binary's connections to this address sit in TIME_WAIT (CI lost a run to
    // "address already in use" here).
    socket.set_reuseaddr(true)?;
    socket
        .bind(net.echo_a())
        .map_err(|e| err(format!("binding the jammed backend {}: {e}", net.echo_a())))?;
    let _jammed = socket.listen(0)?;
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        let connect = connect_from(net.client_ip(), net.echo_a());
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_millis(300), connect).await {
            held.push(s);
        }
    }
    let probe = connect_from(net.client_ip(), net.echo_a());
    ensure!(
        tokio::time::timeout(Duration::from_millis(500), probe)
            .await
            .is_err(),
        "the backend is not jammed: a connect finished (held {})",
        held.len()
    );

    env.write_manifest("m.yaml", &single_route(net, &[]))?;
    let _edge = env
        .spawn_edge_args(
            "edge",
            &[env.manifests()],
            &["--upstream-connect-timeout", "300ms"],
        )
        .await?;
    env.wait_listener(net.gw()).await?;

    let mut client = H1Conn::connect(net.client_ip(), net.gw()).await?;
    let started = Instant::now();
    let answer = client.get("app.example.com", "/").await?;
    let took = started.elapsed();
    ensure!(
        answer.status == 503,
        "status {} ({})",
        answer.status,
        answer.text()
    );
    // One connect, and at most one more to another endpoint: well under the default's
    // 5 s, which a flag that changed nothing would take.
    ensure!(took < Duration::from_secs(3), "the answer took {took:?}");
    Ok(())
}
