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
//!
//! A large configuration change leaves the same kind of holes: the objects it parsed,
//! the maps it compiled routes through and the models it replaced are freed after the
//! long-lived results were allocated among them (0.9 MiB of free pages at 5,000
//! routes, `benches/RESULTS.md`, issue 14, session 32). The control plane says when a
//! change was large ([`after_large_change`]), as it cannot count what it freed.

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

/// Routes compiled again from which a change counts as large. A one-route change
/// leaves a few KiB of holes, not worth a walk of every arena; a first load, a
/// change that every route reads (a grant, a policy) or a large file does.
pub const LARGE_CHANGE_ROUTES: usize = 1_000;

/// A change that compiled `routes` routes again was published: if it was large, the
/// next check trims, whatever the relay has freed.
pub fn after_large_change(routes: usize) {
    if routes >= LARGE_CHANGE_ROUTES {
        freed(AT_LEAST);
    }
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

/// The size from which glibc serves an allocation by its own mapping, which a free
/// gives straight back to the kernel: glibc's own starting value.
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Keeps large allocations in mappings of their own for good. glibc raises the size
/// from which it maps an allocation to that of the largest mapped block freed so far
/// (up to 32 MiB), so once a first load has freed its manifest text, the next load's
/// large temporaries (the text, its document lists, a batch of compiled routes) come
/// from the arena, where they end between the long-lived data made after them and stay
/// resident once freed. Fixed, they come and go whole: 1.2 MiB less resident at
/// 5,000 routes (benches/RESULTS.md, issue 14, session 31). Left alone when the
/// environment sets glibc's threshold. Call before the process starts threads.
pub fn keep_large_allocations_mapped() {
    let set_by_env = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("mmap_threshold"));
    if !set_by_env {
        set_mmap_threshold(MMAP_THRESHOLD);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "glibc's mallopt has no safe wrapper")]
fn set_mmap_threshold(bytes: libc::c_int) {
    // SAFETY: mallopt takes no pointers; it is called before the process starts
    // threads, and glibc takes the main arena's lock for it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
    }
}

/// Other allocators decide for themselves.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold(_bytes: libc::c_int) {}

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
        after_large_change(LARGE_CHANGE_ROUTES - 1);
        assert!(!due(), "a small change is not worth a trim");
        after_large_change(LARGE_CHANGE_ROUTES);
        assert!(due(), "a large change is");
        assert!(!due());
    }
}
