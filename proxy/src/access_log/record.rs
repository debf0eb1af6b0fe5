//! What one access-log line says, gathered on the request path: the request's logged
//! fields copied into one buffer, the matched rule's and listener's `Arc`s, and what
//! the answer was, until the response ends and the line is formatted.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderValue, Method, Request, Version, header};

use super::AccessLog;
use crate::http::{ConnInfo, X_FORWARDED_FOR};
use crate::l4::L4Target;
use crate::routing::RuleAction;
use crate::snapshot::Listener;
use crate::trace::TRACEPARENT;

/// The request fields a record copies, in the order of [`HttpRecord::field`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Copied {
    /// The request target (path and query; empty for CONNECT's authority form).
    Target,
    /// The authority: the URI's (HTTP/2, absolute form), else the Host header.
    Authority,
    UserAgent,
    RequestId,
    TraceParent,
}

/// One HTTP request's line.
pub struct HttpRecord {
    pub(super) log: &'static AccessLog,
    pub(super) time: SystemTime,
    pub(super) started: Instant,
    pub(super) listener: Option<Arc<Listener>>,
    pub(super) rule: Option<Arc<RuleAction>>,
    /// The client: the connection's peer, or the address trusted proxies in front of
    /// the edge put in `x-forwarded-for` (`--xff-trusted-hops`).
    pub(super) client: IpAddr,
    pub(super) method: Method,
    pub(super) version: Version,
    /// The [`Copied`] fields, one after another: copied, not cloned, since a clone
    /// shares the request's buffers (an HTTP/1.1 connection's read buffer, an HTTP/2
    /// request's decoded header block) and keeps them until the response ends. One
    /// plain buffer, kept with the box for the thread's next record (see `SPARES`).
    copied: Vec<u8>,
    /// Where each copied field ends in `copied`.
    ends: [u32; 5],
    pub(super) status: u16,
    /// Why the edge answered itself (no route, timeout, ...); `None` for an answer
    /// that came from a backend.
    pub(super) reason: Option<&'static str>,
    /// Request body bytes, counted by [`super::RequestBody`] as they are read; `None`
    /// for a request without a body.
    pub(super) request_bytes: Option<Arc<AtomicU64>>,
    pub(super) response_bytes: u64,
    pub(super) duration: Duration,
    pub(super) upstream: Option<SocketAddr>,
    /// From the request's arrival to the upstream's response headers.
    pub(super) upstream_time: Option<Duration>,
    pub(super) retries: u32,
    /// The response body was sent to its end (false: the client went away first, or
    /// the upstream body failed).
    pub(super) complete: bool,
}

/// Emptied record boxes a thread keeps for its next records: a record is made and
/// formatted on the same thread, so its box and buffer can serve the next one instead
/// of two allocations and frees per request. The records a worker has in flight swing
/// by about its concurrent streams (an HTTP/2 connection's answers go out in a batch,
/// then its next requests are read), so the spares must cover that swing: with 64
/// kept, 12% of h2load's records (128 streams) were new allocations. At most about
/// 256 x 1.3 KiB a worker.
const SPARES_KEPT: usize = 256;
/// A buffer grown larger than this by a long URL is not kept.
const COPIED_KEPT: usize = 1024;

thread_local! {
    #[expect(clippy::vec_box, reason = "the boxes are what is kept: each goes out again as a record's box")]
    static SPARES: std::cell::RefCell<Vec<Box<HttpRecord>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Starts a record for `req` when access logging is on and samples this request.
/// `request_id` is the ID the edge kept or gave the request (already looked up).
pub fn begin_http<B: hyper::body::Body>(
    log: Option<&'static AccessLog>,
    conn: &ConnInfo,
    req: &Request<B>,
    request_id: &[u8],
    trusted_hops: usize,
    started: Instant,
) -> Option<Box<HttpRecord>> {
    let log = log.filter(|l| l.sampled())?;
    let headers = req.headers();
    // Bodies known to be empty (no Content-Length, Content-Length: 0, or an HTTP/2
    // HEADERS frame ending the stream) need no counter. Asked of the size hint, which
    // hyper keeps with the body, not of `is_end_stream`, which for HTTP/2 locks the
    // connection's stream store (about 25 ns a request).
    let has_body = req.body().size_hint().exact() != Some(0);
    let uri = req.uri();
    let logged = LoggedHeaders::of(headers);
    let authority = uri
        .authority()
        .map_or(logged.host, |a| a.as_str().as_bytes());
    let mut record = HttpRecord::take(log, started);
    record.client = client_ip(conn.peer.ip(), headers, trusted_hops);
    record.method = req.method().clone();
    record.version = req.version();
    record.copy([
        uri.path_and_query().map_or("", |t| t.as_str()).as_bytes(),
        authority,
        logged.user_agent,
        request_id,
        logged.traceparent,
    ]);
    record.request_bytes = has_body.then(|| Arc::new(AtomicU64::new(0)));
    Some(record)
}

/// The request headers a line says (empty when absent): each the first of its name,
/// as `HeaderMap::get` gives.
struct LoggedHeaders<'a> {
    host: &'a [u8],
    user_agent: &'a [u8],
    traceparent: &'a [u8],
}

/// Up to this many headers, one pass over them finds the logged ones; above, each is
/// looked up by its hash.
const LOGGED_BY_PASS: usize = 16;

impl<'a> LoggedHeaders<'a> {
    fn of(headers: &'a HeaderMap) -> Self {
        if headers.keys_len() > LOGGED_BY_PASS {
            let bytes = |name| headers.get(name).map_or(&[][..], HeaderValue::as_bytes);
            return Self {
                host: bytes(header::HOST),
                user_agent: bytes(header::USER_AGENT),
                traceparent: bytes(TRACEPARENT),
            };
        }
        // A request has a few headers, and a standard name compares as one integer:
        // cheaper than hashing three names (about 250 instructions a request under
        // callgrind for two of them).
        let (mut host, mut user_agent, mut traceparent) = (None, None, None);
        for (name, value) in headers {
            let slot = if name == header::HOST {
                &mut host
            } else if name == header::USER_AGENT {
                &mut user_agent
            } else if name == TRACEPARENT {
                &mut traceparent
            } else {
                continue;
            };
            slot.get_or_insert(value.as_bytes());
        }
        Self {
            host: host.unwrap_or_default(),
            user_agent: user_agent.unwrap_or_default(),
            traceparent: traceparent.unwrap_or_default(),
        }
    }
}

/// What the relay ([`crate::relay`]) knows of a request it takes, for its record.
pub(crate) struct Relayed<'a> {
    pub started: Instant,
    pub client: IpAddr,
    pub method: Method,
    pub target: &'a str,
    pub host: &'a str,
    pub user_agent: Option<&'a [u8]>,
    pub request_id: &'a [u8],
    pub traceparent: Option<&'a [u8]>,
}

impl HttpRecord {
    /// A record for a request the relay takes, when access logging samples it. The
    /// relay's requests have no body and are HTTP/1.1.
    pub(crate) fn relayed(log: Option<&'static AccessLog>, r: &Relayed<'_>) -> Option<Box<Self>> {
        let log = log.filter(|l| l.sampled())?;
        let mut record = HttpRecord::take(log, r.started);
        record.client = r.client;
        record.method = r.method.clone();
        record.version = Version::HTTP_11;
        record.copy([
            r.target.as_bytes(),
            r.host.as_bytes(),
            r.user_agent.unwrap_or_default(),
            r.request_id,
            r.traceparent.unwrap_or_default(),
        ]);
        Some(record)
    }

    /// A fresh record in a spare box of this thread's, or a new one.
    fn take(log: &'static AccessLog, started: Instant) -> Box<Self> {
        let spare = SPARES
            .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
            .ok()
            .flatten();
        match spare {
            Some(mut b) => {
                let mut copied = std::mem::take(&mut b.copied);
                copied.clear();
                *b = Self::new(log, started, copied);
                b
            }
            None => Box::new(Self::new(log, started, Vec::new())),
        }
    }

    fn new(log: &'static AccessLog, started: Instant, copied: Vec<u8>) -> Self {
        Self {
            log,
            time: wall_time(started),
            started,
            listener: None,
            rule: None,
            client: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            method: Method::GET,
            version: Version::HTTP_11,
            copied,
            ends: [0; 5],
            status: 0,
            reason: None,
            request_bytes: None,
            response_bytes: 0,
            duration: Duration::ZERO,
            upstream: None,
            upstream_time: None,
            retries: 0,
            complete: false,
        }
    }

    fn copy(&mut self, fields: [&[u8]; 5]) {
        self.copied.reserve(fields.iter().map(|f| f.len()).sum());
        for (end, f) in self.ends.iter_mut().zip(fields) {
            self.copied.extend_from_slice(f);
            *end = u32::try_from(self.copied.len()).unwrap_or(u32::MAX);
        }
    }

    /// A copied field; empty when the request had none.
    pub(super) fn field(&self, which: Copied) -> &[u8] {
        let i = which as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.copied
            .get(start..self.ends[i] as usize)
            .unwrap_or_default()
    }

    /// Lets go of what the record holds of its request (the listener's and rule's
    /// `Arc`s end a removed route's series) and keeps the box for this thread's next
    /// record.
    pub(super) fn give_back(mut self: Box<Self>) {
        self.listener = None;
        self.rule = None;
        self.request_bytes = None;
        if self.copied.capacity() > COPIED_KEPT {
            self.copied = Vec::new();
        }
        let _ = SPARES.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut()
                && s.len() < SPARES_KEPT
            {
                s.push(self);
            }
        });
    }

    /// The target's path: what the line says, without the query.
    pub(super) fn path(&self) -> &[u8] {
        let target = self.field(Copied::Target);
        &target[..query_start(target)]
    }

    /// Ends a relayed request's record: `sent` body bytes, all of them or not.
    pub(crate) fn finish(mut self: Box<Self>, sent: u64, complete: bool) {
        self.response_bytes = sent;
        self.duration = self.started.elapsed();
        self.complete = complete;
        self.log.http(self);
    }

    pub(crate) fn set_listener(&mut self, listener: &Arc<Listener>) {
        self.listener = Some(Arc::clone(listener));
    }

    pub(crate) fn set_rule(&mut self, rule: &Arc<RuleAction>) {
        self.rule = Some(Arc::clone(rule));
    }

    pub(crate) fn take_rule(&mut self, rule: Arc<RuleAction>) {
        self.rule = Some(rule);
    }

    pub(crate) fn set_upstream(&mut self, endpoint: SocketAddr, retries: u32, after: Duration) {
        self.upstream = Some(endpoint);
        self.retries = retries;
        self.upstream_time = Some(after);
    }

    pub(crate) fn set_answer(&mut self, status: u16, reason: Option<&'static str>) {
        self.status = status;
        self.reason = reason;
    }

    /// A forwarded request's record as it stands when its response ends (for
    /// `benches/access_log.rs`): its listener and rule, the upstream and the answer.
    #[doc(hidden)]
    pub fn answered_for_bench(
        &mut self,
        listener: &Arc<Listener>,
        rule: &Arc<RuleAction>,
        upstream: SocketAddr,
        sent: u64,
    ) {
        self.set_listener(listener);
        self.set_rule(rule);
        self.set_upstream(upstream, 0, Duration::from_micros(412));
        self.set_answer(200, None);
        self.response_bytes = sent;
        self.duration = Duration::from_micros(437);
        self.complete = true;
    }

    /// The counter a request body wrapper adds to, if the request has a body.
    pub(crate) fn request_counter(&self) -> Option<Arc<AtomicU64>> {
        self.request_bytes.clone()
    }
}

thread_local! {
    /// A reading of both clocks, taken together on this thread.
    static CLOCKS: std::cell::Cell<Option<(Instant, SystemTime)>> = const { std::cell::Cell::new(None) };
}

/// How long a pairing of the clocks serves: a wall-clock step (NTP, an operator) shows
/// in the log within this.
const CLOCKS_KEPT: Duration = Duration::from_secs(1);

/// The wall-clock time of `at`, from this thread's pairing of the monotonic and wall
/// clocks when it is recent: one clock read less per request (about 60 ns each on a
/// virtual machine), the request's start already being known.
fn wall_time(at: Instant) -> SystemTime {
    let paired = CLOCKS.try_with(std::cell::Cell::get).ok().flatten();
    if let Some(t) = paired.and_then(|pair| wall_time_by(pair, at, CLOCKS_KEPT)) {
        return t;
    }
    let now = (Instant::now(), SystemTime::now());
    let _ = CLOCKS.try_with(|c| c.set(Some(now)));
    wall_time_by(now, at, Duration::MAX).unwrap_or(now.1)
}

/// The wall-clock time of `at` by a pairing of the clocks, if `at` is within `kept`
/// of it.
fn wall_time_by((i, s): (Instant, SystemTime), at: Instant, kept: Duration) -> Option<SystemTime> {
    if at >= i {
        let ahead = at - i;
        (ahead < kept).then(|| s.checked_add(ahead)).flatten()
    } else {
        let behind = i - at;
        (behind < kept).then(|| s.checked_sub(behind)).flatten()
    }
}

/// Where a target's query starts (its length when it has none).
fn query_start(target: &[u8]) -> usize {
    target
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(target.len())
}

/// The client address when `hops` proxies in front of the edge are trusted: the
/// `hops`-th `x-forwarded-for` entry from the right (each trusted proxy appended the
/// address it saw), the leftmost when there are fewer, else the peer. Entries that are
/// not addresses leave the peer.
#[inline]
pub(crate) fn client_ip(peer: IpAddr, headers: &HeaderMap, hops: usize) -> IpAddr {
    // The usual case (no proxy in front trusted) without a call.
    if hops == 0 {
        return peer;
    }
    forwarded_client(peer, headers, hops)
}

fn forwarded_client(peer: IpAddr, headers: &HeaderMap, hops: usize) -> IpAddr {
    let mut entries = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .rev();
    let mut chosen = None;
    for _ in 0..hops {
        match entries.next() {
            Some(e) => chosen = Some(e),
            None => break,
        }
    }
    chosen.and_then(parse_ip).unwrap_or(peer)
}

/// `1.2.3.4`, `1.2.3.4:80`, `::1` or `[::1]:80`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

/// One L4 connection's line (TCPRoute, TLSRoute).
pub struct L4Record {
    pub(super) time: SystemTime,
    pub(super) started: Instant,
    pub(super) listener: Option<Arc<Listener>>,
    pub(super) target: Option<Arc<L4Target>>,
    pub(super) peer: SocketAddr,
    /// `tcp`, `tls-passthrough` or `tls-terminate`.
    pub(super) protocol: &'static str,
    pub(super) sni: Option<Box<str>>,
    /// Why the connection was not forwarded (no route, no endpoint, ...).
    pub(super) reason: Option<&'static str>,
    pub(super) upstream: Option<SocketAddr>,
    /// Client to backend.
    pub(super) bytes_in: u64,
    /// Backend to client.
    pub(super) bytes_out: u64,
    pub(super) duration: Duration,
}

impl L4Record {
    pub fn new(listener: Option<Arc<Listener>>, peer: SocketAddr, protocol: &'static str) -> Self {
        Self {
            time: SystemTime::now(),
            started: Instant::now(),
            listener,
            target: None,
            peer,
            protocol,
            sni: None,
            reason: None,
            upstream: None,
            bytes_in: 0,
            bytes_out: 0,
            duration: Duration::ZERO,
        }
    }

    pub(crate) fn set_sni(&mut self, sni: Option<&str>) {
        self.sni = sni.map(Into::into);
    }

    pub(crate) fn set_target(&mut self, target: &Arc<L4Target>) {
        self.target = Some(Arc::clone(target));
    }

    pub(crate) fn set_protocol(&mut self, protocol: &'static str) {
        self.protocol = protocol;
    }

    pub(crate) fn refused(&mut self, reason: &'static str) {
        self.reason = Some(reason);
    }

    pub(crate) fn set_upstream(&mut self, upstream: SocketAddr) {
        self.upstream = Some(upstream);
    }

    pub(crate) fn add_bytes(&mut self, bytes_in: u64, bytes_out: u64) {
        self.bytes_in += bytes_in;
        self.bytes_out += bytes_out;
    }

    /// Ends the connection's record and hands it to `log`.
    pub fn finish(mut self: Box<Self>, log: &AccessLog) {
        self.duration = self.started.elapsed();
        log.l4(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's wall time is its start's, whether the clocks were paired before or
    /// after it started, and a pairing older than a second is not used.
    #[test]
    fn wall_time_is_the_start_of_the_request() {
        let close = |a: SystemTime, b: SystemTime| {
            let d = a.duration_since(b).unwrap_or_else(|e| e.duration());
            assert!(d < Duration::from_millis(50), "{a:?} vs {b:?}");
        };
        let started = Instant::now();
        let wall = SystemTime::now();
        close(wall_time(started), wall);
        std::thread::sleep(Duration::from_millis(200));
        // Paired after `started` by the call above, or now: either way the start's.
        close(wall_time(started), wall);
        let later = Instant::now();
        close(wall_time(later), wall + later.duration_since(started));
        let long_ago = started.checked_sub(Duration::from_secs(5));
        if let Some(long_ago) = long_ago {
            close(wall_time(long_ago), wall - Duration::from_secs(5));
        }
    }

    /// The headers a line says are each the first of its name, as a lookup gives,
    /// whether found by a pass (few headers) or by their hashes (many).
    #[test]
    fn logged_headers_are_the_first_of_their_names() {
        for filler in [0, LOGGED_BY_PASS + 1] {
            let mut h = HeaderMap::new();
            for i in 0..filler {
                h.insert(
                    http::HeaderName::try_from(format!("x-filler-{i}")).unwrap(),
                    HeaderValue::from_static("f"),
                );
            }
            h.append(header::USER_AGENT, HeaderValue::from_static(""));
            h.append(header::ACCEPT, HeaderValue::from_static("*/*"));
            h.append(header::USER_AGENT, HeaderValue::from_static("second"));
            h.append(TRACEPARENT, HeaderValue::from_static("tp"));
            h.append(header::HOST, HeaderValue::from_static("a.example"));
            h.append(header::HOST, HeaderValue::from_static("b.example"));
            let logged = LoggedHeaders::of(&h);
            let first = |n| h.get(n).map_or(&[][..], HeaderValue::as_bytes);
            assert_eq!(logged.user_agent, first(header::USER_AGENT), "{filler}");
            assert_eq!(logged.host, first(header::HOST), "{filler}");
            assert_eq!(logged.traceparent, first(TRACEPARENT), "{filler}");
            assert_eq!(logged.host, b"a.example");
        }
        let empty = HeaderMap::new();
        let none = LoggedHeaders::of(&empty);
        assert!(none.host.is_empty() && none.user_agent.is_empty() && none.traceparent.is_empty());
    }

    #[test]
    fn client_is_the_trusted_hops_entry_from_the_right() {
        let peer: IpAddr = "127.0.0.9".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let mut h = HeaderMap::new();
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_static("6.6.6.6, 10.0.0.1"),
        );
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.2:443"));
        let ip = |s: &str| s.parse::<IpAddr>().ok();
        assert_eq!(Some(client_ip(peer, &h, 0)), Some(peer));
        assert_eq!(Some(client_ip(peer, &h, 1)), ip("10.0.0.2"));
        assert_eq!(Some(client_ip(peer, &h, 2)), ip("10.0.0.1"));
        assert_eq!(Some(client_ip(peer, &h, 9)), ip("6.6.6.6"));
        assert_eq!(Some(client_ip(peer, &HeaderMap::new(), 1)), Some(peer));
        h.insert(X_FORWARDED_FOR, HeaderValue::from_static("not-an-ip"));
        assert_eq!(Some(client_ip(peer, &h, 1)), Some(peer));
    }
}
