//! What an operator sees: a bad `--manifests` path stops the start, a listener whose
//! port is taken logs once and then retries quietly, and process logs in JSON.

use std::time::Duration;

use crate::common::*;

/// How long a retry may wait at most after the port frees (the backoff's ceiling, 30 s)
/// plus a margin for a busy machine.
const BIND_RETRY_CEILING: Duration = Duration::from_secs(40);

fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_manifests_path_is_a_startup_error() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    env.write_manifest("infra.yaml", &standard_infra(net))?;
    let missing = env.dir.path().join("no-such-manifests");
    let args: Vec<String> = [
        "run".to_owned(),
        "--manifests".to_owned(),
        env.manifests().display().to_string(),
        "--manifests".to_owned(),
        missing.display().to_string(),
        "--admin".to_owned(),
        net.admin().to_string(),
        "--address-pool".to_owned(),
        net.pool(),
    ]
    .into();
    let mut edge = env.spawn("edge", &args)?;
    let status = edge.wait_exit(EVENTUALLY).await?;
    ensure!(!status.success(), "the edge exited with {status}");
    let log = edge.log();
    ensure!(
        lines_with(&log, &missing.display().to_string()) > 0,
        "the error does not name {}: {log}",
        missing.display()
    );
    ensure!(
        lines_with(&log, "No such file or directory") > 0,
        "the error does not say why: {log}"
    );
    // It never served: the Gateway's listener was never bound.
    ensure!(
        lines_with(&log, "listener bound") == 0,
        "a listener was bound: {log}"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_bind_logs_once_then_binds_when_the_port_frees() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let gw = net.gw();
    // Another process holds the Gateway's socket before the edge starts.
    let squatter = std::net::TcpListener::bind(gw)?;
    let mut infra = standard_infra(net);
    infra.push_str(&route(
        "default",
        "route-a",
        "edge",
        &[],
        &[("PathPrefix", "/", "svc-a")],
    ));
    env.write_manifest("infra.yaml", &infra)?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mut edge = env.spawn_edge("edge").await?;
    eventually("the bind failure is reported", EVENTUALLY, || async {
        let st = env.status().await?;
        let gw = status_item(&st, "Gateway", "default", "edge")?;
        let l = gateway_listener(gw, "http")?;
        expect_condition(
            &l["conditions"],
            "Accepted",
            "False",
            Some("PortUnavailable"),
        )
    })
    .await?;

    // Several seconds of a port that stays taken: retries happen, but the failure is
    // news once. (The edge used to log an ERROR and an INFO every second.)
    tokio::time::sleep(Duration::from_secs(5)).await;
    edge.check_alive()?;
    let log = edge.log();
    ensure!(
        lines_with(&log, "cannot bind listener") == 1,
        "the bind failure was logged {} times:\n{log}",
        lines_with(&log, "cannot bind listener")
    );
    ensure!(
        lines_with(&log, "configuration applied") == 1,
        "the configuration was logged as applied {} times:\n{log}",
        lines_with(&log, "configuration applied")
    );

    // Once the port is free a retry binds it, without a reload, and says so.
    drop(squatter);
    eventually(
        "the listener serves after its port frees",
        BIND_RETRY_CEILING,
        || async {
            let e = env.h1(gw, "any.example.com", "/after").await?.echo()?;
            ensure!(e.name() == "a", "answered by {}", e.0);
            Ok(())
        },
    )
    .await?;
    let log = edge.log();
    ensure!(
        log.lines()
            .any(|l| l.contains("listener bound") && l.contains("retried=true")),
        "no INFO line says the listener bound after failing:\n{log}"
    );
    ensure!(
        lines_with(&log, "cannot bind listener") == 1,
        "the bind failure was logged again:\n{log}"
    );
    env.pass()
}

#[tokio::test(flavor = "multi_thread")]
async fn log_format_json_writes_one_json_object_per_line() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let mut infra = standard_infra(net);
    infra.push_str(&route(
        "default",
        "route-a",
        "edge",
        &[],
        &[("PathPrefix", "/", "svc-a")],
    ));
    env.write_manifest("infra.yaml", &infra)?;
    // A broken file: an ERROR with fields (file, line, reason) among the lines.
    env.write_manifest("broken.yaml", "kind: [unclosed\n")?;
    let _echo = env.spawn_echo(net.echo_a(), "a").await?;
    let mut edge = env
        .spawn_edge_args("edge", &[env.manifests()], &["--log-format", "json"])
        .await?;
    env.wait_listener(net.gw()).await?;
    let e = env.h1(net.gw(), "any.example.com", "/").await?.echo()?;
    ensure!(e.name() == "a", "answered by {}", e.0);
    edge.signal("TERM")?;
    let status = edge.wait_exit(EVENTUALLY).await?;
    ensure!(status.success(), "the edge exited with {status}");

    let log = edge.log();
    let mut levels = std::collections::BTreeSet::new();
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| err(format!("not JSON ({e}): {line:?}\nlog:\n{log}")))?;
        for field in ["level", "target", "message", "timestamp"] {
            ensure!(v[field].is_string(), "no string {field:?} in {line}");
        }
        levels.insert(v["level"].as_str().unwrap_or_default().to_owned());
        messages.push(v["message"].as_str().unwrap_or_default().to_owned());
    }
    // Enough lines to mean something: startup, the manifest error, the drain.
    for want in [
        "configuration applied",
        "listener bound",
        "drained; exiting",
    ] {
        ensure!(
            messages.iter().any(|m| m == want),
            "no {want:?} line in:\n{log}"
        );
    }
    ensure!(
        levels.contains("ERROR") && levels.contains("INFO"),
        "levels {levels:?}"
    );
    env.pass()
}
