//! HTTP/2 upstream connections, one per endpoint, multiplexed.
//!
//! The legacy hyper-util client keys its pool by the request URI's authority, which for
//! HTTP/2 is also the `:authority` the backend sees. A proxy must send the client's
//! host there while connecting to a chosen endpoint, so HTTP/2 upstreams get this small
//! pool keyed by endpoint address instead. One connection per endpoint carries every
//! stream; it is replaced when it closes. (Mesh mode's mTLS HTTP/2 has its own pool of
//! several connections per pod: `crate::mesh`.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::UpstreamError;
use super::tls::TlsDial;
use crate::http::Body;

pub struct H2Pool {
    connect_timeout: Duration,
    /// BackendTLSPolicy: each connection is TLS (ALPN h2) with this dial.
    tls: Option<TlsDial>,
    // Held only to clone or insert a sender, never across an await.
    conns: Mutex<HashMap<SocketAddr, SendRequest<Body>>>,
}

impl H2Pool {
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            tls: None,
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// The same pool, dialling TLS to every endpoint.
    pub fn with_tls(mut self, dial: TlsDial) -> Self {
        self.tls = Some(dial);
        self
    }

    /// A handle on the endpoint's connection, dialled if there is none: connecting
    /// consumes no request, so a failed dial can be retried elsewhere.
    pub async fn sender(&self, addr: SocketAddr) -> Result<SendRequest<Body>, UpstreamError> {
        if let Some(s) = self.cached(addr) {
            return Ok(s);
        }
        // Boxed: the dial is a large future that every stream's future would
        // otherwise carry (and copy) inline; dials are rare.
        Box::pin(self.dial(addr)).await
    }

    async fn dial(&self, addr: SocketAddr) -> Result<SendRequest<Body>, UpstreamError> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| UpstreamError::Connect("connect timed out".into()))?
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        let _ = stream.set_nodelay(true);
        let sender = match &self.tls {
            None => handshake(addr, stream).await?,
            Some(dial) => {
                let tls = dial
                    .handshake(stream)
                    .await
                    .map_err(UpstreamError::Connect)?;
                handshake(addr, tls).await?
            }
        };
        if let Ok(mut conns) = self.conns.lock() {
            conns.insert(addr, sender.clone());
        }
        Ok(sender)
    }

    fn cached(&self, addr: SocketAddr) -> Option<SendRequest<Body>> {
        let mut conns = self.conns.lock().ok()?;
        match conns.get(&addr) {
            Some(s) if !s.is_closed() => Some(s.clone()),
            Some(_) => {
                conns.remove(&addr);
                None
            }
            None => None,
        }
    }
}

/// Sends `req` as one stream on the connection `sender` belongs to.
pub async fn send(
    mut sender: SendRequest<Body>,
    req: Request<Body>,
) -> Result<Response<Incoming>, UpstreamError> {
    sender
        .ready()
        .await
        .map_err(|e| UpstreamError::Request(e.into()))?;
    sender
        .send_request(req)
        .await
        .map_err(|e| UpstreamError::Request(e.into()))
}

/// Flow control of an upstream HTTP/2 connection, which carries the streams of many
/// clients. Each stream holds at most its window of answer the client has not read
/// yet; the connection's window is sixteen of those, where hyper's (5 MiB for 2 MiB
/// streams) lets two or three slow clients stall every other stream on it.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONNECTION_WINDOW: u32 = 16 * STREAM_WINDOW;
/// Largest frame the backend may send: a backend that uses it sends a large answer in
/// a quarter of the frames, each a wake-up of the stream's reader.
const MAX_FRAME: u32 = 64 * 1024;

/// The HTTP/2 client builder every upstream connection starts from (mesh's too).
pub(crate) fn client_builder() -> http2::Builder<TokioExecutor> {
    let mut b = http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME);
    b
}

/// The HTTP/2 handshake over any transport; the connection runs on its own task.
async fn handshake<T>(addr: SocketAddr, io: T) -> Result<SendRequest<Body>, UpstreamError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = client_builder()
        .keep_alive_interval(Duration::from_secs(30))
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| UpstreamError::Connect(e.into()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(%addr, error = %e, "upstream h2 connection ended");
        }
    });
    Ok(sender)
}
