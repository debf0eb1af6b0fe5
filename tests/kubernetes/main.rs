//! Kubernetes mode against a real kube-apiserver (see cluster.rs): Services, internal
//! ports, addresses, traffic, deletion, restarts and two instances at once.

// clippy.toml's allow-unwrap-in-tests covers #[test] functions only; this crate's
// helpers (outside them) may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backend_client_cert;
mod backend_tls;
mod chart;
mod chart_rbac;
mod churn;
mod cluster;
mod collision;
mod crd_schema;
mod crds_chart;
mod dedicated;
mod endpoint_burst;
mod infrastructure;
mod l4;
mod listenerset;
mod rbac;
mod replicas;
mod restart;
mod retry;
mod routability;
mod scale_memory;
mod secrets;
mod shared;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use aether_test_support::manifest::{self as m, Manifest};
use aether_test_support::{
    Net, Proc, Resp, Wait, admin_get, eventually_some, free_port, h1_get_from,
};
use gateway_api::gatewayclasses::GatewayClass;
use gateway_api::gateways::Gateway;
use gateway_api::grpcroutes::GrpcRoute;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use cluster::{BoxError, Cluster};

/// Unusual, so the proxies' internal ports clash with nothing else, and below Linux's
/// ephemeral range (32768-60999): a port from there can be taken by any outgoing
/// connection of a test running beside, and a full-suite run did see an edge fail to
/// bind one. `free_port()` stays below this range. Tests run at once and compute the
/// same ports for Gateways of the same name, so each test binds them on a loopback
/// network of its own (`Net::allocate`).
const RANGE: &str = "27100-27199";

/// `aether-edge run --kubernetes` against a test cluster: the one way tests start an
/// edge. Its log is `edge-<label>.log` in the cluster's directory, printed unless the
/// test passes (`cluster.pass()`).
struct Edge<'a> {
    cluster: &'a Cluster,
    kubeconfig: &'a Path,
    listen: String,
    label: String,
    admin: u16,
    lease_duration: &'static str,
    extra: Vec<String>,
}

impl<'a> Edge<'a> {
    /// Internal ports on `listen`, the admin server on a free port of 127.0.0.1, as
    /// the cluster's admin.
    fn new(cluster: &'a Cluster, listen: &str, label: &str) -> Self {
        Edge {
            cluster,
            kubeconfig: &cluster.kubeconfig,
            listen: listen.to_owned(),
            label: label.to_owned(),
            admin: free_port(),
            lease_duration: "2s",
            extra: Vec::new(),
        }
    }

    /// `--lease-duration` (default 2 s, so a killed writer is replaced quickly).
    fn lease_duration(mut self, duration: &'static str) -> Self {
        self.lease_duration = duration;
        self
    }

    /// As the user of `kubeconfig` (e.g. `cluster.user_kubeconfig`).
    fn kubeconfig(mut self, kubeconfig: &'a Path) -> Self {
        self.kubeconfig = kubeconfig;
        self
    }

    /// The admin server on 127.0.0.1:`port`.
    fn admin(mut self, port: u16) -> Self {
        self.admin = port;
        self
    }

    /// Extra command-line flags.
    fn args(mut self, extra: &[&str]) -> Self {
        self.extra.extend(extra.iter().map(|a| (*a).to_owned()));
        self
    }

    fn start(self) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aether-edge"));
        cmd.args([
            "run",
            "--kubernetes",
            "--admin",
            &format!("127.0.0.1:{}", self.admin),
            "--internal-port-range",
            RANGE,
            "--listen-address",
            &self.listen,
            "--drain-timeout",
            "1s",
            "--lease-duration",
            self.lease_duration,
        ])
        .args(&self.extra)
        .env("KUBECONFIG", self.kubeconfig)
        .env("RUST_LOG", "info,aether_controller=debug");
        self.cluster
            .proc(cmd, &format!("edge-{}", self.label))
            .unwrap()
    }
}

/// An edge with the defaults of [`Edge`].
fn edge(cluster: &Cluster, listen: &str, label: &str) -> Proc {
    Edge::new(cluster, listen, label).start()
}

/// Waits until the object `name` no longer exists.
async fn eventually_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually_some(&format!("{name} deleted"), Wait::API, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
}

async fn apply<K>(api: &Api<K>, name: &str, body: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("aether-test").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

/// Applies a namespaced object built with `aether_test_support::manifest` (its
/// namespace and name are its own) as a `K`.
async fn put<K>(client: &Client, object: &impl Manifest)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let body = object.json();
    let ns = body["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = body["metadata"]["name"].as_str().unwrap_or_default();
    apply(
        &Api::<K>::namespaced(client.clone(), ns),
        name,
        body.clone(),
    )
    .await;
}

/// How many times the objects `a` and `b` were written during `window`: their
/// resourceVersions, sampled every 50 ms while both exist (the first version seen of
/// each is not a write).
async fn writes_during<A, B>(window: Duration, a: (&Api<A>, &str), b: (&Api<B>, &str)) -> usize
where
    A: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    B: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use kube::ResourceExt;
    let mut seen = std::collections::BTreeSet::new();
    let end = Instant::now() + window;
    while Instant::now() < end {
        if let (Ok(x), Ok(y)) = (a.0.get(a.1).await, b.0.get(b.1).await) {
            seen.insert(("a", x.resource_version().unwrap_or_default()));
            seen.insert(("b", y.resource_version().unwrap_or_default()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen.len().saturating_sub(2)
}

/// Gateway `gw` in `ns` of class `aether`, with one HTTP listener on port 80.
async fn http_gateway(client: &Client, ns: &str) {
    put::<Gateway>(
        client,
        &m::Gateway::test("gw").namespace(ns).http("http", 80),
    )
    .await;
}

/// The GatewayClass `aether` (ours), the namespaces `namespaces`, and `aether-system`
/// (the edge's: it holds the writer Lease).
async fn class_and_namespaces(client: &Client, namespaces: &[&str]) {
    for ns in namespaces.iter().chain(&["aether-system"]) {
        apply(&Api::<Namespace>::all(client.clone()), ns, m::namespace(ns)).await;
    }
    apply(
        &Api::<GatewayClass>::all(client.clone()),
        m::CLASS,
        m::gateway_class(m::CLASS, m::CONTROLLER),
    )
    .await;
}

/// Namespaces, the class, Gateways `a` (ns one) and `b` (ns two), and a route on `a`
/// that redirects. (A real API server refuses loopback EndpointSlice addresses, and
/// tests stay on loopback, so the route answers at the edge instead of proxying.)
async fn setup(client: &Client) {
    class_and_namespaces(client, &["one", "two"]).await;
    for (ns, name) in [("one", "a"), ("two", "b")] {
        let gw = m::Gateway::test(name)
            .namespace(ns)
            .infrastructure(json!({"annotations": {"lb.example.com/pool": "blue"}}))
            .http("http", 80)
            .http("alt", 8080);
        put::<Gateway>(client, &gw).await;
    }
    let route = m::HttpRoute::test("echo")
        .namespace("one")
        .parent("a")
        .hostname("echo.example.com")
        .redirect("moved.example.com", 302);
    put::<HttpRoute>(client, &route).await;
}

/// The edge's own Service's EndpointSlice, as the cluster's EndpointSlice controller
/// would write it for these edge pods (an API server alone runs no controllers). The
/// addresses are data only: nothing connects to them.
async fn edge_pods(client: &Client, pods: &[(&str, &str, bool)]) {
    let endpoints: Vec<serde_json::Value> = pods
        .iter()
        .map(|(name, ip, ready)| {
            json!({"addresses": [ip], "conditions": {"ready": ready},
                   "targetRef": {"kind": "Pod", "namespace": "aether-system", "name": name}})
        })
        .collect();
    apply(
        &Api::<EndpointSlice>::namespaced(client.clone(), "aether-system"),
        "aether-edge-abcde",
        json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "aether-edge-abcde", "namespace": "aether-system",
                     "labels": {"kubernetes.io/service-name": "aether-edge",
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "admin", "port": 9901, "protocol": "TCP"}]}),
    )
    .await;
}

/// (address, ready) of the Gateway Service's EndpointSlice, and its (port name, port).
async fn gateway_slice(
    client: &Client,
    ns: &str,
    gw: &str,
) -> Option<(Vec<(String, bool)>, Vec<(String, i32)>)> {
    let slice = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .get_opt(&format!("{gw}-aether"))
        .await
        .ok()??;
    let eps = slice
        .endpoints
        .iter()
        .map(|e| {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            (e.addresses[0].clone(), ready)
        })
        .collect();
    let ports = slice
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.port.unwrap_or_default()))
        .collect();
    Some((eps, ports))
}

/// Listener port -> targetPort of the Gateway's Service, once it exists.
async fn service_ports(client: &Client, ns: &str, gw: &str) -> (Service, Vec<(i32, i32)>) {
    let api = Api::<Service>::namespaced(client.clone(), ns);
    let svc = eventually_some(&format!("Service {ns}/{gw}-aether"), Wait::API, || async {
        api.get_opt(&format!("{gw}-aether")).await.ok().flatten()
    })
    .await
    .unwrap();
    let ports = svc
        .spec
        .clone()
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .iter()
        .map(|p| match p.target_port {
            Some(IntOrString::Int(t)) => (p.port, t),
            _ => panic!("targetPort is not a number: {p:?}"),
        })
        .collect();
    (svc, ports)
}

/// (status, reason, message) of the Gateway's condition `ctype`, once it has one.
fn gateway_condition(gw: &Gateway, ctype: &str) -> Option<(String, String, String)> {
    gw.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ctype)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// (status, reason) of the Gateway's Programmed condition.
fn programmed(gw: &Gateway) -> Option<(String, String)> {
    let (status, reason, _) = gateway_condition(gw, "Programmed")?;
    Some((status, reason))
}

/// (status, reason, message) of condition `ctype` of the Gateway's listener `listener`.
fn listener_condition(
    gw: &Gateway,
    listener: &str,
    ctype: &str,
) -> Option<(String, String, String)> {
    let l = gw
        .status
        .as_ref()?
        .listeners
        .as_ref()?
        .iter()
        .find(|l| l.name == listener)?;
    l.conditions
        .iter()
        .find(|c| c.type_ == ctype)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Gateway `ns/name` as the API server has it, fields the typed `Gateway` does not
/// know (status.addresses[].routability) included.
async fn raw_gateway(client: &Client, ns: &str, name: &str) -> Option<serde_json::Value> {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::erase::<Gateway>(&()),
    );
    api.get(name).await.ok().map(|o| o.data)
}

/// `GET /hello` with `Host: host` from the edge at `addr`, on a fresh connection.
async fn get(addr: SocketAddr, host: &str) -> Result<Resp, BoxError> {
    h1_get_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr, host, "/hello").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_get_services_ports_addresses_and_traffic() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    setup(&client).await;
    edge_pods(&client, &[("edge-0", "10.1.0.10", true)]).await;
    let listen = Net::allocate().ip(1);
    let edge_a = edge(&cluster, &listen.to_string(), "a");

    // Two Gateways, two Services with distinct internal ports in range, owned by them.
    let gateways = Api::<Gateway>::namespaced(client.clone(), "one");
    let (svc_a, ports_a) = service_ports(&client, "one", "a").await;
    let (svc_b, ports_b) = service_ports(&client, "two", "b").await;
    let mut all: Vec<i32> = ports_a.iter().chain(&ports_b).map(|p| p.1).collect();
    assert_eq!(
        ports_a.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![80, 8080]
    );
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        4,
        "internal ports not distinct: {ports_a:?} {ports_b:?}"
    );
    assert!(all.iter().all(|p| (27100..=27199).contains(p)));
    let gw_a = gateways.get("a").await?;
    let owner = &svc_a.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid)),
        ("Gateway", gw_a.metadata.uid.as_ref())
    );
    assert_eq!(
        svc_b.spec.clone().and_then(|s| s.type_).as_deref(),
        Some("LoadBalancer")
    );

    // No selector (it could only select pods in "one"); an EndpointSlice we wrote names
    // the edge pods of aether-system at the internal ports, port by port name.
    assert_eq!(svc_a.spec.clone().and_then(|s| s.selector), None);
    let named: Vec<(String, i32)> = svc_a
        .spec
        .clone()
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .into_iter()
        .map(|p| match p.target_port {
            Some(IntOrString::Int(t)) => (p.name.unwrap_or_default(), t),
            other => panic!("targetPort {other:?}"),
        })
        .collect();
    let (eps, mut slice_ports) = eventually_some("a's EndpointSlice", Wait::API, || async {
        gateway_slice(&client, "one", "a").await
    })
    .await?;
    slice_ports.sort();
    assert_eq!(eps, vec![("10.1.0.10".to_owned(), true)]);
    assert_eq!(slice_ports, named);
    // A second edge pod comes up while the first one drains: mirrored as the cluster
    // reports it.
    edge_pods(
        &client,
        &[
            ("edge-0", "10.1.0.10", false),
            ("edge-1", "10.1.0.11", true),
        ],
    )
    .await;
    eventually_some(
        "the new edge pod in b's EndpointSlice",
        Wait::API,
        || async {
            let (eps, _) = gateway_slice(&client, "two", "b").await?;
            (eps == vec![
                ("10.1.0.10".to_owned(), false),
                ("10.1.0.11".to_owned(), true),
            ])
            .then_some(())
        },
    )
    .await?;
    assert_eq!(
        svc_a
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("lb.example.com/pool")
            .map(String::as_str),
        Some("blue")
    );

    // A GRPCRoute is watched, attached and given status like an HTTPRoute.
    let grpc_api: Api<GrpcRoute> = Api::namespaced(client.clone(), "one");
    apply(
        &grpc_api,
        "grpc",
        json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": "grpc", "namespace": "one"},
        "spec": {"parentRefs": [{"name": "a", "sectionName": "alt"}],
                 "rules": [{"matches": [{"method": {"service": "pkg.Svc", "method": "Get"}}]}]}}),
    )
    .await;
    eventually_some("the GRPCRoute's status", Wait::API, || async {
        let r = grpc_api.get("grpc").await.ok()?;
        let parent = r.status?.parents.into_iter().next()?;
        (parent.parent_ref.section_name.as_deref() == Some("alt")
            && parent
                .conditions
                .iter()
                .any(|c| c.type_ == "Accepted" && c.status == "True"))
        .then_some(())
    })
    .await?;

    // No load-balancer address yet: Programmed=False AddressNotAssigned.
    eventually_some("Programmed=False AddressNotAssigned", Wait::API, || async {
        let gw = gateways.get("a").await.ok()?;
        (programmed(&gw)? == ("False".into(), "AddressNotAssigned".into())).then_some(())
    })
    .await?;

    // Play MetalLB: the address shows up in status.addresses, and the Gateway is programmed.
    Api::<Service>::namespaced(client.clone(), "one")
        .patch_status(
            "a-aether",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})),
        )
        .await?;
    eventually_some("status.addresses from the Service", Wait::API, || async {
        let gw = gateways.get("a").await.ok()?;
        let addrs = gw.status.as_ref()?.addresses.clone()?;
        (addrs.first()?.value == "192.0.2.10"
            && programmed(&gw)? == ("True".into(), "Programmed".into()))
            .then_some(())
    })
    .await?;

    // Traffic on a's internal port for listener 80 is served by a's route; other hosts
    // are not.
    let internal: u16 = u16::try_from(ports_a[0].1)?;
    let answer = eventually_some("traffic through the internal port", Wait::API, || async {
        get(SocketAddr::from((listen, internal)), "echo.example.com")
            .await
            .ok()
            .filter(|r| r.status == 302)
    })
    .await?;
    // A redirect that keeps the port names the Gateway listener's port (80: left out),
    // not the internal port the connection landed on.
    assert_eq!(
        answer.header("location"),
        Some("http://moved.example.com/hello"),
        "{answer:?}"
    );
    let other = get(SocketAddr::from((listen, internal)), "other.example.com").await?;
    assert_eq!(other.status, 404, "{other:?}");

    // Restart with the Services gone: the same ports again, from identities alone.
    drop(edge_a);
    for (ns, name) in [("one", "a-aether"), ("two", "b-aether")] {
        Api::<Service>::namespaced(client.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await?;
    }
    let edge_a = edge(&cluster, &listen.to_string(), "a2");
    assert_eq!(service_ports(&client, "one", "a").await.1, ports_a);
    assert_eq!(service_ports(&client, "two", "b").await.1, ports_b);

    // Deleting a Gateway removes its Service.
    Api::<Gateway>::namespaced(client.clone(), "two")
        .delete("b", &DeleteParams::default())
        .await?;
    let services_two = Api::<Service>::namespaced(client.clone(), "two");
    eventually_gone(&services_two, "b-aether").await;
    let slices_two = Api::<EndpointSlice>::namespaced(client.clone(), "two");
    eventually_gone(&slices_two, "b-aether").await;
    drop(edge_a);
    cluster.pass()
}
