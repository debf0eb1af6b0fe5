//! The request path, as named phases: readiness -> route -> backend pick -> forward.
//!
//! One atomic load of the Snapshot per request; the matched rule's `Arc` is all that is
//! held across the upstream await.

mod error;
mod headers;
mod upstream;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::uri::{Parts, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

pub use error::{ProxyError, local_response};
pub use headers::{X_FORWARDED_FOR, X_FORWARDED_PROTO};
pub use upstream::{UpstreamClient, UpstreamSettings};

use crate::backend::Pick;
use crate::routing::RuleAction;
use crate::snapshot::Snapshot;
use crate::telemetry::{RouteStats, upstream_connect_errors};

/// The response body: the upstream's stream, or a small local answer.
pub type Body = Either<Incoming, Full<Bytes>>;

/// Served on every HTTP listener before routing (seed 003), for load balancer probes.
pub const READYZ_PATH: &str = "/aether/readyz";

/// State shared by every listener and connection.
pub struct ProxyState {
    pub snapshot: ArcSwap<Snapshot>,
    pub draining: AtomicBool,
    upstream: UpstreamClient,
}

impl ProxyState {
    pub fn new(settings: &UpstreamSettings) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            draining: AtomicBool::new(false),
            upstream: upstream::client(settings),
        })
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// What a connection knows about itself, computed once at accept.
pub struct ConnInfo {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub client_ip: HeaderValue,
}

impl ConnInfo {
    pub fn new(local: SocketAddr, peer: SocketAddr) -> Self {
        let client_ip = HeaderValue::try_from(peer.ip().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self {
            local,
            peer,
            client_ip,
        }
    }
}

/// Handles one downstream request. Never fails: every error becomes a response.
pub async fn handle(
    state: Arc<ProxyState>,
    conn: Arc<ConnInfo>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    if req.uri().path() == READYZ_PATH {
        return Ok(readyz(&state));
    }
    let action = match route(&state, &conn, &req) {
        Ok(action) => action,
        Err(unrouted) => {
            let resp = ProxyError::NoRoute.into_response();
            if let Some(stats) = unrouted {
                stats.record(resp.status().as_u16(), started.elapsed());
            }
            return Ok(resp);
        }
    };
    let resp = match forward(&state, &conn, &action, req).await {
        Ok(resp) => resp,
        Err(err) => {
            tracing::debug!(route = %action.route, error = %err, "request failed");
            err.into_response()
        }
    };
    action
        .stats
        .record(resp.status().as_u16(), started.elapsed());
    Ok(resp)
}

fn readyz(state: &ProxyState) -> Response<Body> {
    if state.is_draining() {
        local_response(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        local_response(StatusCode::OK, "ok\n")
    }
}

/// Finds the rule for a request in the current Snapshot. When nothing matches, returns
/// the listener's counter for unrouted requests (none if the socket has no listener).
fn route(
    state: &ProxyState,
    conn: &ConnInfo,
    req: &Request<Incoming>,
) -> Result<Arc<RuleAction>, Option<RouteStats>> {
    let snapshot = state.snapshot.load();
    let Some(listener) = snapshot.listener(&conn.local) else {
        return Err(None);
    };
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    let entry = listener.routes.virtual_host(authority).and_then(|vh| {
        vh.find(
            req.method(),
            req.uri().path(),
            req.uri().query(),
            req.headers(),
        )
    });
    match entry {
        Some(e) => Ok(Arc::clone(&e.action)),
        None => Err(Some(listener.unrouted.clone())),
    }
}

/// Picks a backend endpoint and sends the request there over the pooled client.
async fn forward(
    state: &ProxyState,
    conn: &ConnInfo,
    action: &RuleAction,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let (backend, endpoint) = match action.backends.pick() {
        Pick::Endpoint(b, e) => (b, e),
        Pick::NoEndpoints(_) => return Err(ProxyError::NoEndpoints),
        Pick::Invalid => return Err(ProxyError::InvalidBackend),
    };
    let (mut parts, body) = req.into_parts();

    // HTTP/2 carries the host in :authority; an HTTP/1.1 upstream needs it as Host.
    if !parts.headers.contains_key(header::HOST)
        && let Some(authority) = parts.uri.authority()
    {
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| ProxyError::BadRequest("invalid authority\n"))?;
        parts.headers.insert(header::HOST, host);
    }
    let mut uri = Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(endpoint.authority.clone());
    uri.path_and_query = Some(
        parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    parts.uri =
        Uri::from_parts(uri).map_err(|_| ProxyError::BadRequest("invalid request target\n"))?;
    parts.version = Version::HTTP_11;
    headers::strip_hop_by_hop(&mut parts.headers);
    headers::add_forwarded(&mut parts.headers, &conn.client_ip, "http");

    match state
        .upstream
        .request(Request::from_parts(parts, body))
        .await
    {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            headers::strip_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(parts, Either::Left(body)))
        }
        Err(e) if e.is_connect() => {
            upstream_connect_errors(&backend.name).increment(1);
            tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, error = %e, "upstream connect failed");
            Err(ProxyError::UpstreamConnect(e))
        }
        Err(e) => Err(ProxyError::Upstream(e)),
    }
}
