//! Access logs: one line per HTTP request and per L4 connection, written off the
//! request path.
//!
//! A request that is logged (sampled) carries a boxed [`HttpRecord`]: what it arrived
//! with (target, authority, user agent, IDs) copied into one buffer that comes back
//! with the box for the next record, and the matched rule's `Arc`; the record travels with the response body and is handed to a bounded
//! channel when the body ends. A writer thread formats it (JSON or text) and writes
//! stdout. The request path never formats, never waits: when the channel is full the
//! line is dropped and counted in `aether_access_log_dropped_total`.

mod body;
mod format;
mod record;
mod recycle;
mod writer;

use std::io::Write;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::Duration;

use metrics::Counter;

pub use body::{LoggedBody, RequestBody};
pub use record::{HttpRecord, L4Record, begin_http};
pub(crate) use record::{Relayed, client_ip};

use crate::telemetry;

/// How each line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Json,
    /// One logfmt line (`key=value`, values with spaces quoted).
    Text,
}

/// Which status classes are logged: bit `n` is class `n`xx (1 to 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusClasses(u8);

impl StatusClasses {
    pub const ALL: Self = Self(0b11_1110);

    /// Parses `4xx,5xx` (any of 1xx to 5xx, comma-separated).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut bits = 0u8;
        for class in s.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            match class.as_bytes() {
                [d @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => bits |= 1 << (d - b'0'),
                _ => return Err(format!("{class:?} is not a status class (1xx to 5xx)")),
            }
        }
        if bits == 0 {
            return Err("no status class given".to_owned());
        }
        Ok(Self(bits))
    }

    pub fn contains(self, status: u16) -> bool {
        let class = status / 100;
        (1..=5).contains(&class) && self.0 & (1 << class) != 0
    }
}

/// The form [`StatusClasses::parse`] reads: `1xx,2xx`.
impl std::fmt::Display for StatusClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for class in (1..=5u8).filter(|c| self.0 & (1 << c) != 0) {
            let sep = if first { "" } else { "," };
            write!(f, "{sep}{class}xx")?;
            first = false;
        }
        Ok(())
    }
}

/// What is logged and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub format: Format,
    /// Share of HTTP requests and L4 connections logged, 0.0 to 1.0.
    pub sample: f64,
    /// HTTP answers whose status is in these classes are logged; L4 lines always are.
    pub statuses: StatusClasses,
}

impl Settings {
    pub const DEFAULT: Self = Self {
        format: Format::Text,
        sample: 1.0,
        statuses: StatusClasses::ALL,
    };
}

/// Lines waiting for the writer. A burst larger than this while stdout is slow loses
/// lines (counted) rather than holding requests or growing memory without bound; each
/// slot is one pointer.
pub const CAPACITY: usize = 8192;

/// What the writer thread receives.
enum Entry {
    Http(Box<HttpRecord>),
    L4(Box<L4Record>),
    /// Write everything before this, flush, and say so.
    Flush(SyncSender<()>),
}

/// The access log of the process: settings and the writer's channel.
pub struct AccessLog {
    settings: Settings,
    tx: SyncSender<Entry>,
    dropped: Counter,
}

impl AccessLog {
    /// Starts the writer thread on `out` (stdout in the edge) and returns the log.
    /// Leaked on purpose: there is one per process and it lives as long as the
    /// process, so requests can hold a plain `&'static` instead of an `Arc` to bump.
    pub fn start(
        settings: Settings,
        out: Box<dyn Write + Send>,
    ) -> std::io::Result<&'static AccessLog> {
        let (tx, rx) = mpsc::sync_channel(CAPACITY);
        writer::spawn(settings.format, rx, out)?;
        Ok(Box::leak(Box::new(AccessLog {
            settings,
            tx,
            dropped: metrics::counter!(telemetry::ACCESS_LOG_DROPPED_TOTAL),
        })))
    }

    /// Is this request or connection logged? Decided when it starts, so that one not
    /// logged costs no record.
    pub fn sampled(&self) -> bool {
        self.settings.sample >= 1.0 || fastrand::f64() < self.settings.sample
    }

    fn send(&self, entry: Entry) {
        match self.tx.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.dropped.increment(1),
            // The writer is gone (its output failed for good): nothing to write to.
            Err(TrySendError::Disconnected(_)) => self.dropped.increment(1),
        }
    }

    pub(crate) fn http(&self, record: Box<HttpRecord>) {
        if self.settings.statuses.contains(record.status) {
            self.send(Entry::Http(record));
        }
    }

    pub fn l4(&self, record: Box<L4Record>) {
        self.send(Entry::L4(record));
    }

    /// Blocks until every line sent so far is written and flushed, or `timeout`
    /// passes: call at exit, from a thread that may block.
    pub fn flush(&self, timeout: Duration) {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        let deadline = std::time::Instant::now() + timeout;
        let mut entry = Entry::Flush(ack_tx);
        // The channel may be full for a moment; retry until the deadline.
        loop {
            match self.tx.try_send(entry) {
                Ok(()) => break,
                Err(TrySendError::Full(e)) if std::time::Instant::now() < deadline => {
                    entry = e;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let _ = ack_rx.recv_timeout(left);
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("settings", &self.settings)
            .finish()
    }
}

#[cfg(test)]
mod tests;
