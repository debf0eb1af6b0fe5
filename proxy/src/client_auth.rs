//! Client certificates (the Gateway's frontend TLS validation): which CAs a socket
//! trusts for client certificates, and whether a client without a valid one may still
//! connect (`AllowInsecureFallback`).
//!
//! Like server certificates, the rules come from the current Snapshot at each
//! handshake: a changed CA bundle applies to the next handshake with no rebuild of
//! the socket's rustls configuration.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{WebPkiSupportedAlgorithms, ring as provider};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
pub use rustls_pki_types::CertificateDer;
use rustls_pki_types::UnixTime;
use rustls_pki_types::pem::PemObject;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::state::ProxyState;

#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    #[error("no certificate in the CA bundle")]
    Empty,
    #[error("the CA bundle is not PEM: {0}")]
    Pem(rustls_pki_types::pem::Error),
    #[error("a CA certificate is not usable: {0}")]
    Certificate(rustls::Error),
    #[error("cannot build a verifier from these CAs: {0}")]
    Verifier(String),
}

/// The CA certificates of one PEM bundle (a ConfigMap's `ca.crt`).
pub fn ca_bundle(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, ClientAuthError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(ClientAuthError::Pem)?;
    if certs.is_empty() {
        return Err(ClientAuthError::Empty);
    }
    Ok(certs)
}

/// How one socket validates client certificates.
#[derive(Debug)]
pub struct ClientAuth {
    verifier: Arc<dyn ClientCertVerifier>,
    /// `AllowInsecureFallback`: a missing or invalid certificate is let through.
    pub insecure_fallback: bool,
    roots: usize,
}

impl ClientAuth {
    pub fn new(
        cas: Vec<CertificateDer<'static>>,
        insecure_fallback: bool,
    ) -> Result<Self, ClientAuthError> {
        let mut store = RootCertStore::empty();
        for ca in cas {
            store.add(ca).map_err(ClientAuthError::Certificate)?;
        }
        let roots = store.len();
        if roots == 0 {
            return Err(ClientAuthError::Empty);
        }
        let builder = WebPkiClientVerifier::builder_with_provider(
            Arc::new(store),
            Arc::new(provider::default_provider()),
        );
        let builder = if insecure_fallback {
            builder.allow_unauthenticated()
        } else {
            builder
        };
        let verifier = builder
            .build()
            .map_err(|e| ClientAuthError::Verifier(e.to_string()))?;
        Ok(Self {
            verifier,
            insecure_fallback,
            roots,
        })
    }
}

impl Serialize for ClientAuth {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        let mode = if self.insecure_fallback {
            "AllowInsecureFallback"
        } else {
            "AllowValidOnly"
        };
        m.serialize_entry("mode", mode)?;
        m.serialize_entry("caCertificates", &self.roots)?;
        m.end()
    }
}

/// Client-certificate checks from whatever Snapshot is current at handshake time.
pub(crate) struct SnapshotClientVerifier {
    state: Arc<ProxyState>,
    local: SocketAddr,
    algorithms: WebPkiSupportedAlgorithms,
}

impl SnapshotClientVerifier {
    pub(crate) fn new(state: Arc<ProxyState>, local: SocketAddr) -> Self {
        Self {
            state,
            local,
            algorithms: provider::default_provider().signature_verification_algorithms,
        }
    }

    fn current(&self) -> Option<Arc<ClientAuth>> {
        let snapshot = self.state.snapshot.load();
        snapshot.listener(&self.local)?.client_auth.clone()
    }
}

impl std::fmt::Debug for SnapshotClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotClientVerifier({})", self.local)
    }
}

impl ClientCertVerifier for SnapshotClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.current().is_some()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.current().is_some_and(|c| !c.insecure_fallback)
    }

    /// No hints: they would have to outlive the Snapshot they came from, and clients
    /// with a single certificate send it either way.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Validation was removed since the handshake offered it: nothing to check.
        let Some(auth) = self.current() else {
            return Ok(ClientCertVerified::assertion());
        };
        match auth
            .verifier
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(v) => Ok(v),
            Err(e) if auth.insecure_fallback => {
                metrics::counter!(crate::telemetry::CLIENT_CERT_FALLBACK_TOTAL).increment(1);
                tracing::debug!(listener = %self.local, error = %e, "invalid client certificate let through (AllowInsecureFallback)");
                Ok(ClientCertVerified::assertion())
            }
            Err(e) => {
                metrics::counter!(crate::telemetry::CLIENT_CERT_REJECTED_TOTAL).increment(1);
                Err(e)
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
