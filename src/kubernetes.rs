//! `aether-edge run --kubernetes`: cluster watches -> Store -> reconcile (debounced, on
//! a blocking thread) -> the same publish step as the file source, plus two effects:
//! status written back and a Service per Gateway.

use std::sync::Arc;

use aether_controller::Reconciler;
use aether_controller::kube::lease::{self, LeaseConfig};
use aether_controller::kube::services::{Desired, ServiceApplier};
use aether_controller::kube::status::StatusWriter;
use aether_controller::kube::watch::{Extra, Shared};
use aether_controller::reconcile::Addressing;
use aether_controller::reconcile::dedicated::DedicatedSettings;
use aether_controller::reconcile::services::ServiceSettings;
use aether_controller::{Settings, Statuses};
use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::app::SETTLE;
use crate::config::KubernetesConfig;
use crate::publish::Publisher;

/// Serves the cluster's Gateways until SIGTERM/SIGINT.
pub async fn run(
    config: &KubernetesConfig,
    settings: Settings,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let client = aether_controller::kube::client().await?;
    // A dedicated Gateway's own pod serves and writes nothing else, so it provisions
    // nothing either, even though it runs with the shared edge's flags.
    let dedicated = match (&config.dedicated_pod_template, &config.serve_gateway) {
        (Some(path), None) => Some(DedicatedSettings {
            namespace: config.edge_service.namespace().to_string(),
            template: load_template(path).await?,
        }),
        _ => None,
    };
    let extra = Extra {
        pods: config.watch_pods,
        deployments: dedicated.as_ref().map(|d| d.namespace.clone()),
    };
    let service = ServiceSettings {
        edge_service: config.edge_service.clone(),
        dedicated,
        serve_only: config.serve_gateway.clone(),
    };
    let addressing = match config.internal_ports {
        Some(range) => Addressing::InternalPorts {
            range,
            service,
            bind: config.listen_address,
        },
        None => Addressing::SharedService {
            service,
            bind: config.listen_address,
        },
    };
    let shared = Arc::new(Shared::default());
    aether_controller::kube::watch::spawn(&client, &shared, &extra);
    let (status_tx, status_rx) = watch::channel(Arc::new(Statuses::default()));
    let (service_tx, service_rx) = watch::channel(Desired::default());
    // Effects wait for the first reconcile of a fully listed Store: the channels'
    // initial (empty) values are never acted on. A dedicated Gateway's pod has none
    // and doesn't contend for the Lease (nor read the Gateway CRD, which only the
    // status writer needs).
    let mut lease = None;
    let mut effects = if config.serve_gateway.is_some() {
        None
    } else {
        let writer = StatusWriter::new(
            client.clone(),
            Arc::clone(&shared),
            settings.controller_name.clone(),
            aether_controller::kube::crd::spawn(&client),
        );
        let applier = ServiceApplier::new(client.clone(), Arc::clone(&shared));
        let writer_lease = lease::spawn(
            client,
            LeaseConfig {
                namespace: config.edge_service.namespace().to_string(),
                name: config.writer_lease.clone(),
                identity: identity(),
                duration: config.lease_duration,
            },
        );
        let held = writer_lease.held.clone();
        lease = Some(writer_lease);
        Some((writer, status_rx, applier, service_rx, held))
    };

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut last_reconcile: Option<tokio::time::Instant> = None;
    let mut reconciler: Option<Reconciler> = None;
    loop {
        let wake_at = publisher.wake_at();
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            () = crate::publish::sleep_until(wake_at) => {
                if publisher.wake() {
                    status_tx.send_replace(Arc::clone(publisher.statuses()));
                }
            }
            () = shared.changed.notified() => {
                // A change after a quiet spell is served at once; events that keep
                // coming (a re-list, a rollout) are folded into at most one reconcile
                // per SETTLE. Watch events carry whole objects, so unlike files there
                // is no half-written state to wait out.
                if let Some(since) = last_reconcile.map(|t| t.elapsed())
                    && since < SETTLE
                {
                    tokio::time::sleep(SETTLE - since).await;
                }
                if !shared.is_synced() {
                    continue;
                }
                let shared2 = Arc::clone(&shared);
                let mut owned = reconciler
                    .take()
                    .unwrap_or_else(|| Reconciler::new(settings.clone(), addressing.clone()));
                // The Store's objects are shared by Arc, so its copy is cheap; the
                // reconciler reuses what it derived from the objects that did not change.
                let (back, mut outcome) = tokio::task::spawn_blocking(move || {
                    let store = shared2.snapshot();
                    let outcome = owned.reconcile(&store);
                    (owned, outcome)
                })
                .await
                .context("reconcile task failed")?;
                reconciler = Some(back);
                last_reconcile = Some(tokio::time::Instant::now());
                let services = Arc::new(std::mem::take(&mut outcome.services));
                shared.set_endpoint_interest(std::mem::take(&mut outcome.endpoint_interest));
                publisher.outcome(outcome, Vec::new());
                status_tx.send_replace(Arc::clone(publisher.statuses()));
                service_tx.send_replace(services);
                if let Some((writer, status_rx, applier, service_rx, held)) = effects.take() {
                    tokio::spawn(writer.run(status_rx, held.clone()));
                    tokio::spawn(applier.run(service_rx, held));
                }
            }
        }
    }
    // Draining from here on, and no longer reconciling: a writer would leave every
    // Gateway's endpoints as they are now, this pod among them. Another replica takes
    // the Lease at its next try and writes them as they change.
    if let Some(lease) = lease {
        lease.release(LEASE_RELEASE_LIMIT).await;
    }
    Ok(())
}

/// How long shutdown waits for the API server to take the Lease's release; the drain
/// goes on regardless (the Lease then expires after its duration).
const LEASE_RELEASE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The dedicated Gateways' pod template, read once: every replica reads the same
/// file (one ConfigMap), so all compute the same Deployments.
async fn load_template(
    path: &std::path::Path,
) -> anyhow::Result<aether_controller::reconcile::dedicated::PodTemplateSpec> {
    let text = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("reading the dedicated pod template {}", path.display()))?;
    aether_controller::reconcile::dedicated::parse_template(&text)
        .with_context(|| format!("parsing the dedicated pod template {}", path.display()))
}

/// This replica's name in the writer Lease: the pod name (the chart sets `POD_NAME`
/// from the downward API), else the host name, plus the process id so two processes
/// on one host (tests, a local run beside a cluster) are told apart.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .or_else(|_| {
            std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|_| "aether-edge".to_owned());
    format!("{host}-{}", std::process::id())
}
