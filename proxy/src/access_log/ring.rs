//! Each thread that ends requests formats their lines itself, into a ring of bytes of
//! its own that the writer thread drains (nginx's way: the worker formats, a buffer
//! takes the line). Handing records to the writer instead cost a channel send, a box
//! and its return, and the record's fields read again on another thread: about 7% of
//! the core on h2c, against the line's formatting, which is the same work either way.
//!
//! A ring is single-producer, single-consumer and lock-free (`rtrb`): the worker
//! appends whole lines or none, the writer reads what is committed. A thread meets a
//! log's ring the first time it ends a logged request; the writer learns of it
//! through a channel, never a lock a worker could wait on.

use rtrb::{Consumer, Producer, RingBuffer};
use std::cell::RefCell;

use super::AccessLog;
use super::format::LineWriter;

/// Bytes of lines one thread can have waiting for the writer: about 2,400 lines of
/// 430 bytes. A worker whose ring passes half full wakes the writer (see
/// [`WAKE_USED`]), so the other half is slack for the writer to be scheduled: 11 ms
/// at 110k lines/s. A burst beyond while stdout is slow loses lines (counted) rather
/// than holding requests or growing memory. Pages become resident only as the ring is
/// written, and only threads that log have one.
///
/// What a line costs the core depends most on how often the writer passes: each pass
/// is a wake-up and two context switches, and takes the worker's caches. Measured side
/// by side (benches/load/side-by-side.sh, h2c, both logging): against a 256 KiB ring
/// woken at a quarter every 10 ms, a 64 KiB ring woken at 16 KiB cost 3.3% of req/s;
/// this one, woken at half and every 50 ms, gave +2.3%; 4 MiB at 2 MiB every 100 ms
/// +2.6%, not worth its memory.
pub(super) const RING: usize = 1024 * 1024;

/// Bytes in a ring at which its worker wakes the writer: once per crossing, so a busy
/// worker makes one wake-up per half ring (about 1,200 lines), not one per line.
/// Waiting for the writer's timer alone lost 15% of the lines at 70k req/s.
pub(super) const WAKE_USED: usize = RING / 2;

/// A line larger than this leaves the thread's line buffer at this size afterwards
/// (a long URL does not keep its buffer for good).
const LINE_KEPT: usize = 16 * 1024;

/// The writer's end of a ring.
pub(super) type Reader = Consumer<u8>;

/// This thread's ring for one access log.
struct Local {
    /// The log's address: a process has one (tests start several), leaked, so the
    /// address names it for the life of the process.
    log: usize,
    ring: Producer<u8>,
    lines: LineWriter,
    line: Vec<u8>,
    /// Has this ring woken the writer since it was last under [`WAKE_USED`]?
    woke: bool,
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

/// Formats one line on this thread with `render` and puts it in this thread's ring;
/// false when it was not (the ring is full, or the thread is ending).
pub(super) fn put(log: &AccessLog, render: impl FnOnce(&mut LineWriter, &mut Vec<u8>)) -> bool {
    let key = std::ptr::from_ref(log) as usize;
    LOCAL
        .try_with(|locals| {
            // Rendering never logs, so the borrow is never held twice; a failed borrow
            // is a line lost, not a panic.
            let Ok(mut locals) = locals.try_borrow_mut() else {
                return false;
            };
            let local = match locals.iter().position(|l| l.log == key) {
                Some(i) => &mut locals[i],
                None => {
                    let (ring, reader) = RingBuffer::new(RING);
                    if log.new_rings.send(reader).is_err() {
                        return false;
                    }
                    locals.push(Local {
                        log: key,
                        ring,
                        lines: LineWriter::new(),
                        line: Vec::with_capacity(512),
                        woke: false,
                    });
                    let last = locals.len() - 1;
                    &mut locals[last]
                }
            };
            local.line.clear();
            fetch_ahead(&mut local.ring);
            render(&mut local.lines, &mut local.line);
            let put = local.ring.push_entire_slice(&local.line).is_ok();
            let filling = local.ring.slots() <= RING - WAKE_USED;
            if filling && !local.woke {
                log.wake_writer();
            }
            local.woke = filling;
            if local.line.capacity() > LINE_KEPT {
                local.line = Vec::with_capacity(512);
            }
            put
        })
        .unwrap_or(false)
}

/// Bytes of the ring fetched ahead of a line: a line is about 430.
const AHEAD: usize = 512;

/// Asks the core to bring the ring's next bytes into its cache while the line is
/// rendered. The ring has gone round a megabyte since that part was last written, so
/// the copy's stores would each wait for their cache line, and the first atomic
/// operation after them (h2's stream lock) for all of them: in the side-by-side profile
/// that wait was the largest single cost of a line (benches/RESULTS.md, session 37).
/// A ring with less than [`AHEAD`] free is about to refuse lines anyway: skipped.
fn fetch_ahead(ring: &mut Producer<u8>) {
    let Ok(mut chunk) = ring.write_chunk_uninit(AHEAD) else {
        return;
    };
    let (first, second) = chunk.as_mut_slices();
    for part in [&*first, &*second] {
        for line in part.chunks(64) {
            prefetch(line.as_ptr().cast());
        }
    }
    // Dropped uncommitted: nothing is written, no slot is taken.
}

#[cfg(target_arch = "x86_64")]
#[expect(
    unsafe_code,
    reason = "a prefetch is a hint: it reads and writes no memory"
)]
#[inline]
fn prefetch(p: *const i8) {
    // SAFETY: `_mm_prefetch` dereferences nothing and cannot fault; SSE is part of
    // x86_64's baseline.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn prefetch(_: *const i8) {}
