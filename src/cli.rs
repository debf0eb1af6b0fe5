//! The command line: `aether-edge run` and `aether-edge echo`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;

#[derive(Debug, Parser)]
#[command(
    name = "aether-edge",
    version,
    about = "Kubernetes Gateway API edge proxy and reconciler in one process"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Reconcile Gateway API manifests and serve them.
    Run(RunArgs),
    /// A small HTTP/1.1 + h2c backend that answers with JSON describing each request.
    Echo(EchoArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// A YAML file (multi-document) or a directory of *.yaml/*.yml files. Repeatable.
    /// Watched: edits are live within a second.
    #[arg(long = "manifests", required = true, value_name = "PATH")]
    pub manifests: Vec<PathBuf>,

    /// Serve only GatewayClasses with this spec.controllerName, and their Gateways.
    #[arg(long, default_value = "aether.io/edge", value_name = "NAME")]
    pub controller_name: String,

    /// Pool of local addresses for Gateways without spec.addresses.
    #[arg(long, default_value = "127.0.1.0/24", value_name = "CIDR")]
    pub address_pool: IpNet,

    /// Admin server: /readyz, /metrics, /config_dump, /status.
    #[arg(long, default_value = "127.0.0.1:9901", value_name = "ADDR")]
    pub admin: SocketAddr,

    /// On SIGTERM/SIGINT, and for removed listeners: how long in-flight requests may
    /// take to finish before their connections are closed.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub drain_timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Name reported in every answer, to tell backends apart.
    #[arg(long, default_value = "echo")]
    pub name: String,

    /// Append every request received, as one JSON line, to this file (tests read it
    /// to see traffic that gets no answer back, such as mirrored requests).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
}
