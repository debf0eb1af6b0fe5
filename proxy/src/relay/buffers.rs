//! A relayed connection's buffers, given back while the connection waits.
//!
//! Each connection reads its client into one 16 KiB buffer and holds three more for
//! its requests (the upstream head, the answer on its way down, what the upstream
//! sent): about 49 KiB, kept between requests so a busy keep-alive connection
//! allocates nothing per request. A connection with no request in hand held them too,
//! for up to `--header-read-timeout`: `measure.py` found 29 KiB resident per idle
//! keep-alive connection. nginx frees an idle keep-alive connection's buffers at once;
//! here they go after [`IDLE_RELEASE`] without a request, so back-to-back requests
//! still reuse them, and a connection that waits pays one allocation of each when its
//! next request comes.

use std::time::Duration;

use bytes::BytesMut;

/// Read buffer size: reads shorter than this clear the socket's readiness.
pub(super) const READ_BUF: usize = 16 * 1024;
const HEAD_BUF: usize = 1024;

/// How long a connection waits for its next request before it gives back its
/// buffers. Reallocating them costs about a microsecond against that wait, and a
/// busy connection's timer fires at most once in it.
pub(super) const IDLE_RELEASE: Duration = Duration::from_millis(500);

/// Buffers reused by every request of a connection.
pub(super) struct Buffers {
    /// The upstream request head.
    pub upstream_head: Vec<u8>,
    /// What goes to the client next: the answer head and the body bytes read with it.
    pub down: Vec<u8>,
    /// What the upstream sent.
    pub up: BytesMut,
}

impl Buffers {
    /// None yet: [`Buffers::ensure`] makes them when the first request needs them.
    pub(super) fn new() -> Self {
        Self {
            upstream_head: Vec::new(),
            down: Vec::new(),
            up: BytesMut::new(),
        }
    }

    /// Room for a request: a no-op while the connection keeps its buffers.
    pub(super) fn ensure(&mut self) {
        if self.up.capacity() == 0 {
            self.upstream_head.reserve(HEAD_BUF);
            self.down.reserve(READ_BUF);
            self.up.reserve(READ_BUF);
        }
    }

    /// Gives the memory back, with the connection's client read buffer `read`: between
    /// requests nothing is in them. What went is counted for the next trim.
    pub(super) fn release(&mut self, read: &mut BytesMut) {
        let bytes = self.upstream_head.capacity()
            + self.down.capacity()
            + self.up.capacity()
            + read.capacity();
        *self = Self::new();
        *read = BytesMut::new();
        crate::trim::freed(bytes);
    }
}

/// Room for the rest of a head after the first read into a released buffer (which
/// reads at most a few dozen bytes into the room `read_buf` makes).
pub(super) fn regrow(buf: &mut BytesMut) {
    if buf.capacity() < READ_BUF {
        buf.reserve(READ_BUF - buf.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_buffers_hold_nothing_and_come_back_whole() {
        let mut bufs = Buffers::new();
        bufs.ensure();
        assert!(bufs.up.capacity() >= READ_BUF && bufs.down.capacity() >= READ_BUF);
        bufs.down.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        bufs.down.clear();
        let down = bufs.down.as_ptr();
        // A busy connection keeps the same buffers.
        bufs.ensure();
        assert_eq!(bufs.down.as_ptr(), down);
        let mut read = BytesMut::with_capacity(READ_BUF);
        bufs.release(&mut read);
        assert_eq!(read.capacity(), 0);
        assert_eq!(
            (
                bufs.upstream_head.capacity(),
                bufs.down.capacity(),
                bufs.up.capacity()
            ),
            (0, 0, 0)
        );
        bufs.ensure();
        assert!(bufs.upstream_head.capacity() >= HEAD_BUF);
        assert!(bufs.up.capacity() >= READ_BUF && bufs.down.capacity() >= READ_BUF);
    }

    #[test]
    fn a_regrown_read_buffer_keeps_its_bytes() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"GET / HT");
        regrow(&mut buf);
        assert_eq!(&buf[..], b"GET / HT");
        assert!(buf.capacity() >= READ_BUF);
    }
}
