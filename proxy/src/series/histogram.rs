//! A duration histogram that a request records into with two atomic adds and no lock:
//! fixed buckets (`telemetry::DURATION_BUCKETS`), one counter per bucket and a sum in
//! nanoseconds. The exporter's own histograms live in its registry, which never drops a
//! series; these live in the cells `crate::series` drops with their Gateway or route.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::telemetry::DURATION_BUCKETS;

/// The upper bounds (`le`) as Prometheus shows them, ascending; `+Inf` follows.
pub(super) const BOUNDS_LE: &[f64] = DURATION_BUCKETS;

const N: usize = DURATION_BUCKETS.len();

/// The same bounds in nanoseconds, so a record compares integers.
const BOUNDS_NANOS: [u64; N] = {
    let mut b = [0u64; N];
    let mut i = 0;
    while i < N {
        // Rounded: 0.00025 * 1e9 is 250000.00000000003.
        b[i] = (DURATION_BUCKETS[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    b
};

#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket, not cumulative (one add per record); the last one is
    /// `+Inf`. Summed into Prometheus' cumulative buckets at scrape.
    buckets: [AtomicU64; N + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// One observation: its bucket and the sum, two atomic adds. The count is the
    /// buckets' total, read at scrape, so `_count` always equals the `+Inf` bucket.
    pub fn record(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // `le` is inclusive: an observation equal to a bound belongs to that bucket.
        let idx = BOUNDS_NANOS.partition_point(|&b| b < nanos);
        if let Some(bucket) = self.buckets.get(idx) {
            bucket.fetch_add(1, Relaxed);
        }
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// What a scrape shows. Reads are not one atomic snapshot: a record racing the
    /// scrape may be in its bucket and not yet in the sum, which the next scrape fixes.
    pub(super) fn counts(&self) -> Counts {
        let buckets: [u64; N + 1] = std::array::from_fn(|i| self.buckets[i].load(Relaxed));
        Counts {
            count: buckets.iter().sum(),
            buckets,
            sum_nanos: self.sum_nanos.load(Relaxed),
        }
    }
}

/// One scrape's reading of a [`Histogram`].
pub(super) struct Counts {
    /// Per bucket, not cumulative, `+Inf` last.
    pub buckets: [u64; N + 1],
    pub count: u64,
    sum_nanos: u64,
}

impl Counts {
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let h = Histogram::default();
        h.record(Duration::from_micros(100)); // exactly le=0.0001
        h.record(Duration::from_micros(101)); // le=0.00025
        h.record(Duration::from_secs(31)); // +Inf
        h.record(Duration::ZERO); // le=0.0001
        let c = h.counts();
        assert_eq!(c.buckets[0], 2);
        assert_eq!(c.buckets[1], 1);
        assert_eq!(c.buckets[N], 1);
        assert_eq!(c.count, 4);
        assert!(
            (c.sum_seconds() - 31.000201).abs() < 1e-9,
            "{}",
            c.sum_seconds()
        );
    }
}
