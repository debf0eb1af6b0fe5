//! Bad input that must not take down good configuration: a listener port already in
//! use, two Gateways asking for one address, and an object missing required fields.

use http::StatusCode;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_port_in_use_is_reported_and_retried_while_other_gateways_serve() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let taken = net.addr(5, LISTENER_PORT);
    let free = net.addr(6, LISTENER_PORT);
    // Another process holds Gateway A's socket before the edge starts.
    let squatter = std::net::TcpListener::bind(taken)?;

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
    infra.push_str(&backend("default", "svc", net.echo_a(), true));
    infra.push_str(&route(
        "default",
        "route-a",
        "gw-a",
        &[],
        &[("PathPrefix", "/", "svc")],
    ));
    infra.push_str(&route(
        "default",
        "route-b",
        "gw-b",
        &[],
        &[("PathPrefix", "/", "svc")],
    ));
    env.write_manifest("infra.yaml", &infra)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;

    // B serves while A's port is taken.
    eventually("gateway B serves", EVENTUALLY, || async {
        let r = env.h1(free, "any.example.com", "/b").await?;
        ensure!(r.status == StatusCode::OK, "B answered {}", r.status);
        Ok(())
    })
    .await?;
    eventually(
        "A's listener reports PortUnavailable",
        EVENTUALLY,
        || async {
            let st = env.status().await?;
            let gw = status_item(&st, "Gateway", "default", "gw-a")?;
            let l = gateway_listener(gw, "http")?;
            expect_condition(
                &l["conditions"],
                "Accepted",
                "False",
                Some("PortUnavailable"),
            )?;
            expect_condition(&l["conditions"], "Programmed", "False", None)?;
            expect_condition(&gw["status"]["conditions"], "Programmed", "False", None)?;
            let gw_b = status_item(&st, "Gateway", "default", "gw-b")?;
            expect_condition(&gw_b["status"]["conditions"], "Programmed", "True", None)
        },
    )
    .await?;

    // Once the port is free the edge binds it without a reload, and says so.
    drop(squatter);
    eventually(
        "gateway A serves after its port frees",
        EVENTUALLY,
        || async {
            let r = env.h1(taken, "any.example.com", "/a").await?;
            ensure!(r.status == StatusCode::OK, "A answered {}", r.status);
            let st = env.status().await?;
            let gw = status_item(&st, "Gateway", "default", "gw-a")?;
            let l = gateway_listener(gw, "http")?;
            expect_condition(&l["conditions"], "Accepted", "True", None)?;
            expect_condition(&gw["status"]["conditions"], "Programmed", "True", None)
        },
    )
    .await?;
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn address_conflicts_and_invalid_objects_leave_the_rest_serving() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let shared = net.addr(5, LISTENER_PORT);
    let mut infra = gateway_class("aether", CONTROLLER);
    // Both ask for .5: the first in (age, namespace/name) order keeps it.
    infra.push_str(&gateway(
        "default",
        "gw-first",
        Some(&net.ip_str(5)),
        &[("http", LISTENER_PORT)],
    ));
    infra.push_str(&gateway(
        "default",
        "gw-second",
        Some(&net.ip_str(5)),
        &[("http", LISTENER_PORT)],
    ));
    infra.push_str(&backend("default", "svc-a", net.echo_a(), true));
    infra.push_str(&backend("default", "svc-b", net.echo_b(), true));
    infra.push_str(&route(
        "default",
        "first",
        "gw-first",
        &[],
        &[("PathPrefix", "/", "svc-a")],
    ));
    infra.push_str(&route(
        "default",
        "second",
        "gw-second",
        &[],
        &[("PathPrefix", "/", "svc-b")],
    ));
    env.write_manifest("infra.yaml", &infra)?;
    // A Gateway without gatewayClassName (required) in a file of its own.
    let bad = env.write_manifest(
        "bad.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: broken\nspec:\n  listeners: []\n",
    )?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;

    eventually(
        "the first Gateway owns the shared address",
        EVENTUALLY,
        || async {
            let r = env.h1(shared, "x.example.com", "/").await?;
            ensure!(r.status == StatusCode::OK, "answered {}", r.status);
            let e = r.echo()?;
            ensure!(e.name() == "a", "the shared address reached {}", e.0);
            Ok(())
        },
    )
    .await?;
    let st = env.status().await?;
    let second = status_item(&st, "Gateway", "default", "gw-second")?;
    expect_condition(
        &second["status"]["conditions"],
        "Programmed",
        "False",
        Some("AddressNotUsable"),
    )?;
    let msg = condition(&second["status"]["conditions"], "Programmed")?["message"].to_string();
    ensure!(
        msg.contains("gw-first"),
        "the message should name the owner: {msg}"
    );
    let first = status_item(&st, "Gateway", "default", "gw-first")?;
    expect_condition(
        &first["status"]["conditions"],
        "Programmed",
        "True",
        Some("Programmed"),
    )?;

    let errors = st["manifestErrors"].as_array().cloned().unwrap_or_default();
    ensure!(
        errors.iter().any(|e| {
            e["file"].as_str().is_some_and(|f| names_file(f, &bad))
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("gatewayClassName"))
        }),
        "manifestErrors should name bad.yaml and the missing field: {errors:?}"
    );
    env.pass()
}
