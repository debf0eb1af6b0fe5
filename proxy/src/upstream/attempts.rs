//! The upstream exchange of one request and all its attempts: the one place a request
//! is retried (policy: `crate::retry`).
//!
//! Connecting consumes no request, so a connect that fails goes to another endpoint
//! whatever the body: for a rule without `retry`, to one more endpoint (mesh mode: up
//! to two more), at once; for a rule with `retry`, as its attempts and backoff allow.
//! An answer whose status the rule lists, or an attempt past its `backendRequest`
//! timeout, is retried only for idempotent methods and only when the body was kept for
//! replay: empty, or at most 64 KiB (buffered as `Bytes`). The request head is cloned
//! for an attempt only when a later one may need it, so a request on a rule without
//! `retry` pays nothing.
//!
//! Whatever the rule, a request sent on a reused keep-alive connection that ends before
//! any byte of the answer goes once more, on a new connection to the same endpoint, if
//! it is idempotent and its body is empty or kept: the peer had closed the connection
//! (its idle timeout, or it died) before this worker saw the FIN, a race every pool
//! has (hyper-util's legacy client, Envoy and nginx's `proxy_next_upstream error`
//! retry it too). For that, such a request's head is copied before it goes out on a
//! reused connection.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts as RequestParts;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Body as _;
use tokio::time::{Instant, Sleep};

use super::{UpstreamBody, UpstreamError, Upstreams, record_failure, record_health};
use crate::access_log::RequestBody;
use crate::backend::{Backend, Endpoint, UpstreamProtocol};
use crate::backend_client_cert::ClientCertificate;
use crate::http::{ProxyError, outbound};
use crate::retry::{MAX_REPLAY_BODY, RetryPolicy, is_idempotent};

/// Everything an exchange needs besides the request.
pub(crate) struct Target<'a> {
    pub upstreams: &'a Upstreams,
    pub policy: Option<&'a RetryPolicy>,
    pub backend: &'a Backend,
    /// What the listener's Gateway presents to TLS backends.
    pub client_cert: Option<&'a ClientCertificate>,
    pub endpoint: &'a Endpoint,
    pub protocol: UpstreamProtocol,
}

/// Where an exchange went, for the access log: the endpoint of its last attempt and
/// how many attempts came before it.
#[derive(Debug, Default)]
pub(crate) struct Tried {
    pub endpoint: Option<SocketAddr>,
    pub retries: u32,
}

/// What may be retried for this request.
struct Plan<'a> {
    retries: u32,
    /// Statuses to retry; empty when the method is not idempotent or the body can't
    /// be replayed.
    codes: &'a [u16],
    /// An attempt that times out is retried.
    timeouts: bool,
    attempt_timeout: Option<Duration>,
    /// The body is buffered for replay.
    replay: bool,
    /// Sent again on a new connection if a reused one closes before answering:
    /// idempotent, its body empty or buffered, not an upgrade, retries not disabled.
    stale: bool,
    /// Waits between attempts; none without a rule `retry` (a connect retry goes to
    /// another endpoint, and nothing was sent).
    policy: Option<&'a RetryPolicy>,
}

impl<'a> Plan<'a> {
    fn for_request(
        t: &Target<'a>,
        parts: &RequestParts,
        body: &RequestBody,
        upgrade: bool,
    ) -> Self {
        let empty = body.is_end_stream();
        let Some(p) = t.policy else {
            return Self {
                stale: empty && !upgrade && is_idempotent(&parts.method),
                retries: if t.protocol == UpstreamProtocol::Mesh {
                    2
                } else {
                    1
                },
                codes: &[],
                timeouts: false,
                attempt_timeout: None,
                replay: false,
                policy: None,
            };
        };
        let replay = !upgrade
            && p.attempts > 0
            && (body.is_end_stream()
                || body
                    .size_hint()
                    .upper()
                    .is_some_and(|n| n <= MAX_REPLAY_BODY));
        let idempotent = replay && is_idempotent(&parts.method);
        Self {
            retries: p.attempts,
            codes: if idempotent { &p.codes } else { &[] },
            timeouts: idempotent,
            attempt_timeout: p.attempt_timeout,
            replay,
            stale: idempotent,
            policy: Some(p),
        }
    }
}

/// Why an attempt is retried: the `reason` label of `aether_upstream_retries_total`.
#[derive(Clone, Copy)]
enum Reason {
    ConnectError,
    Status,
    BackendTimeout,
    ConnectionClosed,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::ConnectError => "connect_error",
            Reason::Status => "status",
            Reason::BackendTimeout => "backend_timeout",
            Reason::ConnectionClosed => "connection_closed",
        }
    }
}

/// Sends the request (`parts` already filtered, not yet targeted) and returns the
/// upstream's answer, retrying as the rule allows. `upgrade` is the client's `Upgrade`
/// token, when it asked for one.
///
/// An `async` block rather than an `async fn`, whose arguments would be stored twice
/// in the future (as captured and as moved into the body): this future is part of
/// every request's, which hyper's HTTP/2 server moves around.
#[allow(clippy::manual_async_fn)]
pub(crate) fn exchange(
    t: Target<'_>,
    mut parts: RequestParts,
    path_and_query: PathAndQuery,
    body: RequestBody,
    upgrade: Option<&HeaderValue>,
    tried: &mut Tried,
) -> impl Future<Output = Result<Response<UpstreamBody>, ProxyError>> {
    async move {
        let plan = Plan::for_request(&t, &parts, &body, upgrade.is_some());
        let (mut stream, replay) = if !plan.replay || body.is_end_stream() {
            (Some(body), Bytes::new())
        } else {
            let limited =
                Limited::new(body, usize::try_from(MAX_REPLAY_BODY).unwrap_or(usize::MAX));
            match limited.collect().await {
                Ok(b) => (None, b.to_bytes()),
                Err(_) => return Err(ProxyError::BadRequest("cannot read the request body\n")),
            }
        };
        // Endpoints whose connect failed during this request.
        let mut unreachable: Vec<SocketAddr> = Vec::new();
        let mut endpoint = t.endpoint;
        let mut retry = 0u32;
        // The rule's retries, plus the one resend after a closed reused connection.
        let mut budget = plan.retries;
        let mut stale = plan.stale;
        // The next attempt dials anew rather than take a pooled connection.
        let mut fresh = false;
        let mut head_taken = false;
        loop {
            tried.endpoint = Some(endpoint.addr);
            tried.retries = retry;
            let deadline = plan.attempt_timeout.map(|d| Instant::now() + d);
            let outcome = match within(
                deadline,
                t.upstreams
                    .connect(t.protocol, (t.backend, t.client_cert), endpoint, fresh),
            )
            .await
            {
                None => None,
                Some(Err(e)) => {
                    if let UpstreamError::Connect(_) = e {
                        record_failure(t.backend, endpoint);
                    }
                    Some(Err(e))
                }
                Some(Ok(ready)) => {
                    // The head is copied only if a later attempt may send it again.
                    let keep =
                        (plan.policy.is_some() && retry < budget) || (stale && ready.reused());
                    head_taken |= !keep;
                    let body = match stream.take() {
                        Some(s) => Either::Left(s),
                        None => Either::Right(Full::new(replay.clone())),
                    };
                    let send = ready.send(attempt_request(
                        &mut parts,
                        keep,
                        (&path_and_query, t.protocol, endpoint, upgrade),
                        body,
                    )?);
                    let sent = within(deadline, send).await;
                    if let Some(result) = &sent {
                        record_health(t.backend, endpoint, result);
                    }
                    sent
                }
            };
            fresh = false;
            let reason = match &outcome {
                Some(Ok(resp)) if plan.codes.contains(&resp.status().as_u16()) => Reason::Status,
                Some(Err(UpstreamError::Connect(_))) => Reason::ConnectError,
                Some(Err(UpstreamError::Stale(_))) if stale => Reason::ConnectionClosed,
                None if plan.timeouts => Reason::BackendTimeout,
                _ => return finish(outcome, t.backend, endpoint),
            };
            // The request must still be whole: its head, and its body (unsent, kept, or
            // empty: `replay` is then empty too).
            let resendable = !head_taken && (stream.is_some() || plan.replay || plan.stale);
            // After a failed connect, another endpoint that has not failed one; after a
            // closed reused connection, the same endpoint on a new one (the endpoint may
            // well be up: it closed an idle connection); after an answer or a timeout, the
            // next in turn (a single-pod Service retries its one pod).
            let next = match reason {
                _ if !resendable => None,
                Reason::ConnectionClosed => {
                    stale = false;
                    fresh = true;
                    budget += 1;
                    Some(endpoint)
                }
                _ if retry >= budget => None,
                Reason::ConnectError => {
                    unreachable.push(endpoint.addr);
                    t.backend.pick_other(&unreachable)
                }
                Reason::Status | Reason::BackendTimeout => t
                    .backend
                    .pick_other(&unreachable)
                    .or_else(|| t.backend.pick()),
            };
            let Some(next) = next else {
                return finish(outcome, t.backend, endpoint);
            };
            match &outcome {
                Some(Err(UpstreamError::Connect(e))) => {
                    t.backend.stats.connect_error();
                    tracing::debug!(backend = %t.backend.name, from = %endpoint.addr, to = %next.addr, error = %e, "upstream connect failed; retrying on another endpoint");
                }
                Some(Err(UpstreamError::Stale(e))) => {
                    tracing::debug!(backend = %t.backend.name, endpoint = %endpoint.addr, error = %e, "reused upstream connection closed before answering; resending on a new one");
                }
                _ => {}
            }
            // A retried answer's body is not wanted: dropping it closes that connection.
            drop(outcome);
            retry += 1;
            t.backend.stats.retried(reason.label());
            endpoint = next;
            // A closed idle connection says nothing about the endpoint: no backoff.
            if let (Some(p), false) = (plan.policy, fresh) {
                tokio::time::sleep(p.backoff_before(retry)).await;
            }
        }
    }
}

/// The request of one attempt: a copy of the head when a later attempt may send it
/// again (`keep`), else the head itself; targeted at the endpoint.
fn attempt_request(
    parts: &mut RequestParts,
    keep: bool,
    (path_and_query, protocol, endpoint, upgrade): (
        &PathAndQuery,
        UpstreamProtocol,
        &Endpoint,
        Option<&HeaderValue>,
    ),
    body: crate::http::Body,
) -> Result<Request<crate::http::Body>, ProxyError> {
    let mut head = if keep {
        parts.clone()
    } else {
        std::mem::replace(parts, empty_parts())
    };
    outbound::target(
        &mut head,
        path_and_query.clone(),
        protocol,
        endpoint,
        upgrade,
    )?;
    Ok(Request::from_parts(head, body))
}

/// `fut`'s output, or `None` if `deadline` passed first.
fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Within<F> {
    Within {
        fut,
        deadline,
        sleep: None,
    }
}

pin_project_lite::pin_project! {
    /// `fut` bounded by an optional deadline. Not an `async fn` nor tokio's `Timeout`:
    /// those keep the future twice, or a timer inline, in every request's future, which
    /// hyper then moves; the timer is boxed and armed only for a rule with an attempt
    /// timeout, when `fut` is first pending.
    struct Within<F> {
        #[pin]
        fut: F,
        deadline: Option<Instant>,
        sleep: Option<Pin<Box<Sleep>>>,
    }
}

impl<F: Future> Future for Within<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return Poll::Ready(Some(out));
        }
        let Some(deadline) = *this.deadline else {
            return Poll::Pending;
        };
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        sleep.as_mut().poll(cx).map(|()| None)
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
            backend.stats.connect_error();
            tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, error = %e, "upstream connect failed");
            Err(ProxyError::UpstreamConnect(e))
        }
        Err(UpstreamError::NoIdentity(e)) => Err(ProxyError::UpstreamConnect(e)),
        Err(UpstreamError::Request(e) | UpstreamError::Stale(e)) => Err(ProxyError::Upstream(e)),
        Err(UpstreamError::Refused(e)) => {
            tracing::warn!(backend = %backend.name, endpoint = %endpoint.addr, error = %e, "upstream refused");
            Err(ProxyError::Upstream(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::within;

    #[tokio::test]
    async fn within_ends_a_pending_future_at_its_deadline_and_only_with_one() {
        let deadline = Instant::now() + Duration::from_millis(20);
        assert_eq!(within(Some(deadline), pending::<()>()).await, None);
        assert!(Instant::now() >= deadline);
        let unbounded = within(None, pending::<()>());
        let waited = tokio::time::timeout(Duration::from_millis(50), unbounded).await;
        assert!(waited.is_err(), "no deadline, no timeout");
    }

    #[tokio::test]
    async fn within_returns_what_finishes_before_the_deadline() {
        let far = Some(Instant::now() + Duration::from_secs(5));
        assert_eq!(within(far, async { 7 }).await, Some(7));
        let later = async {
            sleep(Duration::from_millis(10)).await;
            3
        };
        assert_eq!(within(far, later).await, Some(3));
        assert_eq!(within(None, async { 1 }).await, Some(1));
    }
}
