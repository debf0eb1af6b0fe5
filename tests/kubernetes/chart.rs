//! The Helm chart, rendered by a real `helm template` and applied with server-side
//! apply to the real API server: every object it renders must be accepted as written
//! (built-in kinds by the server's own validation, GatewayClass by the official CRD,
//! PodMonitor and ServiceMonitor by the Prometheus Operator's).

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client};

use crate::cluster::{BoxError, Cluster};

/// Renders the chart with `helm template` (tests/chart/tools.sh fetches Helm once).
pub(crate) fn render(values: Option<&str>) -> Result<String, BoxError> {
    render_set(values, &[])
}

/// [`render`] with `--set` overrides.
fn render_set(values: Option<&str>, set: &[&str]) -> Result<String, BoxError> {
    let root = aether_test_support::repo_root();
    let helm = aether_test_support::required_tool("tests/chart/tools.sh")?;
    let mut cmd = Command::new(helm);
    cmd.args(["template", "aether-edge"])
        .arg(root.join("charts/aether-edge"))
        .args(["--namespace", "aether-system"]);
    if let Some(v) = values {
        cmd.arg("-f").arg(root.join(v));
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!("helm template: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Applies every rendered document; `dry_run` asks the server to validate and admit
/// without storing.
async fn apply_all(client: &Client, yaml: &str, dry_run: bool) -> Result<usize, BoxError> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut params = PatchParams::apply("aether-test").force();
    params.dry_run = dry_run;
    let mut applied = 0;
    for doc in yaml.split("\n---") {
        let value: serde_json::Value = match serde_saphyr::from_str(doc) {
            Ok(serde_json::Value::Null) | Err(_) if doc.trim().is_empty() => continue,
            Ok(v) => v,
            Err(e) => return Err(format!("rendered YAML does not parse: {e}\n{doc}").into()),
        };
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value.clone())?;
        let types = obj
            .types
            .clone()
            .ok_or("a rendered object without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| format!("the API server does not serve {gvk:?}"))?;
        let name = obj
            .metadata
            .name
            .clone()
            .ok_or("a rendered object without a name")?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = obj.metadata.namespace.as_deref().unwrap_or("default");
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &params, &Patch::Apply(&value))
            .await
            .map_err(|e| format!("{} {name} refused: {e}", types.kind))?;
        applied += 1;
    }
    Ok(applied)
}

/// The container args the chart renders are flags the binary accepts: it is started
/// with them (admin moved to a free loopback port) and must still be running after a
/// moment, where a usage error would have exited at once with status 2.
fn args_are_accepted(cluster: &Cluster, yaml: &str) -> Result<(), BoxError> {
    let deployment = yaml
        .split("\n---")
        .find(|d| d.contains("kind: Deployment"))
        .ok_or("no Deployment rendered")?;
    let value: serde_json::Value = serde_saphyr::from_str(deployment)?;
    // The dedicated pod template is read at start: give it the rendered ConfigMap's
    // copy, as the pod's volume would.
    let template = yaml
        .split("\n---")
        .find(|d| d.contains("kind: ConfigMap") && d.contains("pod-template.yaml"))
        .map(serde_saphyr::from_str::<serde_json::Value>)
        .transpose()?
        .and_then(|cm| cm["data"]["pod-template.yaml"].as_str().map(str::to_owned));
    let template_path = cluster.dir.path().join("rendered-pod-template.yaml");
    if let Some(t) = &template {
        std::fs::write(&template_path, t)?;
    }
    let args: Vec<String> = value["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .ok_or("the Deployment has no args")?
        .iter()
        .filter_map(|a| a.as_str())
        .filter(|a| !a.starts_with("--admin="))
        .map(|a| match a.strip_prefix("--dedicated-pod-template=") {
            Some(_) => format!("--dedicated-pod-template={}", template_path.display()),
            None => a.to_owned(),
        })
        .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aether-edge"));
    cmd.args(&args)
        .arg(format!("--admin=127.0.0.1:{}", crate::free_port()))
        .env("KUBECONFIG", &cluster.kubeconfig);
    let mut edge = cluster.proc(cmd, "edge-chart-args")?;
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let exited = edge.try_exit()?;
    edge.kill()?;
    assert!(
        exited.is_none(),
        "aether-edge {args:?} exited at once ({exited:?}): {}",
        edge.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_applies_to_a_real_apiserver() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    crate::apply(
        &Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()),
        "aether-system",
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": "aether-system"}}),
    )
    .await;

    // The variant renders a PodMonitor: the operator's own CRD validates it.
    let monitoring = tokio::task::spawn_blocking(crate::cluster::monitoring_crd_files)
        .await??
        .ok_or("no Prometheus Operator CRDs")?;
    crate::cluster::install_crd_files(&client, &monitoring).await?;

    let variant = render(Some("tests/chart/values-variant.yaml"))?;
    let n = apply_all(&client, &variant, true).await?;
    assert!(n >= 6, "only {n} objects in the variant rendering");
    args_are_accepted(&cluster, &variant)?;
    // The ServiceMonitor is the other choice (the chart renders one or the other).
    let service_monitor = render_set(None, &["metrics.serviceMonitor.enabled=true"])?;
    assert!(service_monitor.contains("\nkind: ServiceMonitor\n"));
    apply_all(&client, &service_monitor, true).await?;

    let default = render(None)?;
    let n = apply_all(&client, &default, false).await?;
    assert!(n >= 8, "only {n} objects in the default rendering");
    // Also reads the dedicated Gateways' pod template the chart rendered.
    args_are_accepted(&cluster, &default)?;
    // What the server stored runs the edge against its own Service, with a grace
    // period that covers the drain.
    let deploy = Api::<Deployment>::namespaced(client.clone(), "aether-system")
        .get("aether-edge")
        .await?;
    let pod = deploy
        .spec
        .and_then(|s| s.template.spec)
        .ok_or("no pod spec")?;
    let args = pod.containers[0].args.clone().unwrap_or_default();
    assert!(
        args.iter()
            .any(|a| a == "--edge-service=aether-system/aether-edge"),
        "{args:?}"
    );
    assert_eq!(pod.termination_grace_period_seconds, Some(40));
    let class = Api::<gateway_api::gatewayclasses::GatewayClass>::all(client.clone())
        .get("aether")
        .await?;
    assert_eq!(class.spec.controller_name, "aether.io/edge");
    cluster.pass()
}
