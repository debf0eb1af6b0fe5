//! Limits and timeouts the edge enforces on clients, with safe defaults.
//!
//! Each exists because a hostile or broken client could otherwise hold resources
//! forever: slowloris header trickling, oversized or numerous headers, stream floods
//! on one HTTP/2 connection, and connection floods.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    /// Time a client has to send a request's headers, counted from the connection's
    /// start or the previous response; also closes idle keep-alive HTTP/1.1 connections.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers) accepted, in bytes; more is 431.
    pub max_header_bytes: usize,
    /// Most request headers accepted; more is 431.
    pub max_headers: usize,
    /// Concurrent streams per HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// Streams a client may reset before the server has accepted them, per HTTP/2
    /// connection: the CVE-2023-44487 "rapid reset" guard.
    pub max_pending_accept_reset_streams: usize,
    /// Interval of HTTP/2 keep-alive pings; a peer that stops answering is dropped.
    pub http2_keepalive: Duration,
    /// Connections per listener socket; more are refused at accept.
    pub max_connections_per_listener: usize,
    /// Connections across all listeners.
    pub max_connections: usize,
    /// Flow limits of UDP listeners.
    pub udp: crate::l4::udp::UdpSettings,
}

impl Limits {
    pub const DEFAULT: Self = Self {
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 64 * 1024,
        max_headers: 100,
        max_concurrent_streams: 100,
        max_pending_accept_reset_streams: 20,
        http2_keepalive: Duration::from_secs(30),
        max_connections_per_listener: 10_000,
        max_connections: 50_000,
        udp: crate::l4::udp::UdpSettings::DEFAULT,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// HTTP/2 flow control toward clients. A stream may have 1 MiB of request body in
/// flight before the edge has passed it on (hyper's default, about 80 Mbit/s of upload
/// at 100 ms round trip); the connection, four such streams, where hyper allows one, so
/// one upload waiting on a slow backend does not stall the others' bodies. Fixed, not
/// hyper's adaptive (BDP) window: that one grows to 16 MiB per connection on its own,
/// and an edge needs a bound on what a client can make it buffer.
const H2_STREAM_WINDOW: u32 = 1024 * 1024;
const H2_CONNECTION_WINDOW: u32 = 4 * H2_STREAM_WINDOW;
// The largest frame a client may send stays the protocol's 16 KiB: browsers and
// nghttp2 send no larger whatever is allowed, and h2spec's case 4.2 expects a larger
// frame refused.

impl Limits {
    /// The HTTP/1.1 + HTTP/2 server builder with these limits applied.
    pub fn server_builder(&self) -> auto::Builder<TokioExecutor> {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            // hyper refuses buffers under 8 KiB; a smaller setting would panic there.
            .max_buf_size(self.max_header_bytes.max(8 * 1024))
            .max_headers(self.max_headers)
            .writev(false);
        b.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_pending_accept_reset_streams(self.max_pending_accept_reset_streams)
            .max_header_list_size(u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(self.http2_keepalive)
            .keep_alive_timeout(self.http2_keepalive)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW);
        b
    }
}

/// Connection slots: one process-wide pool and one per listener socket.
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    total: Arc<Semaphore>,
    listener: Arc<Semaphore>,
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy)]
pub enum Refusal {
    ListenerFull,
    ProcessFull,
}

/// Held for a connection's life; dropping it frees the slots.
#[derive(Debug)]
pub struct Slot {
    _total: OwnedSemaphorePermit,
    _listener: OwnedSemaphorePermit,
}

impl ConnectionSlots {
    pub fn new(total: Arc<Semaphore>, per_listener: usize) -> Self {
        Self {
            total,
            listener: Arc::new(Semaphore::new(per_listener)),
        }
    }

    pub fn try_take(&self) -> Result<Slot, Refusal> {
        let listener = Arc::clone(&self.listener)
            .try_acquire_owned()
            .map_err(|_| Refusal::ListenerFull)?;
        let total = Arc::clone(&self.total)
            .try_acquire_owned()
            .map_err(|_| Refusal::ProcessFull)?;
        Ok(Slot {
            _total: total,
            _listener: listener,
        })
    }
}
