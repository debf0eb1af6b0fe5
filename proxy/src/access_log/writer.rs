//! The writer thread: formats records and writes them out in batches. A thread, not a
//! task: writing stdout blocks (a slow pipe, a full disk), and that must stall only
//! the log, never a tokio worker.

use std::io::Write;
use std::sync::mpsc::Receiver;

use super::format::{http_fields, l4_fields, write_line};
use super::{Entry, Format};

/// Lines are gathered up to about this many bytes before a write.
const BATCH: usize = 64 * 1024;

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
    // Blocks while there is nothing to write; ends when every sender is gone.
    while let Ok(first) = rx.recv() {
        let mut acks = Vec::new();
        let mut next = Some(first);
        // Take whatever else is waiting, so a burst costs one write, not one per line.
        while let Some(entry) = next.take() {
            match entry {
                Entry::Http(r) => write_line(format, &http_fields(&r), &mut buf),
                Entry::L4(r) => write_line(format, &l4_fields(&r), &mut buf),
                Entry::Flush(ack) => acks.push(ack),
            }
            if buf.len() >= BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = out.write_all(&buf).and_then(|()| out.flush()) {
            // Nowhere to log lines any more (stdout closed): say so once and stop;
            // senders then count their lines as dropped.
            tracing::error!(error = %e, "cannot write the access log; access logging stops");
            return;
        }
        buf.clear();
        for ack in acks {
            let _ = ack.try_send(());
        }
    }
}
