//! Two replicas at once: they converge with a bounded number of writes and no
//! flapping, and the writer Lease moves to the survivor when its holder dies.

use std::time::Duration;

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{Edge, Net, Wait, edge, eventually_some, programmed, setup};

/// Resource versions of a's Gateway and the route, sampled every 50 ms for `window`:
/// how many writes happened.
async fn count_writes(client: &Client, window: Duration) -> usize {
    let gateways = Api::<Gateway>::namespaced(client.clone(), "one");
    let routes = Api::<HttpRoute>::namespaced(client.clone(), "one");
    crate::writes_during(window, (&gateways, "a"), (&routes, "echo")).await
}

/// The resourceVersions of Gateway `one/a` and HTTPRoute `one/echo`, tagged apart.
async fn versions(client: &Client) -> Result<(String, String), BoxError> {
    use kube::ResourceExt;
    let gw = Api::<Gateway>::namespaced(client.clone(), "one")
        .get("a")
        .await?;
    let route = Api::<HttpRoute>::namespaced(client.clone(), "one")
        .get("echo")
        .await?;
    Ok((
        format!("gateway {}", gw.resource_version().unwrap_or_default()),
        format!("route {}", route.resource_version().unwrap_or_default()),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_converge_with_bounded_writes() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    setup(&client).await;
    // Two replicas (each would be its own pod; here two loopback addresses).
    let (listen_a, listen_b) = (Net::allocate().ip_str(1), Net::allocate().ip_str(1));
    let a = edge(&cluster, &listen_a, "a");
    let b = edge(&cluster, &listen_b, "b");
    let gateways = Api::<Gateway>::namespaced(client.clone(), "one");
    eventually_some("a's status written", Wait::API, || async {
        programmed(&gateways.get("a").await.ok()?).filter(|p| p.1 == "AddressNotAssigned")
    })
    .await?;
    let routes = Api::<HttpRoute>::namespaced(client.clone(), "one");
    eventually_some("route status written", Wait::API, || async {
        routes
            .get("echo")
            .await
            .ok()?
            .status
            .filter(|s| !s.parents.is_empty())
    })
    .await?;
    // Settled: nothing more is written, by either.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = count_writes(&client, Duration::from_secs(3)).await;
    assert_eq!(idle, 0, "status kept being written with nothing changing");

    // A change (an address) is written a bounded number of times, then nothing. The
    // versions before the change are the baseline: counting from the first read after
    // it would miss a write that lands first, and a fixed window one that lands late.
    let before = versions(&client).await?;
    Api::<Service>::namespaced(client.clone(), "one")
        .patch_status(
            "a-aether",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"hostname": "a.lb.example"}]}}}),
            ),
        )
        .await?;
    eventually_some("the new address is written", Wait::API, || async {
        let gw = gateways.get("a").await.ok()?;
        let addrs = gw.status?.addresses?;
        addrs
            .iter()
            .any(|a| a.value == "a.lb.example")
            .then_some(())
    })
    .await?;
    let mut seen = std::collections::BTreeSet::from([before.0, before.1]);
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < end {
        let now = versions(&client).await?;
        seen.extend([now.0, now.1]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes = seen.len() - 2;
    assert!(
        (1..=2).contains(&writes),
        "{writes} writes for one change by two instances"
    );
    let gw = gateways.get("a").await?;
    let addrs = gw.status.and_then(|s| s.addresses).unwrap_or_default();
    assert_eq!(
        (addrs[0].r#type.as_deref(), addrs[0].value.as_str()),
        (Some("Hostname"), "a.lb.example")
    );
    assert_eq!(
        count_writes(&client, Duration::from_secs(2)).await,
        0,
        "flapping"
    );

    // One writer: the Lease names one of the two processes. When it dies, the other
    // takes over within a few lease durations and writes what changed since.
    let lease = Api::<Lease>::namespaced(client.clone(), "aether-system")
        .get("aether-edge-writer")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    let (mut leader, survivor) = if holder.ends_with(&format!("-{}", a.pid())) {
        (a, b)
    } else {
        assert!(
            holder.ends_with(&format!("-{}", b.pid())),
            "the Lease names neither instance: {holder}"
        );
        (b, a)
    };
    leader.kill()?;
    Api::<Service>::namespaced(client.clone(), "one")
        .patch_status(
            "a-aether",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.77"}]}}})),
        )
        .await?;
    eventually_some(
        "the surviving instance writes the new address",
        Wait::API,
        || async {
            let gw = gateways.get("a").await.ok()?;
            let addrs = gw.status?.addresses?;
            (addrs.first()?.value == "192.0.2.77").then_some(())
        },
    )
    .await?;
    let lease = Api::<Lease>::namespaced(client.clone(), "aether-system")
        .get("aether-edge-writer")
        .await?;
    let spec = lease.spec.unwrap_or_default();
    assert!(
        spec.holder_identity
            .unwrap_or_default()
            .ends_with(&format!("-{}", survivor.pid())),
        "the Lease did not move to the survivor"
    );
    assert_eq!(spec.lease_transitions, Some(1));
    cluster.pass()
}

/// A writer that shuts down (SIGTERM, as in a rolling update) gives the Lease up: the
/// other replica takes it at its next try, long before the Lease would expire, and
/// writes what changes from then on. (Kept, the Lease would leave every Gateway's
/// endpoints unwritten for a whole duration while the rollout stops pods.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_shuts_down_hands_the_lease_over_at_once() -> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    setup(&client).await;
    // A duration no test would wait out: the handover must come from the release.
    let start = |label: &str| {
        Edge::new(&cluster, &Net::allocate().ip_str(1), label)
            .lease_duration("120s")
            .start()
    };
    let (a, b) = (start("a"), start("b"));
    let leases = Api::<Lease>::namespaced(client.clone(), "aether-system");
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let first = eventually_some("a holder", Wait::API, || async {
        holder(leases.get("aether-edge-writer").await.ok()?)
    })
    .await?;
    let (leader, survivor) = if first.ends_with(&format!("-{}", a.pid())) {
        (a, b)
    } else {
        (b, a)
    };
    leader.signal("TERM")?;
    let suffix = format!("-{}", survivor.pid());
    eventually_some("the survivor holds the Lease", Wait::API, || async {
        holder(leases.get("aether-edge-writer").await.ok()?).filter(|h| h.ends_with(&suffix))
    })
    .await?;
    // And writes: a new load-balancer address reaches the Gateway's status. Retried:
    // on a busy machine the first holder may have been stopped before it created the
    // Gateway's Service, and then the survivor creates it a moment later.
    let services = Api::<Service>::namespaced(client.clone(), "one");
    eventually_some(
        "the Gateway's Service takes a new address",
        Wait::API,
        || async {
            services
                .patch_status(
                    "a-aether",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.78"}]}}}),
                    ),
                )
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await?;
    let gateways = Api::<Gateway>::namespaced(client.clone(), "one");
    eventually_some("the survivor writes the new address", Wait::API, || async {
        let addrs = gateways.get("a").await.ok()?.status?.addresses?;
        (addrs.first()?.value == "192.0.2.78").then_some(())
    })
    .await?;
    assert!(
        leader.log().contains("writer Lease released"),
        "the leader did not say it released the Lease:\n{}",
        leader.log()
    );
    cluster.pass()
}
