//! Upstream connections, all of them: keep-alive HTTP/1.1 per endpoint (plain or with a
//! BackendTLSPolicy, `h1`), one multiplexed HTTP/2 connection per endpoint for backends
//! that declare it (`h2pool`), and mesh mode's mTLS HTTP/2 (`crate::mesh`).

pub(crate) mod attempts;
mod body;
mod h1;
pub(crate) mod h2pool;
mod io;
#[cfg(test)]
mod tests;
pub(crate) mod tls;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};

pub use body::UpstreamBody;
pub(crate) use h1::H1Pool;
pub(crate) use h2pool::H2Pool;

use crate::backend::{Backend, Endpoint, UpstreamProtocol};
use crate::backend_client_cert::ClientCertificate;
use crate::http::Body;
use crate::mesh::MeshClient;

/// Upstream connection settings (mesh mode's connections: [`crate::mesh`]).
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle_per_endpoint: usize,
}

impl UpstreamSettings {
    pub const DEFAULT: Self = Self {
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_idle_per_endpoint: 256,
    };
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an upstream exchange failed: before a connection existed, or after.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connect: {0}")]
    Connect(BoxError),
    /// Mesh mode holds no unexpired SVID: no endpoint can be reached, and none is at
    /// fault (no health record, no retry elsewhere); answered like a failed connect.
    #[error("no mesh identity: {0}")]
    NoIdentity(BoxError),
    #[error("request: {0}")]
    Request(BoxError),
    /// A reused keep-alive connection ended before any byte of the answer: the peer
    /// had closed it, or died. The request may have reached it, so it is sent again
    /// (once, on a new connection) only when it can be replayed and is idempotent.
    #[error("reused connection closed: {0}")]
    Stale(BoxError),
    /// The upstream was reached but refused as a peer (mesh identity): never retried
    /// elsewhere as if it were down, and answered 502.
    #[error("refused: {0}")]
    Refused(BoxError),
}

pub struct Upstreams {
    settings: UpstreamSettings,
    /// The HTTP/1.1 relay's plain connections (`crate::relay`).
    pub(crate) relay: crate::relay::RelayPool,
    http1: H1Pool,
    h2c: H2Pool,
    mesh: Option<Arc<MeshClient>>,
}

impl Upstreams {
    /// One worker's pools (see [`crate::workers`]); `mesh` is shared by all workers.
    pub fn new(settings: &UpstreamSettings, mesh: Option<Arc<MeshClient>>) -> Self {
        Self {
            settings: settings.clone(),
            relay: crate::relay::RelayPool::new(settings),
            http1: H1Pool::new(settings, None),
            h2c: H2Pool::new(settings.connect_timeout),
            mesh,
        }
    }

    /// How `backend` is reached: over the mesh unless mesh mode is off or the
    /// Service opted out.
    pub fn protocol_for(&self, backend: &Backend) -> UpstreamProtocol {
        // A BackendTLSPolicy names the backend's own certificate: the policy wins over
        // mesh mode, whose identities the backend's certificate would not carry.
        if backend.tls.is_some() {
            return match backend.protocol {
                UpstreamProtocol::H2c => UpstreamProtocol::H2Tls,
                _ => UpstreamProtocol::Tls,
            };
        }
        if self.mesh.is_some() && !backend.mesh_disabled {
            UpstreamProtocol::Mesh
        } else {
            backend.protocol
        }
    }

    /// A connection to `endpoint` (or a stream slot on one) for one request; `fresh`:
    /// a new HTTP/1.1 connection, not a pooled one; `client`: the certificate the
    /// listener's Gateway presents to TLS backends. No request is consumed: a failed
    /// connect can be retried on another endpoint.
    pub(crate) async fn connect(
        &self,
        protocol: UpstreamProtocol,
        (backend, client): (&Backend, Option<&ClientCertificate>),
        endpoint: &Endpoint,
        fresh: bool,
    ) -> Result<Ready, UpstreamError> {
        match protocol {
            UpstreamProtocol::Http1 => self
                .http1
                .checkout(endpoint.addr, fresh)
                .await
                .map(Ready::Http1),
            UpstreamProtocol::H2c => self.h2c.sender(endpoint.addr).await.map(Ready::H2),
            UpstreamProtocol::Tls | UpstreamProtocol::H2Tls => match &backend.tls {
                Some(policy) => {
                    let h2 = protocol == UpstreamProtocol::H2Tls;
                    let tls = (&**policy, client);
                    tls::connect(&self.settings, tls, h2, backend, endpoint, fresh).await
                }
                None => Err(UpstreamError::Refused("backend has no TLS policy".into())),
            },
            UpstreamProtocol::Mesh => match &self.mesh {
                Some(mesh) => mesh.connect(endpoint).await.map(Ready::Mesh),
                None => Err(UpstreamError::Refused("mesh mode is off".into())),
            },
        }
    }

    /// One attempt, no retry: connect, send, record the endpoint's health.
    pub(crate) async fn send(
        &self,
        protocol: UpstreamProtocol,
        (backend, client): (&Backend, Option<&ClientCertificate>),
        endpoint: &Endpoint,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let target = (backend, client);
        let result = match self.connect(protocol, target, endpoint, false).await {
            Ok(ready) => ready.send(req).await,
            Err(e) => Err(e),
        };
        record_health(backend, endpoint, &result);
        result
    }
}

/// A connection to one endpoint (or a stream slot on one), ready for one request.
pub(crate) enum Ready {
    Http1(h1::Checkout),
    H2(hyper::client::conn::http2::SendRequest<Body>),
    Mesh(crate::mesh::Lease),
}

impl Ready {
    /// A pooled HTTP/1.1 connection, which the peer may have closed unseen.
    pub(crate) fn reused(&self) -> bool {
        match self {
            Ready::Http1(conn) => conn.reused(),
            Ready::H2(_) | Ready::Mesh(_) => false,
        }
    }

    /// Not an `async fn`: that would keep `self` and `req` beside the future they move
    /// into, in every request's future.
    pub(crate) fn send(
        self,
        req: Request<Body>,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, UpstreamError>> + Send {
        match self {
            Ready::Http1(conn) => Sending::Http1 {
                fut: conn.send(req),
            },
            Ready::H2(sender) => Sending::H2 {
                fut: h2pool::send(sender, req),
            },
            Ready::Mesh(lease) => Sending::Mesh {
                fut: lease.send(req),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The send of one of [`Ready`]'s kinds of connection.
    #[project = SendingProj]
    enum Sending<A, B, C> {
        Http1 { #[pin] fut: A },
        H2 { #[pin] fut: B },
        Mesh { #[pin] fut: C },
    }
}

type Answer<B> = Result<Response<B>, UpstreamError>;

impl<A, B, C> Future for Sending<A, B, C>
where
    A: Future<Output = Answer<UpstreamBody>>,
    B: Future<Output = Answer<hyper::body::Incoming>>,
    C: Future<Output = Answer<hyper::body::Incoming>>,
{
    type Output = Answer<UpstreamBody>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SendingProj::Http1 { fut } => fut.poll(cx),
            SendingProj::H2 { fut } => fut.poll(cx).map(incoming),
            SendingProj::Mesh { fut } => fut.poll(cx).map(incoming),
        }
    }
}

/// An answer whose connection runs on its own task (HTTP/2).
fn incoming(result: Answer<hyper::body::Incoming>) -> Answer<UpstreamBody> {
    result.map(|resp| resp.map(UpstreamBody::from))
}

/// Passive health: 5xx answers and failed exchanges count against the endpoint; a
/// refused peer (identity) is a configuration problem, not ill health.
pub(crate) fn record_health<B>(
    backend: &Backend,
    endpoint: &Endpoint,
    result: &Result<Response<B>, UpstreamError>,
) {
    match result {
        Ok(resp) if !resp.status().is_server_error() => endpoint.health.success(),
        Ok(_)
        | Err(UpstreamError::Connect(_) | UpstreamError::Request(_) | UpstreamError::Stale(_)) => {
            record_failure(backend, endpoint);
        }
        Err(UpstreamError::Refused(_) | UpstreamError::NoIdentity(_)) => {}
    }
}

pub(crate) fn record_failure(backend: &Backend, endpoint: &Endpoint) {
    if endpoint.health.failure() {
        tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, "endpoint ejected after consecutive failures");
    }
}
