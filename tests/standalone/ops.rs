//! What an operator sees: a bad `--manifests` path stops the start.

use crate::common::*;

fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_manifests_path_is_a_startup_error() -> TestResult {
    let env = TestEnv::new(90)?;
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
