//! The writer thread: formats records and writes them out in batches. A thread, not a
//! task: writing stdout blocks (a slow pipe, a full disk), and that must stall only
//! the log, never a tokio worker. It polls the channel on a short timer, so a request
//! handing over its line never has to wake it.

use std::io::Write;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use super::format::{LineWriter, http_fields, l4_fields};
use super::{Entry, Format};

/// Lines are gathered up to about this many bytes before a write.
const BATCH: usize = 64 * 1024;
/// How long the writer sleeps after finding lines, and at most when idle. The writer
/// polls instead of blocking on the channel: a receiver blocked in `recv` must be woken
/// by every send, a futex wake and a context switch per request that cost the request
/// path more than formatting the line (measured: a third of a core at 12k req/s). At
/// 10 ms, the 8,192 slots absorb 800k lines/s; an idle edge wakes 10 times a second.
const BUSY_INTERVAL: Duration = Duration::from_millis(10);
const IDLE_INTERVAL: Duration = Duration::from_millis(100);

pub(super) fn spawn(
    format: Format,
    rx: Receiver<Entry>,
    out: Box<dyn Write + Send>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("access-log".to_owned())
        .spawn(move || run(format, &rx, out))?;
    Ok(())
}

fn run(format: Format, rx: &Receiver<Entry>, mut out: Box<dyn Write + Send>) {
    let mut buf = Vec::with_capacity(BATCH);
    let mut lines = LineWriter::new(format);
    let mut acks = Vec::new();
    let mut idle = BUSY_INTERVAL;
    loop {
        let mut wrote = false;
        // Everything waiting, a batch per write.
        loop {
            let entry = match rx.try_recv() {
                Ok(e) => e,
                Err(TryRecvError::Empty) => break,
                // Every sender is gone: the process is ending.
                Err(TryRecvError::Disconnected) => {
                    let _ = out.write_all(&buf).and_then(|()| out.flush());
                    return;
                }
            };
            match entry {
                Entry::Http(r) => {
                    lines.write_line(&http_fields(&r), &mut buf);
                    super::recycle::give_back(r);
                }
                Entry::L4(r) => lines.write_line(&l4_fields(&r), &mut buf),
                Entry::Flush(ack) => acks.push(ack),
            }
            if buf.len() >= BATCH && !write(&mut out, &mut buf) {
                return;
            }
            wrote = true;
        }
        if !write(&mut out, &mut buf) {
            return;
        }
        for ack in acks.drain(..) {
            let _ = ack.try_send(());
        }
        // Back off while nothing comes; come back soon while lines flow.
        idle = if wrote {
            BUSY_INTERVAL
        } else {
            (idle * 2).min(IDLE_INTERVAL)
        };
        std::thread::sleep(idle);
    }
}

/// Writes and flushes `buf`, then empties it; false when the output failed for good.
fn write(out: &mut Box<dyn Write + Send>, buf: &mut Vec<u8>) -> bool {
    if buf.is_empty() {
        return true;
    }
    if let Err(e) = out.write_all(buf).and_then(|()| out.flush()) {
        // Nowhere to write lines any more (stdout closed): say so once and stop;
        // senders then count their lines as dropped.
        tracing::error!(error = %e, "cannot write the access log; access logging stops");
        return false;
    }
    buf.clear();
    true
}
