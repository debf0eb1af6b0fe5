//! Retry policy of a route rule (GEP-1731, the experimental HTTPRoute `retry` field),
//! as the data plane applies it; the attempt loop itself is `upstream::attempts`.
//!
//! What is retried, and why only that:
//! - a connection that could not be established (refused, reset or timed out before
//!   any byte of the request was written): always safe, the backend saw nothing, and
//!   the request (body included) is still whole;
//! - an answer whose status is in `codes`, and an attempt that passed the rule's
//!   `backendRequest` timeout: only for idempotent methods (RFC 9110 §9.2.2), since
//!   the backend may have acted on the request, and only requests whose body is
//!   empty or fully buffered within [`MAX_REPLAY_BODY`];
//! - never a failure after the request was sent (a reset mid-exchange), never once
//!   response bytes went to the client.

use std::time::Duration;

use http::Method;
use serde::Serialize;

/// Largest request body kept for replay. A larger (or unknown-length, chunked) body is
/// streamed to the upstream as usual and its request is not retried.
pub const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// Backoff when the rule sets none: Envoy's default base interval.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(25);

/// Retries when the rule's `retry` sets no `attempts` (Envoy's default `num_retries`).
pub const DEFAULT_ATTEMPTS: u32 = 1;

/// The most retries a rule may ask for; more would only hold the client longer.
pub const MAX_ATTEMPTS: u32 = 100;

/// Exponential backoff stops growing at this multiple of the base interval.
const BACKOFF_CAP_FACTOR: u32 = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryPolicy {
    /// Retries after the first attempt. 0 disables retries, including the retry of a
    /// failed connect that rules without a `retry` field get.
    pub attempts: u32,
    /// Answer statuses that are retried (400-599).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    /// The minimum wait before the first retry; later ones wait twice as long each
    /// time, up to ten times this, plus up to half again of jitter.
    pub backoff: Duration,
    /// `timeouts.backendRequest`: the deadline of each attempt. An attempt that passes
    /// it is cancelled and retried (the rule's `timeout` bounds all attempts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_timeout: Option<Duration>,
}

impl RetryPolicy {
    pub fn retries_status(&self, status: u16) -> bool {
        self.codes.contains(&status)
    }

    /// How long to wait before retry number `retry` (1-based): never less than the
    /// configured backoff, as the spec requires of jitter.
    pub fn backoff_before(&self, retry: u32) -> Duration {
        let doubled = self
            .backoff
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16));
        let d = doubled.min(self.backoff.saturating_mul(BACKOFF_CAP_FACTOR));
        d + d.mul_f64(fastrand::f64() * 0.5)
    }
}

/// Methods a retry may replay after the backend may have seen the request.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_ten_times_the_base_and_never_goes_below_it() {
        let p = RetryPolicy {
            attempts: 5,
            codes: vec![500],
            backoff: Duration::from_millis(100),
            attempt_timeout: None,
        };
        for (retry, floor) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (30, 1000),
        ] {
            let d = p.backoff_before(retry);
            let floor = Duration::from_millis(floor);
            assert!(
                d >= floor && d <= floor.mul_f64(1.5),
                "retry {retry}: {d:?}"
            );
        }
        assert!(p.retries_status(500) && !p.retries_status(503));
    }

    #[test]
    fn only_rfc_idempotent_methods_replay_after_the_backend_saw_them() {
        assert!(is_idempotent(&Method::GET) && is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST) && !is_idempotent(&Method::PATCH));
    }
}
