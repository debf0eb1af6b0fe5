//! RBAC that forbids a write, against a real API server running RBAC: the edge runs as
//! a user that may read everything and write Gateway Services (and HTTPRoute status)
//! in one namespace but not in another. The refused Gateway says why in its status,
//! the edge says it once in its log (Service and status write alike), the server sees
//! retries only at the backoff's pace, other Gateways are not held back, and granting
//! the permission later heals it without a restart.

use std::time::{Duration, Instant};

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{BoxError, Cluster, USER};
use crate::{
    Edge, Net, Wait, apply, class_and_namespaces, eventually_some, gateway_condition, m, put,
};

/// A refused object's retry schedule (controller/src/kube/retry_schedule.rs): 400 ms
/// after the first failure, doubled after each further one, at most 30 s.
const FIRST_RETRY: f64 = 0.4;
const MAX_BACKOFF: f64 = 30.0;

/// The most attempts that schedule allows within `elapsed` of the first one.
fn max_attempts(elapsed: Duration) -> usize {
    let (mut t, mut gap, mut n) = (0.0, FIRST_RETRY, 1);
    loop {
        t += gap;
        if t > elapsed.as_secs_f64() {
            return n;
        }
        n += 1;
        gap = (gap * 2.0_f64).min(MAX_BACKOFF);
    }
}

fn subject() -> Value {
    json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}])
}

/// What the test user may do: read what the edge watches, patch Gateway API status,
/// hold the writer Lease; write Gateway Services and slices only where bound below.
async fn grants(client: &Client) {
    let gw_kinds = [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "grpcroutes",
        "tlsroutes",
        "tcproutes",
        "udproutes",
        "referencegrants",
        "listenersets",
        "backendtlspolicies",
    ];
    // HTTPRoute status only where `edge-write` is bound, like Services.
    let status: Vec<String> = gw_kinds
        .iter()
        .filter(|k| **k != "httproutes")
        .map(|k| format!("{k}/status"))
        .collect();
    apply(
        &Api::<ClusterRole>::all(client.clone()),
        "edge-read",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "edge-read"},
               "rules": [
                 {"apiGroups": ["gateway.networking.k8s.io"], "resources": gw_kinds,
                  "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["gateway.networking.k8s.io"], "resources": status,
                  "verbs": ["patch", "update"]},
                 {"apiGroups": [""], "resources": ["namespaces", "secrets", "configmaps", "pods", "services"],
                  "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                  "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                  "resourceNames": ["gateways.gateway.networking.k8s.io"],
                  "verbs": ["get", "list", "watch"]}]}),
    )
    .await;
    apply(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        "edge-read",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "edge-read"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edge-read"},
               "subjects": subject()}),
    )
    .await;
    apply(
        &Api::<ClusterRole>::all(client.clone()),
        "edge-write",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "edge-write"},
               "rules": [
                 {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "patch", "delete"]},
                 {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes/status"],
                  "verbs": ["patch", "update"]},
                 {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                  "verbs": ["create", "patch", "delete"]}]}),
    )
    .await;
    apply(
        &Api::<Role>::namespaced(client.clone(), "aether-system"),
        "edge-lease",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "edge-lease", "namespace": "aether-system"},
               "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                          "verbs": ["get", "create", "update"]}]}),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(client.clone(), "aether-system"),
        "edge-lease",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "edge-lease", "namespace": "aether-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "edge-lease"},
               "subjects": subject()}),
    )
    .await;
    allow_writes(client, "open").await;
}

/// Lets the test user write Gateway Services and slices in `ns`.
async fn allow_writes(client: &Client, ns: &str) {
    apply(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        "edge-write",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "edge-write", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edge-write"},
               "subjects": subject()}),
    )
    .await;
}

/// Writes of `resource` the API server refused the edge (403), by its audit log.
fn forbidden(cluster: &Cluster, resource: &str) -> usize {
    cluster
        .user_writes()
        .iter()
        .filter(|e| e["objectRef"]["resource"] == resource && e["responseStatus"]["code"] == 403)
        .count()
}

async fn gateway(client: &Client, ns: &str, name: &str) {
    put::<Gateway>(
        client,
        &m::Gateway::test(name).namespace(ns).http("http", 80),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_service_write_is_a_condition_a_log_line_and_no_hot_loop()
-> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &["open", "locked"]).await;
    grants(&client).await;
    gateway(&client, "open", "gw").await;
    gateway(&client, "locked", "gw").await;
    let locked_routes = Api::<HttpRoute>::namespaced(client.clone(), "locked");
    let route = m::HttpRoute::test("r")
        .namespace("locked")
        .parent("gw")
        .rule();
    put::<HttpRoute>(&client, &route).await;
    let before_status = forbidden(&cluster, "httproutes");
    let before = forbidden(&cluster, "services");
    let started = Instant::now();
    // Internal ports on a loopback network of its own: the port range is shared.
    let listen = Net::allocate().ip_str(1);
    let mut edge = Edge::new(&cluster, &listen, "rbac")
        .kubeconfig(&cluster.user_kubeconfig)
        .start();

    // Where writing is allowed the Service is there: the user is not locked out as a
    // whole.
    let open_services = Api::<Service>::namespaced(client.clone(), "open");
    eventually_some("open/gw's Service", Wait::API, || async {
        open_services.get_opt("gw-aether").await.ok().flatten()
    })
    .await?;

    // (a) The locked Gateway says which Service it lacks and why.
    let locked = Api::<Gateway>::namespaced(client.clone(), "locked");
    let message = eventually_some(
        "locked/gw Programmed=False naming the forbidden Service",
        Wait::API,
        || async {
            let (status, reason, message) =
                gateway_condition(&locked.get("gw").await.ok()?, "Programmed")?;
            (status == "False"
                && reason == "AddressNotAssigned"
                && message.contains("Service locked/gw-aether cannot be written: forbidden"))
            .then_some(message)
        },
    )
    .await?;
    assert!(message.contains(&format!("User \"{USER}\"")), "{message}");
    let open = Api::<Gateway>::namespaced(client.clone(), "open");
    let open_message = gateway_condition(&open.get("gw").await?, "Programmed").map(|p| p.2);
    assert!(
        !open_message
            .clone()
            .unwrap_or_default()
            .contains("forbidden"),
        "{open_message:?}"
    );

    // (c) No hot loop: over a window the server saw no more refused Service writes
    // than the backoff allows (a 200 ms loop would be ~5 a second).
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(started.elapsed())).await;
    // Counted before the clock is read: every attempt counted fits in `elapsed`.
    let refused = forbidden(&cluster, "services") - before;
    let refused_status = forbidden(&cluster, "httproutes") - before_status;
    let elapsed = started.elapsed();
    eprintln!("refused Service writes the server saw in {elapsed:?}: {refused}");
    assert!(refused >= 2, "retried at all: {refused} refused writes");
    assert!(
        refused <= max_attempts(elapsed),
        "{refused} refused Service writes in {elapsed:?}: more than the backoff allows ({})",
        max_attempts(elapsed)
    );
    // The same for a status write RBAC forbids (HTTPRoute status in `locked`).
    eprintln!("refused HTTPRoute status writes in {elapsed:?}: {refused_status}");
    assert!(
        refused_status >= 2,
        "status retried at all: {refused_status}"
    );
    assert!(
        refused_status <= max_attempts(elapsed),
        "{refused_status} refused status writes in {elapsed:?}: more than the backoff allows"
    );
    assert!(edge.try_exit()?.is_none(), "the edge exited");

    // (b) One clear log line for it, not one per retry.
    let log = edge.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("Service locked/gw-aether cannot be written"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("forbidden"), "{}", lines[0]);
    let status_lines = log
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("status write failed") && l.contains("locked/r")
        })
        .count();
    assert_eq!(status_lines, 1, "{log}");

    // The refused Service backs off alone: a new Gateway where writing is allowed gets
    // its Service before the refused one is tried again (~5 s from now: attempts at
    // 0, 0.4, 1.2, 2.8, 6, 12.4, 25.2 s). Held back by one shared backoff, it would be
    // written in the same pass as that retry. An order of events, not a time limit.
    let refused_before = forbidden(&cluster, "services");
    gateway(&client, "open", "later").await;
    eventually_some("open/later's Service", Wait::API, || async {
        open_services.get_opt("later-aether").await.ok().flatten()
    })
    .await?;
    assert_eq!(
        forbidden(&cluster, "services"),
        refused_before,
        "open/later's Service waited for the refused Service's next retry"
    );

    // (d) Granting the permission heals it without a restart: the Service appears, the
    // condition clears, and the Gateway is programmed once it has an address.
    allow_writes(&client, "locked").await;
    let locked_services = Api::<Service>::namespaced(client.clone(), "locked");
    let deadline = Instant::now() + Duration::from_secs(60);
    while locked_services.get_opt("gw-aether").await?.is_none() {
        assert!(
            Instant::now() < deadline,
            "locked/gw's Service never appeared"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    locked_services
        .patch_status(
            "gw-aether",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.20"}]}}})),
        )
        .await?;
    eventually_some("locked/gw Programmed=True", Wait::API, || async {
        let (status, reason, _) = gateway_condition(&locked.get("gw").await.ok()?, "Programmed")?;
        (status == "True" && reason == "Programmed").then_some(())
    })
    .await?;
    eventually_some("locked/r's status, once allowed", Wait::API, || async {
        let r = locked_routes.get("r").await.ok()?;
        (!r.status?.parents.is_empty()).then_some(())
    })
    .await?;
    let settled = forbidden(&cluster, "services");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        forbidden(&cluster, "services"),
        settled,
        "still refused after the grant"
    );
    assert!(edge.try_exit()?.is_none(), "the edge exited");
    cluster.pass()
}

#[test]
fn backoff_bound_matches_the_schedule() {
    // Attempts at 0, 0.4, 1.2, 2.8, 6.0, 12.4, 25.2, 55.2 s.
    assert_eq!(max_attempts(Duration::from_secs(1)), 2);
    assert_eq!(max_attempts(Duration::from_secs(20)), 6);
    assert_eq!(max_attempts(Duration::from_secs(60)), 8);
}
