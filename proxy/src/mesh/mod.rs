//! Mesh mode: the edge as a single-identity mesh client. Each backend endpoint is
//! reached at `pod_ip:<mesh port>` over mutual TLS 1.3 (the edge's SVID as client
//! certificate, the trust bundle as roots, ALPN h2), and the peer must present the
//! SPIFFE ID of the destination pod's service account.
//!
//! The upstream contract (docs/mesh.md): one HTTP/2 request per downstream
//! request, `:authority` = the client's Host, and `x-envoy-original-dst-host:
//! <pod_ip>:<target port>` naming the port the request is for, which an Envoy inbound
//! listener routes on with an ORIGINAL_DST cluster (`use_http_header`).

pub mod identity;
mod pool;
#[cfg(test)]
mod pool_tests;
mod sniff;
mod verify;
pub mod workload;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub use identity::{Identity, IdentityError, Material};
pub use pool::PoolSettings;
pub use verify::PeerIdentityError;

pub(crate) use self::pool::Lease;
use self::pool::Pool;
use self::verify::SpiffeVerifier;
use crate::backend::Endpoint;
use crate::telemetry;
use crate::upstream::UpstreamError;

/// The port the destination's workload listens on, for the inbound listener.
pub const ORIGINAL_DST_HEADER: HeaderName = crate::http::X_ENVOY_ORIGINAL_DST_HOST;

/// Mesh mode settings: where inbound listeners are and who we are.
#[derive(Debug, Clone)]
pub struct MeshSettings {
    pub port: u16,
    pub identity: Arc<Identity>,
    pub pool: PoolSettings,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// `pod_ip:<mesh port>`.
    addr: SocketAddr,
    /// `/ns/<ns>/sa/<sa>`: part of the key, so a pod IP reused by another workload
    /// never shares a connection verified for the previous one.
    peer: Arc<str>,
}

pub struct MeshClient {
    port: u16,
    identity: Arc<Identity>,
    connect_timeout: Duration,
    pool: Arc<Pool<Key>>,
}

impl MeshClient {
    pub fn new(settings: &MeshSettings, connect_timeout: Duration) -> Self {
        Self {
            port: settings.port,
            identity: Arc::clone(&settings.identity),
            connect_timeout,
            pool: reaped(Pool::new(settings.pool.clone()), settings.pool.idle_timeout),
        }
    }

    pub fn identity(&self) -> &Arc<Identity> {
        &self.identity
    }

    /// A stream slot on `endpoint`'s inbound listener. Past its expiry the SVID is not
    /// used at all, pooled connections included: the edge is then not ready either,
    /// so load balancers are already moving off.
    pub(crate) async fn connect(&self, endpoint: &Endpoint) -> Result<Lease, UpstreamError> {
        if !self.identity.is_ready() {
            return Err(UpstreamError::NoIdentity(
                "the mesh SVID has expired or none is held".into(),
            ));
        }
        self.checkout(endpoint).await
    }

    /// A stream slot on `endpoint`'s inbound listener. An endpoint whose workload
    /// identity is unknown is refused: it could be anything.
    async fn checkout(&self, endpoint: &Endpoint) -> Result<Lease, UpstreamError> {
        let Some(peer) = endpoint.peer.as_ref() else {
            metrics::counter!(telemetry::MESH_PEER_IDENTITY_UNKNOWN_TOTAL).increment(1);
            return Err(UpstreamError::Refused(
                format!(
                    "{}: no known pod identity (EndpointSlice targetRef to a known Pod)",
                    endpoint.addr
                )
                .into(),
            ));
        };
        let key = Key {
            addr: SocketAddr::new(endpoint.addr.ip(), self.port),
            peer: Arc::clone(peer),
        };
        let generation = self.identity.generation();
        let dial = || self.dial(key.addr, peer);
        self.pool.checkout(&key, generation, dial).await
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        peer: &str,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, UpstreamError> {
        let Some(material) = self.identity.current() else {
            return Err(UpstreamError::Connect("no unexpired SVID is held".into()));
        };
        let expected: Arc<str> = material.peer_id(peer).into();
        let config = client_config(&material, Arc::clone(&expected))?;
        let connect = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| UpstreamError::Connect(e.into()))?;
            let _ = tcp.set_nodelay(true);
            // SVIDs have no DNS names; the verifier checks the SPIFFE ID instead, and
            // an IP server name sends no SNI.
            let name = ServerName::IpAddress(addr.ip().into());
            TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| tls_error(e, &expected))
        };
        let tls = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| UpstreamError::Connect("connect timed out".into()))??;
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(UpstreamError::Refused(
                format!("{addr}: the inbound listener did not negotiate h2").into(),
            ));
        }
        Ok(tls)
    }
}

/// The pool, with a task that closes its idle connections while it lives.
fn reaped(pool: Pool<Key>, idle: Duration) -> Arc<Pool<Key>> {
    let pool = Arc::new(pool);
    let weak = Arc::downgrade(&pool);
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let mut tick = tokio::time::interval((idle / 3).max(Duration::from_secs(1)));
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(pool) => pool.reap_idle(),
                    None => return,
                }
            }
        });
    }
    pool
}

/// TLS 1.3 only, ALPN h2, our SVID as client certificate, the peer pinned.
fn client_config(
    material: &identity::Material,
    expected: Arc<str>,
) -> Result<Arc<ClientConfig>, UpstreamError> {
    let provider = identity::provider();
    let verifier =
        SpiffeVerifier::new(Arc::clone(&material.roots), expected, Arc::clone(&provider));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| UpstreamError::Connect(e.into()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(Svid(Arc::clone(&material.key))));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Presents the SVID whatever the server asks for: the inbound listener requires it.
#[derive(Debug)]
struct Svid(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Svid {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A handshake refused for the peer's identity is the peer's fault (502), not an
/// unreachable endpoint (503).
fn tls_error(e: std::io::Error, expected: &str) -> UpstreamError {
    let refused = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| matches!(r, rustls::Error::InvalidCertificate(_)));
    if refused {
        UpstreamError::Refused(format!("peer is not {expected}: {e}").into())
    } else {
        UpstreamError::Connect(e.into())
    }
}
