//! Why a request could not be proxied, and the one function that turns that into a
//! response.

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{Either, Full};

use super::Body;
use super::upstream::BoxError;

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

    fn body(&self) -> &'static str {
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

    pub fn into_response(self) -> Response<Body> {
        local_response(self.status(), self.body())
    }
}

/// A response the proxy makes itself, from static text.
pub fn local_response(status: StatusCode, body: &'static str) -> Response<Body> {
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
