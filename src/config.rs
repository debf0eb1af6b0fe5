//! One configuration for `aether-edge run`: the command line turned into the parts
//! the process, the proxy and the controller run on, validated here and nowhere else.
//!
//! A flag is a field of [`RunArgs`] and a field of the part it configures; its default
//! lives with that part (`ProxyConfig::DEFAULT`, `Limits::DEFAULT`, ...) and `--help`
//! shows it from there.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use aether_controller::ObjectKey;
use aether_controller::reconcile::ports::PortRange;
use aether_proxy::ProxyConfig;
use aether_proxy::config::{IdentitySource, MemoryBudget, MeshConfig};
use aether_proxy::l4::udp::UdpSettings;
use aether_proxy::upstream::UpstreamSettings;
use aether_proxy::{Limits, access_log};

use crate::cli::{AccessLogFormat, LimitArgs, LogFormat, MeshArgs, RunArgs};

/// The standard variable a SPIRE agent's workloads read the socket from.
pub const SPIFFE_ENDPOINT_SOCKET: &str = "SPIFFE_ENDPOINT_SOCKET";

#[derive(Debug, Clone)]
pub struct Config {
    pub process: ProcessConfig,
    pub proxy: ProxyConfig,
    pub controller: aether_controller::Settings,
    pub source: Source,
    /// Flags accepted but without effect in this combination, to be logged once.
    pub warnings: Vec<String>,
}

/// What the process itself runs: threads, the admin server, the shutdown sequence.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The admin server: /readyz, /metrics, /config_dump, /status.
    pub admin: SocketAddr,
    /// Data-plane runtimes (see `aether_proxy::workers`).
    pub workers: NonZeroUsize,
    /// How long readiness fails before listeners stop accepting, on SIGTERM/SIGINT.
    pub drain_delay: Duration,
}

/// Where the objects come from.
#[derive(Debug, Clone)]
pub enum Source {
    Files(FilesConfig),
    Kubernetes(KubernetesConfig),
}

#[derive(Debug, Clone)]
pub struct FilesConfig {
    pub manifests: Vec<PathBuf>,
    /// Where the L4 routes' assigned ports are kept across restarts.
    pub port_state: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// `Some`: every Gateway gets a Service of its own, whose ports map to internal
    /// ports from this range; `None`: Gateways share the edge Service's address.
    pub internal_ports: Option<PortRange>,
    pub listen_address: IpAddr,
    pub edge_service: ObjectKey,
    pub writer_lease: String,
    pub lease_duration: Duration,
    /// Dedicated Gateways' pod template; only with per-Gateway addresses.
    pub dedicated_pod_template: Option<PathBuf>,
    /// A dedicated Gateway's own pods: serve only it, write nothing.
    pub serve_gateway: Option<ObjectKey>,
    /// Mesh mode names each backend pod's identity, so pods are watched.
    pub watch_pods: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--serve-gateway needs per-Gateway addressing (--per-gateway-addressing true)")]
    ServeGatewayNeedsPerGatewayAddressing,
    #[error(
        "mesh mode needs an identity: --spiffe-socket, {SPIFFE_ENDPOINT_SOCKET}, or --mesh-svid-cert/--mesh-svid-key/--mesh-bundle"
    )]
    NoMeshIdentity,
}

impl RunArgs {
    /// The configuration these flags say, with `log_format` (a flag of every
    /// subcommand) as the access log's default format. `env` reads the environment
    /// (`SPIFFE_ENDPOINT_SOCKET`); tests pass their own.
    pub fn into_config(
        self,
        log_format: LogFormat,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        let access_log = match self.access_log.unwrap_or(match log_format {
            LogFormat::Text => AccessLogFormat::Text,
            LogFormat::Json => AccessLogFormat::Json,
        }) {
            AccessLogFormat::Off => None,
            AccessLogFormat::Json => Some(access_log::Format::Json),
            AccessLogFormat::Text => Some(access_log::Format::Text),
        };
        let proxy = ProxyConfig {
            limits: self.limits.into_limits(),
            upstream: UpstreamSettings {
                connect_timeout: self.upstream_connect_timeout.into(),
                ..UpstreamSettings::DEFAULT
            },
            mesh: self.mesh.into_mesh(&env)?,
            trusted_hops: self.xff_trusted_hops,
            max_request_body: Some(self.max_request_body_bytes).filter(|&b| b > 0),
            drain_timeout: self.drain_timeout.into(),
            access_log: access_log.map(|format| access_log::Settings {
                format,
                sample: self.access_log_sample,
                statuses: self.access_log_status,
            }),
            tracing: self
                .otlp_endpoint
                .map(|endpoint| aether_proxy::trace::Settings {
                    endpoint,
                    sample: self.trace_sample,
                }),
            route_latency_histogram: self.route_latency_histogram,
            memory_budget: match self.memory_budget {
                None => MemoryBudget::FromCgroup,
                Some(0) => MemoryBudget::Off,
                Some(bytes) => MemoryBudget::Bytes(bytes),
            },
            http1_relay: self.http1_relay,
        };
        let source = if self.kubernetes {
            if self.serve_gateway.is_some() && !self.per_gateway_addressing {
                return Err(ConfigError::ServeGatewayNeedsPerGatewayAddressing);
            }
            let mut dedicated_pod_template = self.dedicated_pod_template;
            if dedicated_pod_template.is_some() && !self.per_gateway_addressing {
                warnings.push(
                    "--dedicated-pod-template is ignored without per-Gateway addressing".into(),
                );
                dedicated_pod_template = None;
            }
            Source::Kubernetes(KubernetesConfig {
                internal_ports: self
                    .per_gateway_addressing
                    .then_some(self.internal_port_range),
                listen_address: self.listen_address,
                edge_service: self.edge_service,
                writer_lease: self.writer_lease,
                lease_duration: self.lease_duration.into(),
                dedicated_pod_template,
                serve_gateway: self.serve_gateway,
                watch_pods: proxy.mesh.is_some(),
            })
        } else {
            Source::Files(FilesConfig {
                manifests: self.manifests,
                port_state: self.port_state,
            })
        };
        Ok(Config {
            process: ProcessConfig {
                admin: self.admin,
                workers: self
                    .workers
                    .unwrap_or_else(aether_proxy::Workers::default_count),
                drain_delay: self.drain_delay.into(),
            },
            proxy,
            controller: aether_controller::Settings {
                controller_name: self.controller_name,
                address_pool: self.address_pool,
            },
            source,
            warnings,
        })
    }
}

impl LimitArgs {
    fn into_limits(self) -> Limits {
        Limits {
            header_read_timeout: self.header_read_timeout.into(),
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            max_concurrent_streams: self.max_concurrent_streams,
            max_connections_per_listener: self.max_connections_per_listener,
            max_connections: self.max_connections,
            udp: UdpSettings {
                idle_timeout: self.udp_idle_timeout.into(),
                max_flows: self.udp_max_flows,
                max_flows_per_source: self.udp_max_flows_per_source,
            },
            ..Limits::DEFAULT
        }
    }
}

impl MeshArgs {
    fn into_mesh(
        self,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<MeshConfig>, ConfigError> {
        if !self.mesh {
            return Ok(None);
        }
        // clap requires all three files together.
        let identity = match (self.mesh_svid_cert, self.mesh_svid_key, self.mesh_bundle) {
            (Some(cert), Some(key), Some(bundle)) => IdentitySource::Files { cert, key, bundle },
            _ => IdentitySource::WorkloadApi(
                self.spiffe_socket
                    .or_else(|| env(SPIFFE_ENDPOINT_SOCKET))
                    .ok_or(ConfigError::NoMeshIdentity)?,
            ),
        };
        Ok(Some(MeshConfig {
            port: self.mesh_port,
            max_streams: self.mesh_max_streams,
            identity,
        }))
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
