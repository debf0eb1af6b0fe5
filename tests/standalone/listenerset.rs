//! ListenerSets end to end: an HTTPS listener contributed by a ListenerSet in another
//! namespace terminates TLS with that namespace's certificate (and a Secret granted to
//! ListenerSets by a ReferenceGrant), serves the routes attached to the ListenerSet,
//! and goes away when the Gateway stops admitting ListenerSets.

use std::time::Duration;

use crate::common::*;

const TLS_PORT: u16 = 8443;
const SQUATTED_PORT: u16 = 8444;

/// Gateway `infra/edge` at .5 (HTTP :8080); its `allowedListeners` is `admit`.
fn gateway(net: Net, admit: &str) -> String {
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .namespace("infra")
            .address(&ip)
            .spec(
                "allowedListeners",
                serde_json::json!({"namespaces": {"from": admit}}),
            )
            .http("http", LISTENER_PORT)
            .yaml(),
    );
    m
}

/// ListenerSet `team/team`: HTTPS for app.team.example (Secret in its namespace), for
/// shared.example (Secret in `infra`, granted to ListenerSets from `team`) and on
/// :9443 for other.example (Secret in `infra`, not granted); HTTP on a port another
/// process holds, named like the Gateway's own listener; a route on the set.
fn team(net: Net) -> String {
    let mut m = format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: team, namespace: team}}
spec:
  parentRef: {{name: edge, namespace: infra}}
  listeners:
  - {{name: app, port: {TLS_PORT}, protocol: HTTPS, hostname: app.team.example, tls: {{certificateRefs: [{{name: team-cert}}]}}}}
  - {{name: shared, port: {TLS_PORT}, protocol: HTTPS, hostname: shared.example, tls: {{certificateRefs: [{{name: shared-cert, namespace: infra}}]}}}}
  - {{name: ungranted, port: 9443, protocol: HTTPS, hostname: other.example, tls: {{certificateRefs: [{{name: other-cert, namespace: infra}}]}}}}
  - {{name: http, port: {SQUATTED_PORT}, protocol: HTTP}}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: team-listeners, namespace: infra}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: ListenerSet, namespace: team}}]
  to: [{{group: \"\", kind: Secret, name: shared-cert}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: app, namespace: team}}
spec:
  parentRefs: [{{group: gateway.networking.k8s.io, kind: ListenerSet, name: team}}]
  rules: [{{backendRefs: [{{name: svc, port: 80}}]}}]
"
    );
    m.push_str(&backend("team", "svc", net.echo_a(), true));
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn listenerset_https_listener_serves_its_namespace_and_follows_admission() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let tls_addr = net.addr(5, TLS_PORT);
    let ca = TestCa::new("aether listenerset CA")?;
    let app = ca.leaf(&["app.team.example"])?;
    let shared = ca.leaf(&["shared.example"])?;
    let other = ca.leaf(&["other.example"])?;
    env.write_manifest("gateway.yaml", &gateway(net, "All"))?;
    env.write_manifest("team.yaml", &team(net))?;
    let mut secrets = tls_secret("team", "team-cert", &app);
    secrets.push_str(&tls_secret("infra", "shared-cert", &shared));
    secrets.push_str(&tls_secret("infra", "other-cert", &other));
    env.write_manifest("secrets.yaml", &secrets)?;
    // Another process holds one ListenerSet port before the edge starts.
    let _squatter = std::net::TcpListener::bind(net.addr(5, SQUATTED_PORT))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    // One Snapshot binds every socket: the Gateway's HTTP one answering means all are.
    env.wait_listener(net.addr(5, LISTENER_PORT)).await?;

    // The ListenerSet's listener terminates with the team's own certificate and serves
    // the route attached to the ListenerSet.
    let (tls, presented) = tls_connect(
        net.client_ip(),
        tls_addr,
        "app.team.example",
        &ca,
        &[b"http/1.1"],
    )
    .await?;
    ensure!(
        presented == app.cert_der,
        "app.team.example: another certificate"
    );
    let e = H1Conn::over(tls)
        .await?
        .get("app.team.example", "/hello")
        .await?
        .echo()?;
    ensure!(
        e.host() == "app.team.example" && e.path() == "/hello",
        "backend saw {}",
        e.0
    );
    // A Secret in the Gateway's namespace, granted to ListenerSets from `team`.
    let (_, presented) = tls_connect(
        net.client_ip(),
        tls_addr,
        "shared.example",
        &ca,
        &[b"http/1.1"],
    )
    .await?;
    ensure!(
        presented == shared.cert_der,
        "shared.example: another certificate"
    );

    let st = env.status().await?;
    let ls = status_item(&st, "ListenerSet", "team", "team")?;
    // Accepted, saying that a listener (the ungranted one) is not valid.
    expect_condition(
        &ls["status"]["conditions"],
        "Accepted",
        "True",
        Some("ListenersNotValid"),
    )?;
    expect_condition(
        &ls["status"]["conditions"],
        "Programmed",
        "True",
        Some("Programmed"),
    )?;
    let ungranted = gateway_listener(ls, "ungranted")?;
    expect_condition(
        &ungranted["conditions"],
        "ResolvedRefs",
        "False",
        Some("RefNotPermitted"),
    )?;
    ensure!(
        gateway_listener(ls, "app")?["attachedRoutes"] == 1,
        "app listener: {ls}"
    );
    let gw = status_item(&st, "Gateway", "infra", "edge")?;
    ensure!(gw["status"]["attachedListenerSets"] == 1, "gateway: {gw}");
    // The bind failure is the ListenerSet listener's, not the Gateway listener's of
    // the same name.
    let squatted = gateway_listener(ls, "http")?;
    expect_condition(
        &squatted["conditions"],
        "Accepted",
        "False",
        Some("PortUnavailable"),
    )?;
    expect_condition(&squatted["conditions"], "Programmed", "False", None)?;
    let own = gateway_listener(gw, "http")?;
    expect_condition(&own["conditions"], "Programmed", "True", None)?;
    let route = status_item(&st, "HTTPRoute", "team", "app")?;
    let parent = route_parent(route, "team", None)?;
    ensure!(parent["parentRef"]["kind"] == "ListenerSet", "{parent}");
    expect_condition(&parent["conditions"], "Accepted", "True", None)?;

    // The Gateway now admits only its own namespace: the set is NotAllowed and its
    // socket closes, while the Gateway's own listener keeps serving.
    env.write_manifest("gateway.yaml", &gateway(net, "Same"))?;
    eventually("the ListenerSet is NotAllowed", EVENTUALLY, || async {
        let st = env.status().await?;
        let ls = status_item(&st, "ListenerSet", "team", "team")?;
        expect_condition(
            &ls["status"]["conditions"],
            "Accepted",
            "False",
            Some("NotAllowed"),
        )
    })
    .await?;
    eventually("the ListenerSet's port is closed", EVENTUALLY, || async {
        let r = tokio::time::timeout(
            Duration::from_secs(2),
            tls_connect(
                net.client_ip(),
                tls_addr,
                "app.team.example",
                &ca,
                &[b"http/1.1"],
            ),
        )
        .await;
        ensure!(
            !matches!(r, Ok(Ok(_))),
            "still serving TLS for the ListenerSet"
        );
        Ok(())
    })
    .await?;
    let st = env.status().await?;
    let gw = status_item(&st, "Gateway", "infra", "edge")?;
    ensure!(gw["status"]["attachedListenerSets"] == 0, "gateway: {gw}");
    let r = env.h1(net.addr(5, LISTENER_PORT), "x.example", "/").await?;
    ensure!(
        r.status == http::StatusCode::NOT_FOUND,
        "gateway listener: {}",
        r.status
    );
    env.pass()
}
