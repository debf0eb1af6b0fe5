//! TLS termination: server certificates chosen by SNI from the current Snapshot.
//!
//! The rustls `ServerConfig` of a socket is built once; its certificate resolver loads
//! the Snapshot on every ClientHello, so a rotated Secret is used by the next handshake
//! and established connections are untouched.
//!
//! Crypto provider: ring. It builds with a C compiler alone (aws-lc-rs wants cmake and
//! a longer build on these 2-core machines), is what rcgen and the test tooling use,
//! and covers every cipher suite the edge offers.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::ring as provider;
use rustls::server::{ClientHello, ResolvesServerCert};
pub use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::client_auth::SnapshotClientVerifier;
use crate::hostmap::HostMap;
use crate::resumption::Resumption;
use crate::state::ProxyState;

/// Why a certificate and key can't be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate in tls.crt")]
    NoCertificate,
    #[error("tls.crt is not PEM: {0}")]
    CertificatePem(rustls_pki_types::pem::Error),
    #[error("tls.key is not a PEM private key: {0}")]
    KeyPem(rustls_pki_types::pem::Error),
    #[error("the private key is not usable: {0}")]
    Key(rustls::Error),
    #[error("the private key does not match the certificate: {0}")]
    Mismatch(rustls::Error),
}

/// Parses a PEM chain and key (a `kubernetes.io/tls` Secret's `tls.crt`/`tls.key`).
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(TlsError::CertificatePem)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(TlsError::KeyPem)?;
    let key = provider::sign::any_supported_type(&key).map_err(TlsError::Key)?;
    let certified = CertifiedKey::new(chain, key);
    certified.keys_match().map_err(TlsError::Mismatch)?;
    Ok(Arc::new(certified))
}

/// The certificates of one socket, by the hostnames of its HTTPS listeners. A client
/// without SNI, or with a name no listener claims, gets the certificate of the listener
/// that has no hostname, as the spec allows.
#[derive(Debug, Default, Clone)]
pub struct TlsCerts {
    certs: HostMap<Arc<CertifiedKey>>,
}

impl TlsCerts {
    /// Adds the certificate of a listener with `hostname` (`None`: any host). The first
    /// listener to claim a name keeps it, matching listener precedence.
    pub fn add(&mut self, hostname: Option<&str>, key: Arc<CertifiedKey>) {
        self.certs.insert_first(hostname, key);
    }

    /// The certificate for a server name: exact, then the longest wildcard, then the
    /// default.
    pub fn lookup(&self, name: Option<&str>) -> Option<&Arc<CertifiedKey>> {
        let name = name.map(|n| n.trim_end_matches('.'));
        match name {
            Some(n) if n.bytes().any(|b| b.is_ascii_uppercase()) => {
                self.certs.get(Some(&n.to_ascii_lowercase()))
            }
            _ => self.certs.get(name),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }
}

impl Serialize for TlsCerts {
    /// Names only: keys and certificates never leave the process.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let names: Vec<String> = self.certs.named().into_iter().map(|(n, _)| n).collect();
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("serverNames", &names)?;
        m.serialize_entry("default", &self.certs.any().is_some())?;
        m.end()
    }
}

/// Picks the certificate from whatever Snapshot is current at handshake time.
struct SnapshotResolver {
    state: Arc<ProxyState>,
    local: SocketAddr,
}

impl std::fmt::Debug for SnapshotResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotResolver({})", self.local)
    }
}

impl ResolvesServerCert for SnapshotResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let snapshot = self.state.snapshot.load();
        let certs = snapshot.listener(&self.local)?.tls.as_ref()?;
        certs.lookup(hello.server_name()).cloned()
    }
}

/// The TLS configuration of the socket bound at `local`; `resumption` is shared by every
/// socket bound there.
pub fn server_config(
    state: Arc<ProxyState>,
    local: SocketAddr,
    resumption: &Arc<Resumption>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(SnapshotClientVerifier::new(
            Arc::clone(&state),
            local,
        )))
        .with_cert_resolver(Arc::new(SnapshotResolver { state, local }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.session_storage = resumption.store();
    config.ticketer = resumption.ticketer();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_for(name: &str) -> Arc<CertifiedKey> {
        let c = rcgen::generate_simple_self_signed(vec![name.to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        certified_key(
            c.cert.pem().as_bytes(),
            c.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn sni_picks_exact_then_longest_wildcard_then_default() {
        let (a, w, d) = (
            key_for("a.example.com"),
            key_for("*.example.com"),
            key_for("default"),
        );
        let mut certs = TlsCerts::default();
        certs.add(Some("a.example.com"), Arc::clone(&a));
        certs.add(Some("*.example.com"), Arc::clone(&w));
        certs.add(None, Arc::clone(&d));
        let is = |got: Option<&Arc<CertifiedKey>>, want: &Arc<CertifiedKey>| {
            got.is_some_and(|g| Arc::ptr_eq(g, want))
        };
        assert!(is(certs.lookup(Some("A.example.com")), &a));
        assert!(is(certs.lookup(Some("b.example.com")), &w));
        assert!(is(certs.lookup(Some("x.y.example.com")), &w));
        assert!(is(certs.lookup(Some("example.com")), &d));
        assert!(is(certs.lookup(None), &d));
    }

    #[test]
    fn mismatched_or_broken_pem_is_refused() {
        let one = rcgen::generate_simple_self_signed(vec!["one".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        let two = rcgen::generate_simple_self_signed(vec!["two".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        let mismatch = certified_key(
            one.cert.pem().as_bytes(),
            two.signing_key.serialize_pem().as_bytes(),
        );
        assert!(
            matches!(mismatch, Err(TlsError::Mismatch(_))),
            "{mismatch:?}"
        );
        assert!(certified_key(b"not pem", b"not pem").is_err());
    }
}
