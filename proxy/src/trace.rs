//! Request IDs and distributed tracing.
//!
//! Every request leaves the edge with one `x-request-id`: the client's, when it sent a
//! usable one, else a random UUID the edge makes (thread-local RNG: no lock, no
//! syscall). The response and the access log carry the same ID.
//!
//! With tracing on (`--otlp-endpoint`), the edge takes part in W3C trace context: it
//! continues an incoming `traceparent` (same trace, its own span, the client's span as
//! parent) or starts a trace, and forwards `traceparent` with its own span as the
//! parent. A sampled request (the incoming sampled flag, else `--trace-sample`) carries
//! a boxed [`ServerSpan`] of cheap clones, like an access-log record; when the response
//! body ends it is handed to a bounded channel. An exporter thread turns spans into the
//! OpenTelemetry SDK's `SpanData` and sends them in batches over OTLP/gRPC. The request
//! path never waits: when the queue is full the span is dropped and counted in
//! `aether_trace_spans_dropped_total`.
//!
//! With tracing off, `ProxyState::tracer` is `None` and a request costs one branch.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};
use metrics::Counter;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};

use crate::http::ConnInfo;
use crate::routing::RuleAction;
use crate::telemetry;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Longest client `x-request-id` kept; a longer one is replaced.
pub const MAX_REQUEST_ID: usize = 128;

/// Makes sure `headers` carry exactly one usable `x-request-id` and returns it: the
/// client's first one if it is 1 to [`MAX_REQUEST_ID`] visible ASCII characters, else
/// a new random one.
///
/// The value returned is marked sensitive, which HTTP/2's HPACK encodes as a literal
/// never added to the connection's header table (HTTP/1.1 ignores the flag). An ID is
/// new on every request: indexed, each one took a table entry, evicted a header that
/// does repeat (`content-type`, `server`, ...), and was first compared with every
/// earlier ID in the table (h2's encoder walks the entries of one name): about 1.4% of
/// the core on h2c, for 9 bytes more per answer (benches/RESULTS.md, session 14).
pub fn ensure_request_id(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(first) = headers.get(X_REQUEST_ID)
        && usable_request_id(first.as_bytes())
    {
        let mut id = first.clone();
        id.set_sensitive(true);
        // Replaces any further values, and the kept one with its sensitive copy.
        headers.insert(X_REQUEST_ID, id.clone());
        return id;
    }
    let id = new_request_id();
    headers.insert(X_REQUEST_ID, id.clone());
    id
}

pub(crate) fn usable_request_id(v: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID).contains(&v.len()) && v.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A random (version 4) UUID: one allocation, shared by every clone of the value.
/// Sensitive, so HPACK never indexes it (see [`ensure_request_id`]).
pub fn new_request_id() -> HeaderValue {
    let mut id = header_value(new_request_id_bytes());
    id.set_sensitive(true);
    id
}

/// The same, as text on the stack.
pub(crate) fn new_request_id_bytes() -> [u8; 36] {
    let mut bits = fastrand::u128(..);
    // Version 4, variant 10xx.
    bits = (bits & !(0xf << 76)) | (0x4 << 76);
    bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let mut out = [0u8; 36];
    let mut at = 0;
    for (i, byte) in bits.to_be_bytes().iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[at] = b'-';
            at += 1;
        }
        out[at] = HEX[usize::from(byte >> 4)];
        out[at + 1] = HEX[usize::from(byte & 0xf)];
        at += 2;
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A header value over `bytes`, which are known to be visible ASCII.
fn header_value<const N: usize>(bytes: [u8; N]) -> HeaderValue {
    HeaderValue::from_maybe_shared(Bytes::from_owner(bytes))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A valid W3C `traceparent`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    pub span_id: u64,
    pub flags: u8,
}

impl TraceParent {
    /// Parses `<version>-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`. Version
    /// `00` must be exactly that; a later version may append fields (W3C level 1,
    /// "versioning"). All-zero IDs and version `ff` are invalid.
    pub fn parse(v: &[u8]) -> Option<Self> {
        if v.len() < 55 || (v.len() > 55 && (v.starts_with(b"00") || v[55] != b'-')) {
            return None;
        }
        if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex(&v[0..2])?;
        let trace_id = hex(&v[3..35])?;
        let span_id = u64::try_from(hex(&v[36..52])?).ok()?;
        let flags = u8::try_from(hex(&v[53..55])?).ok()?;
        (version != 0xff && trace_id != 0 && span_id != 0).then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The edge's span after `incoming` (`None`: the edge starts a trace): the same
    /// trace, a new span ID, and parent-based sampling: the client's decision when it
    /// made one, else `ratio`.
    pub fn next(incoming: Option<TraceParent>, ratio: f64) -> TraceParent {
        let sampled = match incoming {
            Some(p) => p.sampled(),
            None => ratio >= 1.0 || fastrand::f64() < ratio,
        };
        TraceParent {
            trace_id: incoming.map_or_else(|| nonzero(|| fastrand::u128(..)), |p| p.trace_id),
            span_id: nonzero(|| fastrand::u64(..)),
            flags: u8::from(sampled),
        }
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The header value (version 00).
    pub fn to_header(self) -> HeaderValue {
        let mut out = [b'-'; 55];
        out[0] = b'0';
        out[1] = b'0';
        put_hex(&mut out[3..35], self.trace_id);
        put_hex(&mut out[36..52], u128::from(self.span_id));
        put_hex(&mut out[53..55], u128::from(self.flags & 1));
        header_value(out)
    }
}

/// Lower-case hex only, as W3C requires; at most 32 digits.
fn hex(s: &[u8]) -> Option<u128> {
    s.iter().try_fold(0u128, |n, &b| {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some(n << 4 | u128::from(d))
    })
}

/// Writes `n`'s low `out.len()` hex digits into `out`.
fn put_hex(out: &mut [u8], mut n: u128) {
    for b in out.iter_mut().rev() {
        *b = HEX[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The collector's OTLP/gRPC endpoint, `http://host:4317`.
    pub endpoint: String,
    /// Share of requests without a sampled-or-not decision from the client that are
    /// traced, 0.0 to 1.0.
    pub sample: f64,
}

/// Spans waiting for the exporter. A burst larger than this while the collector is
/// slow loses spans (counted) rather than holding requests or growing memory.
pub const CAPACITY: usize = 4096;

impl Settings {
    /// Every request is traced unless the client's `traceparent` says otherwise.
    pub const DEFAULT_SAMPLE: f64 = 1.0;
}
/// Spans sent in one export call at most.
const MAX_BATCH: usize = 512;
/// How long a span may wait for a batch to fill.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// One export call's bound; the queue fills (and drops) while it waits.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

enum Entry {
    Span(Box<ServerSpan>),
    /// Export everything before this and say so.
    Flush(SyncSender<()>),
}

/// The process's tracer: the sampling ratio and the exporter's channel.
pub struct Tracer {
    sample: f64,
    tx: SyncSender<Entry>,
    dropped: Counter,
}

impl Tracer {
    /// Starts the exporter thread (its own single-threaded runtime for the gRPC client)
    /// and returns the tracer. Leaked on purpose, like the access log: one per process.
    pub fn start(settings: &Settings) -> Result<&'static Tracer, String> {
        if !(settings.endpoint.starts_with("http://") || settings.endpoint.starts_with("https://"))
        {
            return Err(format!(
                "--otlp-endpoint {}: give the collector's OTLP/gRPC URL, http://host:4317 \
                 or https://host:4317",
                settings.endpoint
            ));
        }
        let (tx, rx) = mpsc::sync_channel(CAPACITY);
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let endpoint = settings.endpoint.clone();
        std::thread::Builder::new()
            .name("trace-export".into())
            .spawn(move || export_thread(&endpoint, rx, &ready_tx))
            .map_err(|e| format!("cannot start the trace exporter thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "the trace exporter thread died".to_owned())??;
        Ok(Box::leak(Box::new(Tracer {
            sample: settings.sample,
            tx,
            dropped: metrics::counter!(telemetry::TRACE_SPANS_DROPPED_TOTAL, "reason" => "queue_full"),
        })))
    }

    /// Continues or starts the request's trace: rewrites its `traceparent` to name the
    /// edge's span as the parent, and returns the span when the request is sampled.
    pub fn begin<B>(
        &'static self,
        req: &mut Request<B>,
        conn: &ConnInfo,
        trusted_hops: usize,
        started: Instant,
    ) -> Option<Box<ServerSpan>> {
        let headers = req.headers_mut();
        let incoming = headers
            .get(TRACEPARENT)
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        if incoming.is_none() {
            // A tracestate without a valid traceparent belongs to no trace.
            headers.remove(TRACESTATE);
        }
        let ours = TraceParent::next(incoming, self.sample);
        headers.insert(TRACEPARENT, ours.to_header());
        if !ours.sampled() {
            return None;
        }
        Some(Box::new(ServerSpan {
            tracer: self,
            context: ours,
            parent: incoming.map_or(0, |p| p.span_id),
            time: SystemTime::now(),
            started,
            method: req.method().clone(),
            uri: req.uri().clone(),
            host: req.headers().get(http::header::HOST).cloned(),
            version: req.version(),
            scheme: conn.scheme,
            local: conn.local,
            client: crate::access_log::client_ip(conn.peer.ip(), req.headers(), trusted_hops),
            rule: None,
            upstream: None,
            status: 0,
            reason: None,
            response_bytes: 0,
            duration: Duration::ZERO,
        }))
    }

    fn send(&self, span: Box<ServerSpan>) {
        match self.tx.try_send(Entry::Span(span)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.increment(1);
            }
        }
    }

    /// Blocks until every span ended so far is exported (or failed to be), or
    /// `timeout` passes: call at exit, from a thread that may block.
    pub fn flush(&self, timeout: Duration) {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        let deadline = Instant::now() + timeout;
        let mut entry = Entry::Flush(ack_tx);
        loop {
            match self.tx.try_send(entry) {
                Ok(()) => break,
                Err(TrySendError::Full(e)) if Instant::now() < deadline => {
                    entry = e;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = ack_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("sample", &self.sample)
            .finish_non_exhaustive()
    }
}

fn nonzero<T: Default + PartialEq>(mut random: impl FnMut() -> T) -> T {
    loop {
        let n = random();
        if n != T::default() {
            return n;
        }
    }
}

/// One sampled request's server span, gathered on the request path as cheap clones
/// and turned into OTLP only on the exporter thread.
pub struct ServerSpan {
    tracer: &'static Tracer,
    /// The edge's own span: the trace, its ID, the sampled flag.
    context: TraceParent,
    /// The client's span; 0: the edge started the trace.
    parent: u64,
    time: SystemTime,
    started: Instant,
    method: Method,
    uri: Uri,
    host: Option<HeaderValue>,
    version: Version,
    scheme: &'static str,
    local: SocketAddr,
    client: IpAddr,
    rule: Option<Arc<RuleAction>>,
    upstream: Option<SocketAddr>,
    status: u16,
    reason: Option<&'static str>,
    response_bytes: u64,
    duration: Duration,
}

impl ServerSpan {
    pub(crate) fn set_rule(&mut self, rule: &Arc<RuleAction>) {
        self.rule = Some(Arc::clone(rule));
    }

    pub(crate) fn set_upstream(&mut self, endpoint: SocketAddr) {
        self.upstream = Some(endpoint);
    }

    pub(crate) fn set_answer(&mut self, status: u16, reason: Option<&'static str>) {
        self.status = status;
        self.reason = reason;
    }

    /// Ends the span (the response body ended, failed or was dropped) and queues it.
    pub(crate) fn end(mut self: Box<Self>, response_bytes: u64) {
        self.duration = self.started.elapsed();
        self.response_bytes = response_bytes;
        self.tracer.send(self);
    }

    /// The OpenTelemetry SDK's form, with attributes after the HTTP semantic
    /// conventions; on the exporter thread.
    fn to_span_data(&self, scope: &InstrumentationScope) -> SpanData {
        let method = semconv_method(&self.method);
        let route = self.rule.as_ref().map(|r| Arc::clone(r.route()));
        let name: Cow<'static, str> = match &route {
            Some(r) => format!("{method} {r}").into(),
            None => Cow::Borrowed(method),
        };
        let authority = self
            .uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| self.host.as_ref().and_then(|h| h.to_str().ok()))
            .unwrap_or("");
        let mut attributes = Vec::with_capacity(16);
        attributes.push(KeyValue::new("http.request.method", method));
        if method == "_OTHER" {
            attributes.push(KeyValue::new(
                "http.request.method_original",
                self.method.as_str().to_owned(),
            ));
        }
        attributes.push(KeyValue::new("url.scheme", self.scheme));
        attributes.push(KeyValue::new("url.path", self.uri.path().to_owned()));
        attributes.push(KeyValue::new(
            "server.address",
            crate::http::strip_port(authority).to_owned(),
        ));
        attributes.push(KeyValue::new("server.port", i64::from(self.local.port())));
        attributes.push(KeyValue::new("client.address", self.client.to_string()));
        attributes.push(KeyValue::new(
            "network.protocol.version",
            protocol_version(self.version),
        ));
        attributes.push(KeyValue::new(
            "http.response.status_code",
            i64::from(self.status),
        ));
        attributes.push(KeyValue::new(
            "http.response.body.size",
            i64::try_from(self.response_bytes).unwrap_or(i64::MAX),
        ));
        if let Some(rule) = &self.rule {
            attributes.push(KeyValue::new("http.route", rule.route().to_string()));
            attributes.push(KeyValue::new("aether.route.kind", rule.kind.as_str()));
            if let Some(name) = rule.rule() {
                attributes.push(KeyValue::new("aether.route.rule", name.to_string()));
            }
        }
        if let Some(up) = self.upstream {
            attributes.push(KeyValue::new(
                "aether.upstream.address",
                up.ip().to_string(),
            ));
            attributes.push(KeyValue::new("aether.upstream.port", i64::from(up.port())));
        }
        if let Some(reason) = self.reason {
            attributes.push(KeyValue::new("aether.reason", reason));
        }
        // Server spans: only 5xx is the server's error (the HTTP conventions).
        let status = if self.status >= 500 {
            let error = self
                .reason
                .map_or_else(|| self.status.to_string(), str::to_owned);
            attributes.push(KeyValue::new("error.type", error));
            Status::error("")
        } else {
            Status::Unset
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(self.context.trace_id),
                SpanId::from(self.context.span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::from(self.parent),
            parent_span_is_remote: self.parent != 0,
            span_kind: SpanKind::Server,
            name,
            start_time: self.time,
            end_time: self.time + self.duration,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        }
    }
}

/// The method as the conventions name it: the standard ones, else `_OTHER`.
fn semconv_method(m: &Method) -> &'static str {
    crate::http::standard_method(m).unwrap_or("_OTHER")
}

fn protocol_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// The exporter thread: builds the OTLP client, says whether that worked, then
/// batches spans (up to [`MAX_BATCH`], or what came in [`BATCH_DELAY`]) and exports.
fn export_thread(endpoint: &str, rx: Receiver<Entry>, ready: &SyncSender<Result<(), String>>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start the trace exporter runtime: {e}")));
            return;
        }
    };
    let built = {
        // The gRPC channel is made on this runtime (and connects lazily).
        let _entered = runtime.enter();
        let builder = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT);
        if endpoint.starts_with("https://") {
            // The system's roots (SSL_CERT_FILE / SSL_CERT_DIR point elsewhere).
            builder
                .with_tls_config(ClientTlsConfig::new().with_native_roots())
                .build()
        } else {
            builder.build()
        }
    };
    let mut exporter = match built {
        Ok(e) => e,
        Err(e) => {
            let _ = ready.send(Err(format!("--otlp-endpoint {endpoint}: {e}")));
            return;
        }
    };
    exporter.set_resource(&resource());
    let _ = ready.send(Ok(()));
    let scope = InstrumentationScope::builder("aether-edge")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let exported = metrics::counter!(telemetry::TRACE_SPANS_EXPORTED_TOTAL);
    let failed =
        metrics::counter!(telemetry::TRACE_SPANS_DROPPED_TOTAL, "reason" => "export_failed");
    let mut batch: Vec<SpanData> = Vec::with_capacity(MAX_BATCH);
    let export = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let spans = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
        match runtime.block_on(exporter.export(spans)) {
            Ok(()) => exported.increment(n),
            Err(e) => {
                failed.increment(n);
                tracing::debug!(error = %e, spans = n, "trace export failed");
            }
        }
    };
    let mut first_at: Option<Instant> = None;
    loop {
        let entry = match first_at {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => rx.recv_timeout(BATCH_DELAY.saturating_sub(at.elapsed())),
        };
        match entry {
            Ok(Entry::Span(span)) => {
                batch.push(span.to_span_data(&scope));
                first_at.get_or_insert_with(Instant::now);
                if batch.len() >= MAX_BATCH {
                    export(&mut batch);
                    first_at = None;
                }
            }
            Ok(Entry::Flush(ack)) => {
                export(&mut batch);
                first_at = None;
                let _ = ack.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                export(&mut batch);
                first_at = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                export(&mut batch);
                return;
            }
        }
    }
}

/// `service.name` is `aether-edge` unless OTEL_SERVICE_NAME says otherwise;
/// OTEL_RESOURCE_ATTRIBUTES adds to it.
fn resource() -> opentelemetry_sdk::Resource {
    let builder = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name("aether-edge").build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_rejects_what_w3c_rejects() {
        let s = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = TraceParent::parse(s);
        assert_eq!(
            p,
            Some(TraceParent {
                trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
                span_id: 0x00f067aa0ba902b7,
                flags: 1
            })
        );
        assert_eq!(
            p.map(|p| p.to_header()),
            Some(HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            ))
        );
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(
                TraceParent::parse(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A later version may carry more fields; the first four are read.
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        assert_eq!(TraceParent::parse(later).map(|p| p.sampled()), Some(false));
    }

    #[test]
    fn sampling_follows_the_client_else_the_ratio() {
        let client = |flags| TraceParent {
            trace_id: 7,
            span_id: 9,
            flags,
        };
        for ratio in [0.0, 0.5, 1.0] {
            // The client's decision wins either way; the trace is kept, the span is new.
            for flags in [0, 1] {
                let next = TraceParent::next(Some(client(flags)), ratio);
                assert_eq!((next.trace_id, next.flags), (7, flags), "ratio {ratio}");
                assert!(next.span_id != 9 && next.span_id != 0);
            }
        }
        assert!((0..100).all(|_| !TraceParent::next(None, 0.0).sampled()));
        assert!((0..100).all(|_| TraceParent::next(None, 1.0).sampled()));
        let half = (0..2000)
            .filter(|_| TraceParent::next(None, 0.5).sampled())
            .count();
        assert!((800..1200).contains(&half), "{half} of 2000 at 0.5");
        let a = TraceParent::next(None, 1.0);
        let b = TraceParent::next(None, 1.0);
        assert!(a.trace_id != 0 && a.trace_id != b.trace_id);
    }

    #[test]
    fn request_ids_are_kept_when_usable_and_made_otherwise() {
        let mut h = HeaderMap::new();
        h.append(X_REQUEST_ID, HeaderValue::from_static("client-id-1"));
        h.append(X_REQUEST_ID, HeaderValue::from_static("second"));
        assert_eq!(ensure_request_id(&mut h), "client-id-1");
        assert_eq!(h.get_all(X_REQUEST_ID).iter().count(), 1);
        // Never indexed by HPACK, whichever way the ID came: one client ID or two,
        // or a new one, in the request as in what the caller puts in the answer.
        let mut one = HeaderMap::new();
        one.insert(X_REQUEST_ID, HeaderValue::from_static("client-id-2"));
        assert!(ensure_request_id(&mut one).is_sensitive());
        assert!(one.get(X_REQUEST_ID).is_some_and(HeaderValue::is_sensitive));
        assert!(h.get(X_REQUEST_ID).is_some_and(HeaderValue::is_sensitive));
        let mut fresh = HeaderMap::new();
        assert!(ensure_request_id(&mut fresh).is_sensitive());
        assert!(
            fresh
                .get(X_REQUEST_ID)
                .is_some_and(HeaderValue::is_sensitive)
        );

        let made = ensure_request_id(&mut HeaderMap::new());
        let s = made.to_str().unwrap_or("");
        assert_eq!(s.len(), 36);
        assert_eq!(s.as_bytes()[14], b'4', "{s}");
        assert!(s.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()), "{s}");
        assert_ne!(made, ensure_request_id(&mut HeaderMap::new()));

        for bad in ["", "has space", &"x".repeat(MAX_REQUEST_ID + 1)] {
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(bad) {
                h.insert(X_REQUEST_ID, v);
            }
            let id = ensure_request_id(&mut h);
            assert_eq!(id.len(), 36, "{bad:?} was kept");
            assert_eq!(h.get(X_REQUEST_ID), Some(&id));
        }
    }
}
