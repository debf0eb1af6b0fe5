//! One relayed request: the upstream head out on a pooled (or new) connection, the
//! answer's head back, its body passed to the client as framed, the connection back
//! to the pool when it can carry another request.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Step;
use super::attempt::{Attempt, Failed, RequestHead};
use super::buffers::Buffers;
use super::chunked::Chunked;
use super::pool::RelayPool;
use super::response::{Answer, ClientHead, Framing};
use crate::access_log::HttpRecord;
use crate::backend::{Backend, Endpoint};
use crate::http::ProxyError;
use crate::routing::RuleAction;
use crate::upstream::record_failure;

pub(super) struct Exchange<'a> {
    pub pool: &'a RelayPool,
    pub backend: &'a Backend,
    pub endpoint: &'a Endpoint,
    pub action: &'a RuleAction,
    pub head_request: bool,
    /// The client asked to close after this answer.
    pub close: bool,
    pub request_id: RequestId<'a>,
    pub started: Instant,
    pub record: Option<Box<HttpRecord>>,
}

/// The request's ID: the client's, or one the edge made for it.
pub(super) enum RequestId<'a> {
    Client(&'a [u8]),
    Made([u8; 36]),
}

impl RequestId<'_> {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Self::Client(id) => id,
            Self::Made(id) => id,
        }
    }
}

impl<'a> Exchange<'a> {
    pub(super) async fn run<S: AsyncWrite + Unpin>(
        mut self,
        client: &mut S,
        bufs: &mut Buffers,
    ) -> Step {
        let mut retries = 0;
        let sent = {
            let attempt = Attempt {
                pool: self.pool,
                backend: self.backend,
                endpoint: self.endpoint,
                head_request: self.head_request,
            };
            let mut client_head = ClientHead {
                out: &mut bufs.down,
                request_id: self.request_id.bytes(),
                close: self.close,
            };
            let send = attempt.send(
                RequestHead::<fn(&mut BytesMut)>::Ready(&bufs.upstream_head),
                &mut bufs.up,
                &mut client_head,
                &mut retries,
            );
            match self.action.timeout() {
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
        // One clock read for both: about 60 ns each on a virtual machine.
        let elapsed = self.started.elapsed();
        self.action.stats.record(answer.status, elapsed);
        if let Some(r) = self.record.as_mut() {
            r.set_upstream(self.endpoint.addr, retries, elapsed);
            r.set_answer(answer.status, None);
        }
        self.body(client, upstream, &answer, bufs).await
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
        let elapsed = self.started.elapsed();
        self.action.stats.record(status.as_u16(), elapsed);
        if let Some(r) = self.record.as_mut() {
            r.set_upstream(self.endpoint.addr, 0, elapsed);
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
        out.extend_from_slice(self.request_id.bytes());
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
