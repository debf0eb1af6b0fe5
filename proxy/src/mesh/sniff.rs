//! Reads the HTTP/2 frame headers a peer sends, to learn what hyper does not expose:
//! the peer's SETTINGS_MAX_CONCURRENT_STREAMS (so the pool opens another connection
//! instead of queueing streams on a full one) and whether it sent GOAWAY (so no new
//! stream goes there while in-flight ones finish).
//!
//! It only watches bytes that pass by on the plaintext side of TLS; hyper reads them
//! unchanged. The cost is a few comparisons per frame.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;

/// What the peer told us about the connection.
#[derive(Debug)]
pub struct PeerState {
    /// The peer's stream limit; `u32::MAX` until its SETTINGS arrive (RFC 9113: no
    /// limit until told).
    pub max_streams: AtomicU32,
    pub goaway: AtomicBool,
    /// Signalled when a SETTINGS frame has been read whole.
    pub settings_seen: Notify,
}

impl Default for PeerState {
    fn default() -> Self {
        Self {
            max_streams: AtomicU32::new(u32::MAX),
            goaway: AtomicBool::new(false),
            settings_seen: Notify::new(),
        }
    }
}

/// A frame-boundary tracker over the server-to-client byte stream.
#[derive(Debug, Default)]
pub struct FrameParser {
    header: [u8; 9],
    header_len: usize,
    /// Payload bytes of the current frame still to pass.
    remaining: usize,
    /// The current frame is a SETTINGS frame to read (not an ACK).
    settings: bool,
    setting: [u8; 6],
    setting_len: usize,
}

impl FrameParser {
    pub fn feed(&mut self, mut data: &[u8], peer: &PeerState) {
        while !data.is_empty() {
            if self.remaining == 0 {
                let take = (9 - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + take].copy_from_slice(&data[..take]);
                self.header_len += take;
                data = &data[take..];
                if self.header_len < 9 {
                    return;
                }
                self.header_len = 0;
                let [l0, l1, l2, kind, flags, ..] = self.header;
                self.remaining = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                self.settings = kind == FRAME_SETTINGS && flags & FLAG_ACK == 0;
                self.setting_len = 0;
                if kind == FRAME_GOAWAY {
                    peer.goaway.store(true, Ordering::Release);
                }
                if self.settings && self.remaining == 0 {
                    peer.settings_seen.notify_one();
                }
                continue;
            }
            let take = self.remaining.min(data.len());
            if self.settings {
                for &b in &data[..take] {
                    self.setting[self.setting_len] = b;
                    self.setting_len += 1;
                    if self.setting_len == 6 {
                        self.setting_len = 0;
                        let [i0, i1, v0, v1, v2, v3] = self.setting;
                        if u16::from_be_bytes([i0, i1]) == SETTINGS_MAX_CONCURRENT_STREAMS {
                            peer.max_streams
                                .store(u32::from_be_bytes([v0, v1, v2, v3]), Ordering::Release);
                        }
                    }
                }
            }
            self.remaining -= take;
            data = &data[take..];
            if self.settings && self.remaining == 0 {
                peer.settings_seen.notify_one();
            }
        }
    }
}

/// An IO that feeds what it reads to a [`FrameParser`].
pub struct Sniffer<T> {
    inner: T,
    parser: FrameParser,
    peer: Arc<PeerState>,
}

impl<T> Sniffer<T> {
    pub fn new(inner: T, peer: Arc<PeerState>) -> Self {
        Self {
            inner,
            parser: FrameParser::default(),
            peer,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sniffer<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut me.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            me.parser.feed(&buf.filled()[before..], &me.peer);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Sniffer<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn reads_max_streams_across_any_split_and_ignores_acks_and_data() {
        let mut bytes = frame(FRAME_SETTINGS, 0, &[0, 4, 0, 1, 0, 0, 0, 3, 0, 0, 0, 7]);
        bytes.extend(frame(0x0, 0, &[0, 3, 0, 0, 0, 1])); // DATA that looks like a setting
        bytes.extend(frame(FRAME_SETTINGS, FLAG_ACK, &[]));
        for chunk in 1..bytes.len() {
            let peer = PeerState::default();
            let mut p = FrameParser::default();
            for part in bytes.chunks(chunk) {
                p.feed(part, &peer);
            }
            assert_eq!(peer.max_streams.load(Ordering::Relaxed), 7, "chunk {chunk}");
            assert!(!peer.goaway.load(Ordering::Relaxed));
        }
    }

    #[test]
    fn sees_goaway_and_later_settings() {
        let peer = PeerState::default();
        let mut p = FrameParser::default();
        p.feed(&frame(FRAME_SETTINGS, 0, &[]), &peer);
        assert_eq!(peer.max_streams.load(Ordering::Relaxed), u32::MAX);
        p.feed(&frame(FRAME_SETTINGS, 0, &[0, 3, 0, 0, 0, 2]), &peer);
        assert_eq!(peer.max_streams.load(Ordering::Relaxed), 2);
        p.feed(&frame(FRAME_GOAWAY, 0, &[0, 0, 0, 1, 0, 0, 0, 0]), &peer);
        assert!(peer.goaway.load(Ordering::Relaxed));
    }
}
