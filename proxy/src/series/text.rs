//! Prometheus text exposition of the families `crate::series` keeps: `# HELP` and
//! `# TYPE` once per family (from `telemetry::DESCRIPTIONS`), then its samples, one
//! series after another in label order so scrapes diff cleanly.

use std::fmt::{Display, Write as _};

use super::histogram::{BOUNDS_LE, Counts};
use crate::telemetry::{self, Kind};

/// One family's samples, grouped by series: a histogram's `_bucket`, `_sum` and
/// `_count` lines stay together and its buckets in `le` order, which a sort of single
/// lines would scatter (`le="10"` before `le="2.5"`).
pub(super) struct Family {
    name: &'static str,
    /// (label set, the series' lines), sorted by label set when written.
    series: Vec<(String, String)>,
}

impl Family {
    pub(super) fn new(name: &'static str) -> Self {
        Self {
            name,
            series: Vec::new(),
        }
    }

    /// A counter or gauge sample with `labels`; skipped at 0 unless `always`.
    pub(super) fn sample(&mut self, labels: &[(&str, &str)], value: u64, always: bool) {
        if value == 0 && !always {
            return;
        }
        let set = label_set(labels, None);
        let line = format!("{}{set} {value}\n", self.name);
        self.series.push((set, line));
    }

    /// A histogram's buckets (cumulative, `le` ascending, then `+Inf`), `_sum` and
    /// `_count`; skipped while it has counted nothing, so idle series cost nothing.
    pub(super) fn histogram(&mut self, labels: &[(&str, &str)], counts: &Counts) {
        if counts.count == 0 {
            return;
        }
        let name = self.name;
        let mut lines = String::new();
        let mut cumulative = 0u64;
        let les = BOUNDS_LE.iter().map(|le| le as &dyn Display);
        for (le, n) in les.chain([&"+Inf" as &dyn Display]).zip(&counts.buckets) {
            cumulative += n;
            let le = le.to_string();
            let set = label_set(labels, Some(("le", &le)));
            let _ = writeln!(lines, "{name}_bucket{set} {cumulative}");
        }
        let set = label_set(labels, None);
        let _ = writeln!(lines, "{name}_sum{set} {}", counts.sum_seconds());
        let _ = writeln!(lines, "{name}_count{set} {}", counts.count);
        self.series.push((set, lines));
    }

    pub(super) fn write(mut self, out: &mut String) {
        if self.series.is_empty() {
            return;
        }
        self.series.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let described = telemetry::DESCRIPTIONS.iter().find(|d| d.name == self.name);
        let help = described.map_or("", |d| d.help);
        let kind = match described.map(|d| d.kind) {
            Some(Kind::Gauge) => "gauge",
            Some(Kind::Histogram) => "histogram",
            Some(Kind::Counter) | None => "counter",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(help));
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (_, lines) in &self.series {
            out.push_str(lines);
        }
        out.push('\n');
    }
}

/// `{k="v",...}` with `extra` (a histogram's `le`) last; empty without labels.
fn label_set(labels: &[(&str, &str)], extra: Option<(&str, &str)>) -> String {
    let mut s = String::new();
    for (i, (k, v)) in labels.iter().chain(extra.as_ref()).enumerate() {
        s.push(if i == 0 { '{' } else { ',' });
        let _ = write!(s, "{k}=\"{}\"", escape(v));
    }
    if !s.is_empty() {
        s.push('}');
    }
    s
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}
