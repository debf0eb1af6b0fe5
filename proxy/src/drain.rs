//! The signals of a socket's drain: "take no more requests" (the socket stopped
//! accepting) and "close now" (the drain deadline passed), each fired once and watched
//! by every connection of the socket.
//!
//! Not `tokio_util`'s `CancellationToken`: its every check locks a mutex, and its
//! future takes the `Notify`'s lock again each time it is polled. A relayed keep-alive
//! request checked the two signals four times between them: about 2% of the worker's
//! core (`CancellationToken::is_cancelled` and `poll_notified` in the keep-alive
//! profile, benches/RESULTS.md). Here a check is one atomic load, and a waiting future
//! registers its task once and is then polled with a pointer comparison.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// A one-time broadcast: once fired, it stays fired. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct Signal {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    fired: AtomicBool,
    notify: Notify,
}

impl Signal {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal and wakes every task waiting on [`Signal::fired`].
    pub fn fire(&self) {
        // Stored before the wake-up: a woken future reads it set.
        self.inner.fired.store(true, Ordering::Release);
        self.inner.notify.notify_waiters();
    }

    pub fn is_fired(&self) -> bool {
        self.inner.fired.load(Ordering::Acquire)
    }

    /// Ready once the signal has fired (at once if it already has).
    pub fn fired(&self) -> Fired<'_> {
        Fired {
            signal: self,
            // Made now: `notify_waiters` reaches a `Notified` from when it is made,
            // polled or not, so a fire between this and the first poll is not lost.
            notified: self.inner.notify.notified(),
            registered: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Signal::fired`].
    pub struct Fired<'a> {
        signal: &'a Signal,
        #[pin]
        notified: Notified<'a>,
        // The waker the `Notified` holds: polled again by the same task, there is
        // nothing to register.
        registered: Option<Waker>,
    }
}

impl Future for Fired<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.signal.is_fired() {
            return Poll::Ready(());
        }
        if this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        if this.notified.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        *this.registered = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (Arc::clone(&count), Waker::from(count))
    }

    fn poll(f: Pin<&mut Fired<'_>>, w: &Waker) -> Poll<()> {
        f.poll(&mut Context::from_waker(w))
    }

    #[test]
    fn a_waiting_future_is_woken_and_ready_when_fired() {
        let signal = Signal::new();
        let clone = signal.clone();
        let fired = signal.fired();
        tokio::pin!(fired);
        let (count, w) = waker();
        assert!(poll(fired.as_mut(), &w).is_pending());
        assert!(poll(fired.as_mut(), &w).is_pending());
        assert!(!signal.is_fired());
        clone.fire();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(signal.is_fired());
        assert!(poll(fired.as_mut(), &w).is_ready());
    }

    #[test]
    fn a_fire_before_the_first_poll_is_not_lost() {
        let signal = Signal::new();
        let fired = signal.fired();
        tokio::pin!(fired);
        signal.fire();
        let (_, w) = waker();
        assert!(poll(fired.as_mut(), &w).is_ready());
        // And a future made after the fire is ready too.
        let late = signal.fired();
        tokio::pin!(late);
        assert!(poll(late.as_mut(), &w).is_ready());
    }

    #[test]
    fn the_last_task_to_poll_is_the_one_woken() {
        let signal = Signal::new();
        let fired = signal.fired();
        tokio::pin!(fired);
        let (first, a) = waker();
        let (second, b) = waker();
        assert!(poll(fired.as_mut(), &a).is_pending());
        assert!(poll(fired.as_mut(), &b).is_pending());
        signal.fire();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
    }
}
