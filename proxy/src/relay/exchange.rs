//! One relayed request: the upstream head out on a pooled (or new) connection, the
//! answer's head back, its body passed to the client as framed, the connection back
//! to the pool when it can carry another request.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::chunked::Chunked;
use super::pool::RelayPool;
use super::response::{self, Answer, Framing, Parsed};
use super::{Buffers, Step};
use crate::access_log::HttpRecord;
use crate::backend::{Backend, Endpoint};
use crate::http::ProxyError;
use crate::routing::RuleAction;
use crate::upstream::record_failure;

/// Largest answer head read from an upstream.
const MAX_ANSWER_HEAD: usize = 64 * 1024;

pub(super) struct Exchange<'a> {
    pub pool: &'a RelayPool,
    pub backend: &'a Backend,
    pub endpoint: &'a Endpoint,
    pub action: &'a RuleAction,
    pub head_request: bool,
    /// The client asked to close after this answer.
    pub close: bool,
    pub request_id: &'a [u8],
    pub started: Instant,
    pub record: Option<Box<HttpRecord>>,
}

/// Why no answer head came back.
enum Failed {
    /// No connection could be made, to the endpoint picked nor to one other: nothing
    /// was sent.
    Connect(std::io::Error),
    /// Sent, and the upstream failed or answered with something unusable.
    Upstream(&'static str),
    Timeout,
}

impl<'a> Exchange<'a> {
    pub(super) async fn run<S: AsyncWrite + Unpin>(
        mut self,
        client: &mut S,
        bufs: &mut Buffers,
    ) -> Step {
        let mut retries = 0;
        let sent = {
            let send = self.send(
                &bufs.upstream_head,
                &mut bufs.up,
                &mut bufs.down,
                &mut retries,
            );
            match self.action.timeout {
                Some(t) => tokio::time::timeout(t, send)
                    .await
                    .unwrap_or(Err(Failed::Timeout)),
                None => send.await,
            }
        };
        let (upstream, answer) = match sent {
            Ok((upstream, answer, endpoint)) => {
                self.endpoint = endpoint;
                (upstream, answer)
            }
            Err(Failed::Connect(e)) => {
                tracing::warn!(backend = %self.backend.name, endpoint = %self.endpoint.addr, error = %e, "upstream connect failed");
                return self
                    .local(client, &ProxyError::UpstreamConnect(e.into()))
                    .await;
            }
            Err(Failed::Upstream(why)) => {
                tracing::debug!(endpoint = %self.endpoint.addr, why, "relayed request failed");
                record_failure(self.backend, self.endpoint);
                return self.local(client, &ProxyError::Upstream(why.into())).await;
            }
            Err(Failed::Timeout) => return self.local(client, &ProxyError::Timeout).await,
        };
        if answer.status >= 500 {
            record_failure(self.backend, self.endpoint);
        } else {
            self.endpoint.health.success();
        }
        self.action
            .stats
            .record(answer.status, self.started.elapsed());
        if let Some(r) = self.record.as_mut() {
            r.set_upstream(self.endpoint.addr, retries, self.started.elapsed());
            r.set_answer(answer.status, None);
        }
        self.body(client, upstream, &answer, bufs).await
    }

    /// Sends the head and reads the answer's head into `up`, its client version into
    /// `down`; returns the endpoint that answered. As the full path's attempt loop
    /// (`crate::upstream::attempts`) for a rule without `retry`: a refused connect goes
    /// to one other endpoint at once, and a pooled connection that ends before any
    /// answer byte (the peer closed it while idle) is replaced by a new one to the same
    /// endpoint, since the request (idempotent, no body) may go again.
    async fn send(
        &self,
        head: &[u8],
        up: &mut BytesMut,
        down: &mut Vec<u8>,
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
            let result = match conn.write_all(head).await {
                Ok(()) => self.answer_head(&mut conn, up, down).await,
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
        down: &mut Vec<u8>,
    ) -> Result<Answer, Option<&'static str>> {
        let mut any = false;
        loop {
            if !up.is_empty() {
                match response::parse(up, self.head_request, self.request_id, self.close, down) {
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
            match conn.read_buf(up).await {
                Ok(0) | Err(_) if !any => return Err(None),
                Ok(0) => return Err(Some("connection closed mid-head")),
                Err(_) => return Err(Some("read failed mid-head")),
                Ok(_) => any = true,
            }
        }
    }

    /// Passes the head and body on; returns the connection to the pool when the body
    /// ended where its framing said and the upstream keeps it open.
    async fn body<S: AsyncWrite + Unpin>(
        self,
        client: &mut S,
        mut upstream: TcpStream,
        answer: &Answer,
        bufs: &mut Buffers,
    ) -> Step {
        let Buffers { down, up, .. } = bufs;
        // `down` holds the client's head; body bytes read with the upstream's head follow.
        let head_len = down.len();
        up.advance(answer.len);
        let mut chunked = Chunked::default();
        // Body bytes still to come from the upstream (Length), or whether the body
        // has ended (others).
        let (mut left, mut ended) = (0u64, false);
        let mut clean = true;
        match answer.framing {
            Framing::Empty => {
                ended = true;
                clean = up.is_empty();
            }
            Framing::Length(n) => {
                let take = usize::try_from(n).map_or(up.len(), |n| n.min(up.len()));
                down.extend_from_slice(&up[..take]);
                clean = take == up.len();
                left = n - take as u64;
                ended = left == 0;
            }
            Framing::Chunked => match chunked.feed(up) {
                Ok(Some(end)) => {
                    down.extend_from_slice(&up[..end]);
                    clean = end == up.len();
                    ended = true;
                }
                Ok(None) => down.extend_from_slice(up),
                Err(e) => {
                    tracing::debug!(error = %e, "upstream body refused");
                    return self.finish(Step::Close, 0, false);
                }
            },
            Framing::Close => down.extend_from_slice(up),
        }
        let mut sent = (down.len() - head_len) as u64;
        if client.write_all(down).await.is_err() {
            return self.finish(Step::Close, 0, false);
        }
        while !ended {
            up.clear();
            match upstream.read_buf(up).await {
                Ok(0) if answer.framing == Framing::Close => {
                    ended = true;
                    continue;
                }
                Ok(n) if n > 0 => {}
                // Truncated: the client can't be told but by closing.
                _ => return self.finish(Step::Close, sent, false),
            }
            let chunk: &[u8] = match answer.framing {
                Framing::Length(_) => {
                    let take = usize::try_from(left).map_or(up.len(), |l| l.min(up.len()));
                    left -= take as u64;
                    ended = left == 0;
                    clean = take == up.len();
                    &up[..take]
                }
                Framing::Chunked => match chunked.feed(up) {
                    Ok(Some(end)) => {
                        ended = true;
                        clean = end == up.len();
                        &up[..end]
                    }
                    Ok(None) => &up[..],
                    Err(_) => return self.finish(Step::Close, sent, false),
                },
                _ => &up[..],
            };
            if client.write_all(chunk).await.is_err() {
                return self.finish(Step::Close, sent, false);
            }
            sent += chunk.len() as u64;
        }
        if answer.reusable && clean {
            self.pool.put(self.endpoint.addr, upstream);
        }
        let step = if self.close || answer.framing == Framing::Close {
            Step::Close
        } else {
            Step::Next
        };
        self.finish(step, sent, true)
    }

    /// An answer the edge makes itself, as the full path words it.
    async fn local<S: AsyncWrite + Unpin>(mut self, client: &mut S, err: &ProxyError) -> Step {
        let (status, reason, body) = (err.status(), err.reason(), err.body());
        self.action
            .stats
            .record(status.as_u16(), self.started.elapsed());
        if let Some(r) = self.record.as_mut() {
            r.set_upstream(self.endpoint.addr, 0, self.started.elapsed());
            r.set_answer(status.as_u16(), Some(reason));
        }
        let mut out = Vec::with_capacity(192 + body.len());
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\ncontent-type: text/plain\r\ncontent-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\nx-request-id: ");
        out.extend_from_slice(self.request_id);
        if self.close {
            out.extend_from_slice(b"\r\nconnection: close");
        }
        out.extend_from_slice(b"\r\n\r\n");
        if !self.head_request {
            out.extend_from_slice(body.as_bytes());
        }
        if client.write_all(&out).await.is_err() {
            return self.finish(Step::Close, 0, false);
        }
        let sent = if self.head_request {
            0
        } else {
            body.len() as u64
        };
        let step = if self.close { Step::Close } else { Step::Next };
        self.finish(step, sent, true)
    }

    fn finish(self, step: Step, sent: u64, complete: bool) -> Step {
        self.pool.relayed.increment(1);
        if let Some(r) = self.record {
            r.finish(sent, complete);
        }
        step
    }
}
