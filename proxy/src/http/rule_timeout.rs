//! The rule's `request` timeout around an upstream exchange, as a plain future rather
//! than an `async fn`: an `async fn` taking the exchange keeps it twice in its state
//! (the argument's slot and the awaited `Timeout`'s), and every level above holds
//! that size inline, so each request's futures were kilobytes larger, all of it copied
//! as they were built (memmove was 7.5% of the proxy core on h2c).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::ProxyError;

pin_project_lite::pin_project! {
    /// An exchange with or without a deadline.
    #[project = BoundedProj]
    pub(super) enum Bounded<F> {
        Timed { #[pin] inner: tokio::time::Timeout<F> },
        Open { #[pin] inner: F },
    }
}

/// `exchange`, bounded by the rule's `request` timeout: dropping it on expiry cancels
/// the upstream request (and any retry), so the timeout bounds every attempt together.
pub(super) fn within_rule_timeout<F: Future>(timeout: Option<Duration>, exchange: F) -> Bounded<F> {
    match timeout {
        Some(t) => Bounded::Timed {
            inner: tokio::time::timeout(t, exchange),
        },
        None => Bounded::Open { inner: exchange },
    }
}

impl<T, F> Future for Bounded<F>
where
    F: Future<Output = Result<T, ProxyError>>,
{
    type Output = Result<T, ProxyError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            BoundedProj::Timed { inner } => inner
                .poll(cx)
                .map(|r| r.unwrap_or(Err(ProxyError::Timeout))),
            BoundedProj::Open { inner } => inner.poll(cx),
        }
    }
}
