//! Client certificates (the Gateway's frontend TLS validation): which CAs a socket
//! trusts for client certificates, and whether a client without a valid one may still
//! connect (`AllowInsecureFallback`).
//!
//! Like server certificates, the rules come from the Snapshot current at each
//! handshake (`crate::tls`): a changed CA bundle applies to the next handshake.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::ring as provider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
pub use rustls_pki_types::CertificateDer;
use rustls_pki_types::UnixTime;
use rustls_pki_types::pem::PemObject;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

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

/// The client-certificate checks of one Snapshot's listener.
#[derive(Debug)]
pub(crate) struct ListenerClientVerifier {
    auth: Arc<ClientAuth>,
    local: SocketAddr,
}

impl ListenerClientVerifier {
    pub(crate) fn new(auth: Arc<ClientAuth>, local: SocketAddr) -> Self {
        Self { auth, local }
    }
}

impl ClientCertVerifier for ListenerClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        !self.auth.insecure_fallback
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.auth.verifier.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let auth = &self.auth;
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
        self.auth
            .verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.auth
            .verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.auth.verifier.supported_verify_schemes()
    }
}
