//! `aether-edge run`: files (or the cluster: `kubernetes.rs`) -> Store -> reconcile -> Snapshot -> listeners, and status to
//! the admin server; then drain on SIGTERM/SIGINT.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use aether_controller::{Settings, reconcile};
use aether_proxy::http::{ProxyState, UpstreamSettings};
use aether_proxy::{ListenerManager, overload, telemetry};
use anyhow::Context;
use arc_swap::ArcSwap;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::signal::unix::{SignalKind, signal};

use crate::admin::{self, AdminState, StatusDoc};
use crate::cli::RunArgs;
use crate::files::{self, FileSource};
use crate::publish::Publisher;

/// Editors write in bursts; one reconcile per burst.
pub(crate) const SETTLE: Duration = Duration::from_millis(100);

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let prometheus = install_metrics()?;
    let proxy = ProxyState::new(
        &UpstreamSettings {
            mesh: crate::mesh::settings(&args.mesh)?,
            ..UpstreamSettings::default()
        },
        args.xff_trusted_hops,
    );
    proxy
        .max_request_body
        .store(args.max_request_body_bytes, Ordering::Relaxed);
    let budget = match args.memory_budget {
        Some(0) => None,
        Some(b) => Some(b),
        None => overload::default_budget().await,
    };
    if let Some(budget) = budget {
        tracing::info!(budget, "shedding load above this resident memory");
        overload::spawn_monitor(Arc::clone(&proxy), budget);
    }
    let admin_listener = admin::bind(args.admin)
        .await
        .with_context(|| format!("cannot bind the admin server to {}", args.admin))?;
    let admin = Arc::new(AdminState {
        proxy: Arc::clone(&proxy),
        prometheus,
        status: ArcSwap::from_pointee(StatusDoc::default()),
    });
    tracing::info!(addr = %admin_listener.local_addr()?, "admin server listening");
    tokio::spawn(admin::serve(admin_listener, Arc::clone(&admin)));

    let settings = Settings {
        controller_name: args.controller_name.clone(),
        address_pool: args.address_pool,
    };
    let manager =
        ListenerManager::new(Arc::clone(&proxy), args.drain_timeout, args.limits.limits());
    let mut publisher = Publisher::new(manager, Arc::clone(&admin));
    if args.kubernetes {
        crate::kubernetes::run(&args, settings, &mut publisher).await?;
    } else {
        run_files(&args, settings, &mut publisher).await?;
    }
    tracing::info!(timeout = ?args.drain_timeout, "draining");
    proxy.draining.store(true, Ordering::Release);
    // Readiness is already failing; give load balancers time to stop sending before
    // the sockets close.
    tokio::time::sleep(args.drain_delay).await;
    publisher.manager.shutdown().await;
    tracing::info!("drained; exiting");
    Ok(())
}

/// Standalone: serves the manifests until SIGTERM/SIGINT.
async fn run_files(
    args: &RunArgs,
    settings: Settings,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    // A path that is not there at startup is a typo or a missing mount, not an empty
    // configuration: serving nothing would look healthy. Only startup is checked; the
    // watcher handles what changes later.
    for path in &args.manifests {
        tokio::fs::metadata(path)
            .await
            .with_context(|| format!("--manifests {}", path.display()))?;
    }
    let (_watcher, mut changes) =
        files::watch(&args.manifests, SETTLE).context("cannot watch the manifests")?;
    let seed = match &args.port_state {
        Some(path) => crate::portstate::load(path)?,
        None => aether_controller::Statuses::default(),
    };
    let mut control = Control {
        source: FileSource::new(args.manifests.clone()),
        settings,
        publisher,
        port_state: args.port_state.clone().map(|p| (p, String::new())),
        seed,
    };
    control.reload().await?;

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    loop {
        let bind_retry = control.publisher.bind_retry_at();
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            () = crate::publish::sleep_until(bind_retry) => { control.publisher.retry_binds(); }
            tick = changes.recv() => {
                if tick.is_none() { break; }
                if let Err(e) = control.reload().await {
                    tracing::error!(error = %format!("{e:#}"), "reload failed; the previous configuration keeps serving");
                }
            }
        }
    }
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

/// The file source's side: re-reads the manifests and reconciles on every change.
struct Control<'p> {
    source: FileSource,
    settings: Settings,
    publisher: &'p mut Publisher,
    /// `--port-state`: the file and what was last written to it.
    port_state: Option<(std::path::PathBuf, String)>,
    /// L4 route statuses from the port state file, used until the first publish.
    seed: aether_controller::Statuses,
}

impl Control<'_> {
    /// Re-reads the manifests, reconciles, and publishes the result.
    async fn reload(&mut self) -> anyhow::Result<()> {
        let mut source = std::mem::replace(&mut self.source, FileSource::new(Vec::new()));
        let settings = self.settings.clone();
        let mut previous = aether_controller::Statuses::clone(self.publisher.statuses());
        if previous.l4_routes.is_empty() {
            previous.l4_routes = std::mem::take(&mut self.seed.l4_routes);
        }
        // Reading files and reconciling are blocking work; keep them off the async workers.
        let (source, outcome, errors) = tokio::task::spawn_blocking(move || {
            let mut loaded = source.load();
            aether_controller::l4route::carry_status(&mut loaded.store, &previous);
            let outcome = reconcile(&loaded.store, &settings);
            (source, outcome, loaded.errors)
        })
        .await
        .context("reconcile task failed")?;
        self.source = source;
        self.publisher.outcome(outcome, errors);
        if let Some((path, written)) = &mut self.port_state {
            let text = crate::portstate::render(self.publisher.statuses());
            if *written != text {
                crate::portstate::save_in_background(path.clone(), text.clone()).await?;
                *written = text;
            }
        }
        Ok(())
    }
}
