//! `eventually`: the one way tests wait for something to become true.
//!
//! The contract: `f` is polled until it yields a value or the wait's timeout passes;
//! the value is returned, or an error naming `what` and the last failure. It never
//! panics, so a caller decides (`?` in a test, `.expect(..)` in a helper).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::{BoxError, err};

/// How long to wait and how often to look.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    pub timeout: Duration,
    pub interval: Duration,
}

impl Wait {
    /// A local process or socket: polled every 50 ms, for up to 10 s.
    pub const LOCAL: Wait = Wait {
        timeout: Duration::from_secs(10),
        interval: POLL_INTERVAL,
    };
    /// Something an API server must write, watch and be asked for: every 200 ms (so
    /// three test clusters on two cores are not kept busy answering), for up to 40 s.
    pub const API: Wait = Wait {
        timeout: Duration::from_secs(40),
        interval: Duration::from_millis(200),
    };
}

/// A bare timeout polls every [`POLL_INTERVAL`].
impl From<Duration> for Wait {
    fn from(timeout: Duration) -> Self {
        Wait {
            timeout,
            interval: POLL_INTERVAL,
        }
    }
}

/// How often a local condition is polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// The usual timeout of a local wait ([`Wait::LOCAL`]).
pub const EVENTUALLY: Duration = Duration::from_secs(10);

/// Polls `f` until it returns `Ok`, or `wait` times out; then returns the last error,
/// prefixed by `what`.
pub async fn eventually<T, F, Fut>(
    what: &str,
    wait: impl Into<Wait>,
    mut f: F,
) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BoxError>>,
{
    let Wait { timeout, interval } = wait.into();
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(err(format!(
                        "timed out after {timeout:?} waiting for: {what}; last error: {e}"
                    )));
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// [`eventually`] for a probe that says only whether it is there yet: `None` is "not
/// yet". Same contract.
pub async fn eventually_some<T, F, Fut>(
    what: &str,
    wait: impl Into<Wait>,
    mut f: F,
) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually(what, wait, || {
        let probe = f();
        async move { probe.await.ok_or_else(|| err("not yet")) }
    })
    .await
}
