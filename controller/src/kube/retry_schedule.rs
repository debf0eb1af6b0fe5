//! Per-object retry backoff for the writers (status, Gateway Services). With one
//! backoff for the whole writer, a single write the API server keeps refusing (RBAC in
//! one namespace) held every other object's write back by up to the maximum backoff;
//! here each failing object waits its own turn, and the rest are written at once.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The first retry comes this long after a failure; each further failure doubles it.
pub const FIRST_RETRY: Duration = Duration::from_millis(400);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Failing objects: each one's current backoff and when it may be tried again.
pub struct Retries<K> {
    failing: HashMap<K, (Duration, Instant)>,
}

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Self {
            failing: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> Retries<K> {
    /// May `key` be written now? Always, unless it failed and its backoff runs.
    pub fn due(&self, key: &K, now: Instant) -> bool {
        self.failing.get(key).is_none_or(|(_, at)| *at <= now)
    }

    pub fn failed(&mut self, key: K, now: Instant) {
        let backoff = self
            .failing
            .get(&key)
            .map_or(FIRST_RETRY, |(b, _)| (*b * 2).min(MAX_BACKOFF));
        self.failing.insert(key, (backoff, now + backoff));
    }

    pub fn succeeded(&mut self, key: &K) {
        self.failing.remove(key);
    }

    /// Forgets objects no longer wanted.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.failing.retain(|k, _| keep(k));
    }

    /// When the next failing object may be tried again.
    pub fn next(&self) -> Option<Instant> {
        self.failing.values().map(|(_, at)| *at).min()
    }
}

/// Waits for news (a new desired value, a change of Lease holder) or until `retry`.
/// False when a sender is gone.
pub async fn news_or_retry<T>(
    rx: &mut watch::Receiver<T>,
    held: &mut watch::Receiver<bool>,
    retry: Option<Instant>,
) -> bool {
    match retry {
        None => super::lease::news(rx, held).await,
        Some(at) => tokio::select! {
            ok = super::lease::news(rx, held) => ok,
            () = tokio::time::sleep_until(at) => true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_object_backs_off_alone() {
        let t0 = Instant::now();
        let mut r: Retries<&str> = Retries::default();
        assert!(r.due(&"a", t0));
        r.failed("a", t0);
        assert!(!r.due(&"a", t0 + Duration::from_millis(399)));
        assert!(r.due(&"a", t0 + FIRST_RETRY));
        assert!(r.due(&"b", t0), "another object is not held back");
        r.failed("a", t0);
        assert_eq!(r.next(), Some(t0 + FIRST_RETRY * 2));
        for _ in 0..20 {
            r.failed("a", t0);
        }
        assert_eq!(r.next(), Some(t0 + MAX_BACKOFF));
        r.succeeded(&"a");
        assert_eq!(r.next(), None);
    }
}
