//! Graceful shutdown on SIGTERM / SIGINT.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::common::*;

fn slow_manifests(env: &TestEnv) -> TestResult {
    env.write_manifest("infra.yaml", &standard_infra(env.net))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "route-slow",
            "edge",
            &["slow.example.com"],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    Ok(())
}

/// Polls until a new TCP connection to `addr` is refused (or fails).
async fn wait_not_accepting(env: &TestEnv, addr: std::net::SocketAddr) -> TestResult {
    let src = env.net.client_ip();
    eventually(
        &format!("{addr} stops accepting"),
        EVENTUALLY,
        || async move {
            match h1_get_from(src, addr, "slow.example.com", "/aether/readyz").await {
                Err(_) => Ok(()),
                Ok(r) => Err(err(format!(
                    "a new connection was still served: {}",
                    r.status
                ))),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_in_flight_requests_and_exits_zero() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    slow_manifests(&env)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mut edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    // One keep-alive connection, proven to be served, then a slow request on it.
    let mut conn = H1Conn::connect(net.client_ip(), gw).await?;
    let e = conn.get("slow.example.com", "/fast").await?.echo()?;
    ensure!(e.name() == "a", "fast request went to {}", e.0);
    let sent = Instant::now();
    let slow = tokio::spawn(async move {
        let r = conn
            .send(
                "GET",
                "slow.example.com",
                "/slow",
                &[("x-echo-delay-ms", "1500")],
            )
            .await;
        (r, sent.elapsed())
    });
    // The same over h2c: a served connection, then a slow stream on it.
    let mut h2 = H2Conn::connect(net.client_ip(), gw).await?;
    let e = h2.get("slow.example.com", "/fast-h2").await?.echo()?;
    ensure!(e.name() == "a", "fast h2c request went to {}", e.0);
    let slow_h2 = tokio::spawn(async move {
        h2.send(
            "GET",
            "slow.example.com",
            "/slow-h2",
            &[("x-echo-delay-ms", "1500")],
        )
        .await
    });
    // And one that is idle: served, then nothing in flight.
    let mut idle = H1Conn::connect(net.client_ip(), gw).await?;
    let e = idle.get("slow.example.com", "/idle").await?.echo()?;
    ensure!(e.name() == "a", "idle connection's request went to {}", e.0);
    // Synchronisation only (not an assertion): let the requests reach the backend.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !slow.is_finished(),
        "the slow request finished before the signal"
    );

    edge.signal("TERM")?;
    let signalled = Instant::now();
    // Right after the signal the admin server is still up and says 503.
    let seen = eventually(
        "admin /readyz answers 503 while draining",
        EVENTUALLY,
        || async move {
            let r = admin_get(net, "/readyz").await?;
            ensure!(
                r.status == StatusCode::SERVICE_UNAVAILABLE,
                "admin /readyz answered {}",
                r.status
            );
            Ok(signalled.elapsed())
        },
    )
    .await?;
    eprintln!("admin /readyz answered 503 {seen:?} after SIGTERM");
    // Liveness stays green while draining, or a kubelet would kill the drain short.
    let live = admin_get(net, "/livez").await?;
    ensure!(
        live.status == StatusCode::OK,
        "admin /livez answered {} while draining",
        live.status
    );
    ensure!(
        edge.try_exit()?.is_none(),
        "the edge exited before the in-flight request finished"
    );
    // An idle keep-alive connection is closed when the drain starts, not cut at its
    // deadline (5 s after the signal): a client opens its next connection elsewhere.
    eventually(
        "the idle keep-alive connection is closed",
        Duration::from_secs(3),
        || {
            let closed = idle.is_closed();
            async move {
                ensure!(closed, "still open {:?} after SIGTERM", signalled.elapsed());
                Ok(())
            }
        },
    )
    .await?;

    wait_not_accepting(&env, gw).await?;

    let (resp, took) = slow.await?;
    let resp = resp.map_err(|e| {
        err(format!(
            "the in-flight request failed during the drain: {e}"
        ))
    })?;
    let e = resp.echo()?;
    ensure!(
        e.name() == "a" && e.path() == "/slow",
        "in-flight request answered {}",
        e.0
    );
    eprintln!("in-flight request completed after {took:?}");
    let resp = slow_h2.await?.map_err(|e| {
        err(format!(
            "the in-flight h2c request failed during the drain: {e}"
        ))
    })?;
    let e = resp.echo()?;
    ensure!(
        e.name() == "a" && e.path() == "/slow-h2",
        "in-flight h2c request answered {}",
        e.0
    );

    let st = edge.wait_exit(Duration::from_secs(10)).await?;
    eprintln!(
        "edge exited {:?} after SIGTERM with {st}",
        signalled.elapsed()
    );
    ensure!(
        st.code() == Some(0),
        "edge exit status after SIGTERM: {st} (expected code 0)"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_exits_zero_within_the_drain_timeout() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    slow_manifests(&env)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mut edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let mut conn = H1Conn::connect(net.client_ip(), gw).await?;
    let e = conn.get("slow.example.com", "/fast").await?.echo()?;
    ensure!(e.name() == "a", "fast request went to {}", e.0);
    // This request would take 30 s, longer than the 5 s --drain-timeout.
    let slow = tokio::spawn(async move {
        conn.send(
            "GET",
            "slow.example.com",
            "/very-slow",
            &[("x-echo-delay-ms", "30000")],
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    edge.signal("INT")?;
    let signalled = Instant::now();
    // Waits at most 25 s: the edge must exit before the 30 s request could finish,
    // which is what the 5 s --drain-timeout promises. No finer timing is asserted.
    let st = edge.wait_exit(Duration::from_secs(25)).await?;
    eprintln!(
        "edge exited {:?} after SIGINT with {st}",
        signalled.elapsed()
    );
    ensure!(
        st.code() == Some(0),
        "edge exit status after SIGINT: {st} (expected code 0)"
    );
    // The request outlived the drain deadline: its connection was closed, not answered.
    let cut = slow.await?;
    ensure!(
        cut.is_err(),
        "the over-deadline request was answered instead of cut: {:?}",
        cut.map(|r| r.status)
    );
    let r = h1_get_from(net.client_ip(), gw, "slow.example.com", "/fast").await;
    ensure!(
        r.is_err(),
        "the listener still answers after exit: {:?}",
        r.map(|r| r.status)
    );
    env.pass()
}
