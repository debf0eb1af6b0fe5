//! Access logs: one line per HTTP request and per L4 connection, written off the
//! request path.
//!
//! A request that is logged (sampled) carries a boxed [`HttpRecord`]: what it arrived
//! with (target, authority, user agent, IDs) copied into one buffer, and the matched
//! rule's `Arc`; the record travels with the response body, and its box is kept for
//! the thread's next record. When the body ends, the
//! thread that sent it formats the line (JSON or text) into a ring of its own (see
//! `ring`), and a writer thread writes the rings to stdout. The request path never
//! writes and never waits: when its ring is full (stdout slower than the traffic) the
//! line is dropped and counted in `aether_access_log_dropped_total`.

mod body;
mod format;
mod record;
mod ring;
mod writer;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

use metrics::Counter;

pub use body::{LoggedBody, RequestBody};
pub use record::{HttpRecord, L4Record, begin_http};
pub(crate) use record::{Relayed, client_ip};
pub use writer::size_pipe;

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

/// The access log of the process: settings, and the way to the writer thread.
pub struct AccessLog {
    settings: Settings,
    /// Where a thread's first line sends its ring's reading end.
    new_rings: Sender<ring::Reader>,
    writer: OnceLock<std::thread::Thread>,
    /// Flushes asked for, and the last one the writer has done: a flush waits for its
    /// number to be done.
    flush_asked: AtomicU64,
    flushed: AtomicU64,
    /// The writer's output failed for good.
    stopped: AtomicBool,
    dropped: Counter,
    /// Times a worker woke the writer, for the tests.
    #[cfg(test)]
    wakes: std::sync::atomic::AtomicUsize,
}

impl AccessLog {
    /// Starts the writer thread on `out` (stdout in the edge) and returns the log.
    /// Leaked on purpose: there is one per process and it lives as long as the
    /// process, so requests can hold a plain `&'static` instead of an `Arc` to bump.
    pub fn start(
        settings: Settings,
        out: Box<dyn std::io::Write + Send>,
    ) -> std::io::Result<&'static AccessLog> {
        let (new_rings, rings) = mpsc::channel();
        let log: &'static AccessLog = Box::leak(Box::new(AccessLog {
            settings,
            new_rings,
            writer: OnceLock::new(),
            flush_asked: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            dropped: metrics::counter!(telemetry::ACCESS_LOG_DROPPED_TOTAL),
            #[cfg(test)]
            wakes: std::sync::atomic::AtomicUsize::new(0),
        }));
        let writer = writer::spawn(log, rings, out)?;
        let _ = log.writer.set(writer);
        Ok(log)
    }

    /// Is this request or connection logged? Decided when it starts, so that one not
    /// logged costs no record.
    pub fn sampled(&self) -> bool {
        self.settings.sample >= 1.0 || fastrand::f64() < self.settings.sample
    }

    /// Formats a line in style `S` on this thread and hands it to the writer, or
    /// counts it dropped.
    fn put<S: format::Style>(&self, fields: impl FnOnce(&mut format::Line<'_, '_, S>)) {
        let put = !self.stopped.load(Ordering::Relaxed)
            && ring::put(self, |w, out| {
                let mut line = w.line::<S>(out);
                fields(&mut line);
                line.end();
            });
        if !put {
            self.dropped.increment(1);
        }
    }

    pub(crate) fn http(&self, record: Box<HttpRecord>) {
        if !self.settings.statuses.contains(record.status) {
            return record.give_back();
        }
        match self.settings.format {
            Format::Json => self.http_line::<format::Json>(record),
            Format::Text => self.http_line::<format::Text>(record),
        }
    }

    /// Puts `record`'s line in style `S`. The record goes back (its `Arc`s let go) as
    /// soon as its line is rendered, before the line is copied into the ring: an atomic
    /// operation waits for every store before it to reach the cache, and the ring, gone
    /// round since this part was last written, is not in it. Given back after the copy,
    /// the rule's `Arc` decrement took three quarters of `http`'s samples
    /// (benches/RESULTS.md, session 37). A line not put (the log stopped) drops its
    /// record instead.
    fn http_line<S: format::Style>(&self, record: Box<HttpRecord>) {
        self.put::<S>(move |line| {
            format::http_line(&record, line);
            record.give_back();
        });
    }

    pub fn l4(&self, record: Box<L4Record>) {
        match self.settings.format {
            Format::Json => self.put::<format::Json>(|line| format::l4_line(&record, line)),
            Format::Text => self.put::<format::Text>(|line| format::l4_line(&record, line)),
        }
    }

    /// Has the writer drain the rings now rather than at its next timer.
    fn wake_writer(&self) {
        #[cfg(test)]
        self.wakes.fetch_add(1, Ordering::Relaxed);
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    /// Blocks until every line put so far is written and flushed, or `timeout`
    /// passes: call at exit, from a thread that may block.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let want = self.flush_asked.fetch_add(1, Ordering::AcqRel) + 1;
        self.wake_writer();
        while self.flushed.load(Ordering::Acquire) < want
            && !self.stopped.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("settings", &self.settings)
            .finish()
    }
}

/// Lines rendered the way a worker renders them, without a ring or a writer: what
/// `benches/access_log.rs` measures.
#[doc(hidden)]
pub struct BenchLines {
    lines: format::LineWriter,
    out: Vec<u8>,
}

#[doc(hidden)]
impl BenchLines {
    #[must_use]
    pub fn new() -> Self {
        Self {
            lines: format::LineWriter::new(),
            out: Vec::with_capacity(512),
        }
    }

    /// Renders `record`'s line in `format` and returns it.
    pub fn render(&mut self, record: &HttpRecord, format: Format) -> &[u8] {
        self.out.clear();
        match format {
            Format::Json => {
                let mut line = self.lines.line::<format::Json>(&mut self.out);
                format::http_line(record, &mut line);
                line.end();
            }
            Format::Text => {
                let mut line = self.lines.line::<format::Text>(&mut self.out);
                format::http_line(record, &mut line);
                line.end();
            }
        }
        &self.out
    }
}

impl Default for BenchLines {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
