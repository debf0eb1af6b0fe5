//! The writer thread: drains every thread's ring of formatted lines and writes them
//! out. A thread, not a task: writing stdout blocks (a slow pipe, a full disk), and that
//! must stall only the log, never a tokio worker. It polls the rings on a timer, so a
//! request putting its line wakes it only when its ring passes half full.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use super::AccessLog;
use super::ring::{RING, Reader};

/// How long the writer sleeps after finding lines, and at most when idle, unless a
/// filling ring wakes it. It is not woken per line: a wake per line is a futex call
/// and a context switch per request that cost the request path more than its line
/// (measured: a third of a core at 12k req/s). Each pass costs the core two context
/// switches and the worker's caches, so while lines flow it passes every 50 ms, not 10
/// (part of the 2.3% of req/s in `ring::RING`'s note), or sooner when a ring passes
/// half full. An idle edge wakes 10 times a second.
const BUSY_INTERVAL: Duration = Duration::from_millis(50);
const IDLE_INTERVAL: Duration = Duration::from_millis(100);

pub(super) fn spawn(
    log: &'static AccessLog,
    new_rings: Receiver<Reader>,
    out: Box<dyn Write + Send>,
) -> std::io::Result<std::thread::Thread> {
    let handle = std::thread::Builder::new()
        .name("access-log".to_owned())
        .spawn(move || run(log, &new_rings, out))?;
    Ok(handle.thread().clone())
}

fn run(log: &'static AccessLog, new_rings: &Receiver<Reader>, mut out: Box<dyn Write + Send>) {
    let mut rings: Vec<Reader> = Vec::new();
    let mut idle = BUSY_INTERVAL;
    loop {
        // Read first: every line put before a flush was asked is in a ring (or a ring
        // on its way) by now, and is written in this pass.
        let asked = log.flush_asked.load(Ordering::Acquire);
        rings.extend(new_rings.try_iter());
        let mut most = 0;
        for ring in &mut rings {
            match drain(ring, &mut out) {
                Ok(n) => most = most.max(n),
                Err(e) => return stop(log, &e),
            }
        }
        if most > 0
            && let Err(e) = out.flush()
        {
            return stop(log, &e);
        }
        // A thread that ended leaves its ring; what it put is written above.
        rings.retain(|r| !(r.is_abandoned() && r.is_empty()));
        log.flushed.store(asked, Ordering::Release);
        idle = if most > 0 {
            BUSY_INTERVAL
        } else {
            (idle * 2).min(IDLE_INTERVAL)
        };
        std::thread::park_timeout(idle);
    }
}

/// Writes what `ring` holds (whole lines: a worker commits a line at a time); the
/// number of bytes.
fn drain(ring: &mut Reader, out: &mut Box<dyn Write + Send>) -> std::io::Result<usize> {
    let n = ring.slots();
    if n == 0 {
        return Ok(0);
    }
    let Ok(chunk) = ring.read_chunk(n) else {
        return Ok(0);
    };
    let (first, second) = chunk.as_slices();
    out.write_all(first)?;
    out.write_all(second)?;
    chunk.commit_all();
    Ok(n)
}

/// Nowhere to write lines any more (stdout closed): say so once and stop; the rings
/// fill and their lines are counted as dropped.
fn stop(log: &AccessLog, e: &std::io::Error) {
    tracing::error!(error = %e, "cannot write the access log; access logging stops");
    log.stopped.store(true, Ordering::Release);
}

/// When `out` is a pipe (a container runtime's stdout), asks the kernel for a buffer of
/// one ring, so the writer's pass is one write rather than one per 64 KiB (the default)
/// that the reader drains, each a sleep and a wake-up on the edge's core. Measured side
/// by side with a reader on the other core: the larger ring and rarer passes gave
/// +0.8% req/s through a 64 KiB pipe against +2.3% to a file. The pipe's size after,
/// `None` when `out` is not a pipe or could not be resized (above
/// `/proc/sys/fs/pipe-max-size` for an unprivileged process): it serves as it is.
pub fn size_pipe(out: impl AsFd) -> Option<usize> {
    let before = rustix::pipe::fcntl_getpipe_size(&out).ok()?;
    if before >= RING {
        return Some(before);
    }
    match rustix::pipe::fcntl_setpipe_size(&out, RING) {
        Ok(after) => Some(after),
        Err(e) => {
            tracing::debug!(error = %e, before, "the access log's pipe keeps its size");
            None
        }
    }
}
