//! The packaged charts (charts/package.sh) installed as docs/install.md tells a user,
//! with a real Helm against the real API server: the CRDs chart first (every CRD of the
//! bundle established, the Gateway CRD carrying GEP-5093's `routability`), then the
//! edge chart (its GatewayClass is a kind the first chart created). Replacing the
//! Gateway CRD with the published one drops the field; upgrading the CRDs chart brings
//! it back. Uninstalling the CRDs chart keeps the CRDs, and with them every Gateway.

use std::path::Path;
use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use crate::cluster::{BoxError, Cluster};
use crate::{Wait, eventually_some};

const GATEWAY_CRD: &str = "gateways.gateway.networking.k8s.io";

/// Runs `tool args` against the test cluster, with Helm's state inside the cluster's
/// directory; the output, or an error with what the tool said.
fn run(cluster: &Cluster, tool: &Path, args: &[&str]) -> Result<String, BoxError> {
    let state = cluster.dir.path().join("helm");
    let out = Command::new(tool)
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("HELM_CACHE_HOME", state.join("cache"))
        .env("HELM_CONFIG_HOME", state.join("config"))
        .env("HELM_DATA_HOME", state.join("data"))
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "{} {args:?}: {}{}",
            tool.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Whether every served version of the Gateway CRD declares `routability` in both
/// `spec.addresses[]` and `status.addresses[]`.
fn declares_routability(crd: &CustomResourceDefinition) -> Result<bool, BoxError> {
    let crd = serde_json::to_value(crd)?;
    let versions = crd["spec"]["versions"].as_array().ok_or("no versions")?;
    Ok(!versions.is_empty()
        && versions.iter().all(|v| {
            ["spec", "status"].iter().all(|part| {
                let props = &v["schema"]["openAPIV3Schema"]["properties"];
                props[part]["properties"]["addresses"]["items"]["properties"]["routability"]
                    .is_object()
            })
        }))
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// The Gateway API CRDs the server holds: (name, established).
async fn gateway_api_crds(api: &Api<CustomResourceDefinition>) -> Vec<(String, bool)> {
    let mut crds: Vec<(String, bool)> = api
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter(|c| c.spec.group.starts_with("gateway.networking."))
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), established(c)))
        .collect();
    crds.sort();
    crds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packaged_charts_install_crds_with_routability_then_the_edge() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start_without_crds().await? else {
        return Ok(());
    };
    let Some(charts) = tokio::task::spawn_blocking(|| {
        aether_test_support::test_tool(
            "charts/package.sh",
            "no Go toolchain, so no CRDs to package",
        )
    })
    .await??
    else {
        return Ok(());
    };
    let helm = aether_test_support::required_tool("tests/chart/tools.sh")?;
    let kubectl = helm
        .parent()
        .and_then(Path::parent)
        .ok_or("helm's directory")?
        .join("kubectl/kubectl");
    let version = std::fs::read_to_string(
        aether_test_support::repo_root().join("charts/aether-edge/Chart.yaml"),
    )?
    .lines()
    .find_map(|l| l.strip_prefix("version: ").map(str::to_owned))
    .ok_or("no version in Chart.yaml")?;
    let crds_chart = charts.join(format!("aether-edge-crds-{version}.tgz"));
    let edge_chart = charts.join(format!("aether-edge-{version}.tgz"));
    let crds_chart = crds_chart.to_str().ok_or("path")?;
    let client = cluster.client().await?;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());

    tokio::task::block_in_place(|| {
        run(
            &cluster,
            &helm,
            &["install", "aether-edge-crds", crds_chart],
        )
    })?;
    // The bundle's CRDs (experimental channel: the x-k8s.io kinds too), all established.
    let installed = eventually_some("the bundle's CRDs established", Wait::API, || async {
        let all = gateway_api_crds(&crds).await;
        (all.len() >= 12 && all.iter().all(|(_, ok)| *ok)).then_some(all)
    })
    .await?;
    let names: Vec<&str> = installed.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        GATEWAY_CRD,
        "httproutes.gateway.networking.k8s.io",
        "udproutes.gateway.networking.k8s.io",
        "xbackendtrafficpolicies.gateway.networking.x-k8s.io",
    ] {
        assert!(names.contains(&want), "{want} not installed: {names:?}");
    }
    assert!(declares_routability(&crds.get(GATEWAY_CRD).await?)?);

    // The edge chart, into a namespace of its own: its GatewayClass is accepted now.
    tokio::task::block_in_place(|| {
        run(
            &cluster,
            &helm,
            &[
                "install",
                "aether-edge",
                edge_chart.to_str().unwrap_or_default(),
                "--namespace",
                "aether-system",
                "--create-namespace",
            ],
        )
    })?;
    let class = Api::<gateway_api::gatewayclasses::GatewayClass>::all(client.clone())
        .get("aether")
        .await?;
    assert_eq!(class.spec.controller_name, "aether.io/edge");

    // Someone re-applies the published Gateway CRD: the field is gone. Upgrading the
    // CRDs chart puts it back; Helm 4 applies server-side, so it must be told to take
    // the fields another manager (kubectl) now owns, as docs/upgrade.md says.
    let stock = crate::cluster::crds_dir()?
        .ok_or("no CRDs")?
        .join("config/crd/experimental/gateway.networking.k8s.io_gateways.yaml");
    tokio::task::block_in_place(|| {
        run(
            &cluster,
            &kubectl,
            &["replace", "-f", stock.to_str().unwrap_or_default()],
        )
    })?;
    assert!(!declares_routability(&crds.get(GATEWAY_CRD).await?)?);
    tokio::task::block_in_place(|| {
        run(
            &cluster,
            &helm,
            &[
                "upgrade",
                "aether-edge-crds",
                crds_chart,
                "--force-conflicts",
            ],
        )
    })?;
    assert!(
        declares_routability(&crds.get(GATEWAY_CRD).await?)?,
        "helm upgrade did not restore routability"
    );

    // Uninstalling the CRDs chart must not delete the CRDs (and every object of them).
    tokio::task::block_in_place(|| run(&cluster, &helm, &["uninstall", "aether-edge-crds"]))?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let left = gateway_api_crds(&crds).await;
    assert_eq!(left, installed, "CRDs deleted by helm uninstall");
    cluster.pass()
}
