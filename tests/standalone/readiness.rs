//! Admin `/readyz` says ready only once the first configuration is applied. The admin
//! server answers from the first milliseconds of the process, before the manifests are
//! read; a 200 then told a takeover (or a load balancer) to send traffic to listeners
//! that were not bound yet.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::common::*;

/// Routes beside the one served: the first reconcile takes a while, which is the
/// window the check must not say ready in.
const EXTRA_ROUTES: usize = 300;

#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_503_until_the_first_configuration_listens() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    let mut manifest = single_route(net, &["ready.example.com"]);
    for i in 0..EXTRA_ROUTES {
        manifest.push_str(&route(
            "default",
            &format!("extra-{i}"),
            "edge",
            &[&format!("h{i}.example.com")],
            &[("PathPrefix", "/", "svc")],
        ));
    }
    env.write_manifest("m.yaml", &manifest)?;
    let mut edge = env.spawn(
        "edge",
        &[
            "run".to_owned(),
            "--manifests".to_owned(),
            env.manifests().display().to_string(),
            "--admin".to_owned(),
            net.admin().to_string(),
            "--address-pool".to_owned(),
            net.pool(),
        ],
    )?;

    // From process start, as fast as a prober could: the first 200 must mean the
    // listener is there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut refused, mut not_ready) = (0u32, 0u32);
    loop {
        edge.check_alive()?;
        match admin_get(net, "/readyz").await {
            Ok(r) if r.status == StatusCode::OK => break,
            Ok(r) => {
                ensure!(
                    r.status == StatusCode::SERVICE_UNAVAILABLE,
                    "admin /readyz answered {}",
                    r.status
                );
                not_ready += 1;
            }
            // The admin server is not bound yet.
            Err(_) => refused += 1,
        }
        ensure!(
            Instant::now() < deadline,
            "admin /readyz never said ready ({refused} refused, {not_ready} not ready)"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eprintln!("before ready: {refused} connections refused, {not_ready} answers 503");
    // At once, no retry: the listener must already answer.
    let r = h1_get_from(net.client_ip(), gw, "readyz.test", "/aether/readyz")
        .await
        .map_err(|e| err(format!("ready, but the listener {gw} did not answer: {e}")))?;
    ensure!(
        r.status == StatusCode::OK,
        "listener /aether/readyz: {}",
        r.status
    );
    env.pass()
}
