//! Why a request could not be proxied, and the one function that turns that into a
//! response.

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{Either, Full};

use super::ResponseBody;
use crate::upstream::BoxError;

/// Each variant says who is at fault: the client (no route), the configuration
/// (invalid backend), or the upstream (no endpoints, connect or protocol failure).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches the request's host and path")]
    NoRoute,
    #[error("the route's backend is invalid")]
    InvalidBackend,
    #[error("the backend has no ready endpoints")]
    NoEndpoints,
    #[error("could not connect to the upstream: {0}")]
    UpstreamConnect(#[source] BoxError),
    #[error("the upstream request failed: {0}")]
    Upstream(#[source] BoxError),
    #[error("the upstream did not answer within the route's timeout")]
    Timeout,
    #[error("the request's host is not served with this connection's certificate")]
    Misdirected,
    #[error("the request could not be forwarded: {0}")]
    BadRequest(&'static str),
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::InvalidBackend => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::NoEndpoints | ProxyError::UpstreamConnect(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// Why the edge answered itself, as the access log says it.
    pub fn reason(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "no_route",
            ProxyError::InvalidBackend => "invalid_backend",
            ProxyError::NoEndpoints => "no_healthy_endpoint",
            ProxyError::UpstreamConnect(_) => "upstream_connect_failed",
            ProxyError::Upstream(_) => "upstream_failed",
            ProxyError::Timeout => "route_timeout",
            ProxyError::Misdirected => "misdirected",
            ProxyError::BadRequest(_) => "bad_request",
        }
    }

    pub(crate) fn body(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "no route\n",
            ProxyError::InvalidBackend => "invalid backend\n",
            ProxyError::NoEndpoints => "no healthy upstream\n",
            ProxyError::UpstreamConnect(_) => "upstream connect error\n",
            ProxyError::Upstream(_) => "upstream request failed\n",
            ProxyError::Timeout => "upstream request timeout\n",
            ProxyError::Misdirected => "misdirected request\n",
            ProxyError::BadRequest(msg) => msg,
        }
    }

    pub fn into_response(self) -> Response<ResponseBody> {
        local_response(self.status(), self.body())
    }

    /// The response for this error, as a gRPC client understands it when `grpc`: a
    /// trailers-only answer (HTTP 200, `grpc-status`, `grpc-message`), since gRPC
    /// clients read the status from there and report an HTTP error status only as an
    /// opaque transport failure.
    pub fn into_response_for(self, grpc: bool) -> Response<ResponseBody> {
        if !grpc {
            return self.into_response();
        }
        let mut resp = Response::new(Either::Right(Full::new(Bytes::new())));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/grpc"),
        );
        headers.insert(
            "grpc-status",
            header::HeaderValue::from_static(self.grpc_status()),
        );
        // The bodies are static ASCII text; grpc-message wants percent-encoding only
        // for what these don't contain, so trimming the newline is enough.
        if let Ok(v) = header::HeaderValue::from_str(self.body().trim_end()) {
            headers.insert("grpc-message", v);
        }
        resp
    }

    /// gRPC status codes for what the proxy itself answers: the gRPC project's HTTP
    /// mapping (404 UNIMPLEMENTED, 502/503 UNAVAILABLE, 400/500 INTERNAL), except that
    /// the proxy's own timeout is DEADLINE_EXCEEDED, which is what happened.
    fn grpc_status(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "12",
            ProxyError::InvalidBackend | ProxyError::BadRequest(_) => "13",
            ProxyError::NoEndpoints
            | ProxyError::UpstreamConnect(_)
            | ProxyError::Upstream(_)
            | ProxyError::Misdirected => "14",
            ProxyError::Timeout => "4",
        }
    }
}

/// Is this a gRPC request (`content-type: application/grpc[+proto|;...]`)?
pub fn is_grpc<B>(req: &http::Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A response the proxy makes itself, from static text.
pub fn local_response(status: StatusCode, body: &'static str) -> Response<ResponseBody> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from_static(
        body.as_bytes(),
    ))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    resp
}
