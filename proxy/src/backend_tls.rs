//! BackendTLSPolicy on the data plane: what a TLS connection to a backend must verify.
//!
//! The controller builds one [`BackendTls`] per policy and Service port at snapshot-build
//! time: the rustls client configuration (roots, verifier, ALPN) is made once there, never
//! per request. The connection pools that use it live inside it too (created on first
//! use), so a new policy version (a rotated CA bundle, say) starts new connections while
//! requests already on the old ones finish.
//!
//! A Gateway with `spec.tls.backend.clientCertificateRef` presents that certificate on
//! these connections ([`crate::backend_client_cert`]); each certificate gets its own client
//! configuration and pools beside the policy's (`presenting`), so a connection made for
//! one Gateway is never reused for another that presents a different certificate (or
//! none).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

pub use rustls::RootCertStore;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{Resumption, verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, OtherError};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde::Serialize;

use crate::backend_client_cert::Present;

/// The ALPN protocol offered to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Alpn {
    Http1,
    H2,
    /// An opaque stream (TLSRoute Terminate): no ALPN, the edge does not speak for it.
    None,
}

/// A subjectAltName the backend's certificate may present (any one suffices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum SubjectAltName {
    Hostname(String),
    Uri(String),
}

#[derive(Debug, thiserror::Error)]
pub enum BackendTlsError {
    #[error("{0:?} is not a valid hostname")]
    InvalidHostname(String),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("no usable CA certificate")]
    NoRoots,
}

/// A root store of CA certificates (ConfigMap `ca.crt` bundles).
pub fn roots(
    certs: impl IntoIterator<Item = CertificateDer<'static>>,
) -> Result<Arc<RootCertStore>, BackendTlsError> {
    let mut store = RootCertStore::empty();
    for c in certs {
        store.add(c)?;
    }
    if store.is_empty() {
        return Err(BackendTlsError::NoRoots);
    }
    Ok(Arc::new(store))
}

#[derive(Debug, thiserror::Error)]
#[error("certificate matches none of the policy's subjectAltNames")]
struct SanMismatch;

/// The TLS a backend (Service port) is reached with, per its BackendTLSPolicy.
#[derive(Serialize)]
pub struct BackendTls {
    /// `namespace/name` of the policy, for logs and config dumps.
    pub policy: Arc<str>,
    /// The SNI sent, and the name verified when no subjectAltNames are given.
    pub hostname: Arc<str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
    /// Why connections must fail (the policy has no usable CA); `None` when usable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<Arc<str>>,
    #[serde(skip)]
    pub(crate) server_name: ServerName<'static>,
    /// Connections that present no client certificate; `config` is `None` when invalid.
    #[serde(skip)]
    pub(crate) plain: Dialer,
    /// Variants presenting a Gateway's client certificate, by its chain.
    #[serde(skip)]
    presenting: Mutex<Vec<Arc<Dialer>>>,
}

/// One client configuration and the pools of the connections made with it.
pub(crate) struct Dialer {
    pub(crate) config: Option<Arc<ClientConfig>>,
    /// The client certificate chain presented (empty: none).
    chain: Vec<CertificateDer<'static>>,
    pub(crate) http1: OnceLock<crate::upstream::H1Pool>,
    pub(crate) h2: OnceLock<crate::upstream::H2Pool>,
}

impl Dialer {
    fn new(config: Option<Arc<ClientConfig>>, chain: Vec<CertificateDer<'static>>) -> Self {
        Self {
            config,
            chain,
            http1: OnceLock::new(),
            h2: OnceLock::new(),
        }
    }
}

/// Distinct client certificates kept per policy; past it the oldest variant is dropped
/// (its connections close once idle). Only Gateways sharing one backend, or rotations,
/// add variants, so this is rarely reached; beyond it pools are rebuilt, never wrong.
const MAX_PRESENTING: usize = 8;

impl BackendTls {
    /// A usable policy: the chain must lead to `roots`, and the leaf must name
    /// `hostname` (or, when given, one of `sans`), offering `alpn`.
    pub fn new(
        policy: Arc<str>,
        hostname: &str,
        roots: Arc<RootCertStore>,
        sans: Vec<SubjectAltName>,
        alpn: Alpn,
    ) -> Result<Self, BackendTlsError> {
        let server_name = ServerName::try_from(hostname.to_owned())
            .map_err(|_| BackendTlsError::InvalidHostname(hostname.to_owned()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(PolicyVerifier {
            roots,
            sans: sans.clone(),
            provider: Arc::clone(&provider),
        });
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols = match alpn {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::H2 => vec![b"h2".to_vec()],
            Alpn::None => Vec::new(),
        };
        Ok(Self {
            policy,
            hostname: hostname.into(),
            subject_alt_names: sans,
            invalid: None,
            server_name,
            plain: Dialer::new(Some(Arc::new(config)), Vec::new()),
            presenting: Mutex::new(Vec::new()),
        })
    }

    /// The configuration and pools for connections presenting `key`; `None` when the
    /// policy is invalid (its connections fail whatever the certificate).
    pub(crate) fn presenting(&self, key: &Arc<CertifiedKey>) -> Option<Arc<Dialer>> {
        let base = self.plain.config.as_ref()?;
        let mut variants = self
            .presenting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = variants.iter().find(|v| v.chain == key.cert) {
            return Some(Arc::clone(v));
        }
        let mut config = (**base).clone();
        config.client_auth_cert_resolver = Arc::new(Present::new(Arc::clone(key)));
        // A clone shares the session cache: a TLS 1.3 session resumed from it carries
        // the identity of the handshake that made it, so a Gateway presenting no
        // certificate (or another) could resume as this one. Each variant keeps its own.
        config.resumption = Resumption::default();
        let variant = Arc::new(Dialer::new(Some(Arc::new(config)), key.cert.clone()));
        if variants.len() >= MAX_PRESENTING {
            variants.remove(0);
        }
        variants.push(Arc::clone(&variant));
        Some(variant)
    }

    /// A policy whose connections must fail (the spec: "Connections using an invalid
    /// CACertificateRef MUST fail"); requests to its backend answer 5xx.
    pub fn invalid(policy: Arc<str>, hostname: &str, reason: impl Into<Arc<str>>) -> Self {
        Self {
            policy,
            hostname: hostname.into(),
            subject_alt_names: Vec::new(),
            invalid: Some(reason.into()),
            // Never dialled (there is no config); any name will do.
            server_name: ServerName::try_from(hostname.to_owned()).unwrap_or(
                ServerName::IpAddress(std::net::IpAddr::from([0, 0, 0, 0]).into()),
            ),
            plain: Dialer::new(None, Vec::new()),
            presenting: Mutex::new(Vec::new()),
        }
    }
}

impl std::fmt::Debug for BackendTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendTls")
            .field("policy", &self.policy)
            .field("hostname", &self.hostname)
            .field("subject_alt_names", &self.subject_alt_names)
            .field("invalid", &self.invalid)
            .finish_non_exhaustive()
    }
}

/// The platform's trust store (`wellKnownCACertificates: System`), read once per process.
/// An unreadable store yields no roots, so such policies fail closed.
pub fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    Arc::clone(ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "cannot read part of the system trust store");
        }
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        tracing::info!(
            added,
            ignored,
            "system trust store loaded for BackendTLSPolicy"
        );
        Arc::new(roots)
    }))
}

/// Chain to the policy's roots, then the name check the spec asks for: the hostname
/// when no subjectAltNames are given, otherwise any one of them (and not the hostname).
#[derive(Debug)]
struct PolicyVerifier {
    roots: Arc<RootCertStore>,
    sans: Vec<SubjectAltName>,
    provider: Arc<CryptoProvider>,
}

impl PolicyVerifier {
    fn sans_match(&self, cert: &ParsedCertificate<'_>, der: &CertificateDer<'_>) -> bool {
        let mut uris: Option<Vec<String>> = None;
        self.sans.iter().any(|san| match san {
            SubjectAltName::Hostname(h) => ServerName::try_from(h.as_str())
                .is_ok_and(|name| verify_server_name(cert, &name).is_ok()),
            SubjectAltName::Uri(u) => uris.get_or_insert_with(|| uri_sans(der)).contains(u),
        })
    }
}

/// The leaf's URI subjectAltNames (webpki checks DNS and IP names only).
fn uri_sans(der: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

impl ServerCertVerifier for PolicyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        if self.sans.is_empty() {
            verify_server_name(&cert, server_name)?;
        } else if !self.sans_match(&cert, end_entity) {
            return Err(Error::InvalidCertificate(CertificateError::Other(
                OtherError(Arc::new(SanMismatch)),
            )));
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
