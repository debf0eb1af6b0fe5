//! The HTTP/1.1 relay (`--http1-relay`): plain keep-alive `GET`/`HEAD` requests
//! proxied as bytes, without building an `http::Request` and two `HeaderMap`s and
//! running hyper's server and client state machines for each.
//!
//! `benches/RESULTS.md` (issue 19, session 10) measured where the edge's per-request
//! CPU goes: not syscalls (it makes fewer than nginx) but user space, 6-8 µs against
//! nginx's 2-2.5, spread over hyper's two state machines, `HeaderMap` building, and
//! moving requests between them. nginx, HAProxy and pingora relay heads as bytes; so
//! does this, for the requests where that is exactly what the full path would do:
//!
//! - the head is parsed in place (`httparse`, as hyper does), and taken only when no
//!   reader could frame it differently ([`request`]: HTTP/1.1, no body, no upgrade);
//! - its rule has no filters and no `retry`, its backend is plain HTTP/1.1 (no
//!   BackendTLSPolicy, no mesh), and the edge neither traces nor trusts forwarding
//!   headers (`--xff-trusted-hops`);
//! - the upstream head is the client's bytes less hop-by-hop headers, plus the
//!   forwarding headers and the request ID; the answer's head comes back the same way,
//!   and its body is passed through as framed ([`response`], [`chunked`]).
//!
//! Anything else goes to the full request path ([`crate::http`]) with the bytes read
//! so far ([`Prefixed`]), for the rest of the connection: a request the relay does not
//! take, a failed connect (the full path's retry and answer apply), an HTTP/2 preface.
//! What a client and a backend see is the same either way, which the standalone tests
//! check with the relay on.

mod attempt;
mod buffers;
mod chunked;
mod exchange;
pub(crate) mod full_path;
pub mod fuzzing;
mod pool;
mod prefixed;
mod request;
mod response;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::Instant;

use buffers::{Buffers, IDLE_RELEASE, READ_BUF};
use exchange::RequestId;
pub(crate) use full_path::RelayedBody;
pub(crate) use pool::RelayPool;
pub(crate) use prefixed::Prefixed;

use crate::access_log::{HttpRecord, Relayed};
use crate::backend::{Pick, UpstreamProtocol};
use crate::drain::Signal;
use crate::http::{ConnInfo, READYZ_PATH, strip_port};
use crate::snapshot::Snapshot;
use crate::state::ProxyState;

/// Headers a head may have for the relay; more go to the full path (which applies
/// `--max-headers`).
const MAX_HEADERS: usize = 100;
/// How a connection left the relay.
pub(crate) enum Outcome {
    /// Closed, or to be closed.
    Closed,
    /// For the full request path, with the bytes read and not yet used.
    Fallback(BytesMut),
}

/// What one connection's relay needs.
pub(crate) struct Relay<'a> {
    pub state: &'a ProxyState,
    pub conn: &'a ConnInfo,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// The listener socket is draining: finish the request in hand, then close.
    pub draining: &'a Signal,
}

/// What `Relay::prepare` made of the bytes in hand.
enum Prepared<'s> {
    /// Not yet a whole head.
    Partial,
    /// Not for the relay: the full path takes the connection from here.
    Fallback,
    /// A head of `.0` bytes, to relay.
    Relay(usize, exchange::Exchange<'s>),
}

/// What became of one request.
enum Step {
    /// Answered; the connection may carry the next request.
    Next,
    /// Answered (or failed mid-answer): close the connection.
    Close,
    /// Not taken: nothing was sent to the client or consumed.
    Fallback,
}

impl Relay<'_> {
    /// Relays requests from `stream` (TCP, or TLS after the handshake) until one it
    /// does not take, the client closes, or the socket drains.
    pub(crate) async fn serve<S>(&self, stream: &mut S) -> Outcome
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(READ_BUF);
        let mut bufs = Buffers::new();
        let mut released = false;
        // One timer and one drain waiter for the connection, not one of each per
        // request: arming and disarming a timer (and registering a waiter) for every
        // read that waits was a fixed cost on every keep-alive request. The timer may
        // fire early, at a time since moved on; it is then set to the current one. It
        // serves two times: the buffers' release, then the header read deadline.
        let mut last = Instant::now();
        let mut deadline = last + self.header_read_timeout;
        let timer = tokio::time::sleep_until((last + IDLE_RELEASE).min(deadline));
        let drained = self.draining.fired();
        tokio::pin!(timer, drained);
        loop {
            loop {
                let step = if buf.is_empty() {
                    None
                } else {
                    // Loaded here, not in `prepare`: the exchange borrows its route
                    // and backend across the await.
                    let snapshot = self.state.snapshot.load();
                    match self.prepare(&buf, &snapshot, &mut bufs) {
                        Prepared::Partial => None,
                        Prepared::Fallback => Some((0, Step::Fallback)),
                        Prepared::Relay(n, exchange) => {
                            Some((n, exchange.run(stream, &mut bufs).await))
                        }
                    }
                };
                match step {
                    Some((n, Step::Next)) => {
                        buf.advance(n);
                        break;
                    }
                    Some((_, Step::Close)) => return Outcome::Closed,
                    Some((_, Step::Fallback)) => return Outcome::Fallback(buf),
                    None => {}
                }
                let idle = buf.is_empty();
                tokio::select! {
                    biased;
                    () = &mut drained, if idle => return Outcome::Closed,
                    () = &mut timer => {
                        let now = Instant::now();
                        if now >= deadline {
                            // No whole head in time, idle time included.
                            return Outcome::Closed;
                        }
                        let release = last + IDLE_RELEASE;
                        // A partial head keeps its bytes, and so its buffer.
                        if !released && idle && now >= release {
                            bufs.release(&mut buf);
                            released = true;
                        }
                        let next = if released || now >= release { deadline } else { release.min(deadline) };
                        timer.as_mut().reset(next);
                    }
                    read = stream.read_buf(&mut buf) => {
                        match read {
                            Ok(n) if n > 0 => {
                                if released {
                                    buffers::regrow(&mut buf);
                                    released = false;
                                    timer.as_mut().reset((Instant::now() + IDLE_RELEASE).min(deadline));
                                }
                            }
                            // Closed or failed.
                            _ => return Outcome::Closed,
                        }
                    }
                }
            }
            if self.draining.is_fired() {
                return Outcome::Closed;
            }
            // As hyper's header_read_timeout: from the previous answer to a whole head.
            last = Instant::now();
            deadline = last + self.header_read_timeout;
        }
    }

    /// Parses the head in `buf` and routes it; if the relay takes it, writes the
    /// upstream head and returns the exchange to run. Not async: the parsed header
    /// list (3.2 KB) lives on the thread's stack for the routing only, not in every
    /// connection's future across its waits.
    fn prepare<'s>(
        &'s self,
        buf: &'s [u8],
        snapshot: &'s Snapshot,
        bufs: &mut Buffers,
    ) -> Prepared<'s> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => match request::take(&req) {
                Some(head) if req.headers.len() <= self.max_headers => {
                    match self.route(&head, snapshot, bufs) {
                        Some(exchange) => Prepared::Relay(n, exchange),
                        None => Prepared::Fallback,
                    }
                }
                _ => Prepared::Fallback,
            },
            Ok(httparse::Status::Partial) if buf.len() < self.max_header_bytes => Prepared::Partial,
            // Malformed, too many headers or too large: the full path gives the
            // right answer (400, 431).
            _ => Prepared::Fallback,
        }
    }

    /// Routes one request; `None` if the relay does not take it.
    fn route<'s>(
        &'s self,
        head: &request::Head<'_, 's>,
        snapshot: &'s Snapshot,
        bufs: &mut Buffers,
    ) -> Option<exchange::Exchange<'s>> {
        let started = Instant::now();
        let state = self.state;
        let (path, query) = match head.target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (head.target, None),
        };
        if path == READYZ_PATH
            || state.tracer.is_some()
            || state.trusted_hops > 0
            || state.shedding.load(Ordering::Relaxed)
        {
            return None;
        }
        let listener = snapshot.listeners.get(&self.conn.local)?;
        if let (Some(certs), Some(sni)) = (&listener.tls, self.conn.sni.as_deref()) {
            // Another host on this connection only if its certificate is the one the
            // client was given; else the full path answers 421.
            let same = match (
                certs.lookup(Some(sni)),
                certs.lookup(Some(strip_port(head.host))),
            ) {
                (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
                _ => false,
            };
            if !same {
                return None;
            }
        }
        let entry = listener.routes.virtual_host(head.host).and_then(|vh| {
            vh.find_with(&head.method, path, query, |name| head.header(name.as_str()))
        });
        // No route: the full path answers 404 and counts it.
        let entry = entry?;
        let action = &entry.action;
        if !action.filters.is_empty() || action.retry().is_some() {
            return None;
        }
        let (backend, endpoint) = match action.backends.pick() {
            Pick::Endpoint(chosen, backend, endpoint) if chosen.filters.is_empty() => {
                (backend, endpoint)
            }
            _ => return None,
        };
        if self.conn.upstreams.protocol_for(backend) != UpstreamProtocol::Http1 {
            return None;
        }
        let request_id = match head.request_id {
            Some(id) => RequestId::Client(id),
            None => RequestId::Made(crate::trace::new_request_id_bytes()),
        };
        bufs.ensure();
        head.write_upstream(
            &mut bufs.upstream_head,
            self.conn.client_ip.as_bytes(),
            self.conn.scheme,
            request_id.bytes(),
        );
        let mut record = HttpRecord::relayed(
            state.access_log,
            &Relayed {
                started: started.into_std(),
                client: self.conn.peer.ip(),
                method: head.method.clone(),
                target: head.target,
                host: head.host,
                user_agent: head.user_agent,
                request_id: request_id.bytes(),
                traceparent: head.traceparent,
            },
        );
        if let Some(r) = record.as_mut() {
            r.set_listener(listener);
            r.set_rule(action);
        }
        Some(exchange::Exchange {
            pool: &self.conn.upstreams.relay,
            backend,
            endpoint,
            action,
            head_request: head.method == http::Method::HEAD,
            // Draining: the answer says so, as hyper's do, so the client opens its
            // next connection elsewhere instead of finding this one closed.
            close: head.close || self.draining.is_fired(),
            request_id,
            started,
            record,
        })
    }
}
