//! TLS origination for backends with a BackendTLSPolicy: a hyper-util connector that
//! dials the endpoint and runs the policy's handshake, and the send path that picks the
//! policy's own pools (HTTP/1.1 keep-alive, or one HTTP/2 connection per endpoint).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::Body;
use super::h2pool::H2Pool;
use super::upstream::{BoxError, UpstreamError, UpstreamSettings};
use crate::backend::{Backend, Endpoint};
use crate::backend_tls::BackendTls;
use crate::telemetry;

pub type TlsHttp1Client = Client<PolicyConnector, Body>;

/// What a TLS dial needs: the policy's client config and SNI, and the backend's name
/// for the error counter.
#[derive(Clone)]
pub struct TlsDial {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
    pub backend: Arc<str>,
}

impl TlsDial {
    /// Runs the handshake; a failure (unknown CA, wrong name) is counted and logged.
    pub async fn handshake(&self, tcp: TcpStream) -> Result<TlsStream<TcpStream>, BoxError> {
        self.connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| {
                telemetry::upstream_tls_errors(&self.backend).increment(1);
                tracing::warn!(backend = %self.backend, sni = ?self.server_name, error = %e, "upstream TLS handshake failed");
                e.into()
            })
    }
}

/// Dials the endpoint the request URI names, then TLS with the policy's config.
#[derive(Clone)]
pub struct PolicyConnector {
    http: HttpConnector,
    dial: TlsDial,
}

impl tower_service::Service<Uri> for PolicyConnector {
    type Response = TlsConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.http.call(dst);
        let dial = self.dial.clone();
        Box::pin(async move {
            let tcp = connecting.await?.into_inner();
            Ok(TlsConn(TokioIo::new(dial.handshake(tcp).await?)))
        })
    }
}

/// A TLS connection to a backend, as hyper-util's pool wants it.
pub struct TlsConn(TokioIo<TlsStream<TcpStream>>);

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl Read for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl Write for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The policy's TLS dial for `backend`, or why its connections must fail.
pub(crate) fn dial(tls: &BackendTls, backend: &Backend) -> Result<TlsDial, UpstreamError> {
    let Some(config) = &tls.config else {
        let why = tls.invalid.as_deref().unwrap_or("no usable CA certificate");
        return Err(UpstreamError::Connect(
            format!("BackendTLSPolicy {}: {why}", tls.policy).into(),
        ));
    };
    Ok(TlsDial {
        connector: TlsConnector::from(Arc::clone(config)),
        server_name: tls.server_name.clone(),
        backend: Arc::clone(&backend.name),
    })
}

/// Sends `req` to `endpoint` over the policy's TLS: HTTP/2 when `h2`, else HTTP/1.1
/// (whose request URI names the endpoint, as for plain HTTP/1.1).
pub async fn send(
    settings: &UpstreamSettings,
    tls: &BackendTls,
    h2: bool,
    backend: &Backend,
    endpoint: &Endpoint,
    req: Request<Body>,
) -> Result<Response<Incoming>, UpstreamError> {
    if h2 {
        let pool = match tls.h2.get() {
            Some(p) => p,
            None => {
                let dial = dial(tls, backend)?;
                tls.h2
                    .get_or_init(|| H2Pool::new(settings.connect_timeout).with_tls(dial))
            }
        };
        return pool.send(endpoint.addr, req).await;
    }
    let client = match tls.http1.get() {
        Some(c) => c,
        None => {
            let dial = dial(tls, backend)?;
            tls.http1.get_or_init(|| http1_client(settings, dial))
        }
    };
    client.request(req).await.map_err(|e| {
        if e.is_connect() {
            UpstreamError::Connect(e.into())
        } else {
            UpstreamError::Request(e.into())
        }
    })
}

fn http1_client(settings: &UpstreamSettings, dial: TlsDial) -> TlsHttp1Client {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(settings.connect_timeout));
    // The URI keeps the `http` scheme (it keys the pool by endpoint); TLS is ours.
    http.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(settings.idle_timeout)
        .pool_max_idle_per_host(settings.max_idle_per_endpoint)
        .set_host(false)
        .http1_writev(false)
        .build(PolicyConnector { http, dial })
}
