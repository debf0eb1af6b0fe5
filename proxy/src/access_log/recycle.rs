//! Records go back to the thread that made them. A record is allocated by a worker and
//! formatted by the writer thread; freed there, its box and the buffers its clones
//! share (the request head's bytes) would be freed across threads, which glibc pays
//! for with arena locks and lost tcache reuse on the worker (issue 16: with the log on,
//! the worker's allocator share went from 4.7% to 6.2% on h2c). Instead the writer
//! hands each formatted record back to its home thread's return channel; that
//! thread empties it (its contents dropped where they were allocated) and reuses the
//! box for a later record.

use std::cell::RefCell;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::record::HttpRecord;

/// Returned records a thread keeps: about what one worker logs between two of the
/// writer's passes (10 ms at 100k lines/s); more are freed by the writer.
const SPARES: usize = 2048;

/// The return channel's sending half, for the writer.
pub(super) type Home = &'static SyncSender<Box<HttpRecord>>;

struct Spares {
    home: Home,
    rx: Receiver<Box<HttpRecord>>,
    /// Returned boxes, emptied: kept as boxes because boxes are what is reused.
    #[allow(clippy::vec_box)]
    empty: RefCell<Vec<Box<HttpRecord>>>,
}

thread_local! {
    // The sender is leaked (one small channel per thread that ever logs a request,
    // which are the data-plane workers) so records can name it without an `Arc` to
    // count per request. When the thread ends, its receiver goes and the writer
    // frees what it would have returned.
    static SPARES_HERE: Spares = {
        let (tx, rx) = sync_channel(SPARES);
        Spares { home: Box::leak(Box::new(tx)), rx, empty: RefCell::new(Vec::new()) }
    };
}

/// `record` boxed, in a returned box when one is waiting; its home is this thread.
pub(super) fn boxed(mut record: HttpRecord) -> Box<HttpRecord> {
    let spare = SPARES_HERE
        .try_with(|s| {
            record.home = Some(s.home);
            let mut empty = s.empty.borrow_mut();
            // Everything returned since this thread's last record is emptied now, so
            // no returned box keeps a request's buffers or an old Snapshot's
            // listener alive for longer than that.
            while let Ok(mut r) = s.rx.try_recv() {
                r.clear();
                if empty.len() < SPARES {
                    empty.push(r);
                }
            }
            empty.pop()
        })
        .ok()
        .flatten();
    match spare {
        Some(mut b) => {
            *b = record;
            b
        }
        None => Box::new(record),
    }
}

/// Sends a formatted record back to the thread that made it (the writer's side);
/// when that thread's channel is full or gone, it is freed here.
pub(super) fn give_back(record: Box<HttpRecord>) {
    if let Some(home) = record.home {
        let _ = home.try_send(record);
    }
}
