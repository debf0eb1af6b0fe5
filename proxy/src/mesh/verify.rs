//! Verifies a mesh peer: its chain must lead to the trust bundle, and its leaf's URI
//! SAN must be exactly the SPIFFE ID the destination pod's service account implies.
//!
//! DNS names play no part (SVIDs carry none), which is why this replaces webpki's
//! server verifier instead of wrapping it. A connection is dialled with one expected
//! ID, so the check happens inside the handshake: a wrong peer never gets a byte of
//! the request.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, OtherError, RootCertStore};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::telemetry;

/// Why a peer's identity was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerIdentityError {
    #[error("peer certificate has no SPIFFE ID")]
    NoSpiffeId,
    #[error("peer is {got}, expected {expected}")]
    Mismatch { got: String, expected: Arc<str> },
}

#[derive(Debug)]
pub struct SpiffeVerifier {
    roots: Arc<RootCertStore>,
    expected: Arc<str>,
    provider: Arc<CryptoProvider>,
}

impl SpiffeVerifier {
    pub fn new(
        roots: Arc<RootCertStore>,
        expected: Arc<str>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        Self {
            roots,
            expected,
            provider,
        }
    }

    fn refuse(&self, why: PeerIdentityError) -> Error {
        counted("spiffe_id", &why);
        Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(why))))
    }
}

/// Counts and logs a refused peer; hands the error back.
fn counted<E: std::fmt::Display>(reason: &'static str, e: E) -> E {
    metrics::counter!(telemetry::MESH_PEER_IDENTITY_MISMATCH_TOTAL, "reason" => reason)
        .increment(1);
    tracing::warn!(reason, error = %e, "mesh peer identity refused");
    e
}

impl ServerCertVerifier for SpiffeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let cert = ParsedCertificate::try_from(end_entity).map_err(|e| counted("chain", e))?;
        // A chain that does not lead to our bundle is another trust domain's (or
        // none): refused and counted like a wrong ID.
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )
        .map_err(|e| counted("chain", e))?;
        let id = spiffe::cert::spiffe_id_from_der(end_entity.as_ref())
            .map_err(|_| self.refuse(PeerIdentityError::NoSpiffeId))?;
        let id = id.to_string();
        if id != *self.expected {
            return Err(self.refuse(PeerIdentityError::Mismatch {
                got: id,
                expected: Arc::clone(&self.expected),
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
