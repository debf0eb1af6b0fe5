//! HTTP/1.1 upstream connections, driven by the task of the request that uses them.
//!
//! hyper-util's legacy client ran every upstream connection on a task of its own and
//! handed each request to it over a channel: two extra task wake-ups per proxied
//! request, and a cross-thread hand-off whenever the two tasks sat on different
//! workers. Here a connection is hyper's `client::conn::http1` pair, and its
//! `Connection` future is polled by nobody but the request holding it: the request's
//! own task writes the request, reads the answer head and, through [`UpstreamBody`],
//! the body. An idle connection is polled by no one; it is checked when taken.
//!
//! The pool is, per endpoint address, a stack of idle connections behind one mutex
//! held only for a push or a pop (never across an await). Last in, first out: the
//! warmest socket is reused and the coldest age out at the bottom. Each data-plane
//! worker ([`crate::workers`]) has pools of its own, so the mutex is uncontended and a
//! connection's socket stays with the reactor of the thread that polls it; only a
//! BackendTLSPolicy's pools, which live in the Snapshot, are shared by the workers.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::body::UpstreamBody;
use super::io::Io;
use super::tls::TlsDial;
use super::{UpstreamError, UpstreamSettings};
use crate::http::Body;

type Driver = Connection<TokioIo<Io>, Body>;

/// One upstream connection: the handle requests are sent on, and the future that
/// does its I/O (polled by whoever holds the connection).
pub(crate) struct Conn {
    sender: SendRequest<Body>,
    /// `None` once the connection has ended. Boxed once per connection (hyper's state
    /// is most of a KiB), so a request moves a pointer through checkout, exchange and
    /// body rather than the state itself.
    driver: Option<Box<Driver>>,
}

impl Conn {
    /// Does the connection's I/O; false once it has ended (closed, failed or
    /// upgraded) and must not be polled again.
    pub(crate) fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = self.driver.as_mut() else {
            return false;
        };
        match Pin::new(driver.as_mut()).poll(cx) {
            Poll::Pending => true,
            Poll::Ready(result) => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
                self.driver = None;
                false
            }
        }
    }

    /// Ready for another request: open, and the last exchange fully done. Polls with
    /// a no-op waker: an idle connection has no task to wake.
    fn reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.drive(&mut cx) && self.sender.is_ready()
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

pub(crate) struct Shared {
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    /// BackendTLSPolicy: every connection is TLS with this dial.
    tls: Option<TlsDial>,
    idle: Mutex<HashMap<SocketAddr, Vec<Idle>>>,
}

impl Shared {
    /// Puts a connection whose exchange is complete back, if it can take another.
    pub(crate) fn release(&self, addr: SocketAddr, mut conn: Conn) {
        if !conn.reusable() {
            return;
        }
        let since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.entry(addr).or_default();
        if stack.len() < self.max_idle {
            stack.push(Idle { conn, since });
        }
    }

    /// The most recently used idle connection to `addr` that is still usable.
    fn pop(&self, addr: SocketAddr) -> Option<Conn> {
        loop {
            let idle = {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                idle.get_mut(&addr)?.pop()?
            };
            // Closed by the peer, or idle too long: dropping it closes the socket.
            if idle.since.elapsed() < self.idle_timeout {
                let mut conn = idle.conn;
                if conn.reusable() {
                    return Some(conn);
                }
            }
        }
    }

    /// Closes connections idle longer than the idle timeout.
    fn reap(&self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.retain(|_, stack| {
                // Oldest at the bottom: everything below the first fresh one is stale.
                let fresh = stack
                    .iter()
                    .position(|i| now.duration_since(i.since) < self.idle_timeout)
                    .unwrap_or(stack.len());
                expired.extend(stack.drain(..fresh));
                !stack.is_empty()
            });
        }
        // Sockets close outside the lock.
        drop(expired);
    }

    #[cfg(test)]
    pub(crate) fn idle_count(&self, addr: SocketAddr) -> usize {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.get(&addr).map_or(0, Vec::len)
    }
}

/// Keep-alive HTTP/1.1 connections per endpoint, plain or with a BackendTLSPolicy.
pub(crate) struct H1Pool {
    shared: Arc<Shared>,
}

impl H1Pool {
    pub(crate) fn new(settings: &UpstreamSettings, tls: Option<TlsDial>) -> Self {
        let shared = Arc::new(Shared {
            connect_timeout: settings.connect_timeout,
            idle_timeout: settings.idle_timeout,
            max_idle: settings.max_idle_per_endpoint,
            tls,
            idle: Mutex::new(HashMap::new()),
        });
        spawn_reaper(Arc::downgrade(&shared), settings.idle_timeout);
        Self { shared }
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// A connection to `addr`: the most recently used idle one, or a new one (always a
    /// new one when `fresh`). No request is consumed, so a failed connect can be
    /// retried elsewhere.
    pub(crate) async fn checkout(
        &self,
        addr: SocketAddr,
        fresh: bool,
    ) -> Result<Checkout, UpstreamError> {
        let pooled = if fresh { None } else { self.shared.pop(addr) };
        let (conn, reused) = match pooled {
            Some(conn) => (conn, true),
            // Boxed: a dial (TCP, TLS) is a large future, and every request's future
            // would carry it inline and copy it around; dials are rare.
            None => (Box::pin(self.shared.dial(addr)).await?, false),
        };
        Ok(Checkout {
            shared: Arc::clone(&self.shared),
            addr,
            conn,
            reused,
        })
    }

    /// Checks a connection out and sends `req` on it.
    #[cfg(test)]
    pub(crate) async fn send(
        &self,
        addr: SocketAddr,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.checkout(addr, false).await?.send(req).await
    }
}

/// A connection taken from the pool (or new) for one request.
pub(crate) struct Checkout {
    shared: Arc<Shared>,
    addr: SocketAddr,
    conn: Conn,
    reused: bool,
}

impl Checkout {
    /// Taken from the pool rather than dialled for this request.
    pub(crate) fn reused(&self) -> bool {
        self.reused
    }

    /// Sends `req` (origin-form URI) and returns the answer head; the body streams
    /// from the same connection, which goes back to the pool once it is read.
    pub(crate) async fn send(
        self,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let Checkout {
            shared,
            addr,
            conn,
            reused,
        } = self;
        if crate::http::upgrade_requested(&req) {
            return send_upgrade(addr, conn, req).await;
        }
        let req = match exchange(conn, req).await {
            Ok((resp, conn)) => return Ok(lease(shared, addr, resp, conn)),
            // A reused connection the peer closed just before the request went out
            // (its keep-alive timeout): nothing was sent, so a fresh connection may
            // carry it, as the legacy client did.
            Err(Failed {
                request: Some(req), ..
            }) if reused => req,
            // Sent on a reused connection that ended before any answer: the peer had
            // closed it (or died) and this task had not seen the FIN yet. The request
            // may have reached it, so only the attempt loop, which knows whether it can
            // be replayed, may send it again.
            Err(Failed { error, .. }) if reused && closed_before_answer(&error) => {
                tracing::debug!(%addr, error = %error, "reused upstream connection closed before answering");
                return Err(UpstreamError::Stale(error.into()));
            }
            Err(Failed { error, .. }) => {
                tracing::debug!(%addr, reused, error = %error, "upstream exchange failed");
                return Err(UpstreamError::Request(error.into()));
            }
        };
        let conn = Box::pin(shared.dial(addr)).await?;
        match exchange(conn, req).await {
            Ok((resp, conn)) => Ok(lease(shared, addr, resp, conn)),
            Err(Failed { error, .. }) => Err(UpstreamError::Request(error.into())),
        }
    }
}

fn lease(
    shared: Arc<Shared>,
    addr: SocketAddr,
    resp: Response<Incoming>,
    conn: Conn,
) -> Response<UpstreamBody> {
    resp.map(|body| UpstreamBody::pooled(body, conn, shared, addr))
}

/// An upgrade takes the connection for good: it runs on a task of its own until
/// hyper hands it over to the tunnel.
async fn send_upgrade(
    addr: SocketAddr,
    mut conn: Conn,
    req: Request<Body>,
) -> Result<Response<UpstreamBody>, UpstreamError> {
    let Some(driver) = conn.driver.take() else {
        return Err(UpstreamError::Request("the connection has ended".into()));
    };
    tokio::spawn(async move {
        if let Err(e) = (*driver).with_upgrades().await {
            tracing::debug!(%addr, error = %e, "upstream upgrade connection ended");
        }
    });
    let resp = conn
        .sender
        .send_request(req)
        .await
        .map_err(|e| UpstreamError::Request(e.into()))?;
    Ok(resp.map(UpstreamBody::from))
}

impl Shared {
    /// TCP (and TLS) within the connect timeout, then the HTTP/1.1 handles.
    async fn dial(&self, addr: SocketAddr) -> Result<Conn, UpstreamError> {
        let connect = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| UpstreamError::Connect(e.into()))?;
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                None => Ok(Io::Plain(tcp)),
                Some(dial) => match dial.handshake(tcp).await {
                    Ok(tls) => Ok(Io::Tls(Box::new(tls))),
                    Err(e) => Err(UpstreamError::Connect(e)),
                },
            }
        };
        let io = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| UpstreamError::Connect("connect timed out".into()))??;
        let (sender, driver) = http1::Builder::new()
            // One buffer per write: the whole head (and a small body) in one syscall.
            .writev(false)
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        Ok(Conn {
            sender,
            driver: Some(Box::new(driver)),
        })
    }
}

/// Why an exchange failed; `request` is back when none of it was written.
struct Failed {
    error: hyper::Error,
    request: Option<Request<Body>>,
}

/// The connection ended (EOF, reset, write to a closed socket) before an answer head
/// was in: what a request sent to a peer that already closed the connection gets.
fn closed_before_answer(error: &hyper::Error) -> bool {
    use std::io::ErrorKind;
    if error.is_incomplete_message() || error.is_canceled() {
        return true;
    }
    std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            )
        })
}

/// Sends `req` on `conn`, doing the connection's I/O in this task, until the answer
/// head is in.
async fn exchange(
    mut conn: Conn,
    req: Request<Body>,
) -> Result<(Response<Incoming>, Conn), Failed> {
    let mut answer = std::pin::pin!(conn.sender.try_send_request(req));
    let result = poll_fn(|cx| {
        conn.drive(cx);
        // Only the connection's I/O, just done, completes the answer: checked with a
        // no-op waker, so its completion does not wake this task a second time.
        answer
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
    })
    .await;
    match result {
        Ok(resp) => Ok((resp, conn)),
        Err(mut e) => Err(Failed {
            request: e.take_message(),
            error: e.into_error(),
        }),
    }
}

/// Closes idle connections past their timeout while the pool lives, so a quiet
/// endpoint's sockets do not linger.
fn spawn_reaper(pool: Weak<Shared>, idle_timeout: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let period = (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(15));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match pool.upgrade() {
                Some(pool) => pool.reap(),
                None => return,
            }
        }
    });
}
