//! Admin `/metrics` and `/config_dump`.

use std::collections::BTreeMap;

use http::StatusCode;

use crate::common::*;

/// One Prometheus sample: labels and value.
#[derive(Debug)]
struct Sample {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of metric `name` (exact name, with labels) in Prometheus text.
fn samples(text: &str, name: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels_str, value_str) = if let Some(inner) = rest.strip_prefix('{') {
            let Some(close) = inner.rfind('}') else {
                continue;
            };
            (&inner[..close], inner[close + 1..].trim())
        } else if rest.starts_with(' ') {
            ("", rest.trim())
        } else {
            continue;
        };
        let mut labels = BTreeMap::new();
        for pair in labels_str.split("\",") {
            if let Some((k, v)) = pair.split_once("=\"") {
                labels.insert(k.trim().to_owned(), v.trim_end_matches('"').to_owned());
            }
        }
        let value = value_str
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok());
        if let Some(value) = value {
            out.push(Sample { labels, value });
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_routed_requests() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    env.write_manifest("infra.yaml", &standard_infra(net))?;
    env.write_manifest(
        "routes.yaml",
        &route(
            "default",
            "route-metrics",
            "edge",
            &["m.example.com"],
            &[("PathPrefix", "/", "svc-a")],
        ),
    )?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    for i in 0..3 {
        let e = env
            .h1(gw, "m.example.com", &format!("/m/{i}"))
            .await?
            .echo()?;
        ensure!(e.name() == "a", "request went to {}", e.0);
    }
    let e = env.h2(gw, "m.example.com", "/m/h2").await?.echo()?;
    ensure!(e.name() == "a", "h2c request went to {}", e.0);

    let text = eventually("aether_requests_total counts the route's 2xx", EVENTUALLY, || async move {
        let text = metrics_text(net).await?;
        let found = samples(&text, "aether_requests_total").into_iter().find(|s| {
            s.labels.get("code").map(String::as_str) == Some("2xx")
                && s.labels.get("route").is_some_and(|r| r.contains("route-metrics"))
        });
        match found {
            Some(s) => {
                ensure!(s.value >= 4.0, "expected at least 4 2xx requests, got {s:?}");
                ensure!(
                    s.labels.get("gateway").is_some_and(|g| g.contains("edge")),
                    "gateway label does not name the Gateway: {s:?}"
                );
                Ok(text)
            }
            None => Err(err(format!(
                "no aether_requests_total{{route~route-metrics,code=\"2xx\"}} sample; aether_requests_total lines: {:?}",
                text.lines().filter(|l| l.starts_with("aether_requests_total")).collect::<Vec<_>>()
            ))),
        }
    })
    .await?;
    for name in [
        "aether_request_duration_seconds",
        "aether_config_reloads_total",
        "aether_config_generation",
    ] {
        ensure!(
            text.lines().any(|l| l.starts_with(name)),
            "/metrics has no {name} sample"
        );
    }
    let generation = samples(&text, "aether_config_generation");
    ensure!(
        generation.iter().any(|s| s.value >= 1.0),
        "aether_config_generation should be at least 1 once a config is served: {generation:?}"
    );

    let dump = admin_get(net, "/config_dump").await?;
    ensure!(
        dump.status == StatusCode::OK,
        "/config_dump answered {}",
        dump.status
    );
    let dump = dump.json()?;
    ensure!(
        dump.to_string().contains("m.example.com"),
        "/config_dump does not mention the route's hostname: {dump}"
    );
    env.pass()
}

/// Lines of `/metrics` that name `what` (a route or backend), to show in a failure.
fn lines_naming<'a>(text: &'a str, what: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(what))
        .collect()
}

/// A route's and its backend's series leave `/metrics` after the reload that removes
/// them, while a route that stays keeps counting in its series (no reset), also when a
/// change compiles it again.
#[tokio::test(flavor = "multi_thread")]
async fn removed_route_and_backend_series_are_dropped() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    env.write_manifest("infra.yaml", &serving_infra(net))?;
    env.write_manifest(
        "keep.yaml",
        &route(
            "default",
            "keep",
            "edge",
            &["keep.example.com"],
            &[("PathPrefix", "/", "svc")],
        ),
    )?;
    // Route "gone" and its Service, whose endpoint (echo b's address, nothing listening)
    // refuses connections: a 5xx and an upstream connect error by backend.
    let mut gone = route(
        "default",
        "gone",
        "edge",
        &["gone.example.com"],
        &[("PathPrefix", "/", "svc-gone")],
    );
    gone.push_str(&backend("default", "svc-gone", net.echo_b(), true));
    env.write_manifest("gone.yaml", &gone)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env.spawn_edge("edge").await?;
    env.wait_listener(gw).await?;

    let r = env.h1(gw, "keep.example.com", "/series").await?;
    ensure!(
        r.status == StatusCode::OK,
        "keep.example.com answered {}",
        r.status
    );
    let r = env.h1(gw, "gone.example.com", "/series").await?;
    ensure!(
        r.status.is_server_error(),
        "gone.example.com answered {}",
        r.status
    );
    let keep = "route=\"default/keep\"";
    eventually(
        "both routes' series are on /metrics",
        EVENTUALLY,
        || async move {
            let text = metrics_text(net).await?;
            ensure!(
                metric_sum_where(&text, "aether_requests_total", keep) >= 1.0,
                "no 2xx of default/keep: {:?}",
                lines_naming(&text, "default/keep")
            );
            ensure!(
                metric_sum_where(&text, "aether_requests_total", "route=\"default/gone\"") >= 1.0,
                "no 5xx of default/gone: {:?}",
                lines_naming(&text, "gone")
            );
            ensure!(
                metric_sum_where(&text, "aether_upstream_connect_errors_total", "svc-gone") >= 1.0,
                "no connect error of svc-gone: {:?}",
                lines_naming(&text, "svc-gone")
            );
            Ok(())
        },
    )
    .await?;

    std::fs::remove_file(env.manifests().join("gone.yaml"))?;
    eventually("the reload removes route gone", EVENTUALLY, || async move {
        let r = h1_get_from(net.client_ip(), net.gw(), "gone.example.com", "/series").await?;
        ensure!(
            r.status == StatusCode::NOT_FOUND,
            "gone.example.com answered {}",
            r.status
        );
        Ok(())
    })
    .await?;
    let r = env.h1(gw, "keep.example.com", "/series").await?;
    ensure!(
        r.status == StatusCode::OK,
        "keep.example.com answered {}",
        r.status
    );
    let text = eventually(
        "route gone's series leave /metrics",
        EVENTUALLY,
        || async move {
            let text = metrics_text(net).await?;
            let left = lines_naming(&text, "gone");
            ensure!(
                left.is_empty(),
                "series of the removed route or backend: {left:?}"
            );
            Ok(text)
        },
    )
    .await?;
    // The route that stayed counts on where it was: 2 answers, not 1 after a reset.
    ensure!(
        metric_sum_where(&text, "aether_requests_total", keep) == 2.0,
        "default/keep's series after the reload: {:?}",
        lines_naming(&text, "default/keep")
    );
    ensure!(
        text.contains("# HELP aether_requests_total "),
        "aether_requests_total has no HELP:\n{text}"
    );

    // A change to route keep compiles it again: its counter still goes on (3).
    env.write_manifest(
        "keep.yaml",
        &route(
            "default",
            "keep",
            "edge",
            &["keep.example.com", "kept.example.com"],
            &[("PathPrefix", "/", "svc")],
        ),
    )?;
    eventually(
        "the changed route serves its new hostname",
        EVENTUALLY,
        || async move {
            let r = h1_get_from(net.client_ip(), net.gw(), "kept.example.com", "/series").await?;
            ensure!(
                r.status == StatusCode::OK,
                "kept.example.com answered {}",
                r.status
            );
            Ok(())
        },
    )
    .await?;
    let text = metrics_text(net).await?;
    ensure!(
        metric_sum_where(&text, "aether_requests_total", keep) == 3.0,
        "default/keep's series after a change to the route: {:?}",
        lines_naming(&text, "default/keep")
    );
    env.pass()
}
