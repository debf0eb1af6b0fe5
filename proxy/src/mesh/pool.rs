//! A pool of HTTP/2 connections per key, several per key when needed.
//!
//! hyper-util's pool keeps one HTTP/2 connection per key, so every stream to a busy
//! pod would queue on it once the peer's `max_concurrent_streams` is reached. Here a
//! request takes a stream slot on a connection that has one (peer limit, capped
//! locally), and only when none has a slot is another connection dialled; concurrent
//! requests wait for that one dial rather than each dialling their own.
//!
//! Connections leave the pool (no new streams; in-flight ones finish, then hyper closes
//! the connection once the last handle is gone) when the peer sends GOAWAY, when they
//! close (PING keepalive timeout included), and when their `generation` (the SVID they
//! were made with) is no longer the current one.
//!
//! The slot is held until the response head arrives, not until the body ends: a
//! streamed response longer than its head under-counts, and then h2 itself queues the
//! extra stream instead of failing it.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::sniff::{PeerState, Sniffer};
use crate::http::Body;
use crate::upstream::UpstreamError;

#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Streams per connection at most, even if the peer allows more.
    pub max_streams: usize,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// How long a new connection waits for the peer's SETTINGS before use.
    pub settings_wait: Duration,
    /// Connections per key at most: a peer that allows no streams (or very few) must
    /// not make every request open another one.
    pub max_connections: usize,
    /// A connection with no stream for this long is closed (pods come and go; their
    /// connections must not linger until the next SVID rotation).
    pub idle_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_streams: crate::config::MeshConfig::DEFAULT_MAX_STREAMS.get(),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            settings_wait: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(90),
            max_connections: 32,
        }
    }
}

struct Conn {
    sender: SendRequest<Body>,
    active: AtomicUsize,
    peer: Arc<PeerState>,
    generation: u64,
    /// When a stream last finished on it (ms on the pool's clock), for idle reaping.
    last_used: AtomicU64,
}

impl Conn {
    fn usable(&self, generation: u64) -> bool {
        self.generation == generation
            && !self.sender.is_closed()
            && !self.peer.goaway.load(Ordering::Acquire)
    }

    fn try_acquire(self: &Arc<Self>, cap: usize) -> Option<Lease> {
        let limit =
            cap.min(usize::try_from(self.peer.max_streams.load(Ordering::Acquire)).unwrap_or(cap));
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Lease(Arc::clone(self)))
    }
}

/// A stream slot on a connection; freed when dropped.
pub struct Lease(Arc<Conn>);

impl Lease {
    /// Sends `req` on the leased connection; the slot is freed with the response head.
    pub async fn send(self, req: Request<Body>) -> Result<Response<Incoming>, UpstreamError> {
        crate::upstream::h2pool::send(self.0.sender.clone(), req).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.last_used.store(now_ms(), Ordering::Relaxed);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    u64::try_from(
        EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

struct Entry {
    conns: Vec<Arc<Conn>>,
    dialing: bool,
    /// Bumped when a dial ends; waiters subscribe under the lock, so none misses it.
    dialled: watch::Sender<u64>,
}

impl Default for Entry {
    fn default() -> Self {
        Self {
            conns: Vec::new(),
            dialing: false,
            dialled: watch::Sender::new(0),
        }
    }
}

enum Next {
    Go(Lease),
    Dial,
    Wait(watch::Receiver<u64>),
    Full,
}

pub struct Pool<K> {
    settings: PoolSettings,
    // Held only to pick or insert a connection, never across an await.
    entries: Mutex<HashMap<K, Entry>>,
    /// The generation the pool last swept for, so a rotation retires idle connections
    /// of every key, not only of keys that see traffic again.
    swept: AtomicU64,
}

impl<K: Hash + Eq + Clone + Send + 'static> Pool<K> {
    pub fn new(settings: PoolSettings) -> Self {
        Self {
            settings,
            entries: Mutex::new(HashMap::new()),
            swept: AtomicU64::new(0),
        }
    }

    /// Sends `req` on a connection for `key` made at `generation`; `dial` makes a new
    /// transport when every such connection is full (called at most once).
    #[cfg(test)]
    pub async fn send<F, Fut, IO>(
        &self,
        key: &K,
        generation: u64,
        dial: F,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<IO, UpstreamError>>,
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        self.checkout(key, generation, dial).await?.send(req).await
    }

    /// A stream slot on a connection for `key` made at `generation`; `dial` makes a
    /// new transport when every such connection is full (called at most once). The
    /// request is not consumed here, so a failed dial can be retried elsewhere.
    pub async fn checkout<F, Fut, IO>(
        &self,
        key: &K,
        generation: u64,
        dial: F,
    ) -> Result<Lease, UpstreamError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<IO, UpstreamError>>,
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        // A plain load first: the swap (a write to a shared line) only on rotation.
        if self.swept.load(Ordering::Acquire) != generation
            && self.swept.swap(generation, Ordering::AcqRel) != generation
        {
            self.sweep(generation);
        }
        let mut dial = Some(dial);
        loop {
            match self.next(key, generation) {
                Next::Go(lease) => return Ok(lease),
                Next::Full => {
                    return Err(UpstreamError::Connect(
                        "every connection to the endpoint is full".into(),
                    ));
                }
                Next::Wait(mut rx) => {
                    // The dial in progress ends one way or the other; then look again.
                    let _ = rx.changed().await;
                }
                Next::Dial => {
                    let Some(dial) = dial.take() else {
                        self.dial_done(key, None);
                        return Err(UpstreamError::Connect("no connection available".into()));
                    };
                    // Boxed: dial and handshake are large futures that every
                    // request's future would otherwise carry inline; dials are rare.
                    let made = Box::pin(async {
                        match dial().await {
                            Ok(io) => self.handshake(io, generation).await,
                            Err(e) => Err(e),
                        }
                    })
                    .await;
                    match made {
                        Ok(conn) => {
                            let lease = conn.try_acquire(self.settings.max_streams);
                            self.dial_done(key, Some(conn));
                            match lease {
                                Some(l) => return Ok(l),
                                None => continue,
                            }
                        }
                        Err(e) => {
                            self.dial_done(key, None);
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// Connections open for `key` (any generation).
    #[cfg(test)]
    pub fn connections(&self, key: &K) -> usize {
        self.entries
            .lock()
            .map(|e| e.get(key).map_or(0, |e| e.conns.len()))
            .unwrap_or(0)
    }

    fn next(&self, key: &K, generation: u64) -> Next {
        let Ok(mut entries) = self.entries.lock() else {
            return Next::Dial;
        };
        let entry = entries.entry(key.clone()).or_default();
        entry.conns.retain(|c| c.usable(generation));
        // Fill the oldest connection first, so surplus ones go idle and can close.
        if let Some(lease) = entry
            .conns
            .iter()
            .find_map(|c| c.try_acquire(self.settings.max_streams))
        {
            return Next::Go(lease);
        }
        if entry.dialing {
            return Next::Wait(entry.dialled.subscribe());
        }
        if entry.conns.len() >= self.settings.max_connections {
            return Next::Full;
        }
        entry.dialing = true;
        Next::Dial
    }

    fn dial_done(&self, key: &K, conn: Option<Arc<Conn>>) {
        if let Ok(mut entries) = self.entries.lock() {
            let entry = entries.entry(key.clone()).or_default();
            entry.dialing = false;
            entry.conns.extend(conn);
            entry.dialled.send_modify(|n| *n += 1);
        }
    }

    /// Drops every connection made with another generation (they finish their
    /// in-flight streams first) and keys left with none.
    /// Closes connections idle for longer than the idle timeout and forgets keys left
    /// with none. Called periodically by the pool's owner.
    pub fn reap_idle(&self) {
        let idle = u64::try_from(self.settings.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        let now = now_ms();
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| {
                e.conns.retain(|c| {
                    c.active.load(Ordering::Acquire) > 0
                        || now.saturating_sub(c.last_used.load(Ordering::Relaxed)) < idle
                });
                !e.conns.is_empty() || e.dialing
            });
        }
    }

    fn sweep(&self, generation: u64) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| {
                e.conns.retain(|c| c.usable(generation));
                !e.conns.is_empty() || e.dialing
            });
        }
    }

    async fn handshake<IO>(&self, io: IO, generation: u64) -> Result<Arc<Conn>, UpstreamError>
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let peer = Arc::new(PeerState::default());
        let io = Sniffer::new(io, Arc::clone(&peer));
        let (sender, conn) = crate::upstream::h2pool::client_builder()
            .keep_alive_interval(self.settings.keepalive_interval)
            .keep_alive_timeout(self.settings.keepalive_timeout)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        metrics::counter!(crate::telemetry::MESH_UPSTREAM_CONNECTIONS_TOTAL).increment(1);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "mesh upstream connection ended");
            }
        });
        // The peer's stream limit comes in its first SETTINGS, one round trip away;
        // without it the requests waiting for this connection would all pile onto it.
        let _ =
            tokio::time::timeout(self.settings.settings_wait, peer.settings_seen.notified()).await;
        Ok(Arc::new(Conn {
            sender,
            active: AtomicUsize::new(0),
            peer,
            generation,
            last_used: AtomicU64::new(now_ms()),
        }))
    }
}
