//! TLS termination: server certificates chosen by SNI, and client certificates
//! validated, as the current Snapshot says.
//!
//! A socket reads the ClientHello first, then loads the Snapshot once and takes that
//! Snapshot's handshake configuration for the socket's listener: its certificates, its
//! client validation and ALPN, built at the listener's first handshake and dropped with
//! the Snapshot. One load per handshake (the resolver and the verifier used to load it
//! for every callback, three to five times), and a handshake consistent with one
//! Snapshot; a rotated Secret is used by the next handshake, and established
//! connections are untouched.
//!
//! Crypto provider: ring. It builds with a C compiler alone (aws-lc-rs wants cmake and
//! a longer build on these 2-core machines), is what rcgen and the test tooling use,
//! and covers every cipher suite the edge offers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, OnceLock};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::crypto::ring as provider;
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
pub use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

use crate::client_auth::ListenerClientVerifier;
use crate::hostmap::HostMap;
use crate::resumption::Resumption;
use crate::snapshot::Listener;
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
    /// The names, and the SHA-256 fingerprint of each one's leaf certificate (`*`: the
    /// default's), which tells an operator which certificate is served: no key or
    /// certificate leaves the process.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let named = self.certs.named();
        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        let default = self.certs.any().map(|k| ("*", k));
        let fingerprints: BTreeMap<&str, String> = named
            .iter()
            .map(|(n, k)| (n.as_str(), *k))
            .chain(default)
            .map(|(n, k)| (n, leaf_sha256(k)))
            .collect();
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("serverNames", &names)?;
        m.serialize_entry("default", &default.is_some())?;
        m.serialize_entry("sha256", &fingerprints)?;
        m.end()
    }
}

/// The leaf certificate's SHA-256 fingerprint in lower-case hex (as `openssl x509
/// -fingerprint -sha256` prints it, without the colons).
fn leaf_sha256(key: &CertifiedKey) -> String {
    use std::fmt::Write;
    let Some(leaf) = key.cert.first() else {
        return String::new();
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, leaf.as_ref());
    digest
        .as_ref()
        .iter()
        .fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

/// The certificates of one Snapshot's listener.
#[derive(Debug)]
struct ListenerResolver(TlsCerts);

impl ResolvesServerCert for ListenerResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.lookup(hello.server_name()).cloned()
    }
}

/// Built once per process: every handshake configuration shares it.
static PROVIDER: LazyLock<Arc<CryptoProvider>> =
    LazyLock::new(|| Arc::new(provider::default_provider()));

/// The handshake configurations of one Snapshot's listener, built at its first
/// handshake of each kind and dropped with the Snapshot.
#[derive(Debug, Default)]
pub struct HandshakeConfigs {
    /// HTTPS: ALPN offers `h2` and `http/1.1`.
    http: OnceLock<Built>,
    /// TLS terminated in front of a TLSRoute backend: no ALPN, since the edge must not
    /// agree to an application protocol on the backend's behalf.
    l4: OnceLock<Built>,
}

#[derive(Debug)]
struct Built {
    /// The session store it was built with: a socket bound anew (a listener removed
    /// and added back) has another.
    resumption: Arc<Resumption>,
    config: Arc<ServerConfig>,
}

impl HandshakeConfigs {
    /// The configuration for `listener` (whose field this is) and the socket's session
    /// store, cached for the Snapshot's life.
    fn get(
        &self,
        listener: &Listener,
        resumption: &Arc<Resumption>,
        alpn: bool,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        let cell = if alpn { &self.http } else { &self.l4 };
        if let Some(b) = cell
            .get()
            .filter(|b| Arc::ptr_eq(&b.resumption, resumption))
        {
            return Ok(Arc::clone(&b.config));
        }
        let config = build(listener, resumption, alpn)?;
        let _ = cell.set(Built {
            resumption: Arc::clone(resumption),
            config: Arc::clone(&config),
        });
        Ok(config)
    }
}

fn build(
    listener: &Listener,
    resumption: &Arc<Resumption>,
    alpn: bool,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let builder = ServerConfig::builder_with_provider(Arc::clone(&PROVIDER))
        .with_safe_default_protocol_versions()?;
    let builder = match &listener.client_auth {
        Some(auth) => builder.with_client_cert_verifier(Arc::new(ListenerClientVerifier::new(
            Arc::clone(auth),
            listener.bind,
        ))),
        None => builder.with_no_client_auth(),
    };
    let certs = listener.tls.clone().unwrap_or_default();
    let mut config = builder.with_cert_resolver(Arc::new(ListenerResolver(certs)));
    if alpn {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    }
    config.session_storage = resumption.store();
    config.ticketer = resumption.ticketer();
    Ok(Arc::new(config))
}

/// The TLS handshakes of the sockets bound at one address (one per worker), which
/// share its session store.
#[derive(Clone)]
pub struct Handshakes {
    state: Arc<ProxyState>,
    local: SocketAddr,
    resumption: Arc<Resumption>,
}

impl Handshakes {
    pub fn new(state: Arc<ProxyState>, local: SocketAddr, resumption: Arc<Resumption>) -> Self {
        Self {
            state,
            local,
            resumption,
        }
    }

    /// Reads the ClientHello, then completes the handshake with the configuration of
    /// the Snapshot current then; `alpn`: offer `h2` and `http/1.1` (HTTPS listeners).
    pub async fn accept<IO>(&self, io: IO, alpn: bool) -> std::io::Result<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let start = LazyConfigAcceptor::new(Acceptor::default(), io).await?;
        let config = {
            let snapshot = self.state.snapshot.load();
            let listener = snapshot
                .listeners
                .get(&self.local)
                .ok_or_else(|| std::io::Error::other("the listener is gone"))?;
            listener
                .handshakes
                .get(listener, &self.resumption, alpn)
                .map_err(std::io::Error::other)?
        };
        start.into_stream(config).await
    }
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
