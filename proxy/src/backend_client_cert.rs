//! A Gateway's client certificate towards its TLS backends
//! (`spec.tls.backend.clientCertificateRef`): what the controller resolves, and the
//! rustls resolver that presents it. Each [`crate::backend_tls::BackendTls`] keeps a
//! client configuration and pools per certificate (`presenting`).

use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use serde::Serialize;

/// The certificate a Gateway presents to the backends it reaches over TLS
/// (`spec.tls.backend.clientCertificateRef`), or why it cannot: then those connections
/// fail rather than go out without the identity the Gateway was configured with.
#[derive(Serialize)]
pub struct ClientCertificate {
    /// The reference, for logs and config dumps (`namespace/name` of the Secret).
    pub reference: Arc<str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<Arc<str>>,
    #[serde(skip)]
    pub(crate) key: Option<Arc<CertifiedKey>>,
}

impl ClientCertificate {
    pub fn new(reference: Arc<str>, key: Arc<CertifiedKey>) -> Self {
        Self {
            reference,
            invalid: None,
            key: Some(key),
        }
    }

    pub fn invalid(reference: Arc<str>, reason: impl Into<Arc<str>>) -> Self {
        Self {
            reference,
            invalid: Some(reason.into()),
            key: None,
        }
    }

    /// The same reference resolved to the same thing (the same chain, hence key, or the
    /// same problem): a reconcile that rebuilt it need not rebuild what uses it.
    pub fn same(&self, other: &Self) -> bool {
        self.reference == other.reference
            && self.invalid == other.invalid
            && match (&self.key, &other.key) {
                (Some(a), Some(b)) => a.cert == b.cert,
                (None, None) => true,
                _ => false,
            }
    }
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("reference", &self.reference)
            .field("invalid", &self.invalid)
            .finish_non_exhaustive()
    }
}

/// Presents one certificate whatever the server asks: the backend decides whether the
/// Gateway's certificate is one it accepts.
#[derive(Debug)]
pub(crate) struct Present(Arc<CertifiedKey>);

impl Present {
    pub(crate) fn new(key: Arc<CertifiedKey>) -> Self {
        Self(key)
    }
}

impl ResolvesClientCert for Present {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}
