//! The full path's plain HTTP/1.1 upstream exchange, as bytes: for a request the
//! relay itself does not take (HTTP/2 downstream, filters, trusted forwarding headers,
//! tracing) but whose upstream exchange is a bodiless `GET` or `HEAD` to a plain
//! HTTP/1.1 backend without a retry policy. The prepared request (`crate::http::
//! outbound::prepare`: filters, Host, forwarding headers) is written as bytes on the
//! relay's pool, the answer's head parsed into a `Response`, and its body streamed by
//! [`RelayedBody`], which gives the connection back when the body ends.
//!
//! hyper's client did the same with a request envelope sent over a channel to the
//! connection's dispatcher and a head encoded and parsed by its state machine: on h2c
//! that cost 15% of req/s (`benches/RESULTS.md`, issue 19, session 20).

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use hyper::body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use super::attempt::{Attempt, Failed, RequestHead};
use super::chunked::Chunked;
use super::pool::{PoolHandle, RelayPool};
use super::response::{Framing, HeadOut};
use crate::backend::{Backend, Endpoint, UpstreamProtocol};
use crate::http::ProxyError;
use crate::upstream::attempts::Tried;
use crate::upstream::record_failure;

/// The buffer an answer's head is read into: a usual head and a small body fit, and
/// an allocation this size comes from glibc's per-thread cache (up to 1,032 bytes).
/// 8 KiB per request went through `_int_malloc` and `malloc_consolidate` instead
/// (about 3% of the core on h2c).
const HEAD_BUF: usize = 1024;
/// Bytes read at a time from the upstream for the rest of a body.
const READ_BUF: usize = 8 * 1024;

/// Whether this exchange can go as bytes: a bodiless `GET` or `HEAD` to a plain
/// HTTP/1.1 upstream, without a retry policy (the relay's attempt loop resends only a
/// request that met a closed pooled connection) and without an upgrade.
pub(crate) fn takes(
    method: &Method,
    body_ended: bool,
    protocol: UpstreamProtocol,
    retry: bool,
    upgrade: bool,
) -> bool {
    (*method == Method::GET || *method == Method::HEAD)
        && body_ended
        && protocol == UpstreamProtocol::Http1
        && !retry
        && !upgrade
}

/// Sends the prepared request to `endpoint` (or, if its connect fails, one other
/// endpoint of `backend`); `tried` learns where it went.
pub(crate) async fn exchange(
    pool: &RelayPool,
    backend: &Backend,
    endpoint: &Endpoint,
    parts: &http::request::Parts,
    path_and_query: &PathAndQuery,
    tried: &mut Tried,
) -> Result<Response<RelayedBody>, ProxyError> {
    let attempt = Attempt {
        pool,
        backend,
        endpoint,
        head_request: parts.method == Method::HEAD,
    };
    let mut up = BytesMut::with_capacity(HEAD_BUF);
    let mut answer_head = ResponseHead::default();
    let mut retries = 0;
    tried.endpoint = Some(endpoint.addr);
    let sent = attempt
        .send(
            RequestHead::Written(|buf: &mut BytesMut| upstream_head(parts, path_and_query, buf)),
            &mut up,
            &mut answer_head,
            &mut retries,
        )
        .await;
    tried.retries = retries;
    pool.byte_exchanges.increment(1);
    let (conn, answer, endpoint) = match sent {
        Ok(sent) => sent,
        Err(Failed::Connect(e)) => {
            tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, error = %e, "upstream connect failed");
            return Err(ProxyError::UpstreamConnect(e.into()));
        }
        Err(Failed::Upstream(why)) => {
            tracing::debug!(endpoint = %endpoint.addr, why, "upstream request failed");
            record_failure(backend, endpoint);
            return Err(ProxyError::Upstream(why.into()));
        }
        Err(Failed::Timeout) => return Err(ProxyError::Timeout),
    };
    tried.endpoint = Some(endpoint.addr);
    let head = up.split_to(answer.len).freeze();
    let status = match (
        answer_head.headers(&head),
        StatusCode::from_u16(answer.status),
    ) {
        (Some(headers), Ok(status)) => (status, headers),
        _ => {
            record_failure(backend, endpoint);
            return Err(ProxyError::Upstream("invalid answer head".into()));
        }
    };
    let (status, headers) = status;
    if status.is_server_error() {
        record_failure(backend, endpoint);
    } else {
        endpoint.health.success();
    }
    let left = match answer.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let mut body = RelayedBody {
        conn: Some(conn),
        buf: up,
        framing: answer.framing,
        left,
        chunked: Chunked::default(),
        reusable: answer.reusable,
        done: false,
        home: (pool.handle(), endpoint.addr),
    };
    if answer.framing == Framing::Empty {
        let clean = body.buf.is_empty();
        body.finish(clean);
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// The request line and headers as prepared, origin-form, appended to `head`.
fn upstream_head(parts: &http::request::Parts, path_and_query: &PathAndQuery, head: &mut BytesMut) {
    head.extend_from_slice(parts.method.as_str().as_bytes());
    head.extend_from_slice(b" ");
    head.extend_from_slice(path_and_query.as_str().as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
}

/// The answer's headers as the client gets them: each name, and where its value is in
/// the head. The values become slices of the head once it is read (no copy each), and
/// the map is made then, sized for them and the request ID the edge adds: a map made
/// for 16 headers was 2.5 KiB, more than glibc's per-thread cache takes (1 KiB), and
/// four copied values were four allocations per answer.
#[derive(Default)]
struct ResponseHead {
    kept: Vec<(HeaderName, usize, usize)>,
    /// Every name was valid.
    valid: bool,
}

impl ResponseHead {
    /// The map of the kept headers, their values slices of `head`; `None` when a name
    /// or a value is not valid.
    fn headers(&self, head: &Bytes) -> Option<HeaderMap> {
        if !self.valid {
            return None;
        }
        let mut headers = HeaderMap::with_capacity(self.kept.len() + 1);
        for (name, start, end) in &self.kept {
            let value = head.get(*start..*end)?;
            let value = HeaderValue::from_maybe_shared(head.slice_ref(value)).ok()?;
            headers.append(name.clone(), value);
        }
        Some(headers)
    }
}

impl HeadOut for ResponseHead {
    fn status(&mut self, _status: u16, _reason: &str, headers: usize) {
        // A resent request's answer replaces the first one's.
        self.kept.clear();
        self.kept.reserve_exact(headers);
        self.valid = true;
    }

    fn header(&mut self, name: &str, value: &[u8], at: usize) {
        // The body is given decoded; the client's side frames it anew.
        if name.eq_ignore_ascii_case(header::TRANSFER_ENCODING.as_str()) {
            return;
        }
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => self.kept.push((n, at, at + value.len())),
            Err(_) => self.valid = false,
        }
    }

    fn end(&mut self, _framing: Framing) {}
}

/// An answer's body read from its upstream connection, which goes back to the relay's
/// pool once the body has ended where its framing said (and the upstream keeps it
/// open). Dropped before its end, it closes the connection.
pub struct RelayedBody {
    conn: Option<TcpStream>,
    /// Read and not yet given.
    buf: BytesMut,
    framing: Framing,
    /// Bytes still to come (`Length`).
    left: u64,
    chunked: Chunked,
    reusable: bool,
    done: bool,
    home: (PoolHandle, SocketAddr),
}

impl RelayedBody {
    /// The body has ended; `clean`: nothing after it was read.
    fn finish(&mut self, clean: bool) {
        self.done = true;
        if let Some(conn) = self.conn.take()
            && self.reusable
            && clean
            && self.framing != Framing::Close
        {
            self.home.0.put(self.home.1, conn);
        }
    }

    /// The next piece of body in what was read, if any; ends the body where it ends.
    fn take_buffered(&mut self) -> Result<Option<Bytes>, std::io::Error> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        match self.framing {
            Framing::Empty => Ok(None),
            Framing::Length(_) => {
                let take =
                    usize::try_from(self.left).map_or(self.buf.len(), |l| l.min(self.buf.len()));
                let data = self.buf.split_to(take).freeze();
                self.left -= take as u64;
                if self.left == 0 {
                    let clean = self.buf.is_empty();
                    self.finish(clean);
                }
                Ok(Some(data))
            }
            Framing::Chunked => {
                let mut data = BytesMut::new();
                let buf = &self.buf;
                let end = self
                    .chunked
                    .decode(buf, |r| data.extend_from_slice(&buf[r]))
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                match end {
                    Some(end) => {
                        let clean = end == self.buf.len();
                        self.buf.clear();
                        self.finish(clean);
                    }
                    None => self.buf.clear(),
                }
                Ok((!data.is_empty()).then(|| data.freeze()))
            }
            Framing::Close => Ok(Some(self.buf.split().freeze())),
        }
    }
}

impl Body for RelayedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            match this.take_buffered() {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) => {}
                Err(e) => {
                    this.done = true;
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            if this.done {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            this.buf.reserve(READ_BUF);
            let read = match conn.try_read_buf(&mut this.buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match conn.poll_read_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => Err(e),
                    }
                }
                read => read,
            };
            match read {
                Ok(0) if this.framing == Framing::Close => {
                    this.finish(false);
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    // Truncated: the client can only be told by an error.
                    this.done = true;
                    this.conn = None;
                    return Poll::Ready(Some(Err(std::io::ErrorKind::UnexpectedEof.into())));
                }
                Ok(_) => {}
                Err(e) => {
                    this.done = true;
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty => SizeHint::with_exact(0),
            Framing::Length(_) => SizeHint::with_exact(self.left),
            _ => SizeHint::default(),
        }
    }
}

impl std::fmt::Debug for RelayedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayedBody")
            .field("framing", &self.framing)
            .field("done", &self.done)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::response::{Parsed, parse};
    use super::*;

    /// The client's headers are the upstream's, in order, repeated names kept, less
    /// the connection's own and the framing the client's side makes anew; their values
    /// are the head's bytes.
    #[test]
    fn answer_headers_are_slices_of_the_head() {
        let raw = b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nConnection: keep-alive\r\n\
            Transfer-Encoding: chunked\r\nX-Custom: \xe9t\xe9\r\nSet-Cookie: b=2\r\n\
            X-Request-Id: upstream\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let mut up = BytesMut::from(&raw[..]);
        let mut out = ResponseHead::default();
        let Ok(Parsed::Final(answer)) = parse(&up, false, &mut out) else {
            panic!("a final answer");
        };
        let head = up.split_to(answer.len).freeze();
        let headers = out.headers(&head).unwrap();
        let got: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        assert_eq!(
            got,
            [
                ("set-cookie", &b"a=1"[..]),
                ("set-cookie", b"b=2"),
                ("x-custom", b"\xe9t\xe9"),
            ]
        );
        assert_eq!(&up[..], b"5\r\nhello\r\n0\r\n\r\n", "the body stays");
        assert!(
            ResponseHead::default().headers(&head).is_none(),
            "no answer, no headers"
        );
    }
}
