//! A client's request body, as the connection that read its head delivers it: through
//! hyper's server (HTTP/1.1, and HTTP/2 with `--http1-relay=false`), or straight from
//! an h2 stream (`crate::http2`).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::RecvStream;
use http::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// What reading a client's body can fail with.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body.
pub enum ClientBody {
    Hyper(Incoming),
    H2(H2Body),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ClientBody::H2(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::H2(b) => b.stream.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::H2(b) if b.stream.is_end_stream() => SizeHint::with_exact(0),
            ClientBody::H2(b) => b.left.map(SizeHint::with_exact).unwrap_or_default(),
        }
    }
}

/// An HTTP/2 request's body: its DATA frames, then its trailers. Each frame's bytes
/// are given back to the flow-control window as they are handed on, as hyper does: the
/// window bounds what the client may send ahead of the upstream reading it.
pub struct H2Body {
    stream: RecvStream,
    /// What Content-Length announced and is still to come (the h2 crate refuses a
    /// stream whose DATA disagrees with it).
    left: Option<u64>,
    data_done: bool,
}

impl H2Body {
    pub(crate) fn new(stream: RecvStream, headers: &HeaderMap) -> Self {
        let left = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Self {
            stream,
            left,
            data_done: false,
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if !self.data_done {
            match ready!(self.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    if let Some(left) = self.left.as_mut() {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                // RST_STREAM with NO_ERROR ends the body rather than failing it, as
                // hyper reads it (RFC 9113 section 8.1).
                Some(Err(e)) if e.reason() == Some(h2::Reason::NO_ERROR) => {
                    return Poll::Ready(None);
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => self.data_done = true,
            }
        }
        match ready!(self.stream.poll_trailers(cx)) {
            Ok(trailers) => Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t)))),
            Err(e) if e.reason() == Some(h2::Reason::NO_ERROR) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }
}
