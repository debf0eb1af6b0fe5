//! Passive health (outlier detection): an endpoint that fails `EJECT_AFTER` times in a
//! row (connect failure, reset, or a 5xx answer) is skipped by the load balancer for
//! `EJECTION`, then tried again; one success clears its count.
//!
//! State lives with the endpoint in the Snapshot, so a reconcile starts it afresh; it
//! is two atomics, read without a clock on the hot path unless the endpoint is ejected.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const EJECT_AFTER: u32 = 5;
pub const EJECTION: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Health {
    failures: AtomicU32,
    /// Milliseconds since the process epoch until which the endpoint is skipped; 0 for
    /// never ejected.
    ejected_until: AtomicU64,
}

impl Health {
    /// May the load balancer choose this endpoint now?
    pub fn is_available(&self) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until == 0 || now_ms() >= until
    }

    pub fn success(&self) {
        // Skip the store (and the cache-line write) in the usual all-healthy case.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.ejected_until.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failure; true when it ejected the endpoint.
    pub fn failure(&self) -> bool {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= EJECT_AFTER {
            let until = now_ms() + u64::try_from(EJECTION.as_millis()).unwrap_or(u64::MAX);
            self.ejected_until.store(until, Ordering::Relaxed);
            return true;
        }
        false
    }
}

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // +1 keeps 0 free to mean "never ejected".
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_failures_eject_and_a_success_clears_them() {
        let h = Health::default();
        for _ in 0..EJECT_AFTER - 1 {
            assert!(!h.failure());
        }
        h.success();
        for _ in 0..EJECT_AFTER - 1 {
            assert!(!h.failure());
        }
        assert!(h.is_available());
        assert!(h.failure());
        assert!(!h.is_available());
    }
}
