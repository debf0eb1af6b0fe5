//! One accepted connection: optional TLS handshake, then HTTP/1.1 or HTTP/2 (chosen by
//! ALPN or the client's preface) until it closes, drains, or is cut at the deadline.

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::rt::{Read, Write};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

use crate::access_log::{L4Record, LoggedBody};
use crate::drain::Signal;
use crate::http::{ConnInfo, handle};
use crate::limits::Slot;
use crate::relay::{Outcome, Prefixed, Relay};
use crate::series::Open;
use crate::snapshot::Listener;
use crate::state::ProxyState;
use crate::telemetry;
use crate::tls::Handshakes;
use crate::upstream::Upstreams;

/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection of one socket shares, behind one `Arc`: a connection's task
/// takes a reference, not a copy of the whole (632 bytes and about ten `Arc`s).
pub struct Connections {
    pub state: Arc<ProxyState>,
    /// The upstream pools of the worker this socket belongs to.
    pub upstreams: Arc<Upstreams>,
    pub local: SocketAddr,
    pub builder: auto::Builder<TokioExecutor>,
    /// The same, HTTP/2 only: for connections that agreed on `h2` by ALPN.
    pub builder_h2: auto::Builder<TokioExecutor>,
    /// TLS termination for this socket's address.
    pub tls: Handshakes,
    /// Fired at the drain deadline to close connections still open then.
    pub force_close: Signal,
    /// Fired when the socket stops accepting: relayed connections close once idle
    /// (hyper's are told by the graceful watcher).
    pub draining: Signal,
    /// The relay's share of the limits hyper is configured with.
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// Every connection task, so the deadline can wait until they are all gone:
    /// returning earlier lets the process exit while upstream requests are cut, and a
    /// handler could then still answer 502 on a connection that was meant to be cut.
    pub tasks: TaskTracker,
}

impl Connections {
    /// Serves `stream` on its own task. Whether it speaks TLS is decided by
    /// `listener`, the socket's in the Snapshot the accept loaded. `open` counts it in
    /// its listener's active connections until the task ends.
    pub fn spawn(
        self: &Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        listener: Option<Arc<Listener>>,
        watcher: Watcher,
        slot: Slot,
        open: Open,
    ) {
        let this = Arc::clone(self);
        // Boxed: a task moves its future by value as it is spawned and writes a value
        // as large when it ends: about 8% of the worker's core in memmove with a new
        // connection per request (benches/RESULTS.md, issue 19, session 25). Boxed, it
        // is moved once, into its box, and the task holds a pointer. One box per kind
        // of connection, each its own size: one future for all kinds is as large as
        // the largest (L4's, the relay over TLS), 15.1 KB, and every idle keep-alive
        // connection held that much (benches/RESULTS.md, issue 14, session 27).
        let conn: Pin<Box<dyn Future<Output = ()> + Send>> = match listener {
            Some(listener) if listener.l4.is_some() => {
                Box::pin(async move { this.serve_l4(stream, peer, listener, watcher).await })
            }
            Some(listener) if listener.tls.is_some() => {
                Box::pin(async move { this.serve_tls(stream, peer, watcher).await })
            }
            _ if this.state.http1_relay => Box::pin(async move {
                this.relay(stream, this.conn_info(peer), watcher).await;
            }),
            _ => Box::pin(async move {
                let io = TokioIo::new(stream);
                this.serve(io, this.conn_info(peer), watcher).await;
            }),
        };
        self.tasks.spawn(async move {
            let _held = (slot, open);
            conn.await;
        });
    }

    fn conn_info(&self, peer: SocketAddr) -> ConnInfo {
        ConnInfo::new(self.local, peer, Arc::clone(&self.upstreams))
    }

    /// A TCP or TLS passthrough connection, forwarded by its listener's L4 routes.
    async fn serve_l4(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        listener: Arc<Listener>,
        watcher: Watcher,
    ) {
        let Some(routes) = listener.l4.as_ref().map(Arc::clone) else {
            return;
        };
        // Held while bytes flow, so a removed listener's drain waits for it.
        let _watcher = watcher;
        let protocol = listener.protocol;
        let log = self.state.access_log.filter(|l| l.sampled());
        let mut record = log.map(|_| {
            Box::new(L4Record::new(
                Some(listener),
                peer,
                crate::l4::log_protocol(protocol),
            ))
        });
        crate::l4::serve_stream(
            stream,
            peer,
            protocol,
            &routes,
            &self.tls,
            &self.force_close,
            &mut record,
        )
        .await;
        if let (Some(log), Some(record)) = (log, record) {
            record.finish(log);
        }
    }

    /// A connection the edge terminates TLS on: the handshake, then HTTP/2 if the
    /// client agreed on `h2` by ALPN, else HTTP/1.1.
    async fn serve_tls(&self, stream: TcpStream, peer: SocketAddr, watcher: Watcher) {
        // The stream comes out of this `let` in a binding never borrowed: one that
        // was (for the SNI and ALPN) would be kept beside the copy moved on, 1.2 KB
        // more in the future for the connection's life.
        let (tls, sni, h2) =
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.tls.accept(stream, true)).await {
                Ok(Ok(tls)) => {
                    let session = tls.get_ref().1;
                    let sni = session.server_name().map(str::to_owned);
                    let h2 = session.alpn_protocol() == Some(b"h2");
                    (tls, sni, h2)
                }
                Ok(Err(e)) => {
                    metrics::counter!(telemetry::TLS_HANDSHAKE_ERRORS_TOTAL).increment(1);
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    metrics::counter!(telemetry::TLS_HANDSHAKE_ERRORS_TOTAL).increment(1);
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
        let info = self.conn_info(peer).tls(sni.as_deref());
        // hyper's connections boxed, as after a relay's fallback: inline, they would
        // size every relayed TLS connection's future (7.3 KB against 4.6).
        if h2 {
            Box::pin(self.serve_h2(TokioIo::new(tls), info, watcher)).await;
        } else if self.state.http1_relay {
            self.relay(tls, info, watcher).await;
        } else {
            Box::pin(self.serve(TokioIo::new(tls), info, watcher)).await;
        }
    }

    /// An HTTP/1.1 connection (cleartext, or TLS after the handshake), relayed
    /// (`crate::relay`) until a request the relay does not take; the full path serves
    /// the rest of it.
    async fn relay<S>(&self, mut stream: S, info: ConnInfo, watcher: Watcher)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let outcome = {
            let relay = Relay {
                state: &self.state,
                conn: &info,
                header_read_timeout: self.header_read_timeout,
                max_header_bytes: self.max_header_bytes,
                max_headers: self.max_headers,
                draining: &self.draining,
            };
            tokio::select! {
                biased;
                () = self.force_close.fired() => Outcome::Closed,
                o = relay.serve(&mut stream) => o,
            }
        };
        if let Outcome::Fallback(read) = outcome {
            self.upstreams.relay.handoffs.increment(1);
            // HTTP/2 with prior knowledge (h2c) opens with the preface: served as
            // HTTP/2 only, as the auto builder would after reading the same bytes, but
            // with the boxed service the HTTP/2 path wants (`boxed_handle`).
            let h2c = read.starts_with(H2_PREFACE);
            // Boxed: hyper's connection is 3.8 KB, and inline it would size the future
            // of every relayed connection, most of which never fall back.
            let io = TokioIo::new(Prefixed::new(read, stream));
            if h2c {
                Box::pin(self.serve_h2(io, info, watcher)).await;
            } else {
                Box::pin(self.serve(io, info, watcher)).await;
            }
        }
    }

    async fn serve<I>(&self, io: I, info: ConnInfo, watcher: Watcher)
    where
        I: Read + Write + Unpin + Send + 'static,
    {
        let peer = info.peer;
        let info = Arc::new(info);
        let state = Arc::clone(&self.state);
        let svc = service_fn(move |req| handle(Arc::clone(&state), Arc::clone(&info), req));
        let conn = watcher.watch(
            self.builder
                .serve_connection_with_upgrades(io, svc)
                .into_owned(),
        );
        self.run(conn, peer).await;
    }

    /// A connection that agreed on `h2` by ALPN speaks HTTP/2 from its first byte:
    /// anything but the HTTP/2 preface is a connection error (RFC 9113 §3.4), never
    /// an HTTP/1.1 request to answer, as the version sniffing of `serve` would.
    async fn serve_h2<I>(&self, io: I, info: ConnInfo, watcher: Watcher)
    where
        I: Read + Write + Unpin + Send + 'static,
    {
        let peer = info.peer;
        let info = Arc::new(info);
        let state = Arc::clone(&self.state);
        let svc = service_fn(move |req| boxed_handle(&state, &info, req));
        let conn = watcher.watch(self.builder_h2.serve_connection(io, svc).into_owned());
        self.run(conn, peer).await;
    }

    /// Drives a connection until it ends or the drain deadline cuts it.
    async fn run<E: Display>(&self, conn: impl Future<Output = Result<(), E>>, peer: SocketAddr) {
        tokio::select! {
            // Checked first: a connection cut at the deadline must not get one last answer.
            biased;
            () = self.force_close.fired() => tracing::debug!(%peer, "connection closed at drain deadline"),
            r = conn => if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "connection ended with error");
            },
        }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The answer to one HTTP/2 request, as a boxed future. The future is about 4.6 KiB
/// (the upstream exchange, retries and timers inline; 7.5 KiB when this box came in,
/// with the measurements below), and hyper's HTTP/2 server moves
/// it whole several times per stream (into the stream, into the task it spawns for
/// it); boxed, one allocation replaces those copies: memmove 12.3% -> 8.0% of the
/// worker on h2c, +6-7% req/s (benches/RESULTS.md). HTTP/1.1 keeps it unboxed: its
/// dispatcher holds the future in a box of its own and copies it once, and the
/// allocation cost more than that copy there (-5-7% req/s measured).
fn boxed_handle(
    state: &Arc<ProxyState>,
    info: &Arc<ConnInfo>,
    req: http::Request<hyper::body::Incoming>,
) -> Pin<Box<impl Future<Output = Result<http::Response<LoggedBody>, Infallible>> + Send + use<>>> {
    Box::pin(handle(Arc::clone(state), Arc::clone(info), req))
}
