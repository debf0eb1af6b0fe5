//! The SPIFFE Workload API as identity source (SPIRE agent's socket): the `spiffe`
//! crate's X509Source keeps a stream open, reconnects with backoff and holds the last
//! good SVID; every update it reports becomes a new [`Material`].
//!
//! While the API is unreachable the current SVID keeps being used until it expires;
//! the expiry gauge and a warning say so (see `Identity::spawn_expiry_gauge`).

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use spiffe::x509_source::{MetricsErrorKind, MetricsRecorder};
use spiffe::{X509Source, X509SourceBuilder};

use super::identity::{Identity, IdentityError, Material};
use crate::telemetry;

/// How long the first sync may take before the wait is logged and started over.
const INITIAL_SYNC: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// `unix:///path` or `unix:/path` as given, a bare path as `unix:<path>`.
pub fn endpoint_uri(socket: &str) -> String {
    if socket.starts_with('/') {
        format!("unix:{socket}")
    } else {
        socket.to_owned()
    }
}

/// Follows the Workload API at `endpoint` for the life of the process.
pub fn spawn(endpoint: String, identity: Arc<Identity>) {
    tokio::spawn(async move {
        let mut backoff = BACKOFF_MIN;
        loop {
            let built = X509SourceBuilder::new()
                .endpoint(&endpoint)
                .reconnect_backoff(BACKOFF_MIN, BACKOFF_MAX)
                .initial_sync_timeout(INITIAL_SYNC)
                .metrics(Arc::new(Recorder {
                    identity: Arc::clone(&identity),
                }))
                .build()
                .await;
            match built {
                Ok(source) => {
                    backoff = BACKOFF_MIN;
                    follow(&source, &identity).await;
                    source.shutdown().await;
                }
                Err(e) => {
                    metrics::counter!(telemetry::MESH_IDENTITY_SOURCE_ERRORS_TOTAL, "source" => "workload_api").increment(1);
                    tracing::warn!(%endpoint, error = %e, held = identity.is_ready(), "SPIFFE Workload API unavailable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    });
}

/// Installs the source's SVID now and after every update, until the source closes.
async fn follow(source: &X509Source, identity: &Identity) {
    let mut updates = source.updated();
    loop {
        match material(source) {
            Ok(m) => identity.update(m, "workload_api"),
            Err(e) => {
                metrics::counter!(telemetry::MESH_IDENTITY_SOURCE_ERRORS_TOTAL, "source" => "workload_api").increment(1);
                tracing::warn!(error = %e, "SVID from the Workload API is unusable; keeping the current one");
            }
        }
        if let Err(e) = updates.changed().await {
            tracing::warn!(error = %e, "Workload API source closed; reconnecting");
            return;
        }
    }
}

/// The source's own reconnects and stream failures, as logs and metrics: the
/// supervisor inside the spiffe crate retries on its own and would otherwise be
/// silent while the agent is away.
struct Recorder {
    identity: Arc<Identity>,
}

impl MetricsRecorder for Recorder {
    fn record_update(&self) {}

    fn record_reconnect(&self) {
        tracing::info!("SPIFFE Workload API stream reconnected");
    }

    fn record_error(&self, kind: MetricsErrorKind) {
        metrics::counter!(telemetry::MESH_IDENTITY_SOURCE_ERRORS_TOTAL, "source" => "workload_api", "kind" => kind.as_str()).increment(1);
        let held = self.identity.current();
        tracing::warn!(
            kind = kind.as_str(),
            svid_expires_in_s = held.as_ref().map(|m| m.expires_in()),
            "SPIFFE Workload API error; retrying with backoff, the current SVID stays in use until it expires"
        );
    }
}

#[derive(Debug, thiserror::Error)]
enum SourceError {
    #[error("{0}")]
    Source(#[from] spiffe::X509SourceError),
    #[error("no bundle for the SVID's trust domain")]
    NoBundle,
    #[error("{0}")]
    Identity(#[from] IdentityError),
}

fn material(source: &X509Source) -> Result<Material, SourceError> {
    let svid = source.svid()?;
    let bundle = source
        .try_bundle_for_trust_domain(svid.spiffe_id().trust_domain())
        .ok_or(SourceError::NoBundle)?;
    let chain = svid
        .cert_chain()
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes().to_vec()))
        .collect();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        svid.private_key().as_bytes().to_vec(),
    ));
    let roots = bundle
        .authorities()
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes().to_vec()))
        .collect();
    Ok(Material::from_der(chain, key, roots)?)
}
