//! Load shedding: when the process nears its memory budget, new work is refused
//! (503 with Retry-After for requests, a close for new connections) so the requests
//! already in flight finish instead of everything slowing down or the kernel's OOM
//! killer ending the process.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::MemoryBudget;
use crate::state::ProxyState;

/// How often resident memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The budget in bytes, if there is one. By default it is 90% of the cgroup's memory
/// limit, if the process runs under one (a container usually does).
pub async fn budget(config: MemoryBudget) -> Option<u64> {
    match config {
        MemoryBudget::Off => None,
        MemoryBudget::Bytes(bytes) => Some(bytes),
        MemoryBudget::FromCgroup => {
            let max = memory_limit(Path::new("/sys/fs/cgroup")).await?;
            Some(max / 10 * 9)
        }
    }
}

/// The memory limit of the cgroup mounted at `root`: cgroup v2's `memory.max`, else
/// cgroup v1's `memory/memory.limit_in_bytes`. None when neither exists or neither
/// sets a limit.
async fn memory_limit(root: &Path) -> Option<u64> {
    if let Ok(text) = tokio::fs::read_to_string(root.join("memory.max")).await {
        return parse_v2_limit(&text);
    }
    let text = tokio::fs::read_to_string(root.join("memory/memory.limit_in_bytes"))
        .await
        .ok()?;
    parse_v1_limit(&text)
}

/// cgroup v2 `memory.max`: bytes, or `max` for none.
fn parse_v2_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// cgroup v1 has no word for "no limit": it reports the largest page counter in bytes,
/// a number near 2^63 whose exact value depends on the page size. Anything this large
/// is no limit a host could enforce.
const V1_UNLIMITED: u64 = 1 << 62;

/// cgroup v1 `memory.limit_in_bytes`.
fn parse_v1_limit(text: &str) -> Option<u64> {
    let limit: u64 = text.trim().parse().ok()?;
    (limit < V1_UNLIMITED).then_some(limit)
}

/// Resident set size of this process.
async fn resident_bytes() -> Option<u64> {
    rss_in(Path::new("/proc/self")).await
}

/// Resident set size of the process whose /proc directory is `proc_dir`: `VmRSS` in
/// `status`, which the kernel gives in kB whatever the page size (statm counts pages).
async fn rss_in(proc_dir: &Path) -> Option<u64> {
    let status = tokio::fs::read_to_string(proc_dir.join("status"))
        .await
        .ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kb.checked_mul(1024)
}

/// Samples memory against `budget` and flips the proxy's shedding flag.
pub fn spawn_monitor(state: Arc<ProxyState>, budget: u64) {
    let active = metrics::gauge!(crate::telemetry::OVERLOAD_ACTIVE);
    // Both kinds of shedding at 0 from the start: a dashboard's rate is 0, not empty.
    for what in ["connection", "request"] {
        metrics::counter!(crate::telemetry::OVERLOAD_SHED_TOTAL, "what" => what).increment(0);
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[tokio::test]
    async fn cgroup_v2_limit_and_max() {
        let limited = dir_with(&[("memory.max", "536870912\n")]);
        assert_eq!(memory_limit(limited.path()).await, Some(512 << 20));
        let unlimited = dir_with(&[("memory.max", "max\n")]);
        assert_eq!(memory_limit(unlimited.path()).await, None);
    }

    #[tokio::test]
    async fn cgroup_v1_limit_and_unlimited() {
        let limited = dir_with(&[("memory/memory.limit_in_bytes", "268435456\n")]);
        assert_eq!(memory_limit(limited.path()).await, Some(256 << 20));
        // v1 says "no limit" with PAGE_COUNTER_MAX in bytes, which depends on the page
        // size: 4 KiB and 64 KiB pages.
        for huge in ["9223372036854771712\n", "9223372036854710272\n"] {
            let unlimited = dir_with(&[("memory/memory.limit_in_bytes", huge)]);
            assert_eq!(memory_limit(unlimited.path()).await, None, "{huge}");
        }
    }

    #[tokio::test]
    async fn no_cgroup_files_no_limit() {
        let empty = dir_with(&[]);
        assert_eq!(memory_limit(empty.path()).await, None);
    }

    /// A 64 KiB-page arm64 host: statm's 16 resident pages are 1 MiB, not 64 KiB.
    #[tokio::test]
    async fn rss_does_not_assume_4k_pages() {
        let proc_dir = dir_with(&[
            ("statm", "100 16 8 1 0 50 0\n"),
            (
                "status",
                "Name:\taether-edge\nVmPeak:\t    6400 kB\nVmRSS:\t    1024 kB\nRssAnon:\t     512 kB\nThreads:\t4\n",
            ),
        ]);
        assert_eq!(rss_in(proc_dir.path()).await, Some(1 << 20));
    }

    #[test]
    fn vm_rss_needs_its_unit() {
        assert_eq!(parse_vm_rss("VmRSS:\t  20 kB\n"), Some(20 << 10));
        assert_eq!(parse_vm_rss("VmRSS:\t  20\n"), None);
        assert_eq!(parse_vm_rss("VmHWM:\t  20 kB\n"), None);
    }

    #[tokio::test]
    async fn own_rss_is_read() {
        let rss = resident_bytes().await.unwrap();
        // A running test binary holds at least a few hundred KiB and less than 1 TiB.
        assert!(rss > 100 << 10 && rss < 1 << 40, "{rss}");
    }
}
