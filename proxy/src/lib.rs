//! aether-proxy: the data plane of aether-edge.
//!
//! Its only input is an immutable [`Snapshot`] (plain Rust, no Kubernetes types),
//! published atomically through [`ListenerManager::apply`]. Requests load the current
//! Snapshot once, route by Host and the rules' matches, and forward to a backend
//! endpoint over a pooled upstream client.

pub mod access_log;
pub mod backend;
pub mod backend_client_cert;
pub mod backend_tls;
pub mod client_auth;
pub mod config;
mod connection;
pub mod cors;
mod drain;
pub mod filters;
pub mod health;
pub mod hostmap;
pub mod http;
pub mod l4;
pub mod limits;
pub mod listener;
pub mod mesh;
pub mod overload;
mod relay;
/// The HTTP/1.1 relay's parsers, for the `relay` fuzz target.
#[doc(hidden)]
pub use relay::fuzzing as relay_fuzzing;
pub mod resumption;
pub mod retry;
pub mod routing;
pub mod series;
pub mod snapshot;
pub mod state;
pub mod telemetry;
pub mod tls;
pub mod trace;
pub mod trim;
pub mod upstream;
pub mod workers;

pub use config::ProxyConfig;
pub use limits::Limits;
pub use listener::{BindFailure, ListenerManager};
pub use snapshot::{Listener, Protocol, Snapshot};
pub use workers::Workers;
