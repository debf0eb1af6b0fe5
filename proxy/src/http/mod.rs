//! The request path, as named phases: readiness -> route -> backend pick -> forward.
//!
//! One atomic load of the Snapshot per request; the matched rule's `Arc` is all that is
//! held across the upstream await.

mod error;
mod headers;
mod integrity;
mod mirror;
pub(crate) mod outbound;
mod rule_timeout;
mod upgrade;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::{Body as _, Incoming};

pub use error::{ProxyError, local_response};
pub use headers::{X_ENVOY_ORIGINAL_DST_HOST, X_FORWARDED_FOR, X_FORWARDED_PROTO};
pub(crate) use upgrade::requested as upgrade_requested;

use crate::access_log::{self, HttpRecord, LoggedBody, RequestBody};
use crate::relay::{RelayedBody, full_path};
use crate::state::ProxyState;
use crate::upstream::{UpstreamBody, Upstreams, attempts};
use rule_timeout::within_rule_timeout;

use crate::backend::{Pick, UpstreamProtocol};
use crate::cors::Cors;
use crate::filters::{Redirect, RedirectInput};
use crate::routing::RuleAction;
use crate::telemetry::RouteStats;
use crate::trace::{self, ServerSpan};

/// A request body sent upstream: the client's stream, or one the proxy made (a
/// mirrored or replayed request's).
pub type Body = Either<RequestBody, Full<Bytes>>;

/// A request on its way through the proxy: the client's body, counted for the access
/// log when the request is logged.
type Req = Request<RequestBody>;

/// A request's access-log record, when it is logged.
type Record = Option<Box<HttpRecord>>;

/// A request's server span, when tracing is on and the request is sampled.
type Span = Option<Box<ServerSpan>>;

/// An answer's body: the upstream's stream (through hyper's client, or read as bytes:
/// `crate::relay::full_path`), or one the proxy made.
pub type ResponseBody = Either<Either<UpstreamBody, RelayedBody>, Full<Bytes>>;

/// Served on every HTTP listener before routing, for load balancer probes.
pub const READYZ_PATH: &str = "/aether/readyz";

/// What a connection knows about itself, computed once at accept (and handshake).
pub struct ConnInfo {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub client_ip: HeaderValue,
    /// `https` when TLS was terminated, for `x-forwarded-proto` and redirects.
    pub scheme: &'static str,
    /// The TLS server name the client asked for.
    pub sni: Option<Box<str>>,
    /// The upstream pools of the worker serving this connection.
    pub(crate) upstreams: Arc<Upstreams>,
}

impl ConnInfo {
    pub fn new(local: SocketAddr, peer: SocketAddr, upstreams: Arc<Upstreams>) -> Self {
        let client_ip = HeaderValue::try_from(peer.ip().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self {
            local,
            peer,
            client_ip,
            scheme: "http",
            sni: None,
            upstreams,
        }
    }

    /// The same, for a connection whose TLS handshake chose `sni`.
    pub fn tls(mut self, sni: Option<&str>) -> Self {
        self.scheme = "https";
        self.sni = sni.map(Into::into);
        self
    }
}

/// Handles one downstream request. Never fails: every error becomes a response.
pub async fn handle(
    state: Arc<ProxyState>,
    conn: Arc<ConnInfo>,
    mut req: Request<Incoming>,
) -> Result<Response<LoggedBody>, Infallible> {
    let started = Instant::now();
    if req.uri().path() == READYZ_PATH {
        // Load-balancer probes, once a second per balancer: not access-logged.
        return Ok(readyz(&state).map(|b| LoggedBody::new(b, None)));
    }
    // Before the access log reads them: the upstream, the log and the client see the
    // same request ID and (tracing on) the edge's traceparent.
    let request_id = trace::ensure_request_id(req.headers_mut());
    let mut span = match state.tracer {
        Some(tracer) => tracer.begin(&mut req, &conn, state.trusted_hops, started),
        None => None,
    };
    let mut record = access_log::begin_http(
        state.access_log,
        &conn,
        &req,
        request_id.as_bytes(),
        state.trusted_hops,
        started,
    );
    let counter = record.as_ref().and_then(|r| r.request_counter());
    let ended = ended_at_start(&req);
    let req = req.map(|b| RequestBody::new(b, counter, ended));
    // The phases before and after forwarding are plain functions, so the one await is
    // here and this future holds the forwarding future directly: each async level
    // between would add its own copy of the request and of everything below it (the
    // futures are copied whole as they are built).
    let (routed, grpc) = match admit(&state, &conn, &req, started, &mut record, &mut span) {
        Admitted::Answered(answer) => return Ok(respond(answer, request_id, record, span)),
        Admitted::Routed(routed, grpc) => (routed, grpc),
    };
    let mut tried = attempts::Tried::default();
    let result = forward(&state, &conn, &routed, req, &mut tried).await;
    let after = After {
        routed: &routed,
        grpc,
        tried: &tried,
        started,
    };
    let answer = settle(result, &after, &mut record, &mut span);
    // The request's own reference to its rule goes to the record: a clone would be
    // two atomic operations more per logged request.
    if let Some(r) = record.as_mut() {
        r.take_rule(routed.action);
    }
    Ok(respond(answer, request_id, record, span))
}

/// One of HTTP's own methods by its name as a constant, `None` for an extension
/// method (whose name lives only as long as the request).
pub(crate) fn standard_method(m: &Method) -> Option<&'static str> {
    Some(match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => return None,
    })
}

/// Whether a request is known at its start to have no body. hyper gives an exact size
/// of zero to a request without one: in HTTP/1.1 one with no Content-Length and no
/// Transfer-Encoding, in HTTP/2 one whose HEADERS frame ended the stream. A declared
/// `Content-Length: 0` gives the same size to an HTTP/2 stream that may still be open
/// (for trailers), so that one is left to `is_end_stream`.
fn ended_at_start(req: &Request<Incoming>) -> bool {
    req.body().size_hint().exact() == Some(0) && !req.headers().contains_key(header::CONTENT_LENGTH)
}

/// The client's response: the request ID, and the record and span ended with its body.
fn respond(
    (mut resp, status, reason): Answer,
    request_id: HeaderValue,
    mut record: Record,
    mut span: Span,
) -> Response<LoggedBody> {
    resp.headers_mut().insert(trace::X_REQUEST_ID, request_id);
    if let Some(r) = record.as_mut() {
        r.set_answer(status.as_u16(), reason);
    }
    if let Some(s) = span.as_mut() {
        s.set_answer(status.as_u16(), reason);
    }
    resp.map(|b| LoggedBody::new(b, record).traced(span))
}

/// An answer with the status it counts as (the HTTP one, also when a gRPC client is
/// told in gRPC terms) and why the edge answered itself, if it did.
type Answer = (Response<ResponseBody>, StatusCode, Option<&'static str>);

/// What the checks before forwarding decided.
#[expect(
    clippy::large_enum_variant,
    reason = "returned at once, never held across an await; a box would add an allocation to every answer the edge makes"
)]
enum Admitted {
    /// Answered at the edge: overloaded, invalid, too large, or no route.
    Answered(Answer),
    /// The request matched a rule; whether the client speaks gRPC.
    Routed(Routed, bool),
}

/// The checks before forwarding, and routing.
fn admit(
    state: &Arc<ProxyState>,
    conn: &ConnInfo,
    req: &Req,
    started: Instant,
    record: &mut Record,
    span: &mut Span,
) -> Admitted {
    if state.shedding.load(Ordering::Relaxed) {
        metrics::counter!(crate::telemetry::OVERLOAD_SHED_TOTAL, "what" => "request").increment(1);
        let mut resp = local_response(StatusCode::SERVICE_UNAVAILABLE, "overloaded\n");
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Admitted::Answered((resp, StatusCode::SERVICE_UNAVAILABLE, Some("overloaded")));
    }
    if let Err(why) = integrity::check(req) {
        metrics::counter!(crate::telemetry::REQUESTS_REFUSED_TOTAL, "reason" => "integrity")
            .increment(1);
        let err = ProxyError::BadRequest(why);
        return Admitted::Answered((
            err.into_response(),
            StatusCode::BAD_REQUEST,
            Some("invalid_request"),
        ));
    }
    if let Some(limit) = state.max_request_body
        && announced_body(req).is_some_and(|n| n > limit)
    {
        metrics::counter!(crate::telemetry::REQUESTS_REFUSED_TOTAL, "reason" => "body_too_large")
            .increment(1);
        let status = StatusCode::PAYLOAD_TOO_LARGE;
        let resp = local_response(status, "request body too large\n");
        return Admitted::Answered((resp, status, Some("body_too_large")));
    }
    let grpc = error::is_grpc(req);
    match route(state, conn, req, record) {
        Ok(routed) => {
            if let Some(s) = span.as_mut() {
                s.set_rule(&routed.action);
            }
            Admitted::Routed(routed, grpc)
        }
        Err(miss) => {
            let (err, stats) = match miss {
                RouteMiss::NoListener => (ProxyError::NoRoute, None),
                RouteMiss::NoRoute(stats) => (ProxyError::NoRoute, Some(stats)),
                RouteMiss::Misdirected(stats) => (ProxyError::Misdirected, Some(stats)),
            };
            let (status, reason) = (err.status(), err.reason());
            if let Some(stats) = stats {
                stats.record(status.as_u16(), started.elapsed());
            }
            Admitted::Answered((err.into_response_for(grpc), status, Some(reason)))
        }
    }
}

/// What `settle` needs to know of the forwarded request.
struct After<'a> {
    routed: &'a Routed,
    grpc: bool,
    tried: &'a attempts::Tried,
    started: Instant,
}

/// The forwarded request's answer: where it went into the record and span, a failure
/// made into the client's response, the rule's counters.
fn settle(
    result: Result<Forwarded, ProxyError>,
    after: &After<'_>,
    record: &mut Record,
    span: &mut Span,
) -> Answer {
    let action = &after.routed.action;
    // One clock read for the log's upstream time and the rule's latency: about 60 ns
    // each on a virtual machine.
    let elapsed = after.started.elapsed();
    if let (Some(r), Some(endpoint)) = (record.as_mut(), after.tried.endpoint) {
        r.set_upstream(endpoint, after.tried.retries, elapsed);
    }
    if let (Some(s), Some(endpoint)) = (span.as_mut(), after.tried.endpoint) {
        s.set_upstream(endpoint);
    }
    let (resp, status, reason) = match result {
        Ok((resp, local)) => {
            let status = resp.status();
            (resp, status, local)
        }
        Err(err) => {
            tracing::debug!(route = %action.route(), error = %err, "request failed");
            let (status, reason) = (err.status(), err.reason());
            (err.into_response_for(after.grpc), status, Some(reason))
        }
    };
    action.stats.record(status.as_u16(), elapsed);
    (resp, status, reason)
}

/// The body length a request announces in Content-Length (malformed values were
/// already refused by the integrity check).
fn announced_body(req: &Req) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn readyz(state: &ProxyState) -> Response<ResponseBody> {
    match state.not_ready() {
        Some(why) => local_response(StatusCode::SERVICE_UNAVAILABLE, why),
        None => local_response(StatusCode::OK, "ok\n"),
    }
}

/// The rule a request matched, and what its filters need to know about the match.
pub(crate) struct Routed {
    pub(crate) action: Arc<RuleAction>,
    /// Bytes of the path the rule's path match covered, for ReplacePrefixMatch.
    pub(crate) matched_prefix: usize,
    /// The Gateway listener's port, for redirects that keep it.
    pub(crate) listener_port: u16,
    /// `http` or `https`: how the client reached the listener.
    pub(crate) scheme: &'static str,
}

/// Why a request found no rule; the listener's counter for unrouted requests comes
/// along when there is a listener.
enum RouteMiss {
    NoListener,
    NoRoute(Arc<RouteStats>),
    /// The Host is served with another certificate than the one this TLS connection
    /// negotiated (the spec's 421 case).
    Misdirected(Arc<RouteStats>),
}

/// Finds the rule for a request in the current Snapshot.
fn route(
    state: &ProxyState,
    conn: &ConnInfo,
    req: &Req,
    record: &mut Record,
) -> Result<Routed, RouteMiss> {
    let snapshot = state.snapshot.load();
    let Some(listener) = snapshot.listeners.get(&conn.local) else {
        return Err(RouteMiss::NoListener);
    };
    if let Some(r) = record.as_mut() {
        r.set_listener(listener);
    }
    let authority = request_authority(req);
    if let (Some(certs), Some(sni)) = (&listener.tls, conn.sni.as_deref()) {
        // A client may send another host over this connection only if the certificate
        // it was given is the one that host is served with.
        let host = strip_port(authority);
        let same = match (certs.lookup(Some(sni)), certs.lookup(Some(host))) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if !same {
            return Err(RouteMiss::Misdirected(listener.unrouted.clone()));
        }
    }
    let entry = listener.routes.virtual_host(authority).and_then(|vh| {
        vh.find(
            req.method(),
            req.uri().path(),
            req.uri().query(),
            req.headers(),
        )
    });
    match entry {
        Some(e) => Ok(Routed {
            action: Arc::clone(&e.action),
            matched_prefix: e.matcher.path.matched_prefix_len(),
            listener_port: listener.port,
            scheme: conn.scheme,
        }),
        None => Err(RouteMiss::NoRoute(listener.unrouted.clone())),
    }
}

/// `host:port` without the port (IPv6 literals keep their brackets).
pub(crate) fn strip_port(authority: &str) -> &str {
    authority
        .rsplit_once(':')
        .filter(|(h, p)| !h.ends_with(':') && p.bytes().all(|b| b.is_ascii_digit()))
        .map_or(authority, |(h, _)| h)
}

/// An answer, and why the edge made it itself when it did (a preflight, a redirect).
type Forwarded = (Response<ResponseBody>, Option<&'static str>);

/// Applies the rule's filters, picks a backend endpoint and sends the request there
/// over the pooled client; `tried` learns where it went.
async fn forward(
    state: &Arc<ProxyState>,
    conn: &ConnInfo,
    routed: &Routed,
    mut req: Req,
    tried: &mut attempts::Tried,
) -> Result<Forwarded, ProxyError> {
    let action = &routed.action;
    if let Some(cors) = &action.filters.cors
        && Cors::is_preflight(req.method(), req.headers())
    {
        // Preflights are answered at the edge; the backend never sees them.
        let mut resp = local_response(StatusCode::OK, "");
        resp.headers_mut()
            .extend(cors.preflight_headers(req.headers()));
        return Ok((resp, Some("cors_preflight")));
    }
    if let Some(redirect) = &action.filters.redirect {
        return Ok((redirect_response(redirect, routed, &req), Some("redirect")));
    }
    // CORS response headers depend on the request's Origin, which filters may not see
    // again once the request is gone upstream.
    let cors_headers = action.filters.cors.as_ref().map(|cors| {
        let mut h = http::HeaderMap::new();
        cors.apply_to_response(req.headers(), &mut h);
        h
    });
    let (chosen, backend, endpoint) = match action.backends.pick() {
        Pick::Endpoint(c, b, e) => (c, b, e),
        Pick::NoEndpoints(_) => return Err(ProxyError::NoEndpoints),
        Pick::Invalid => return Err(ProxyError::InvalidBackend),
    };
    if let Some(redirect) = &chosen.filters.redirect {
        return Ok((redirect_response(redirect, routed, &req), Some("redirect")));
    }
    let upgrade = if upgrade::requested(&req) {
        req.headers()
            .get(header::UPGRADE)
            .cloned()
            .map(|proto| (proto, hyper::upgrade::on(&mut req)))
    } else {
        None
    };
    let (mut parts, body) = req.into_parts();
    let (upgrade_proto, downstream_upgrade) = upgrade.unzip();
    let path_and_query = outbound::prepare(
        &mut parts,
        &outbound::Context {
            routed,
            backend_filters: &chosen.filters,
            client_ip: &conn.client_ip,
            trusted_hops: state.trusted_hops,
        },
    )?;
    if !action.filters.mirrors.is_empty() {
        mirror::send(
            &conn.upstreams,
            &action.filters.mirrors,
            action.backend_client_cert(),
            &parts,
            &path_and_query,
            body.is_end_stream(),
        );
    }
    let protocol = conn.upstreams.protocol_for(backend);
    let as_bytes = state.http1_relay
        && full_path::takes(
            &parts.method,
            body.is_end_stream(),
            protocol,
            action.retry().is_some(),
            upgrade_proto.is_some(),
        );
    if as_bytes {
        let exchange = full_path::exchange(
            &conn.upstreams.relay,
            backend,
            endpoint,
            &parts,
            &path_and_query,
            tried,
        );
        let resp = within_rule_timeout(action.timeout(), exchange).await?;
        return Ok((
            answered(resp.map(Either::Right), routed, chosen, cors_headers),
            None,
        ));
    }
    // A WebSocket to an HTTP/2 upstream goes as extended CONNECT (see `upgrade`); its
    // answer needs the client's key.
    let extended_connect = matches!(
        protocol,
        UpstreamProtocol::H2c | UpstreamProtocol::H2Tls | UpstreamProtocol::Mesh
    ) && upgrade_proto.as_ref().is_some_and(upgrade::is_websocket);
    let ws_key = extended_connect
        .then(|| parts.headers.get(header::SEC_WEBSOCKET_KEY).cloned())
        .flatten();
    // Boxed: this exchange's future (retries, HTTP/2 and mesh clients, bodies) is
    // several times the byte exchange's above, and inline it would set the size of
    // every request's future, which is copied whole as each level is built.
    let exchange = Box::pin(attempts::exchange(
        attempts::Target {
            upstreams: &conn.upstreams,
            policy: action.retry(),
            backend,
            client_cert: action.backend_client_cert().map(Arc::as_ref),
            endpoint,
            protocol,
        },
        parts,
        path_and_query,
        body,
        upgrade_proto.as_ref(),
        tried,
    ));
    let mut resp = within_rule_timeout(action.timeout(), exchange).await?;
    if extended_connect && resp.status() == StatusCode::OK {
        upgrade::to_switching(&mut resp, ws_key.as_ref());
    }
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upgraded_to = switching
        .then(|| resp.headers().get(header::UPGRADE).cloned())
        .flatten();
    if let (true, Some(down)) = (switching, downstream_upgrade) {
        upgrade::tunnel(down, &mut resp);
    }
    let mut resp = answered(resp.map(Either::Left), routed, chosen, cors_headers);
    if let (true, Some(proto)) = (switching, upgraded_to) {
        upgrade::restore_headers(resp.headers_mut(), proto);
    }
    Ok((resp, None))
}

/// The upstream's answer as the client gets it: hop-by-hop headers out, the rule's and
/// backend's response header filters and CORS headers in.
fn answered(
    resp: Response<Either<UpstreamBody, RelayedBody>>,
    routed: &Routed,
    chosen: &crate::backend::WeightedBackend,
    cors_headers: Option<http::HeaderMap>,
) -> Response<ResponseBody> {
    let (mut parts, body) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    for filters in [&chosen.filters, &routed.action.filters] {
        if let Some(m) = &filters.response_headers {
            m.apply(&mut parts.headers);
        }
    }
    if let Some(h) = cors_headers {
        parts.headers.extend(h);
    }
    Response::from_parts(parts, Either::Left(body))
}

fn redirect_response(redirect: &Redirect, routed: &Routed, req: &Req) -> Response<ResponseBody> {
    let host = strip_port(request_authority(req));
    let location = redirect.location(&RedirectInput {
        scheme: routed.scheme,
        host,
        listener_port: routed.listener_port,
        path: req.uri().path(),
        query: req.uri().query(),
        matched_prefix: routed.matched_prefix,
    });
    let mut resp = local_response(redirect.status, "");
    match HeaderValue::try_from(location) {
        Ok(v) => {
            resp.headers_mut().insert(header::LOCATION, v);
            resp
        }
        Err(_) => {
            ProxyError::BadRequest("cannot build a redirect for this request\n").into_response()
        }
    }
}

/// The request's authority: from an absolute-form or HTTP/2 URI, else the Host header.
fn request_authority<B>(req: &Request<B>) -> &str {
    req.uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("")
}
