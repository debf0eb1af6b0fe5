use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

fn config(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let cli = Cli::try_parse_from(["aether-edge"].iter().chain(args)).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not `run`: {args:?}");
    };
    run.into_config(cli.log_format, |name| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    })
}

#[test]
fn the_flags_defaults_are_the_proxys_own() {
    let c = config(&["run", "--manifests", "m.yaml"], &[]).unwrap();
    // Every proxy default the CLI shows comes from ProxyConfig::DEFAULT: a default
    // changed in one place only would differ here.
    assert_eq!(c.proxy, ProxyConfig::DEFAULT);
    assert!(c.warnings.is_empty());
    let Source::Files(files) = c.source else {
        panic!("not standalone");
    };
    assert_eq!(files.manifests, [PathBuf::from("m.yaml")]);
}

#[test]
fn the_access_log_follows_the_log_format_unless_told() {
    let format = |args: &[&str]| {
        config(args, &[])
            .unwrap()
            .proxy
            .access_log
            .map(|s| s.format)
    };
    let json = Some(access_log::Format::Json);
    let text = Some(access_log::Format::Text);
    assert_eq!(
        format(&["--log-format", "json", "run", "--manifests", "m"]),
        json
    );
    assert_eq!(
        format(&["run", "--manifests", "m", "--access-log", "json"]),
        json
    );
    let args = [
        "--log-format",
        "json",
        "run",
        "--manifests",
        "m",
        "--access-log",
        "text",
    ];
    assert_eq!(format(&args), text);
    assert_eq!(
        format(&["run", "--manifests", "m", "--access-log", "off"]),
        None
    );
}

#[test]
fn zero_turns_a_limit_off() {
    let proxy = |extra: &[&str]| {
        let args: Vec<&str> = ["run", "--manifests", "m"]
            .iter()
            .chain(extra)
            .copied()
            .collect();
        config(&args, &[]).unwrap().proxy
    };
    let off = proxy(&["--max-request-body-bytes", "0", "--memory-budget", "0"]);
    assert_eq!(off.max_request_body, None);
    assert_eq!(off.memory_budget, MemoryBudget::Off);
    let set = proxy(&["--max-request-body-bytes", "10", "--memory-budget", "4096"]);
    assert_eq!(set.max_request_body, Some(10));
    assert_eq!(set.memory_budget, MemoryBudget::Bytes(4096));
    assert!(
        Cli::try_parse_from([
            "aether-edge",
            "run",
            "--manifests",
            "m",
            "--mesh",
            "--mesh-max-streams",
            "0"
        ])
        .is_err()
    );
}

#[test]
fn mesh_mode_needs_an_identity_from_somewhere() {
    let mesh = ["run", "--manifests", "m", "--mesh"];
    assert_eq!(config(&mesh, &[]).unwrap_err(), ConfigError::NoMeshIdentity);
    let from_env = config(&mesh, &[(SPIFFE_ENDPOINT_SOCKET, "/run/spire.sock")]).unwrap();
    let expected = IdentitySource::WorkloadApi("/run/spire.sock".into());
    assert_eq!(from_env.proxy.mesh.unwrap().identity, expected);
    let files = [
        "run",
        "--manifests",
        "m",
        "--mesh",
        "--mesh-svid-cert",
        "c",
        "--mesh-svid-key",
        "k",
        "--mesh-bundle",
        "b",
    ];
    let mesh = config(&files, &[]).unwrap().proxy.mesh.unwrap();
    assert_eq!(
        mesh.identity,
        IdentitySource::Files {
            cert: "c".into(),
            key: "k".into(),
            bundle: "b".into()
        }
    );
    assert_eq!(mesh.port, MeshConfig::DEFAULT_PORT);
}

#[test]
fn kubernetes_combinations_are_checked_once() {
    let err = config(
        &[
            "run",
            "--kubernetes",
            "--per-gateway-addressing",
            "false",
            "--serve-gateway",
            "ns/gw",
        ],
        &[],
    )
    .unwrap_err();
    assert_eq!(err, ConfigError::ServeGatewayNeedsPerGatewayAddressing);

    let shared = config(
        &[
            "run",
            "--kubernetes",
            "--per-gateway-addressing",
            "false",
            "--dedicated-pod-template",
            "t.yaml",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(shared.warnings.len(), 1, "{:?}", shared.warnings);
    let Source::Kubernetes(kube) = shared.source else {
        panic!("not Kubernetes");
    };
    assert_eq!(kube.internal_ports, None);
    assert_eq!(kube.dedicated_pod_template, None);

    let own = config(
        &["run", "--kubernetes", "--mesh", "--spiffe-socket", "s"],
        &[],
    )
    .unwrap();
    let Source::Kubernetes(kube) = own.source else {
        panic!("not Kubernetes");
    };
    assert!(kube.internal_ports.is_some());
    assert!(kube.watch_pods, "mesh mode needs the pods' identities");
}

#[test]
fn traces_are_exported_only_with_an_endpoint() {
    let off = config(&["run", "--manifests", "m", "--trace-sample", "0.5"], &[]).unwrap();
    assert_eq!(off.proxy.tracing, None);
    let on = config(
        &[
            "run",
            "--manifests",
            "m",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
            "--trace-sample",
            "0.5",
        ],
        &[],
    )
    .unwrap();
    let tracing = on.proxy.tracing.unwrap();
    assert_eq!(
        (tracing.endpoint.as_str(), tracing.sample),
        ("http://127.0.0.1:4317", 0.5)
    );
}

#[test]
fn the_per_route_histogram_is_on_only_when_asked() {
    let off = config(&["run", "--manifests", "m"], &[]).unwrap();
    assert!(!off.proxy.route_latency_histogram);
    let on = config(
        &["run", "--manifests", "m", "--route-latency-histogram"],
        &[],
    )
    .unwrap();
    assert!(on.proxy.route_latency_histogram);
}
