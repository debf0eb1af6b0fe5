//! An upstream answer's body. For a pooled HTTP/1.1 connection it also carries the
//! connection: reading the body is what drives the connection's I/O (nobody else polls
//! it), and once the body has been read to its end the connection goes back to its
//! pool. A body dropped before its end takes the connection with it (closed), as an
//! HTTP/1.1 exchange cannot be abandoned halfway.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::h1::{Conn, Shared};

pub struct UpstreamBody {
    inner: Incoming,
    lease: Option<Lease>,
    /// The body has been read to its end.
    done: bool,
}

struct Lease {
    conn: Conn,
    pool: Arc<Shared>,
    addr: SocketAddr,
}

impl UpstreamBody {
    pub(crate) fn pooled(inner: Incoming, conn: Conn, pool: Arc<Shared>, addr: SocketAddr) -> Self {
        Self {
            inner,
            lease: Some(Lease { conn, pool, addr }),
            done: false,
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("pooled", &self.lease.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl From<Incoming> for UpstreamBody {
    /// A body whose connection runs elsewhere (HTTP/2, mesh, upgrades).
    fn from(inner: Incoming) -> Self {
        Self {
            inner,
            lease: None,
            done: false,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let driven = this.lease.as_mut().is_some_and(|l| l.conn.drive(cx));
        let polled = if driven {
            // Only the connection's I/O, just done, feeds the body: it is read with a
            // no-op waker, so a chunk arriving does not wake this task a second time.
            Pin::new(&mut this.inner).poll_frame(&mut Context::from_waker(Waker::noop()))
        } else {
            // The connection ended (or runs elsewhere): read with this task's waker.
            Pin::new(&mut this.inner).poll_frame(cx)
        };
        if let Poll::Ready(None) = polled {
            this.done = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take()
            && self.is_end_stream()
        {
            lease.pool.release(lease.addr, lease.conn);
        }
    }
}
