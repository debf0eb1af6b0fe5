//! `aether-edge run`: files (or the cluster: `kubernetes.rs`) -> Store -> reconcile -> Snapshot -> listeners, and status to
//! the admin server; then drain on SIGTERM/SIGINT.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aether_controller::{Reconciler, Settings};
use aether_proxy::access_log::AccessLog;
use aether_proxy::state::ProxyState;
use aether_proxy::trace::Tracer;
use aether_proxy::{ListenerManager, overload, trim};
use anyhow::Context;
use arc_swap::ArcSwap;

use tokio::signal::unix::{SignalKind, signal};

use crate::admin::{self, AdminState, StatusDoc};
use crate::config::{Config, FilesConfig, Source};
use crate::files::{self, FileSource};
use crate::publish::Publisher;

/// Editors write in bursts; one reconcile per burst.
pub(crate) const SETTLE: Duration = Duration::from_millis(100);

/// `workers`: the data-plane runtimes the listeners are served on (see
/// `aether_proxy::workers`); this future runs on the control plane's runtime.
pub async fn run(config: Config, workers: &[tokio::runtime::Handle]) -> anyhow::Result<()> {
    let Config {
        process,
        proxy: proxy_config,
        controller,
        source,
        warnings,
    } = config;
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let prometheus = crate::metrics::install()?;
    // Before the first Snapshot is built: routes take their cells then.
    aether_proxy::series::enable_route_latency(proxy_config.route_latency_histogram);
    let access_log = match proxy_config.access_log {
        Some(settings) => Some({
            aether_proxy::access_log::size_pipe(std::io::stdout());
            AccessLog::start(settings, Box::new(std::io::stdout()))
                .context("cannot start the access log writer")?
        }),
        None => None,
    };
    let mesh = proxy_config
        .mesh
        .as_ref()
        .map(crate::mesh::start)
        .transpose()?;
    let tracer = match &proxy_config.tracing {
        Some(settings) => Some(start_tracer(settings)?),
        None => None,
    };
    let proxy = ProxyState::new(&proxy_config, mesh, access_log, tracer);
    if let Some(budget) = overload::budget(proxy_config.memory_budget).await {
        tracing::info!(budget, "shedding load above this resident memory");
        overload::spawn_monitor(Arc::clone(&proxy), budget);
    }
    trim::spawn();
    let admin_listener = admin::bind(process.admin)
        .await
        .with_context(|| format!("cannot bind the admin server to {}", process.admin))?;
    let admin = Arc::new(AdminState {
        proxy: Arc::clone(&proxy),
        prometheus,
        status: ArcSwap::from_pointee(StatusDoc::default()),
        applied: AtomicBool::new(false),
    });
    tracing::info!(addr = %admin_listener.local_addr()?, "admin server listening");
    tokio::spawn(admin::serve(admin_listener, Arc::clone(&admin)));

    let manager = ListenerManager::new(Arc::clone(&proxy), workers, &proxy_config);
    // Only Kubernetes mode has endpoints that lag behind a change; in standalone mode
    // a dropped listener stops at once, as its files say.
    let linger = match &source {
        Source::Kubernetes(_) => process.drain_delay,
        Source::Files(_) => Duration::ZERO,
    };
    let mut publisher = Publisher::new(manager, Arc::clone(&admin), linger);
    match source {
        Source::Kubernetes(kube) => {
            crate::kubernetes::run(&kube, controller, &mut publisher).await?;
        }
        Source::Files(files) => run_files(files, controller, &mut publisher).await?,
    }
    tracing::info!(timeout = ?proxy_config.drain_timeout, "draining");
    proxy.draining.store(true, Ordering::Release);
    // Readiness is already failing; give load balancers time to stop sending before
    // the sockets close.
    tokio::time::sleep(process.drain_delay).await;
    publisher.manager.shutdown().await;
    if let Some(log) = access_log {
        // The lines of the last requests are still in the writer's queue.
        let flushed = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(2))).await;
        if let Err(e) = flushed {
            tracing::warn!(error = %e, "could not flush the access log");
        }
    }
    if let Some(tracer) = tracer {
        // The spans of the last requests are still queued for the collector.
        let flushed =
            tokio::task::spawn_blocking(move || tracer.flush(Duration::from_secs(5))).await;
        if let Err(e) = flushed {
            tracing::warn!(error = %e, "could not flush the trace exporter");
        }
    }
    tracing::info!("drained; exiting");
    Ok(())
}

/// Starts the OTLP span exporter (`--otlp-endpoint`).
fn start_tracer(settings: &aether_proxy::trace::Settings) -> anyhow::Result<&'static Tracer> {
    let tracer = Tracer::start(settings).map_err(anyhow::Error::msg)?;
    tracing::info!(endpoint = %settings.endpoint, sample = settings.sample, "exporting request spans over OTLP");
    Ok(tracer)
}

/// Standalone: serves the manifests until SIGTERM/SIGINT.
async fn run_files(
    config: FilesConfig,
    settings: Settings,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    // A path that is not there at startup is a typo or a missing mount, not an empty
    // configuration: serving nothing would look healthy. Only startup is checked; the
    // watcher handles what changes later.
    for path in &config.manifests {
        tokio::fs::metadata(path)
            .await
            .with_context(|| format!("--manifests {}", path.display()))?;
    }
    let (_watcher, mut changes) =
        files::watch(&config.manifests, SETTLE, files::may_hold_manifests)
            .context("cannot watch the manifests")?;
    let seed = match &config.port_state {
        Some(path) => crate::portstate::load(path)?,
        None => aether_controller::Statuses::default(),
    };
    let mut control = Control {
        loader: Some(Loader::new(config.manifests.clone(), settings.clone())),
        paths: config.manifests,
        settings,
        publisher,
        port_state: config.port_state.map(|p| (p, String::new())),
        seed,
        published_once: false,
    };
    control.reload(None).await?;

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    loop {
        let wake_at = control.publisher.wake_at();
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            () = crate::publish::sleep_until(wake_at) => { control.publisher.wake(); }
            tick = changes.recv() => {
                if tick.is_none() { break; }
                if let Err(e) = control.reload(tick.flatten()).await {
                    tracing::error!(error = %format!("{e:#}"), "reload failed; the previous configuration keeps serving");
                }
            }
        }
    }
    Ok(())
}

/// The file source's side: re-reads the manifests and reconciles on every change.
struct Control<'p> {
    paths: Vec<std::path::PathBuf>,
    /// Taken while a reload runs on a blocking thread.
    loader: Option<Loader>,
    settings: Settings,
    publisher: &'p mut Publisher,
    /// `--port-state`: the file and what was last written to it.
    port_state: Option<(std::path::PathBuf, String)>,
    /// L4 route statuses from the port state file, used until the first publish.
    seed: aether_controller::Statuses,
    /// The first load publishes even an empty configuration (readiness waits for it).
    published_once: bool,
}

/// The manifests' Store and the reconciler that keeps what it derived from it.
struct Loader {
    source: FileSource,
    reconciler: Reconciler,
}

impl Loader {
    fn new(paths: Vec<std::path::PathBuf>, settings: Settings) -> Self {
        Self {
            source: FileSource::new(paths),
            reconciler: Reconciler::standalone(settings),
        }
    }
}

impl Control<'_> {
    /// Reads what changed in the manifests, reconciles, and publishes the result. A
    /// change that leaves the objects and errors as they were publishes nothing.
    async fn reload(&mut self, touched: crate::files::Touched) -> anyhow::Result<()> {
        let Some(mut loader) = self.loader.take() else {
            anyhow::bail!("a reload is already running");
        };
        let mut previous_l4 = self.publisher.statuses().l4_routes.clone();
        if previous_l4.is_empty() {
            previous_l4 = std::mem::take(&mut self.seed.l4_routes);
        }
        let first = !self.published_once;
        // Reading files and reconciling are blocking work; keep them off the async workers.
        let task = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let loaded = loader.source.load_touched(touched.as_ref());
            if !loaded.changed && !first {
                return (loader, None, loaded.errors);
            }
            let read = started.elapsed();
            let store = loader.source.store_mut();
            aether_controller::l4route::carry_status(store, &previous_l4);
            let outcome = loader.reconciler.reconcile(loader.source.store());
            tracing::debug!(
                read_us = read.as_micros(),
                reconcile_us = (started.elapsed() - read).as_micros(),
                "manifests reconciled"
            );
            (loader, Some(outcome), loaded.errors)
        });
        let (loader, outcome, errors) = match task.await {
            Ok(done) => done,
            Err(e) => {
                // Start over from the files: the next change reloads everything.
                self.loader = Some(Loader::new(self.paths.clone(), self.settings.clone()));
                return Err(e).context("reconcile task failed");
            }
        };
        self.loader = Some(loader);
        let Some(outcome) = outcome else {
            tracing::debug!("manifests changed nothing; nothing published");
            return Ok(());
        };
        self.published_once = true;
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
