//! The relay's idle upstream connections: plain TCP sockets per endpoint address, one
//! pool per data-plane worker (like `crate::upstream::h1`'s, whose connections are
//! hyper's and can't carry relayed bytes), behind a mutex held only for a push or pop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::upstream::UpstreamSettings;

pub(crate) struct RelayPool {
    inner: Arc<Inner>,
    /// Resolved once per worker: no registry lookup per request.
    pub(crate) relayed: metrics::Counter,
    pub(crate) handoffs: metrics::Counter,
    pub(crate) byte_exchanges: metrics::Counter,
}

struct Inner {
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    idle: Mutex<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>>,
}

impl RelayPool {
    /// Call on the worker's runtime: the idle reaper runs there.
    pub(crate) fn new(settings: &UpstreamSettings) -> Self {
        let inner = Arc::new(Inner {
            connect_timeout: settings.connect_timeout,
            idle_timeout: settings.idle_timeout,
            max_idle: settings.max_idle_per_endpoint,
            idle: Mutex::new(HashMap::new()),
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(reap(Arc::downgrade(&inner), settings.idle_timeout));
        }
        Self {
            inner,
            relayed: metrics::counter!(crate::telemetry::HTTP1_RELAYED_REQUESTS_TOTAL),
            handoffs: metrics::counter!(crate::telemetry::HTTP1_RELAY_HANDOFFS_TOTAL),
            byte_exchanges: metrics::counter!(crate::telemetry::HTTP1_BYTE_EXCHANGES_TOTAL),
        }
    }

    /// The most recently used idle connection to `addr` that the peer has not closed.
    pub(crate) fn take(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let (stream, since) = {
                let mut idle = self
                    .inner
                    .idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                idle.get_mut(&addr)?.pop()?
            };
            // An idle socket has nothing to read: readable means the peer closed it
            // (or sent bytes nobody asked for). The relay's reads end short, which
            // clears tokio's readiness, so this costs no syscall.
            if since.elapsed() < self.inner.idle_timeout
                && stream.poll_read_ready(&mut cx).is_pending()
            {
                return Some(stream);
            }
        }
    }

    pub(crate) fn put(&self, addr: SocketAddr, stream: TcpStream) {
        self.inner.put(addr, stream);
    }

    /// Where a body read after its exchange returns its connection.
    pub(crate) fn handle(&self) -> PoolHandle {
        PoolHandle(Arc::clone(&self.inner))
    }

    /// A new connection, within the connect timeout.
    pub(crate) async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let stream = tokio::time::timeout(self.inner.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
        Ok(stream)
    }
}

/// A pool's idle stacks, for a body that gives its connection back when it ends.
pub(crate) struct PoolHandle(Arc<Inner>);

impl PoolHandle {
    pub(crate) fn put(&self, addr: SocketAddr, stream: TcpStream) {
        self.0.put(addr, stream);
    }
}

impl Inner {
    fn put(&self, addr: SocketAddr, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.entry(addr).or_default();
        if stack.len() < self.max_idle {
            stack.push((stream, Instant::now()));
        }
    }
}

async fn reap(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut idle = inner.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.retain(|_, stack| {
                let fresh = stack
                    .iter()
                    .position(|(_, since)| now.duration_since(*since) < inner.idle_timeout)
                    .unwrap_or(stack.len());
                expired.extend(stack.drain(..fresh));
                !stack.is_empty()
            });
        }
        drop(expired);
    }
}
