//! x-forwarded-for / x-forwarded-proto: a client can't make the backend trust more of
//! the chain than `--xff-trusted-hops` allows.

use crate::common::*;

/// What the backend saw for a request whose client claims a forwarding chain and https.
async fn seen_with_spoofed_chain(env: &TestEnv) -> Result<(String, String), BoxError> {
    let mut c = H1Conn::connect(env.net.client_ip(), env.net.gw()).await?;
    let r = c
        .send(
            "GET",
            "xff.example.com",
            "/",
            &[
                ("x-forwarded-for", "6.6.6.6, 10.9.9.9"),
                ("x-forwarded-proto", "https"),
            ],
        )
        .await?;
    ensure!(r.status == 200, "status {}", r.status);
    let echo = r.echo()?;
    let header = |n: &str| echo.header(n).unwrap_or("(none)").to_owned();
    Ok((header("x-forwarded-for"), header("x-forwarded-proto")))
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_headers_trust_only_the_configured_hops() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("m.yaml", &single_route(net, &["xff.example.com"]))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let client = net.client_ip().to_string();

    // By default the edge faces clients: the claimed chain and scheme are dropped.
    let mut edge = env.spawn_edge("edge").await?;
    env.wait_listener(net.gw()).await?;
    let (xff, proto) = seen_with_spoofed_chain(&env).await?;
    ensure!(xff == client, "x-forwarded-for {xff:?}, want only {client}");
    ensure!(proto == "http", "x-forwarded-proto {proto:?}, want http");
    edge.signal("TERM")?;
    edge.wait_exit(REQUEST_TIMEOUT).await?;

    // Behind one trusted proxy: its entry (the last) and its scheme are kept, what the
    // client wrote before it is not.
    let manifests = [env.manifests()];
    let _edge = env
        .spawn_edge_args("edge-trusting", &manifests, &["--xff-trusted-hops", "1"])
        .await?;
    env.wait_listener(net.gw()).await?;
    let (xff, proto) = seen_with_spoofed_chain(&env).await?;
    ensure!(
        xff == format!("10.9.9.9, {client}"),
        "x-forwarded-for {xff:?}, want the trusted hop and {client}"
    );
    ensure!(
        proto == "https",
        "x-forwarded-proto {proto:?}, want the trusted https"
    );
    env.pass()
}
