//! Port pools: one TCP and one UDP listener hand each route a port of its
//! own from a range; ports are reported in status, served for that route only, stable
//! when another route goes, refused when taken, and the same after a restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::UdpSocket;

use crate::common::*;

const FIRST: u16 = 30000;
const LAST: u16 = 30009;

fn gateway_yaml(net: Net) -> String {
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    let range = format!("{FIRST}-{LAST}");
    m.push_str(
        &Gateway::test("shared")
            .address(&ip)
            .annotation("aether.io/port-range.apps", &range)
            .annotation("aether.io/port-range.dns", &range)
            .listener(serde_json::json!({"name": "apps", "port": FIRST, "protocol": "TCP"}))
            .listener(serde_json::json!({"name": "dns", "port": FIRST, "protocol": "UDP"}))
            .yaml(),
    );
    for (i, svc) in ["svc-1", "svc-2", "svc-3"].iter().enumerate() {
        let host = 251 + u8::try_from(i).unwrap_or(0);
        m.push_str(&backend("default", svc, net.addr(host, 7100), true));
    }
    m
}

fn tcp_route(name: &str, svc: &str, port: Option<u16>) -> String {
    let port = port.map(|p| format!("\n    port: {p}")).unwrap_or_default();
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata:
  name: {name}
  namespace: default
spec:
  parentRefs:
  - name: shared
    sectionName: apps{port}
  rules:
  - backendRefs: [{{name: {svc}, port: 80}}]
"
    )
}

/// The port each named route's status reports for Gateway `shared` (`kind` routes).
async fn ports(
    env: &TestEnv,
    kind: &str,
    names: &[&str],
) -> Result<BTreeMap<String, u16>, BoxError> {
    let status = env.status().await?;
    let mut out = BTreeMap::new();
    for n in names {
        let route = status_item(&status, kind, "default", n)?;
        let parent = route_parent(route, "shared", None)?;
        expect_condition(&parent["conditions"], "Accepted", "True", None)?;
        let port = parent["parentRef"]["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| err(format!("{n}: no port in {parent}")))?;
        out.insert((*n).to_owned(), port);
    }
    Ok(out)
}

/// The greeting of the TCP backend behind `addr`.
async fn greeting(net: Net, addr: SocketAddr) -> Result<String, BoxError> {
    let mut s = connect_from(net.client_ip(), addr).await?;
    let mut buf = [0u8; 32];
    let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut buf))
        .await
        .map_err(|_| err(format!("{addr}: no greeting")))??;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn port_pools_assign_stable_ports_per_route_and_survive_a_restart() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let mut backends = Vec::new();
    for (i, name) in ["one", "two", "three"].iter().enumerate() {
        let host = 251 + u8::try_from(i).unwrap_or(0);
        backends.push(tcp_backend(net.addr(host, 7100), name).await?);
        backends.push(udp_backend(net.addr(host, 7100), name).await?);
    }
    env.write_manifest("gateway.yaml", &gateway_yaml(net))?;
    env.write_manifest("r1.yaml", &tcp_route("r1", "svc-1", None))?;
    env.write_manifest("r2.yaml", &tcp_route("r2", "svc-2", None))?;
    env.write_manifest("r3.yaml", &tcp_route("r3", "svc-3", None))?;
    for (name, svc) in [("u1", "svc-1"), ("u2", "svc-2")] {
        env.write_manifest(
            &format!("{name}.yaml"),
            &l4_route("UDPRoute", name, "shared", Some("dns"), &[], &[(svc, 1)]),
        )?;
    }
    let state = env.dir.path().join("ports.json");
    let state_arg = state.display().to_string();
    let args = ["--port-state", state_arg.as_str()];
    let mut edge = env
        .spawn_edge_args("edge", &[env.manifests()], &args)
        .await?;

    // Three distinct ports from the range, each reaching only its own backend.
    let first = eventually("three routes get ports", EVENTUALLY, || {
        ports(&env, "TCPRoute", &["r1", "r2", "r3"])
    })
    .await?;
    let distinct: std::collections::BTreeSet<u16> = first.values().copied().collect();
    ensure!(distinct.len() == 3, "ports not distinct: {first:?}");
    ensure!(
        distinct.iter().all(|p| (FIRST..=LAST).contains(p)),
        "outside the range: {first:?}"
    );
    for (route, name) in [("r1", "one"), ("r2", "two"), ("r3", "three")] {
        let addr = net.addr(5, first[route]);
        let g = eventually(&format!("{route} served"), EVENTUALLY, || {
            greeting(net, addr)
        })
        .await?;
        ensure!(
            g == format!("hello from {name}\n"),
            "{route} on {addr} reached {g:?}"
        );
    }
    let status = env.status().await?;
    let gw = status_item(&status, "Gateway", "default", "shared")?;
    ensure!(
        gateway_listener(gw, "apps")?["attachedRoutes"] == 3,
        "attachedRoutes: {}",
        gateway_listener(gw, "apps")?
    );

    // UDP pool: two routes, two ports, each answered by its own backend.
    let udp = ports(&env, "UDPRoute", &["u1", "u2"]).await?;
    ensure!(udp["u1"] != udp["u2"], "UDP ports not distinct: {udp:?}");
    let sock = UdpSocket::bind(SocketAddr::new(net.client_ip(), 0)).await?;
    for (route, name) in [("u1", "one"), ("u2", "two")] {
        let to = net.addr(5, udp[route]);
        let said = eventually(&format!("{route} answers"), EVENTUALLY, || {
            let sock = &sock;
            async move {
                sock.send_to(b"q", to).await?;
                let mut buf = [0u8; 64];
                let (n, _) =
                    tokio::time::timeout(Duration::from_millis(300), sock.recv_from(&mut buf))
                        .await
                        .map_err(|_| err("no answer"))??;
                Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
            }
        })
        .await?;
        ensure!(said == format!("{name}:q"), "{route} answered {said:?}");
    }

    // Removing the middle route frees its port and moves nobody.
    std::fs::remove_file(env.manifests().join("r2.yaml"))?;
    let freed = net.addr(5, first["r2"]);
    eventually("r2's port is released", EVENTUALLY, || async move {
        ensure!(
            connect_from(net.client_ip(), freed).await.is_err(),
            "{freed} still accepts"
        );
        Ok(())
    })
    .await?;
    let after = ports(&env, "TCPRoute", &["r1", "r3"]).await?;
    ensure!(
        after["r1"] == first["r1"] && after["r3"] == first["r3"],
        "moved: {first:?} -> {after:?}"
    );

    // A route asking for a taken port gets a clear condition.
    env.write_manifest("r4.yaml", &tcp_route("r4", "svc-2", Some(first["r1"])))?;
    eventually("r4 is refused the taken port", EVENTUALLY, || async {
        let status = env.status().await?;
        let r4 = status_item(&status, "TCPRoute", "default", "r4")?;
        let parent = route_parent(r4, "shared", Some("apps"))?;
        expect_condition(
            &parent["conditions"],
            "Accepted",
            "False",
            Some("PortUnavailable"),
        )?;
        let msg = condition(&parent["conditions"], "Accepted")?["message"].to_string();
        ensure!(
            msg.contains("already assigned to TCPRoute default/r1"),
            "message {msg}"
        );
        Ok(())
    })
    .await?;
    ensure!(
        greeting(net, net.addr(5, first["r1"])).await? == "hello from one\n",
        "r1 lost its port to r4"
    );

    // A restart reproduces the assignment.
    edge.signal("TERM")?;
    edge.wait_exit(Duration::from_secs(15)).await?;
    let _edge = env
        .spawn_edge_args("edge-2", &[env.manifests()], &args)
        .await?;
    let again = eventually("ports after restart", EVENTUALLY, || {
        ports(&env, "TCPRoute", &["r1", "r3"])
    })
    .await?;
    ensure!(
        again == after,
        "restart changed ports: {after:?} -> {again:?}"
    );
    let udp_again = ports(&env, "UDPRoute", &["u1", "u2"]).await?;
    ensure!(
        udp_again == udp,
        "restart changed UDP ports: {udp:?} -> {udp_again:?}"
    );
    let g = eventually("r3 served after restart", EVENTUALLY, || {
        greeting(net, net.addr(5, again["r3"]))
    })
    .await?;
    ensure!(g == "hello from three\n", "r3 reached {g:?}");
    env.pass()
}
