//! Bodies that count bytes for the access log: the request body as the upstream reads
//! it, and the response body as the client is sent it. The response body also ends
//! the record: when it is read to its end, fails, or is dropped (the client went
//! away), the line is handed to the writer.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::HttpRecord;
use crate::http::ResponseBody;
use crate::trace::ServerSpan;

/// The client's request body; counts its bytes when the request is logged.
pub struct RequestBody {
    inner: Incoming,
    counted: Option<Arc<AtomicU64>>,
    /// Known at the request's start to have no body (see [`RequestBody::new`]).
    ended: bool,
}

impl RequestBody {
    /// `ended`: the request is known to have no body. Forwarding asks up to three
    /// times whether the body has ended, and for HTTP/2 hyper answers each time by
    /// locking the connection's stream store (0.37% of an h2c core); what was known
    /// at the start answers without it.
    pub fn new(inner: Incoming, counted: Option<Arc<AtomicU64>>, ended: bool) -> Self {
        Self {
            inner,
            counted,
            ended,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Some(n), Poll::Ready(Some(Ok(frame)))) = (&this.counted, &polled)
            && let Some(data) = frame.data_ref()
        {
            n.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody").finish_non_exhaustive()
    }
}

/// The answer's body; with a record or a span, counts what is sent and ends them.
pub struct LoggedBody {
    inner: ResponseBody,
    record: Option<Box<HttpRecord>>,
    span: Option<Box<ServerSpan>>,
    sent: u64,
}

impl LoggedBody {
    pub fn new(inner: ResponseBody, record: Option<Box<HttpRecord>>) -> Self {
        Self {
            inner,
            record,
            span: None,
            sent: 0,
        }
    }

    /// The same, also ending the request's server span.
    pub(crate) fn traced(mut self, span: Option<Box<ServerSpan>>) -> Self {
        self.span = span;
        self
    }

    fn observed(&self) -> bool {
        self.record.is_some() || self.span.is_some()
    }

    fn finish(&mut self, complete: bool) {
        if let Some(mut r) = self.record.take() {
            r.response_bytes = self.sent;
            r.duration = r.started.elapsed();
            r.complete = complete;
            r.log.http(r);
        }
        if let Some(s) = self.span.take() {
            s.end(self.sent);
        }
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = <ResponseBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.observed() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        this.sent += data.len() as u64;
                    }
                    // A body that knows it has ended is not polled again (a local
                    // answer's one chunk): end the record now, not at drop.
                    if this.inner.is_end_stream() {
                        this.finish(true);
                    }
                }
                Poll::Ready(None) => this.finish(true),
                Poll::Ready(Some(Err(_))) => this.finish(false),
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        // Never polled because empty, or dropped early because the client left.
        let complete = self.inner.is_end_stream();
        self.finish(complete);
    }
}

impl std::fmt::Debug for LoggedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggedBody")
            .field("logged", &self.record.is_some())
            .field("traced", &self.span.is_some())
            .finish_non_exhaustive()
    }
}
