//! The upstream exchange of one request, with its retries (policy: `crate::retry`).
//!
//! The pooled HTTP/1.1 client consumes the request it sends, so a request that may be
//! retried keeps its head (one clone per attempt but the last) and its body as
//! `Bytes`. That happens only when a retry is possible: the rule has a `retry`, or the
//! request has no body and the Service another endpoint to try after a failed connect
//! (issue #9: plain mode retries that once, as mesh mode does). Every other request
//! takes the single-attempt path and pays nothing.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts as RequestParts;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Body as _, Incoming};

use super::{ProxyError, outbound};
use crate::backend::{Backend, Endpoint, UpstreamProtocol};
use crate::retry::{MAX_REPLAY_BODY, RetryPolicy, is_idempotent};
use crate::telemetry::{UPSTREAM_RETRIES_TOTAL, upstream_connect_errors};
use crate::upstream::{UpstreamBody, UpstreamError, Upstreams};

/// Everything an exchange needs besides the request.
pub(super) struct Target<'a> {
    pub upstreams: &'a Upstreams,
    pub policy: Option<&'a RetryPolicy>,
    pub backend: &'a Backend,
    pub endpoint: &'a Endpoint,
    pub protocol: UpstreamProtocol,
}

/// What may be retried for this request.
struct Plan<'a> {
    retries: u32,
    /// Statuses to retry; empty when the method is not idempotent.
    codes: &'a [u16],
    /// An attempt that times out is retried (idempotent methods only).
    timeouts: bool,
    attempt_timeout: Option<Duration>,
    /// Waits between attempts; none for the connect retry of a rule without `retry`
    /// (it goes to another endpoint, and nothing was sent).
    policy: Option<&'a RetryPolicy>,
}

impl<'a> Plan<'a> {
    /// `None`: one attempt, no deadline of its own, nothing kept.
    fn for_request(t: &Target<'a>, parts: &RequestParts, body: &Incoming) -> Option<Self> {
        let replayable = body.is_end_stream()
            || body
                .size_hint()
                .upper()
                .is_some_and(|n| n <= MAX_REPLAY_BODY);
        match t.policy {
            Some(p) => {
                let idempotent = is_idempotent(&parts.method);
                Some(Self {
                    retries: if replayable { p.attempts } else { 0 },
                    codes: if idempotent { &p.codes } else { &[] },
                    timeouts: idempotent,
                    attempt_timeout: p.attempt_timeout,
                    policy: Some(p),
                })
            }
            // Mesh mode retries failed connects inside its pool.
            None if t.protocol != UpstreamProtocol::Mesh
                && body.is_end_stream()
                && t.backend.endpoints.len() > 1 =>
            {
                Some(Self {
                    retries: 1,
                    codes: &[],
                    timeouts: false,
                    attempt_timeout: None,
                    policy: None,
                })
            }
            None => None,
        }
    }
}

/// Why an attempt is retried: the `reason` label of `aether_upstream_retries_total`.
#[derive(Clone, Copy)]
enum Reason {
    ConnectError,
    Status,
    BackendTimeout,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::ConnectError => "connect_error",
            Reason::Status => "status",
            Reason::BackendTimeout => "backend_timeout",
        }
    }
}

/// Sends the request (`parts` already filtered, not yet targeted) and returns the
/// upstream's answer, retrying as the rule allows. Upgrades never get here retried.
pub(super) async fn exchange(
    t: Target<'_>,
    mut parts: RequestParts,
    path_and_query: PathAndQuery,
    body: Incoming,
    upgrade: Option<&HeaderValue>,
) -> Result<Response<UpstreamBody>, ProxyError> {
    let plan = if upgrade.is_some() {
        None
    } else {
        Plan::for_request(&t, &parts, &body)
    };
    let Some(plan) = plan else {
        outbound::target(&mut parts, path_and_query, t.protocol, t.endpoint, upgrade)?;
        let req = Request::from_parts(parts, Either::Left(body));
        let result = t
            .upstreams
            .send(t.protocol, t.backend, t.endpoint, req)
            .await;
        return into_proxy_result(result, t.backend, t.endpoint);
    };
    // A body that can't be replayed goes upstream once, as a stream.
    let (mut stream, replay) = if plan.retries == 0 {
        (Some(body), Bytes::new())
    } else if body.is_end_stream() {
        (None, Bytes::new())
    } else {
        let limited = Limited::new(body, usize::try_from(MAX_REPLAY_BODY).unwrap_or(usize::MAX));
        match limited.collect().await {
            Ok(b) => (None, b.to_bytes()),
            Err(_) => return Err(ProxyError::BadRequest("cannot read the request body\n")),
        }
    };
    // Endpoints whose connect failed during this request.
    let mut unreachable: Vec<SocketAddr> = Vec::new();
    let mut endpoint = t.endpoint;
    let mut retry = 0u32;
    loop {
        let last = retry >= plan.retries;
        // The last attempt takes the head itself; earlier ones a copy.
        let mut head = if last {
            std::mem::replace(&mut parts, empty_parts())
        } else {
            parts.clone()
        };
        outbound::target(
            &mut head,
            path_and_query.clone(),
            t.protocol,
            endpoint,
            None,
        )?;
        let body = match stream.take() {
            Some(s) => Either::Left(s),
            None => Either::Right(Full::new(replay.clone())),
        };
        let sent = t.upstreams.send(
            t.protocol,
            t.backend,
            endpoint,
            Request::from_parts(head, body),
        );
        let outcome = match plan.attempt_timeout {
            Some(d) => tokio::time::timeout(d, sent).await.ok(),
            None => Some(sent.await),
        };
        let reason = match &outcome {
            Some(Ok(resp)) if plan.codes.contains(&resp.status().as_u16()) => Reason::Status,
            Some(Err(UpstreamError::Connect(_))) => Reason::ConnectError,
            None if plan.timeouts => Reason::BackendTimeout,
            _ => return finish(outcome, t.backend, endpoint),
        };
        // After a failed connect, another endpoint that has not failed one; after
        // an answer or a timeout, the next in turn (a single-pod Service retries
        // its one pod).
        let next = if last {
            None
        } else if let Reason::ConnectError = reason {
            unreachable.push(endpoint.addr);
            t.backend.pick_other(&unreachable)
        } else {
            t.backend
                .pick_other(&unreachable)
                .or_else(|| t.backend.pick())
        };
        let Some(next) = next else {
            return finish(outcome, t.backend, endpoint);
        };
        if let Some(Err(UpstreamError::Connect(e))) = &outcome {
            upstream_connect_errors(&t.backend.name).increment(1);
            tracing::debug!(backend = %t.backend.name, endpoint = %endpoint.addr, error = %e, "upstream connect failed; retrying");
        }
        // A retried answer's body is not wanted: dropping it closes that connection.
        drop(outcome);
        retry += 1;
        metrics::counter!(UPSTREAM_RETRIES_TOTAL, "backend" => t.backend.name.to_string(), "reason" => reason.label())
            .increment(1);
        endpoint = next;
        if let Some(p) = plan.policy {
            tokio::time::sleep(p.backoff_before(retry)).await;
        }
    }
}

fn empty_parts() -> RequestParts {
    Request::new(()).into_parts().0
}

/// The answer of the attempt that is not retried; a timed-out one is a 504.
fn finish(
    outcome: Option<Result<Response<UpstreamBody>, UpstreamError>>,
    backend: &Backend,
    endpoint: &Endpoint,
) -> Result<Response<UpstreamBody>, ProxyError> {
    match outcome {
        Some(result) => into_proxy_result(result, backend, endpoint),
        None => Err(ProxyError::Timeout),
    }
}

fn into_proxy_result(
    result: Result<Response<UpstreamBody>, UpstreamError>,
    backend: &Backend,
    endpoint: &Endpoint,
) -> Result<Response<UpstreamBody>, ProxyError> {
    match result {
        Ok(resp) => Ok(resp),
        Err(UpstreamError::Connect(e)) => {
            upstream_connect_errors(&backend.name).increment(1);
            tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, error = %e, "upstream connect failed");
            Err(ProxyError::UpstreamConnect(e))
        }
        Err(UpstreamError::Request(e)) => Err(ProxyError::Upstream(e)),
        Err(UpstreamError::Refused(e)) => {
            tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, error = %e, "upstream refused");
            Err(ProxyError::Upstream(e))
        }
    }
}
