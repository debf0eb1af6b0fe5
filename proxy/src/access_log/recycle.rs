//! Record boxes go back to the thread that made them. A record is allocated by a worker
//! and formatted by the writer thread; freed there, every box would be freed across
//! threads, which glibc pays for with arena locks and lost tcache reuse on the worker.
//! Instead the writer empties each formatted record (what it held of its request goes
//! at once: buffers, and the listener and rule whose last reference ends their metric
//! series) and hands the empty box back to its home thread's return channel, whose
//! next record reuses it.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::record::HttpRecord;

/// Returned boxes a thread keeps: about what one worker logs between two of the
/// writer's passes (10 ms at 100k lines/s); more are freed by the writer.
const SPARES: usize = 2048;

/// The return channel's sending half, for the writer.
pub(super) type Home = &'static SyncSender<Box<HttpRecord>>;

struct Spares {
    home: Home,
    rx: Receiver<Box<HttpRecord>>,
}

thread_local! {
    // The sender is leaked (one small channel per thread that ever logs a request,
    // which are the data-plane workers) so records can name it without an `Arc` to
    // count per request. When the thread ends, its receiver goes and the writer
    // frees what it would have returned.
    static SPARES_HERE: Spares = {
        let (tx, rx) = sync_channel(SPARES);
        Spares { home: Box::leak(Box::new(tx)), rx }
    };
}

/// A returned box of this thread's, if one is waiting: the caller reuses what the box
/// kept (its head buffer) before [`place`] fills it.
pub(super) fn take_spare() -> Option<Box<HttpRecord>> {
    SPARES_HERE
        .try_with(|s| s.rx.try_recv().ok())
        .ok()
        .flatten()
}

/// `record` in `spare` (or a new box); its home is this thread.
pub(super) fn place(spare: Option<Box<HttpRecord>>, mut record: HttpRecord) -> Box<HttpRecord> {
    record.home = SPARES_HERE.try_with(|s| s.home).ok();
    match spare {
        Some(mut b) => {
            *b = record;
            b
        }
        None => Box::new(record),
    }
}

/// Empties a formatted record and sends its box back to the thread that made it (the
/// writer's side); when that thread's channel is full or gone, it is freed here.
pub(super) fn give_back(mut record: Box<HttpRecord>) {
    record.clear();
    if let Some(home) = record.home {
        let _ = home.try_send(record);
    }
}
