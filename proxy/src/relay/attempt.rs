//! One upstream attempt as bytes: the head written on a pooled (or new) connection and
//! the answer's head read back. Shared by the relay's own requests ([`super::exchange`])
//! and the full path's plain HTTP/1.1 exchanges ([`super::full_path`]).

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::pool::RelayPool;
use super::response::{self, Answer, HeadOut, Parsed};
use crate::backend::{Backend, Endpoint};
use crate::upstream::record_failure;

/// Largest answer head read from an upstream.
const MAX_ANSWER_HEAD: usize = 64 * 1024;

/// Why no answer head came back.
pub(super) enum Failed {
    /// No connection could be made, to the endpoint picked nor to one other: nothing
    /// was sent.
    Connect(std::io::Error),
    /// Sent, and the upstream failed or answered with something unusable.
    Upstream(&'static str),
    Timeout,
}

/// Where a request goes.
pub(super) struct Attempt<'a> {
    pub pool: &'a RelayPool,
    pub backend: &'a Backend,
    pub endpoint: &'a Endpoint,
    /// `HEAD`: the answer has no body whatever its headers say.
    pub head_request: bool,
}

/// The request head an attempt sends: ready in a buffer of the caller's (the relay
/// keeps one per connection), or written by a function into the buffer the answer is
/// then read into (the full path: no buffer of its own per request; a resend writes
/// it again).
pub(super) enum RequestHead<'h, W> {
    Ready(&'h [u8]),
    Written(W),
}

impl<'a> Attempt<'a> {
    /// Sends `head` and reads the answer's head into `up`, giving its fields to `out`;
    /// returns the connection, the answer and the endpoint that answered. As the full
    /// path's attempt loop (`crate::upstream::attempts`) for a rule without `retry`: a
    /// refused connect goes to one other endpoint at once, and a pooled connection that
    /// ends before any answer byte (the peer closed it while idle) is replaced by a new
    /// one to the same endpoint, since the request (idempotent, no body) may go again.
    pub(super) async fn send<W: Fn(&mut BytesMut)>(
        &self,
        head: RequestHead<'_, W>,
        up: &mut BytesMut,
        out: &mut impl HeadOut,
        retries: &mut u32,
    ) -> Result<(TcpStream, Answer, &'a Endpoint), Failed> {
        let mut endpoint = self.endpoint;
        let mut pooled = self.pool.take(endpoint.addr);
        let mut other_tried = false;
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => match self.pool.dial(endpoint.addr).await {
                    Ok(c) => c,
                    Err(e) => {
                        record_failure(self.backend, endpoint);
                        let next = if other_tried {
                            None
                        } else {
                            self.backend.pick_other(&[endpoint.addr])
                        };
                        let Some(next) = next else {
                            self.backend.stats.connect_error();
                            return Err(Failed::Connect(e));
                        };
                        self.backend.stats.connect_error();
                        tracing::debug!(backend = %self.backend.name, from = %endpoint.addr, to = %next.addr, error = %e, "upstream connect failed; retrying on another endpoint");
                        self.backend.stats.retried("connect_error");
                        *retries += 1;
                        other_tried = true;
                        endpoint = next;
                        continue;
                    }
                },
            };
            up.clear();
            let written = match &head {
                RequestHead::Ready(head) => conn.write_all(head).await,
                RequestHead::Written(write) => {
                    write(up);
                    let written = conn.write_all(&up[..]).await;
                    up.clear();
                    written
                }
            };
            let result = match written {
                Ok(()) => self.answer_head(&mut conn, up, out).await,
                Err(_) => Err(None),
            };
            match result {
                Ok(answer) => return Ok((conn, answer, endpoint)),
                Err(None) if reused => {
                    *retries += 1;
                    self.backend.stats.retried("connection_closed");
                }
                Err(None) => return Err(Failed::Upstream("connection closed before answering")),
                Err(Some(why)) => return Err(Failed::Upstream(why)),
            }
        }
    }

    /// Reads until a final answer head. `Err(None)`: the connection ended before any
    /// byte of it.
    async fn answer_head(
        &self,
        conn: &mut TcpStream,
        up: &mut BytesMut,
        out: &mut impl HeadOut,
    ) -> Result<Answer, Option<&'static str>> {
        let mut any = false;
        loop {
            if !up.is_empty() {
                match response::parse(up, self.head_request, out) {
                    Ok(Parsed::Final(answer)) => return Ok(answer),
                    Ok(Parsed::Interim(n)) => {
                        up.advance(n);
                        continue;
                    }
                    Ok(Parsed::Partial) if up.len() < MAX_ANSWER_HEAD => {}
                    Ok(Parsed::Partial) => return Err(Some("answer head too large")),
                    Err(e) => {
                        tracing::debug!(error = %e, "upstream answer refused");
                        return Err(Some("invalid answer head"));
                    }
                }
            }
            // A head longer than the buffer grows it a kilobyte per read at least.
            up.reserve(1024);
            match conn.read_buf(up).await {
                Ok(0) | Err(_) if !any => return Err(None),
                Ok(0) => return Err(Some("connection closed mid-head")),
                Err(_) => return Err(Some("read failed mid-head")),
                Ok(_) => any = true,
            }
        }
    }
}
