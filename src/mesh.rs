//! Mesh mode's wiring: where the edge's SVID comes from (the SPIFFE Workload API, or
//! PEM files for development), kept live in one `Identity` the upstream pool reads.

use std::path::PathBuf;
use std::sync::Arc;

use aether_proxy::config::{IdentitySource, MeshConfig};
use aether_proxy::mesh::{Identity, Material, MeshSettings, PoolSettings, workload};
use aether_proxy::telemetry;
use anyhow::Context;

use crate::app::SETTLE;
use crate::files;

/// Starts fetching the edge's SVID from where `config` says, and gives the mesh
/// settings the upstream pools read it from.
pub fn start(config: &MeshConfig) -> anyhow::Result<MeshSettings> {
    let identity = Identity::new();
    identity.spawn_expiry_gauge();
    match &config.identity {
        IdentitySource::Files { cert, key, bundle } => {
            spawn_files(
                [cert.clone(), key.clone(), bundle.clone()],
                Arc::clone(&identity),
            )?;
        }
        IdentitySource::WorkloadApi(socket) => {
            let endpoint = workload::endpoint_uri(socket);
            tracing::info!(%endpoint, "mesh identity from the SPIFFE Workload API");
            workload::spawn(endpoint, Arc::clone(&identity));
        }
    }
    Ok(MeshSettings {
        port: config.port,
        identity,
        pool: PoolSettings {
            max_streams: config.max_streams.get(),
            ..PoolSettings::default()
        },
    })
}

/// Loads the PEM files now and on every change. A broken or half-written set keeps
/// the current SVID (logged and counted); an unchanged set changes nothing, so
/// connections are not retired for nothing.
fn spawn_files(paths: [PathBuf; 3], identity: Arc<Identity>) -> anyhow::Result<()> {
    let (watcher, mut changes) =
        files::watch(&paths, SETTLE, |_| true).context("cannot watch the mesh SVID files")?;
    tracing::info!(cert = %paths[0].display(), "mesh identity from PEM files");
    tokio::spawn(async move {
        let _watcher = watcher;
        let mut last: Option<[Vec<u8>; 3]> = None;
        loop {
            match read(&paths).await {
                Ok(bytes) if last.as_ref() != Some(&bytes) => {
                    match Material::from_pem(&bytes[0], &bytes[1], &bytes[2]) {
                        Ok(m) => {
                            identity.update(m, "files");
                            last = Some(bytes);
                        }
                        Err(e) => {
                            metrics::counter!(telemetry::MESH_IDENTITY_SOURCE_ERRORS_TOTAL, "source" => "files").increment(1);
                            tracing::warn!(error = %e, "mesh SVID files are unusable; keeping the current SVID");
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the mesh SVID files; keeping the current SVID")
                }
            }
            if changes.recv().await.is_none() {
                return;
            }
        }
    });
    Ok(())
}

async fn read(paths: &[PathBuf; 3]) -> std::io::Result<[Vec<u8>; 3]> {
    Ok([
        tokio::fs::read(&paths[0]).await?,
        tokio::fs::read(&paths[1]).await?,
        tokio::fs::read(&paths[2]).await?,
    ])
}
