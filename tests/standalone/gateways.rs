//! Gateway addresses: explicit addresses sharing a port, and the address pool.

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_on_one_port_serve_only_their_own_routes() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let a = net.addr(5, LISTENER_PORT);
    let b = net.addr(6, LISTENER_PORT);
    let mut infra = gateway_class("aether", CONTROLLER);
    infra.push_str(&gateway(
        "default",
        "gw-a",
        Some(&net.ip_str(5)),
        &[("http", LISTENER_PORT)],
    ));
    infra.push_str(&gateway(
        "default",
        "gw-b",
        Some(&net.ip_str(6)),
        &[("http", LISTENER_PORT)],
    ));
    infra.push_str(&backend("default", "svc-a", net.echo_a(), true));
    infra.push_str(&backend("default", "svc-b", net.echo_b(), true));
    env.write_manifest("infra.yaml", &infra)?;
    // Hostname-less routes on both Gateways, plus a hostname route on B.
    let mut routes = route(
        "default",
        "route-a",
        "gw-a",
        &[],
        &[
            ("PathPrefix", "/shared", "svc-a"),
            ("PathPrefix", "/a-only", "svc-a"),
        ],
    );
    routes.push_str(&route(
        "default",
        "route-b",
        "gw-b",
        &[],
        &[
            ("PathPrefix", "/shared", "svc-b"),
            ("PathPrefix", "/b-only", "svc-b"),
        ],
    ));
    routes.push_str(&route(
        "default",
        "route-b-host",
        "gw-b",
        &["b.example.com"],
        &[("PathPrefix", "/", "svc-b")],
    ));
    env.write_manifest("routes.yaml", &routes)?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(a).await?;
    env.wait_listener(b).await?;

    let cases: &[(std::net::SocketAddr, &str, &str, Option<&str>)] = &[
        (a, "any.example.com", "/shared/x", Some("a")),
        (b, "any.example.com", "/shared/x", Some("b")),
        (a, "any.example.com", "/a-only", Some("a")),
        (b, "any.example.com", "/b-only", Some("b")),
        (a, "any.example.com", "/b-only", None),
        (b, "any.example.com", "/a-only", None),
        (b, "b.example.com", "/anything", Some("b")),
        (a, "b.example.com", "/anything", None),
        (a, "b.example.com", "/shared", Some("a")),
    ];
    for (addr, host, path, want) in cases {
        let r1 = env.h1(*addr, host, path).await?;
        let r2 = env.h2(*addr, host, path).await?;
        for (proto, r) in [("HTTP/1.1", r1), ("h2c", r2)] {
            let what = format!("{proto} {addr} {host}{path}");
            match want {
                Some(name) => {
                    let e = r.echo().map_err(|e| err(format!("{what}: {e}")))?;
                    ensure!(
                        e.name() == *name,
                        "{what}: expected backend {name}, got {}",
                        e.0
                    );
                }
                None => ensure!(
                    r.status == StatusCode::NOT_FOUND,
                    "{what}: expected 404, got {} {:?}",
                    r.status,
                    r.text()
                ),
            }
        }
    }

    eventually("/status shows both Gateways", EVENTUALLY, || async move {
        let st = status_json(net).await?;
        for (name, host, attached) in [("gw-a", 5, 1), ("gw-b", 6, 2)] {
            let gw = status_item(&st, "Gateway", "default", name)?;
            ensure!(
                gateway_addresses(gw) == vec![net.ip_str(host)],
                "{name} addresses: {}",
                gw["status"]["addresses"]
            );
            expect_condition(&gw["status"]["conditions"], "Programmed", "True", None)?;
            let l = gateway_listener(gw, "http")?;
            ensure!(
                l["attachedRoutes"] == attached,
                "{name} listener: expected {attached} routes: {l}"
            );
        }
        Ok(())
    })
    .await?;
    env.pass()
}

/// The pool addresses of Gateways `pool-one` and `pool-two`, once both are reported.
async fn pool_addresses(net: Net) -> Result<(String, String), BoxError> {
    eventually(
        "/status reports pool addresses",
        EVENTUALLY,
        || async move {
            let st = status_json(net).await?;
            let get = |name: &str| -> Result<String, BoxError> {
                let gw: &Value = status_item(&st, "Gateway", "default", name)?;
                let addrs = gateway_addresses(gw);
                ensure!(
                    addrs.len() == 1,
                    "{name}: expected one IPAddress, got {}",
                    gw["status"]["addresses"]
                );
                expect_condition(&gw["status"]["conditions"], "Programmed", "True", None)?;
                Ok(addrs.concat())
            };
            Ok((get("pool-one")?, get("pool-two")?))
        },
    )
    .await
}

fn in_pool(net: Net, addr: &str) -> Result<std::net::Ipv4Addr, BoxError> {
    let ip: std::net::Ipv4Addr = addr
        .parse()
        .map_err(|e| err(format!("{addr:?} is not an IPv4 address: {e}")))?;
    let o = ip.octets();
    ensure!(
        o[0] == 127 && o[1] == net.b && o[2] == net.k && o[3] < 16,
        "{ip} is not in the pool {}",
        net.pool()
    );
    Ok(ip)
}

async fn check_pool_traffic(env: &TestEnv, one: &str, two: &str) -> TestResult {
    for (addr, name) in [(one, "a"), (two, "b")] {
        let ip = in_pool(env.net, addr)?;
        let sa = std::net::SocketAddr::new(ip.into(), LISTENER_PORT);
        env.wait_listener(sa).await?;
        let e = env.h1(sa, "pool.example.com", "/p").await?.echo()?;
        ensure!(e.name() == name, "{sa} went to {}", e.0);
        let e = env.h2(sa, "pool.example.com", "/p").await?.echo()?;
        ensure!(e.name() == name, "h2c {sa} went to {}", e.0);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn address_pool_is_deterministic_across_restarts() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let mut infra = gateway_class("aether", CONTROLLER);
    infra.push_str(&gateway(
        "default",
        "pool-one",
        None,
        &[("http", LISTENER_PORT)],
    ));
    infra.push_str(&gateway(
        "default",
        "pool-two",
        None,
        &[("http", LISTENER_PORT)],
    ));
    infra.push_str(&backend("default", "svc-a", net.echo_a(), true));
    infra.push_str(&backend("default", "svc-b", net.echo_b(), true));
    env.write_manifest("infra.yaml", &infra)?;
    let mut routes = route(
        "default",
        "route-one",
        "pool-one",
        &[],
        &[("PathPrefix", "/", "svc-a")],
    );
    routes.push_str(&route(
        "default",
        "route-two",
        "pool-two",
        &[],
        &[("PathPrefix", "/", "svc-b")],
    ));
    env.write_manifest("routes.yaml", &routes)?;
    let _echoes = env.spawn_echoes().await?;

    let mut edge = env.spawn_edge("edge-1").await?;
    let (one, two) = pool_addresses(net).await?;
    eprintln!("first run: pool-one={one} pool-two={two}");
    ensure!(one != two, "two Gateways got the same pool address {one}");
    check_pool_traffic(&env, &one, &two).await?;

    edge.signal("TERM")?;
    let st = edge.wait_exit(Duration::from_secs(15)).await?;
    ensure!(st.success(), "edge-1 exited with {st} after SIGTERM");
    drop(edge);

    let _edge = env.spawn_edge("edge-2").await?;
    let (one2, two2) = pool_addresses(net).await?;
    eprintln!("second run: pool-one={one2} pool-two={two2}");
    ensure!(
        (one2.as_str(), two2.as_str()) == (one.as_str(), two.as_str()),
        "pool addresses changed across a restart: ({one}, {two}) -> ({one2}, {two2})"
    );
    check_pool_traffic(&env, &one2, &two2).await?;
    env.pass()
}
