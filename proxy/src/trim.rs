//! Giving memory the process freed back to the kernel.
//!
//! glibc keeps freed memory for later allocations, and returns it only from the top
//! of an arena. What an idle keep-alive connection gives back (its buffers, see
//! `relay/buffers.rs`) sits between live allocations, so it stayed resident: 1,000
//! idle connections kept 29 MiB whether or not their buffers were freed
//! (`benches/RESULTS.md`, issue 14, session 26). `malloc_trim` returns the free pages
//! of every arena; HAProxy calls it after it releases its pools for the same reason.
//! It walks each arena under that arena's lock, so it runs on a blocking thread of the
//! control plane, and only once enough has been freed since the last time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Bytes freed since the last trim by those who report it.
static FREED: AtomicUsize = AtomicUsize::new(0);

/// How often the control plane looks at what was freed.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Less than this freed is not worth a walk of the arenas.
const AT_LEAST: usize = 1 << 20;

/// Counts `bytes` freed that a trim could give back.
pub(crate) fn freed(bytes: usize) {
    FREED.fetch_add(bytes, Ordering::Relaxed);
}

/// Whether enough was freed since the last trim; if so, the count starts again.
fn due() -> bool {
    FREED.load(Ordering::Relaxed) >= AT_LEAST && FREED.swap(0, Ordering::Relaxed) >= AT_LEAST
}

/// Trims every second in which at least [`AT_LEAST`] was freed. Call on the control
/// plane's runtime.
pub fn spawn() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if due() {
                let returned = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
                tracing::debug!(returned, "freed memory trimmed");
            }
        }
    });
}

/// Returns the free pages of every arena to the kernel; true if any went.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "glibc's malloc_trim has no safe wrapper")]
fn trim() -> bool {
    // SAFETY: malloc_trim takes no pointers and may be called from any thread at any
    // time; glibc takes each arena's own lock.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Other allocators return memory themselves, or have no such call.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_once_a_mebibyte_is_freed_and_then_counts_again() {
        // The only test touching the count (a static shared by the test binary).
        FREED.store(0, Ordering::Relaxed);
        freed(AT_LEAST / 2);
        assert!(!due());
        freed(AT_LEAST / 2);
        assert!(due());
        assert!(!due(), "the count starts again after a trim");
    }
}
