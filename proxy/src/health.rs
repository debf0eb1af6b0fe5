//! Passive health (outlier detection): an endpoint that fails `EJECT_AFTER` times in a
//! row (connect failure, reset, or a 5xx answer) is skipped by the load balancer for
//! `EJECTION`, then tried again; one success clears its count.
//!
//! State belongs to the endpoint's address, not to one Snapshot: every reconcile builds
//! new Endpoints, and a dead pod that is still listed must stay ejected across them, or
//! each unrelated change (a route edit, a Secret rotation) would send it fresh traffic
//! to fail. It is two atomics, read without a clock on the hot path unless the
//! endpoint is ejected.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
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

impl Health {
    /// The health record of `addr`, shared with every live Endpoint for the same
    /// address. Called when a Snapshot is built, never per request.
    pub fn for_addr(addr: SocketAddr) -> Arc<Self> {
        static REGISTRY: OnceLock<Mutex<HashMap<SocketAddr, Weak<Health>>>> = OnceLock::new();
        let mut map = REGISTRY
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = map.get(&addr).and_then(Weak::upgrade) {
            return h;
        }
        // Records of endpoints no Snapshot holds any more go when the map has doubled
        // since the last sweep, which keeps the sweep's cost amortised.
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let h = Arc::new(Self::default());
        map.insert(addr, Arc::downgrade(&h));
        h
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

    #[test]
    fn an_address_keeps_its_record_while_any_endpoint_holds_it() {
        let addr = SocketAddr::from(([127, 0, 0, 9], 4242));
        let first = Health::for_addr(addr);
        for _ in 0..EJECT_AFTER {
            first.failure();
        }
        let rebuilt = Health::for_addr(addr);
        assert!(
            !rebuilt.is_available(),
            "a rebuilt endpoint forgot its ejection"
        );
        drop((first, rebuilt));
        assert!(Health::for_addr(addr).is_available());
    }
}
