use clap::Parser;
use tracing_subscriber::EnvFilter;

use aether_edge::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    // rustls warns on every handshake with a client quirk (an IP address sent as SNI),
    // which any client can trigger at will: keep those out of the default log.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rustls=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Run(args) => runtime.block_on(aether_edge::app::run(*args)),
        Command::Echo(args) => runtime.block_on(aether_edge::echo::run(args)),
    }
}
