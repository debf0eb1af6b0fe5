//! Dedicated Gateways against the real API server: an annotated Gateway gets a Deployment, a
//! PodDisruptionBudget and a pods Service of its own; running exactly what that Deployment says serves that
//! Gateway alone, the shared edge stops serving it (after a linger: endpoints take a
//! while to move everywhere), and its Service's endpoints follow its own pods. Dropping
//! the annotation hands it back to the shared edge.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{Api, Client};
use serde_json::{Value, json};

use aether_test_support::manifest::Manifest;

use crate::cluster::{BoxError, Cluster};
use crate::{
    Edge, Net, RANGE, Wait, apply, class_and_namespaces, edge_pods, eventually_gone,
    eventually_some, free_port, gateway_condition, gateway_slice, get, m, put, service_ports,
};

/// Gateway `ns/name` with `annotations` (all of them: applying it again without one
/// removes it), and a route redirecting to `<name>.example.com`.
async fn gateway(client: &Client, ns: &str, name: &str, annotations: Value) {
    let gw = m::Gateway::test(name)
        .namespace(ns)
        .infrastructure(json!({"labels": {"team": "blue"}}))
        .http("http", 80);
    let mut gw = gw.json();
    gw["metadata"]["annotations"] = annotations;
    put::<Gateway>(client, &gw).await;
    let route = m::HttpRoute::test(name)
        .namespace(ns)
        .parent(name)
        .redirect(&format!("{name}.example.com"), 302);
    put::<HttpRoute>(client, &route).await;
}

/// Which Gateway answered on `addr`: the redirect target, or None if nothing listens.
async fn served_by(addr: SocketAddr) -> Option<String> {
    let answer = get(addr, "any.example.com").await.ok()?;
    let location = answer.header("location")?.strip_prefix("http://")?;
    location.split('.').next().map(str::to_owned)
}

fn dedicated_condition(gw: &Gateway) -> Option<(String, String)> {
    let (status, reason, _) = gateway_condition(gw, "aether.io/Dedicated")?;
    Some((status, reason))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_gateway_is_served_by_its_own_deployment() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["one", "two"]).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;

    // The pod template the chart would render: here, the flags a dedicated pod needs
    // to run on this machine. The test later runs exactly what the Deployment says.
    let admin = free_port();
    // Internal ports on loopback networks of their own: the port range is shared.
    let (shared, dedicated) = (Net::allocate().ip(1), Net::allocate().ip(1));
    let template = format!(
        "metadata:\n  labels: {{app.kubernetes.io/name: aether-edge}}\nspec:\n  serviceAccountName: aether-edge\n  containers:\n  - name: edge\n    image: example.com/aether-edge:test\n    args: [run, --kubernetes, --admin, '127.0.0.1:{admin}', --internal-port-range, '{RANGE}', --listen-address, '{dedicated}', --drain-timeout, 1s]\n    ports: [{{name: admin, containerPort: {admin}}}]\n"
    );
    let template_path = cluster.dir.path().join("pod-template.yaml");
    std::fs::write(&template_path, template)?;
    let template_arg = template_path.display().to_string();
    // The drain delay is also how long a listener the edge drops keeps serving.
    let _shared = Edge::new(&cluster, &shared.to_string(), "shared")
        .args(&["--dedicated-pod-template", &template_arg])
        .args(&["--drain-delay", "10s"])
        .start();
    gateway(&client, "one", "plain", json!({})).await;
    gateway(
        &client,
        "two",
        "own",
        json!({"aether.io/dedicated": "true"}),
    )
    .await;

    // The Deployment and pods Service, in the edge's namespace.
    let deployments = Api::<Deployment>::namespaced(client.clone(), "aether-system");
    let deployment = eventually_some("the dedicated Deployment", Wait::API, || async {
        deployments.get_opt("aether-two-own").await.ok().flatten()
    })
    .await?;
    let labels = deployment.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("blue"));
    let spec = deployment.spec.clone().unwrap_or_default();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.clone().unwrap_or_default();
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("example.com/aether-edge:test")
    );
    let args = container.args.clone().unwrap_or_default();
    assert_eq!(
        args.last().map(String::as_str),
        Some("--serve-gateway=two/own")
    );
    let pods_service = eventually_some("the pods Service", Wait::API, || async {
        Api::<Service>::namespaced(client.clone(), "aether-system")
            .get_opt("aether-two-own")
            .await
            .ok()
            .flatten()
    })
    .await?;
    let selector = pods_service
        .spec
        .and_then(|s| s.selector)
        .unwrap_or_default();
    assert_eq!(
        Some(&selector),
        spec.template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .map(|l| {
                l.iter()
                    .filter(|(k, _)| selector.contains_key(*k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .as_ref(),
        "the pods Service selects the Deployment's pods"
    );
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), "aether-system");
    let budget = eventually_some("the PodDisruptionBudget", Wait::API, || async {
        budgets.get_opt("aether-two-own").await.ok().flatten()
    })
    .await?;
    assert_eq!(
        budget.spec.and_then(|s| s.selector),
        Some(spec.selector.clone())
    );
    let gateways = Api::<Gateway>::namespaced(client.clone(), "two");
    eventually_some("aether.io/Dedicated=True", Wait::API, || async {
        let gw = gateways.get("own").await.ok()?;
        (dedicated_condition(&gw)? == ("True".into(), "Provisioned".into())).then_some(())
    })
    .await?;

    // Play the cluster's EndpointSlice controller for the pods Service, as it does:
    // the Service's labels copied onto the slice (ours among them, which once made
    // the edge delete the slice as one of its own). The Gateway's Service then names
    // those pods, the other Gateway's still the shared edge.
    let mut labels = Api::<Service>::namespaced(client.clone(), "aether-system")
        .get("aether-two-own")
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    labels.insert("kubernetes.io/service-name".into(), "aether-two-own".into());
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".into(),
        "endpointslice-controller.k8s.io".into(),
    );
    let pod_slices = Api::<EndpointSlice>::namespaced(client.clone(), "aether-system");
    apply(
        &pod_slices,
        "aether-two-own-abcde",
        json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "aether-two-own-abcde", "namespace": "aether-system",
                     "labels": labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.20"], "conditions": {"ready": true}}],
        "ports": [{"name": "admin", "port": admin, "protocol": "TCP"}]}),
    )
    .await;
    eventually_some("own's Service names its own pod", Wait::API, || async {
        let (eps, _) = gateway_slice(&client, "two", "own").await?;
        (eps == vec![("10.1.0.20".to_owned(), true)]).then_some(())
    })
    .await?;
    // Handed over, and still served here for the linger: kube-proxy on every node
    // applies the Service's new endpoints a little later, and what it still sends to
    // the shared edge meanwhile must not be refused.
    let own_port = u16::try_from(service_ports(&client, "two", "own").await.1[0].1)?;
    let plain_port = u16::try_from(service_ports(&client, "one", "plain").await.1[0].1)?;
    let at = |ip: std::net::Ipv4Addr, port: u16| SocketAddr::from((ip, port));
    assert_eq!(
        served_by(at(shared, own_port)).await.as_deref(),
        Some("own"),
        "the shared edge stopped serving a handed-over Gateway before its linger"
    );
    // And keeps naming it: the controller's slice is left alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        pod_slices.get_opt("aether-two-own-abcde").await?.is_some(),
        "the edge deleted the EndpointSlice controller's slice of the pods Service"
    );
    let (eps, _) = gateway_slice(&client, "two", "own")
        .await
        .unwrap_or_default();
    assert_eq!(eps, vec![("10.1.0.20".to_owned(), true)]);
    let (plain_eps, _) = gateway_slice(&client, "one", "plain")
        .await
        .unwrap_or_default();
    assert_eq!(plain_eps, vec![("10.1.0.10".to_owned(), true)]);

    // Run what the Deployment says.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aether-edge"));
    cmd.args(&args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "info");
    let _dedicated = cluster.proc(cmd, "edge-dedicated")?;
    eventually_some(
        "the dedicated pod serves its Gateway",
        Wait::API,
        || async {
            (served_by(at(dedicated, own_port)).await.as_deref() == Some("own")).then_some(())
        },
    )
    .await?;
    assert_eq!(
        served_by(at(shared, plain_port)).await.as_deref(),
        Some("plain")
    );
    eventually_some(
        "the shared edge stops serving own after the linger",
        Wait::API,
        || async {
            served_by(at(shared, own_port))
                .await
                .is_none()
                .then_some(())
        },
    )
    .await?;
    assert_eq!(
        served_by(at(dedicated, plain_port)).await,
        None,
        "a dedicated pod serves its Gateway only"
    );

    // Without the annotation the shared edge takes the Gateway back, at the same port,
    // and the Deployment and pods Service are deleted.
    gateway(&client, "two", "own", json!({})).await;
    eventually_some("the shared edge serves own again", Wait::API, || async {
        (served_by(at(shared, own_port)).await.as_deref() == Some("own")).then_some(())
    })
    .await?;
    eventually_gone(&deployments, "aether-two-own").await;
    eventually_some(
        "own's Service names the shared edge again",
        Wait::API,
        || async {
            let (eps, _) = gateway_slice(&client, "two", "own").await?;
            (eps == vec![("10.1.0.10".to_owned(), true)]).then_some(())
        },
    )
    .await?;
    eventually_gone(&budgets, "aether-two-own").await;
    let svc = Api::<Service>::namespaced(client.clone(), "aether-system")
        .get_opt("aether-two-own")
        .await?;
    assert!(svc.is_none(), "the pods Service is deleted too");
    // The status writer and the Service applier run apart: the condition goes in its
    // own write, not necessarily before the deletions.
    eventually_some(
        "own's Dedicated condition is removed",
        Wait::API,
        || async {
            let gw = gateways.get("own").await.ok()?;
            dedicated_condition(&gw).is_none().then_some(())
        },
    )
    .await?;
    cluster.pass()
}
