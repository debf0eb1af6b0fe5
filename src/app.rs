//! `aether-edge run`: files -> Store -> reconcile -> Snapshot -> listeners, and status to
//! the admin server; then drain on SIGTERM/SIGINT.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use aether_controller::Timestamp;
use aether_controller::manifest::ManifestError;
use aether_controller::{Settings, Statuses, reconcile};
use aether_proxy::http::{ProxyState, UpstreamSettings};
use aether_proxy::{ListenerManager, Snapshot, telemetry};
use anyhow::Context;
use arc_swap::ArcSwap;
use bytes::Bytes;
use metrics::{counter, gauge};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::signal::unix::{SignalKind, signal};

use crate::admin::{self, AdminState};
use crate::cli::RunArgs;
use crate::files::{self, FileSource};

/// Editors write in bursts; one reconcile per burst.
const SETTLE: Duration = Duration::from_millis(100);
/// How often sockets that failed to bind are tried again.
const BIND_RETRY: Duration = Duration::from_secs(1);

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let prometheus = install_metrics()?;
    let proxy = ProxyState::new(&UpstreamSettings::default());
    let admin_listener = admin::bind(args.admin)
        .await
        .with_context(|| format!("cannot bind the admin server to {}", args.admin))?;
    let admin = Arc::new(AdminState {
        proxy: Arc::clone(&proxy),
        prometheus,
        status: ArcSwap::from_pointee(Bytes::new()),
    });
    tracing::info!(addr = %admin_listener.local_addr()?, "admin server listening");
    tokio::spawn(admin::serve(admin_listener, Arc::clone(&admin)));

    let settings = Settings {
        controller_name: args.controller_name.clone(),
        address_pool: args.address_pool,
    };
    let (_watcher, mut changes) =
        files::watch(&args.manifests, SETTLE).context("cannot watch the manifests")?;
    let mut control = Control {
        source: FileSource::new(args.manifests.clone()),
        settings,
        manager: ListenerManager::new(Arc::clone(&proxy), args.drain_timeout),
        admin: Arc::clone(&admin),
        generation: 0,
        current: None,
        statuses: Statuses::default(),
    };
    control.reload().await?;

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut bind_retry = tokio::time::interval(BIND_RETRY);
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = bind_retry.tick() => control.retry_binds(),
            tick = changes.recv() => {
                if tick.is_none() { break; }
                if let Err(e) = control.reload().await {
                    tracing::error!(error = %format!("{e:#}"), "reload failed; the previous configuration keeps serving");
                }
            }
        }
    }
    tracing::info!(timeout = ?args.drain_timeout, "draining");
    proxy.draining.store(true, Ordering::Release);
    control.manager.shutdown().await;
    tracing::info!("drained; exiting");
    Ok(())
}

fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(telemetry::REQUEST_DURATION_SECONDS.to_owned()),
            telemetry::DURATION_BUCKETS,
        )?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The control side: owns the source, the listener set and the last statuses.
struct Control {
    source: FileSource,
    settings: Settings,
    manager: ListenerManager,
    admin: Arc<AdminState>,
    generation: u64,
    /// The last reconcile, kept to re-publish when a failed bind is retried.
    current: Option<Published>,
    /// Statuses as last published, for carrying condition transition times.
    statuses: Statuses,
}

/// What the last reconcile produced, before bind results were folded in.
struct Published {
    snapshot: Arc<Snapshot>,
    statuses: Statuses,
    errors: Vec<ManifestError>,
    bind_failures: usize,
}

impl Control {
    /// Re-reads the manifests, reconciles, and publishes the result.
    async fn reload(&mut self) -> anyhow::Result<()> {
        let mut source = std::mem::replace(&mut self.source, FileSource::new(Vec::new()));
        let settings = self.settings.clone();
        // Reading files and reconciling are blocking work; keep them off the async workers.
        let (source, outcome, errors) = tokio::task::spawn_blocking(move || {
            let loaded = source.load();
            let outcome = reconcile(&loaded.store, &settings);
            (source, outcome, loaded.errors)
        })
        .await
        .context("reconcile task failed")?;
        self.source = source;

        self.generation += 1;
        let mut snapshot = outcome.snapshot;
        snapshot.generation = self.generation;
        counter!("aether_config_reloads_total", "result" => if errors.is_empty() { "ok" } else { "partial" }).increment(1);
        gauge!("aether_config_generation").set(self.generation as f64);
        self.current = Some(Published {
            snapshot: Arc::new(snapshot),
            statuses: outcome.statuses,
            errors,
            bind_failures: 0,
        });
        self.publish();
        Ok(())
    }

    /// Brings listeners in line with the current Snapshot and publishes the statuses,
    /// with any sockets that could not be bound marked on their listeners.
    fn publish(&mut self) {
        let Some(current) = self.current.as_mut() else {
            return;
        };
        let failures = self.manager.apply(Arc::clone(&current.snapshot));
        let mut statuses = current.statuses.clone();
        statuses.mark_bind_failures(&current.snapshot, &failures);
        statuses.carry_transition_times(&self.statuses, Timestamp::now());
        self.admin
            .status
            .store(Arc::new(render_status(&statuses, &current.errors)));
        tracing::info!(
            generation = self.generation,
            listeners = current.snapshot.listeners.len(),
            errors = current.errors.len(),
            bind_failures = failures.len(),
            "configuration applied"
        );
        current.bind_failures = failures.len();
        self.statuses = statuses;
    }

    /// Sockets that failed to bind (typically a port still held by another process)
    /// are retried until they bind or the configuration stops asking for them.
    fn retry_binds(&mut self) {
        if self.current.as_ref().is_some_and(|c| c.bind_failures > 0) {
            self.publish();
        }
    }
}

fn render_status(statuses: &Statuses, errors: &[ManifestError]) -> Bytes {
    let doc = serde_json::json!({
        "items": statuses.items(),
        "manifestErrors": errors,
    });
    serde_json::to_vec_pretty(&doc).unwrap_or_default().into()
}
