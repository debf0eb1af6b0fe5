mod math;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use aether_edge::cli::{Cli, Command, LogFormat};
use aether_proxy::Workers;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    match run(cli.command, cli.log_format) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Through the log, so a JSON log stays JSON to its last line.
            tracing::error!(error = %format!("{e:#}"), "aether-edge cannot continue");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, log_format: LogFormat) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            aether_proxy::trim::keep_large_allocations_mapped();
            let config = args.into_config(log_format, |name| std::env::var(name).ok())?;
            let count = config.process.workers;
            let workers = Workers::spawn(count)?;
            tracing::info!(workers = count.get(), "data-plane workers started");
            // The control plane's own runtime: one thread (plus this one, which drives
            // the sources and the publisher), so watches, reconciles and admin
            // scrapes never take a data-plane worker's thread, and never wait for one.
            let control = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("aether-control")
                .enable_all()
                .build()?;
            let result = control.block_on(aether_edge::app::run(config, workers.handles()));
            // The listeners have drained; stop the control plane's tasks, then the
            // workers (joining their threads, outside any runtime).
            drop(control);
            drop(workers);
            result
        }
        Command::Echo(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(aether_edge::echo::run(args)),
    }
}

fn init_logs(format: LogFormat) {
    // rustls warns on every handshake with a client quirk (an IP address sent as SNI),
    // which any client can trigger at will: keep those out of the default log.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rustls=error"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // Fields at the top level (message, addr, error, ...) beside timestamp, level
        // and target, as collectors index them; spans are not used for context here.
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}
