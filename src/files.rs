//! The standalone source: manifest files, re-read on every change, with the last good
//! content of each file kept when its new content fails to parse.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use aether_controller::manifest::{self, ManifestError};
use aether_controller::{Object, Store};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

pub struct FileSource {
    paths: Vec<PathBuf>,
    last_good: BTreeMap<PathBuf, Vec<Object>>,
    /// Each file's text (by hash) as last parsed, and that parse's errors: a change to
    /// one file re-parses that file only. YAML parsing was the largest cost of a
    /// change with thousands of routes in other files.
    parsed: BTreeMap<PathBuf, (u64, Vec<ManifestError>)>,
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
            parsed: BTreeMap::new(),
        }
    }

    /// Reads every manifest file. Blocking: call from a blocking thread.
    pub fn load(&mut self) -> Loaded {
        let (files, mut errors) = manifest::expand(&self.paths);
        // Files that are gone take their objects with them.
        self.last_good.retain(|p, _| files.contains(p));
        self.parsed.retain(|p, _| files.contains(p));
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
            let hash = {
                let mut h = DefaultHasher::new();
                text.hash(&mut h);
                h.finish()
            };
            if let Some((seen, seen_errors)) = self.parsed.get(file)
                && *seen == hash
            {
                errors.extend(seen_errors.iter().cloned());
                continue;
            }
            let parsed = manifest::parse(file, &text);
            self.parsed
                .insert(file.clone(), (hash, parsed.errors.clone()));
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

/// Watches `paths` and sends a tick on every change. A finished write (a file closed
/// after writing, renamed into place, or removed) ticks at once, so a change is served
/// without waiting; other events (a file truncated and still being written) wait for
/// the write to finish, at most `settle`, so a half-written file is never applied.
/// Events queued behind a tick are folded into it.
pub fn watch(
    paths: &[PathBuf],
    settle: Duration,
) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<bool>();
    let mut watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) => {
                if let Some(finished) = classify(ev.kind) {
                    let _ = raw_tx.send(finished);
                }
            }
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
        while let Some(finished) = raw_rx.recv().await {
            if !finished {
                let deadline = tokio::time::sleep(settle);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        () = &mut deadline => break,
                        ev = raw_rx.recv() => match ev {
                            Some(true) | None => break,
                            Some(false) => {}
                        },
                    }
                }
            }
            while raw_rx.try_recv().is_ok() {}
            if tx.send(()).await.is_err() {
                break;
            }
        }
    });
    Ok((watcher, rx))
}

/// `Some(true)` for an event that ends a write, `Some(false)` for one that may be in
/// the middle of one, `None` for events that change nothing.
fn classify(kind: EventKind) -> Option<bool> {
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write))
        | EventKind::Modify(ModifyKind::Name(_))
        | EventKind::Remove(_) => Some(true),
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Any => Some(false),
        EventKind::Access(_) | EventKind::Other => None,
    }
}
