//! `--route-latency-histogram`: a duration histogram per route, whose counts are the
//! requests a real client sent, that lints clean, and that leaves `/metrics` with its
//! route. Off by default (`metrics_lint::every_metric_has_help_and_type`).

use http::StatusCode;

use crate::common::*;
use crate::metrics_lint::{promtool, promtool_check};

const FAMILY: &str = "aether_route_request_duration_seconds";

fn routes(with_b: bool) -> String {
    let mut m = route(
        "default",
        "a",
        "edge",
        &["a.example.com"],
        &[("PathPrefix", "/", "svc")],
    );
    if with_b {
        m.push_str(&route(
            "default",
            "b",
            "edge",
            &["b.example.com"],
            &[("PathPrefix", "/", "svc")],
        ));
    }
    m
}

/// The labels of route `name`'s series (`route` last, so `route="default/a"` does not
/// match another route's prefix).
fn of(name: &str) -> String {
    format!("gateway=\"default/edge\",route_kind=\"HTTPRoute\",route=\"default/{name}\"")
}

fn family_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with(FAMILY)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn route_latency_histogram_counts_what_clients_sent() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    env.write_manifest("infra.yaml", &serving_infra(net))?;
    env.write_manifest("routes.yaml", &routes(true))?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let _edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--route-latency-histogram"])
        .await?;
    env.wait_listener(gw).await?;

    // 5 to route a (HTTP/1.1 and h2c), 3 to route b, 2 that no route matches.
    for i in 0..5 {
        let r = if i % 2 == 0 {
            env.h1(gw, "a.example.com", "/lat").await?
        } else {
            env.h2(gw, "a.example.com", "/lat").await?
        };
        ensure!(r.status == StatusCode::OK, "a answered {}", r.status);
    }
    for _ in 0..3 {
        let r = env.h1(gw, "b.example.com", "/lat").await?;
        ensure!(r.status == StatusCode::OK, "b answered {}", r.status);
    }
    for _ in 0..2 {
        let r = env.h1(gw, "nothing.example.com", "/lat").await?;
        ensure!(r.status == StatusCode::NOT_FOUND, "unrouted: {}", r.status);
    }

    let text = metrics_text(net).await?;
    for (name, sent) in [("a", 5.0), ("b", 3.0)] {
        let labels = of(name);
        let count = metric_sum_where(&text, &format!("{FAMILY}_count"), &labels);
        let inf = metric_sum_where(
            &text,
            &format!("{FAMILY}_bucket"),
            &format!("{labels},le=\"+Inf\""),
        );
        let sum = metric_sum_where(&text, &format!("{FAMILY}_sum"), &labels);
        ensure!(
            count == sent && inf == sent && sum > 0.0,
            "route {name}: sent {sent}, count {count}, +Inf {inf}, sum {sum}: {:?}",
            family_lines(&text)
        );
    }
    // Unrouted requests are in the per-Gateway histogram only: 10 in all.
    ensure!(
        !family_lines(&text)
            .iter()
            .any(|l| l.contains("route=\"none\"")),
        "a per-route series for unrouted requests: {:?}",
        family_lines(&text)
    );
    let gateway = metric_sum_where(
        &text,
        "aether_request_duration_seconds_count",
        "gateway=\"default/edge\"",
    );
    ensure!(gateway == 10.0, "per-Gateway count {gateway}, want 10");

    if let Some(promtool) = promtool()? {
        let (ok, said) = promtool_check(&promtool, &text)?;
        ensure!(
            ok && said.trim().is_empty(),
            "promtool check metrics (exit ok: {ok}) says:\n{said}\n--- /metrics:\n{text}"
        );
    }

    // Route b removed: its histogram goes, route a's stays as it was.
    env.write_manifest("routes.yaml", &routes(false))?;
    let text = eventually(
        "route b's histogram leaves /metrics",
        EVENTUALLY,
        || async move {
            let text = metrics_text(net).await?;
            let left: Vec<&str> = family_lines(&text)
                .into_iter()
                .filter(|l| l.contains("route=\"default/b\""))
                .collect();
            ensure!(left.is_empty(), "route b's series: {left:?}");
            Ok(text)
        },
    )
    .await?;
    let count = metric_sum_where(&text, &format!("{FAMILY}_count"), &of("a"));
    ensure!(count == 5.0, "route a's count after the reload: {count}");
    env.pass()
}
