//! Load shedding: when the process nears its memory budget, new work is refused
//! (503 with Retry-After for requests, a close for new connections) so the requests
//! already in flight finish instead of everything slowing down or the kernel's OOM
//! killer ending the process.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::http::ProxyState;

/// How often resident memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The budget to use when none is given: 90% of the cgroup's memory limit, if the
/// process runs under one (a container usually does).
pub async fn default_budget() -> Option<u64> {
    let max = tokio::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .await
        .ok()?;
    let max: u64 = max.trim().parse().ok()?;
    Some(max / 10 * 9)
}

/// Resident set size of this process, from /proc/self/statm (pages).
async fn resident_bytes() -> Option<u64> {
    let statm = tokio::fs::read_to_string("/proc/self/statm").await.ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Samples memory against `budget` and flips the proxy's shedding flag.
pub fn spawn_monitor(state: Arc<ProxyState>, budget: u64) {
    let active = metrics::gauge!(crate::telemetry::OVERLOAD_ACTIVE);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tick.tick().await;
            let Some(rss) = resident_bytes().await else {
                continue;
            };
            let over = rss > budget;
            if state.shedding.swap(over, Ordering::AcqRel) != over {
                tracing::warn!(rss, budget, shedding = over, "memory budget crossed");
            }
            active.set(if over { 1.0 } else { 0.0 });
        }
    });
}
