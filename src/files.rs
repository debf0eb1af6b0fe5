//! The standalone source: manifest files, re-read on every change, with the last good
//! content of each file kept when its new content fails to parse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aether_controller::manifest::{self, ManifestError};
use aether_controller::{Object, Store};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

pub struct FileSource {
    paths: Vec<PathBuf>,
    last_good: BTreeMap<PathBuf, Vec<Object>>,
}

/// A load: the Store to reconcile, and what could not be read.
pub struct Loaded {
    pub store: Store,
    pub errors: Vec<ManifestError>,
}

impl FileSource {
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Self {
            paths,
            last_good: BTreeMap::new(),
        }
    }

    /// Reads every manifest file. Blocking: call from a blocking thread.
    pub fn load(&mut self) -> Loaded {
        let (files, mut errors) = manifest::expand(&self.paths);
        // Files that are gone take their objects with them.
        self.last_good.retain(|p, _| files.contains(p));
        for file in &files {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(ManifestError {
                        file: file.clone(),
                        line: None,
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            let parsed = manifest::parse(file, &text);
            if parsed.errors.is_empty() {
                self.last_good.insert(file.clone(), parsed.objects);
            } else {
                for e in &parsed.errors {
                    tracing::error!(file = %e.file.display(), line = ?e.line, reason = %e.reason, "manifest error; keeping the file's last good content");
                }
                errors.extend(parsed.errors);
                // A file never seen good still contributes the documents that parsed.
                self.last_good.entry(file.clone()).or_insert(parsed.objects);
            }
        }
        let store = Store::from_objects(self.last_good.values().flatten().cloned());
        Loaded { store, errors }
    }
}

/// Watches `paths` and sends a tick on every change, coalescing bursts (editors write a
/// file in several steps) into one tick after `settle`.
pub fn watch(
    paths: &[PathBuf],
    settle: Duration,
) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev)
                if matches!(
                    ev.kind,
                    EventKind::Create(_)
                        | EventKind::Modify(_)
                        | EventKind::Remove(_)
                        | EventKind::Any
                ) =>
            {
                let _ = raw_tx.send(());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "file watch error"),
        })?;
    for p in paths {
        // Watch a file's directory, not the file: editors and `kubectl`-style tools
        // replace files by rename, which a watch on the old inode would miss.
        let (target, mode) = if p.is_dir() {
            (p.as_path(), RecursiveMode::Recursive)
        } else {
            (
                p.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new(".")),
                RecursiveMode::NonRecursive,
            )
        };
        watcher.watch(target, mode)?;
    }
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        while raw_rx.recv().await.is_some() {
            tokio::time::sleep(settle).await;
            while raw_rx.try_recv().is_ok() {}
            if tx.send(()).await.is_err() {
                break;
            }
        }
    });
    Ok((watcher, rx))
}
