//! The Prometheus recorder: every metric described once at start (`# HELP`, `# TYPE`),
//! `aether_build_info`, and the standard `process_*` set, refreshed on every scrape.

use std::time::Duration;

use aether_proxy::telemetry;
use anyhow::Context;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The recorder's handle and the process collector, kept by the admin server.
pub struct Exporter {
    prometheus: PrometheusHandle,
    process: metrics_process::Collector,
}

impl Exporter {
    /// `/metrics`: the process metrics read now, then everything in Prometheus text:
    /// the recorder's families, then the Gateway, listener, route and backend series of
    /// the Snapshots still alive (`aether_proxy::series`, which the recorder never sees).
    pub fn render(&self) -> String {
        self.process.collect();
        let mut text = self.prometheus.render();
        aether_proxy::series::render(&mut text);
        text
    }
}

/// Installs the global recorder, describes every metric and starts the upkeep tick.
/// Needs a Tokio runtime.
pub fn install() -> anyhow::Result<Exporter> {
    // No histogram goes through the recorder: the duration histograms are
    // `aether_proxy::series` cells, which leave /metrics with their Gateway or route.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    telemetry::describe();
    telemetry::build_info();
    telemetry::register_at_zero();
    let process = metrics_process::Collector::default();
    process.describe();
    process.collect();
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(Exporter {
        prometheus,
        process,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use aether_proxy::telemetry::{DESCRIPTIONS, Kind};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// `pub const NAME: &str = "aether_…";` in proxy/src/telemetry.rs: NAME -> value.
    fn constants(telemetry: &str) -> BTreeMap<String, String> {
        telemetry
            .lines()
            .filter_map(|l| {
                let rest = l.trim().strip_prefix("pub const ")?;
                let (name, value) = rest.split_once(": &str = \"")?;
                Some((name.to_owned(), value.strip_suffix("\";")?.to_owned()))
            })
            .collect()
    }

    /// Every `counter!`, `gauge!` and `histogram!` in src/, proxy/src and controller/src
    /// names a metric (a string literal, or a constant of proxy/src/telemetry.rs) that is
    /// described, as that kind: a new metric without `# HELP` fails here. None names a
    /// family `aether_proxy::series` renders.
    #[test]
    fn every_metric_is_described() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let consts =
            constants(&std::fs::read_to_string(root.join("proxy/src/telemetry.rs")).unwrap());
        let described: BTreeMap<&str, Kind> =
            DESCRIPTIONS.iter().map(|d| (d.name, d.kind)).collect();
        assert_eq!(
            described.len(),
            DESCRIPTIONS.len(),
            "a metric is described twice"
        );
        let mut files = Vec::new();
        for dir in ["src", "proxy/src", "controller/src"] {
            rust_files(&root.join(dir), &mut files);
        }
        let mut problems = Vec::new();
        let mut seen = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for (macro_name, kind) in [
                ("counter!(", Kind::Counter),
                ("gauge!(", Kind::Gauge),
                ("histogram!(", Kind::Histogram),
            ] {
                for (at, _) in text.match_indices(macro_name) {
                    // `describe_counter!(` and the like are not uses, nor this test's
                    // own "counter!(".
                    if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '"') {
                        continue;
                    }
                    let args = &text[at + macro_name.len()..];
                    let first = args.split([',', ')']).next().unwrap_or_default().trim();
                    let name = if let Some(lit) = first.strip_prefix('"') {
                        lit.trim_end_matches('"').to_owned()
                    } else {
                        let ident = first.rsplit("::").next().unwrap_or_default();
                        // A closure's parameter (`|name| counter!(name, …)` in l4): its
                        // callers pass constants, which are checked where they are defined.
                        if ident.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                            continue;
                        }
                        match consts.get(ident) {
                            Some(v) => v.clone(),
                            None => {
                                problems.push(format!("{}: {macro_name}{first}: not a constant of proxy/src/telemetry.rs", file.display()));
                                continue;
                            }
                        }
                    };
                    seen += 1;
                    if aether_proxy::series::FAMILIES.contains(&name.as_str()) {
                        problems.push(format!(
                            "{}: {name} is rendered by aether_proxy::series; through the recorder too it would appear twice",
                            file.display()
                        ));
                    }
                    match described.get(name.as_str()) {
                        None => problems.push(format!(
                            "{}: {name} has no description in telemetry::DESCRIPTIONS",
                            file.display()
                        )),
                        Some(k) if *k != kind => problems.push(format!(
                            "{}: {name} is used by {macro_name} but described as {k:?}",
                            file.display()
                        )),
                        Some(_) => {}
                    }
                }
            }
        }
        assert!(
            seen > 30,
            "found only {seen} metric uses: is the scan broken?"
        );
        // The constants that only l4's closure uses are described too.
        for (ident, value) in &consts {
            if value.starts_with("aether_") && !described.contains_key(value.as_str()) {
                problems.push(format!("telemetry::{ident} ({value}) has no description"));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
