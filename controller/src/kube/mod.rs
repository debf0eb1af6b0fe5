//! Kubernetes mode: watches fill the same [`Store`](crate::Store) the file source fills,
//! and effects write what the reconciler decided (status, Gateway Services) back with
//! server-side apply under one field manager.

pub mod apply_errors;
pub mod crd;
pub mod lease;
mod policy_status;
pub mod retry_schedule;
pub mod services;
pub mod status;
pub mod watch;

use kube::Client;

/// The field manager of every write, so replicas share ownership instead of fighting.
pub const FIELD_MANAGER: &str = "aether.io/edge";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load a Kubernetes client configuration (in-cluster or kubeconfig): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client from the in-cluster environment or the kubeconfig (`KUBECONFIG`, then
/// `~/.kube/config`).
pub async fn client() -> Result<Client, Error> {
    // kube's rustls config takes the process-wide provider; we build with ring only,
    // and rustls refuses to guess when none is installed. Already installed is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::infer().await?;
    Ok(Client::try_from(config)?)
}
