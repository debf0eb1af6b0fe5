//! Admin `/status`: Gateway API status of GatewayClasses, Gateways and HTTPRoutes.

use http::StatusCode;
use serde_json::{Value, json};

use crate::common::*;

/// Every condition in an item (top level, listeners, route parents) has the standard
/// fields, and `observedGeneration == metadata.generation`.
fn check_condition_shape(item: &Value) -> TestResult {
    let what = format!("{} {}", item["kind"], item["metadata"]["name"]);
    let generation = &item["metadata"]["generation"];
    ensure!(
        generation.is_u64(),
        "{what}: metadata.generation is not a number: {}",
        item["metadata"]
    );
    ensure!(
        item["apiVersion"] == "gateway.networking.k8s.io/v1",
        "{what}: apiVersion is {}",
        item["apiVersion"]
    );
    let status = &item["status"];
    let mut lists: Vec<(String, &Value)> = Vec::new();
    if !status["conditions"].is_null() {
        lists.push(("status.conditions".into(), &status["conditions"]));
    }
    for l in status["listeners"].as_array().into_iter().flatten() {
        lists.push((format!("listener {}", l["name"]), &l["conditions"]));
    }
    for p in status["parents"].as_array().into_iter().flatten() {
        lists.push((format!("parent {}", p["parentRef"]), &p["conditions"]));
    }
    ensure!(!lists.is_empty(), "{what}: no conditions at all: {status}");
    for (place, conds) in lists {
        let conds = conds.as_array().ok_or_else(|| {
            err(format!(
                "{what} {place}: conditions is not an array: {conds}"
            ))
        })?;
        ensure!(!conds.is_empty(), "{what} {place}: empty conditions");
        for c in conds {
            ensure!(
                c["observedGeneration"] == *generation,
                "{what} {place}: observedGeneration {} != metadata.generation {generation}: {c}",
                c["observedGeneration"]
            );
            ensure!(
                c["status"] == "True" || c["status"] == "False" || c["status"] == "Unknown",
                "{what} {place}: bad condition status: {c}"
            );
            for field in ["type", "reason", "message", "lastTransitionTime"] {
                ensure!(
                    c[field].is_string(),
                    "{what} {place}: condition lacks string {field}: {c}"
                );
            }
        }
    }
    Ok(())
}

fn check_parent_ref(parent: &Value, name: &str, ns: &str, section: Option<&str>) -> TestResult {
    let r = &parent["parentRef"];
    ensure!(
        r["group"] == "gateway.networking.k8s.io",
        "parentRef.group: {r}"
    );
    ensure!(r["kind"] == "Gateway", "parentRef.kind: {r}");
    ensure!(r["name"] == name, "parentRef.name: {r}");
    ensure!(r["namespace"] == ns, "parentRef.namespace: {r}");
    if let Some(s) = section {
        ensure!(r["sectionName"] == s, "parentRef.sectionName: {r}");
    }
    ensure!(
        parent["controllerName"] == CONTROLLER,
        "controllerName: {parent}"
    );
    Ok(())
}

fn check_main_status(st: &Value, net: Net) -> TestResult {
    let errors = &st["manifestErrors"];
    ensure!(
        errors.as_array().is_some_and(Vec::is_empty),
        "manifestErrors should be an empty array: {errors}"
    );

    let class = status_item(st, "GatewayClass", "", "aether")?;
    expect_condition(&class["status"]["conditions"], "Accepted", "True", None)?;
    check_condition_shape(class)?;

    let gw = status_item(st, "Gateway", "default", "edge")?;
    let conds = &gw["status"]["conditions"];
    expect_condition(conds, "Accepted", "True", None)?;
    expect_condition(conds, "Programmed", "True", None)?;
    let addrs = gateway_addresses(gw);
    ensure!(
        addrs == vec![net.ip_str(5)],
        "Gateway status.addresses: expected [{}], got {}",
        net.ip_str(5),
        gw["status"]["addresses"]
    );
    // http: route-all, route-section, route-missing-backend. http-alt: route-all only.
    for (listener, attached) in [("http", 3), ("http-alt", 1)] {
        let l = gateway_listener(gw, listener)?;
        ensure!(
            l["attachedRoutes"] == attached,
            "listener {listener}: expected attachedRoutes {attached}, got {l}"
        );
        let kinds = l["supportedKinds"].as_array().cloned().unwrap_or_default();
        ensure!(
            kinds.iter().any(|k| k["kind"] == "HTTPRoute"),
            "listener {listener} supportedKinds: {l}"
        );
    }
    check_condition_shape(gw)?;

    let all = status_item(st, "HTTPRoute", "default", "route-all")?;
    let p = route_parent(all, "edge", None)?;
    expect_condition(&p["conditions"], "Accepted", "True", Some("Accepted"))?;
    expect_condition(
        &p["conditions"],
        "ResolvedRefs",
        "True",
        Some("ResolvedRefs"),
    )?;
    check_condition_shape(all)?;

    let section = status_item(st, "HTTPRoute", "default", "route-section")?;
    let p = route_parent(section, "edge", Some("http"))?;
    expect_condition(&p["conditions"], "Accepted", "True", Some("Accepted"))?;
    check_condition_shape(section)?;

    let missing = status_item(st, "HTTPRoute", "default", "route-missing-backend")?;
    let p = route_parent(missing, "edge", Some("http"))?;
    expect_condition(&p["conditions"], "Accepted", "True", Some("Accepted"))?;
    expect_condition(
        &p["conditions"],
        "ResolvedRefs",
        "False",
        Some("BackendNotFound"),
    )?;
    check_condition_shape(missing)?;

    let bad = status_item(st, "HTTPRoute", "default", "route-bad-section")?;
    let p = route_parent(bad, "edge", Some("nope"))?;
    expect_condition(
        &p["conditions"],
        "Accepted",
        "False",
        Some("NoMatchingParent"),
    )?;
    check_condition_shape(bad)?;
    Ok(())
}

/// Each status parentRef is complete: group, kind, name, namespace (defaulted from the
/// route's namespace), and the sectionName given.
fn check_parent_refs(st: &Value) -> TestResult {
    for (route, section) in [
        ("route-all", None),
        ("route-section", Some("http")),
        ("route-missing-backend", Some("http")),
        ("route-bad-section", Some("nope")),
    ] {
        let r = status_item(st, "HTTPRoute", "default", route)?;
        let p = route_parent(r, "edge", section)?;
        check_parent_ref(p, "edge", "default", section)
            .map_err(|e| err(format!("{route}: {e}")))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reports_gateway_api_conditions() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let mut infra = gateway_class("aether", CONTROLLER);
    infra.push_str(&gateway(
        "default",
        "edge",
        Some(&net.ip_str(5)),
        &[("http", 8080), ("http-alt", 8081)],
    ));
    infra.push_str(&backend("default", "svc-a", net.echo_a(), true));
    env.write_manifest("infra.yaml", &infra)?;
    let routes = [
        HttpRoute::test("route-all")
            .parent("edge")
            .hostname("all.example.com")
            .backend("svc-a", 80),
        HttpRoute::test("route-section")
            .section("edge", "http")
            .hostname("section.example.com")
            .backend("svc-a", 80),
        HttpRoute::test("route-missing-backend")
            .section("edge", "http")
            .hostname("missing.example.com")
            .backend("svc-nope", 80),
        HttpRoute::test("route-bad-section")
            .section("edge", "nope")
            .hostname("bad.example.com")
            .backend("svc-a", 80),
    ];
    let routes: String = routes.iter().map(Manifest::yaml).collect();
    env.write_manifest("routes.yaml", &routes)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(net.gw()).await?;

    eventually("/status matches the manifests", EVENTUALLY, || async move {
        let st = status_json(net).await?;
        check_main_status(&st, net).map_err(|e| err(format!("{e}\n/status: {st}")))
    })
    .await?;

    // The data plane agrees with the status.
    let alt = net.addr(5, 8081);
    env.wait_listener(alt).await?;
    let e = env.h1(alt, "all.example.com", "/").await?.echo()?;
    ensure!(e.name() == "a", "route-all on http-alt went to {}", e.0);
    let r = env.h1(alt, "section.example.com", "/").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "route-section must not be on http-alt: {}",
        r.status
    );
    let e = env.h1(net.gw(), "section.example.com", "/").await?.echo()?;
    ensure!(e.name() == "a", "route-section on http went to {}", e.0);
    let r = env.h1(net.gw(), "bad.example.com", "/").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "a route with no matching parent is served: {}",
        r.status
    );
    let r = env.h1(net.gw(), "missing.example.com", "/").await?;
    ensure!(
        r.status == StatusCode::INTERNAL_SERVER_ERROR,
        "missing backend: {}",
        r.status
    );
    // Checked last so that it does not hide the checks above.
    let st = env.status().await?;
    check_parent_refs(&st)?;
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reports_route_rejection_reasons() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let mut infra = gateway_class("aether", CONTROLLER);
    infra.push_str(&namespace("other"));
    infra.push_str(
        &Gateway::test("edge")
            .address(&net.ip_str(5))
            .http("http", 8080)
            .http_host("wild", 8081, "*.example.com")
            .yaml(),
    );
    infra.push_str(&backend("default", "svc-a", net.echo_a(), true));
    infra.push_str(&backend("other", "svc-other", net.echo_b(), true));
    env.write_manifest("infra.yaml", &infra)?;
    let routes = [
        HttpRoute::test("route-other-ns")
            .namespace("other")
            .parent_ref(json!({"name": "edge", "namespace": "default", "sectionName": "http"}))
            .hostname("otherns.example.com")
            .backend("svc-other", 80),
        HttpRoute::test("route-bad-host")
            .section("edge", "wild")
            .hostname("foo.other.org")
            .backend("svc-a", 80),
        HttpRoute::test("route-wrong-kind")
            .section("edge", "http")
            .hostname("kind.example.com")
            .backend_ref(json!({"group": "", "kind": "ConfigMap", "name": "svc-a", "port": 80})),
        HttpRoute::test("route-cross-ns")
            .section("edge", "http")
            .hostname("cross.example.com")
            .backend_ref(json!({"name": "svc-other", "namespace": "other", "port": 80})),
        HttpRoute::test("route-good")
            .parent("edge")
            .hostname("good.example.com")
            .backend("svc-a", 80),
    ];
    let routes: String = routes.iter().map(Manifest::yaml).collect();
    env.write_manifest("routes.yaml", &routes)?;
    let _echoes = env.spawn_echoes().await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(net.gw()).await?;

    eventually(
        "/status shows the rejection reasons",
        EVENTUALLY,
        || async move {
            let st = status_json(net).await?;
            let check = || -> TestResult {
                let r = status_item(&st, "HTTPRoute", "other", "route-other-ns")?;
                let p = route_parent(r, "edge", Some("http"))?;
                expect_condition(
                    &p["conditions"],
                    "Accepted",
                    "False",
                    Some("NotAllowedByListeners"),
                )?;
                check_condition_shape(r)?;

                let r = status_item(&st, "HTTPRoute", "default", "route-bad-host")?;
                let p = route_parent(r, "edge", Some("wild"))?;
                expect_condition(
                    &p["conditions"],
                    "Accepted",
                    "False",
                    Some("NoMatchingListenerHostname"),
                )?;
                check_condition_shape(r)?;

                let r = status_item(&st, "HTTPRoute", "default", "route-wrong-kind")?;
                let p = route_parent(r, "edge", Some("http"))?;
                expect_condition(&p["conditions"], "Accepted", "True", Some("Accepted"))?;
                expect_condition(
                    &p["conditions"],
                    "ResolvedRefs",
                    "False",
                    Some("InvalidKind"),
                )?;
                check_condition_shape(r)?;

                let r = status_item(&st, "HTTPRoute", "default", "route-cross-ns")?;
                let p = route_parent(r, "edge", Some("http"))?;
                expect_condition(&p["conditions"], "Accepted", "True", Some("Accepted"))?;
                expect_condition(
                    &p["conditions"],
                    "ResolvedRefs",
                    "False",
                    Some("RefNotPermitted"),
                )?;
                check_condition_shape(r)?;

                let r = status_item(&st, "HTTPRoute", "default", "route-good")?;
                let p = route_parent(r, "edge", None)?;
                expect_condition(&p["conditions"], "Accepted", "True", Some("Accepted"))?;
                expect_condition(
                    &p["conditions"],
                    "ResolvedRefs",
                    "True",
                    Some("ResolvedRefs"),
                )?;
                check_condition_shape(r)?;

                let gw = status_item(&st, "Gateway", "default", "edge")?;
                // http: route-wrong-kind, route-cross-ns, route-good; wild: route-good.
                for (listener, attached) in [("http", 3), ("wild", 1)] {
                    let l = gateway_listener(gw, listener)?;
                    ensure!(
                        l["attachedRoutes"] == attached,
                        "listener {listener}: expected {attached} routes: {l}"
                    );
                }

                Ok(())
            };
            check().map_err(|e| err(format!("{e}\n/status: {st}")))
        },
    )
    .await?;

    let wild = net.addr(5, 8081);
    env.wait_listener(wild).await?;
    let e = env.h1(wild, "good.example.com", "/").await?.echo()?;
    ensure!(e.name() == "a", "route-good on wild went to {}", e.0);
    let r = env.h1(wild, "foo.other.org", "/").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "route with a non-matching hostname is served: {}",
        r.status
    );
    let r = env.h1(net.gw(), "otherns.example.com", "/").await?;
    ensure!(
        r.status == StatusCode::NOT_FOUND,
        "route not allowed by listeners is served: {}",
        r.status
    );
    for host in ["kind.example.com", "cross.example.com"] {
        let r = env.h1(net.gw(), host, "/").await?;
        ensure!(
            r.status == StatusCode::INTERNAL_SERVER_ERROR,
            "{host}: an invalid backendRef must answer 500, got {} {:?}",
            r.status,
            r.text()
        );
    }
    // Checked last so that it does not hide the checks above.
    let st = env.status().await?;
    let r = status_item(&st, "HTTPRoute", "other", "route-other-ns")?;
    let p = route_parent(r, "edge", Some("http"))?;
    check_parent_ref(p, "edge", "default", Some("http"))
        .map_err(|e| err(format!("route-other-ns: {e}")))?;
    env.pass()
}
