//! The edge's own mesh identity: its X.509 SVID (chain and key) and its trust domain's
//! bundle, swapped atomically on every update from a source (the SPIFFE Workload API,
//! or PEM files). New upstream connections read the current one at their handshake;
//! established ones keep the identity they were made with until the pool retires them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("the SVID has no certificate")]
    EmptyChain,
    #[error("the SVID's leaf certificate carries no SPIFFE ID: {0}")]
    NoSpiffeId(String),
    #[error("the SVID's leaf certificate cannot be parsed")]
    BadCertificate,
    #[error("the SVID's private key is unusable: {0}")]
    BadKey(rustls::Error),
    #[error("the trust bundle has no usable CA certificate")]
    EmptyBundle,
    #[error("PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
}

/// One SVID with its bundle, ready to hand to rustls.
#[derive(Debug)]
pub struct Material {
    /// `spiffe://<td>/<path>` of this SVID.
    pub spiffe_id: Arc<str>,
    /// `spiffe://<td>`: the prefix every peer's ID must have.
    pub trust_domain_id: Arc<str>,
    pub key: Arc<CertifiedKey>,
    pub roots: Arc<RootCertStore>,
    /// Leaf `notAfter`, seconds since the Unix epoch.
    pub not_after: i64,
}

impl Material {
    /// From DER: the chain (leaf first), its PKCS#8 key, and the bundle's CAs.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        bundle: Vec<CertificateDer<'static>>,
    ) -> Result<Self, IdentityError> {
        let leaf = chain.first().ok_or(IdentityError::EmptyChain)?;
        let id = spiffe::cert::spiffe_id_from_der(leaf.as_ref())
            .map_err(|e| IdentityError::NoSpiffeId(e.to_string()))?;
        let not_after = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|_| IdentityError::BadCertificate)?
            .1
            .validity()
            .not_after
            .timestamp();
        let mut roots = RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(bundle);
        if added == 0 {
            return Err(IdentityError::EmptyBundle);
        }
        let provider = provider();
        let key = CertifiedKey::from_der(chain, key, &provider).map_err(IdentityError::BadKey)?;
        Ok(Self {
            spiffe_id: id.to_string().into(),
            trust_domain_id: format!("spiffe://{}", id.trust_domain_name()).into(),
            key: Arc::new(key),
            roots: Arc::new(roots),
            not_after,
        })
    }

    /// From PEM: certificate chain, private key, and bundle files' contents.
    pub fn from_pem(cert: &[u8], key: &[u8], bundle: &[u8]) -> Result<Self, IdentityError> {
        let chain = CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(key)?;
        let bundle = CertificateDer::pem_slice_iter(bundle).collect::<Result<Vec<_>, _>>()?;
        Self::from_der(chain, key, bundle)
    }

    /// Seconds until the SVID expires (negative once it has).
    pub fn expires_in(&self) -> i64 {
        self.not_after - unix_now()
    }

    /// The SPIFFE ID a peer serving `path` (`/ns/<ns>/sa/<sa>`) must present.
    pub fn peer_id(&self, path: &str) -> String {
        format!("{}{path}", self.trust_domain_id)
    }
}

/// The live identity. `generation` increases with every update, so pools can tell
/// connections made with an older SVID.
#[derive(Debug, Default)]
pub struct Identity {
    current: ArcSwapOption<Material>,
    generation: AtomicU64,
}

impl Identity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Installs a new SVID and bundle; new connections use them at once.
    pub fn update(&self, material: Material, source: &'static str) {
        tracing::info!(
            spiffe_id = %material.spiffe_id,
            expires_in_s = material.expires_in(),
            source,
            "mesh identity updated"
        );
        metrics::counter!(telemetry::MESH_SVID_UPDATES_TOTAL, "source" => source).increment(1);
        metrics::gauge!(telemetry::MESH_SVID_EXPIRY_SECONDS).set(material.expires_in() as f64);
        self.current.store(Some(Arc::new(material)));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The current SVID, if one is held and has not expired.
    pub fn current(&self) -> Option<Arc<Material>> {
        self.current.load_full().filter(|m| m.expires_in() > 0)
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Ready means: an unexpired SVID is held. (No reference count taken: this is
    /// asked on every mesh request.)
    pub fn is_ready(&self) -> bool {
        self.current
            .load()
            .as_ref()
            .is_some_and(|m| m.expires_in() > 0)
    }

    /// Keeps `aether_mesh_svid_expiry_seconds` current and warns while the SVID is
    /// close to, or past, its expiry (a source that stopped delivering updates).
    pub fn spawn_expiry_gauge(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut warned = 0i64;
            loop {
                tick.tick().await;
                let Some(m) = me.current.load_full() else {
                    continue;
                };
                let left = m.expires_in();
                metrics::gauge!(telemetry::MESH_SVID_EXPIRY_SECONDS).set(left as f64);
                // Once a minute at most: near expiry means the source is not renewing.
                if left < 60 && unix_now() - warned >= 60 {
                    warned = unix_now();
                    tracing::warn!(spiffe_id = %m.spiffe_id, expires_in_s = left, "mesh SVID is about to expire or has expired and no newer one arrived");
                }
            }
        });
    }
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
