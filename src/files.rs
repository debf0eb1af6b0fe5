//! The standalone source: manifest files kept in one Store that each change updates by
//! the objects it touches. A file whose new content fails to parse keeps its last good
//! content serving.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aether_controller::manifest::{self, ManifestError};
use aether_controller::store::ObjectId;
use aether_controller::{Object, Store};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

pub struct FileSource {
    paths: Vec<PathBuf>,
    store: Store,
    /// Keyed by shared paths: `shared` names files by these.
    files: BTreeMap<Arc<Path>, FileState>,
    /// The objects more than one file declares, with those files in load order: the
    /// last one's version is served, as if the files were applied one after another.
    /// An object one file declares (nearly every one) has no entry: its file's
    /// documents name it and the Store holds it. A table of every object's files was
    /// 120 bytes a route.
    shared: HashMap<ObjectId, Vec<Arc<Path>>>,
    /// The errors last reported, so that a load changing nothing publishes nothing.
    last_errors: Vec<ManifestError>,
}

/// What a file contributes, as last read.
#[derive(Default)]
struct FileState {
    /// Size, modification time and inode, and when the file was last read: a file
    /// whose stamp is unchanged is not read again once its modification time was
    /// already old at that read (file times are coarse: two writes within one clock
    /// tick can leave the same stamp).
    stamp: Option<(u64, SystemTime, u64)>,
    read_at: Option<SystemTime>,
    /// Hash of the whole text last read.
    hash: u64,
    /// The hash of every document of the last good content, and what it declares: a
    /// change re-parses only the documents whose text changed. (Its objects are
    /// derived from it when the file changes, not kept beside it.)
    docs: Vec<(u64, Option<ObjectId>)>,
    /// The errors of the last read.
    errors: Vec<ManifestError>,
    /// Has any content of this file loaded without errors?
    seen_good: bool,
}

impl FileState {
    /// Per object declared, the hash of the document that declares it (the last one,
    /// when a file declares an object twice).
    fn objects(&self) -> BTreeMap<ObjectId, u64> {
        self.docs
            .iter()
            .filter_map(|(h, id)| id.clone().map(|id| (id, *h)))
            .collect()
    }

    fn declares(&self, id: &ObjectId) -> bool {
        self.docs.iter().any(|(_, d)| d.as_ref() == Some(id))
    }
}

/// What a load found.
pub struct Loaded {
    /// Did the Store or the list of errors change? If not there is nothing to publish.
    pub changed: bool,
    pub errors: Vec<ManifestError>,
}

impl FileSource {
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Self {
            paths,
            store: Store::default(),
            files: BTreeMap::new(),
            shared: HashMap::new(),
            last_errors: Vec::new(),
        }
    }

    /// The objects of every file, as last loaded.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Reads what changed on disk into the Store. Blocking: call from a blocking thread.
    pub fn load(&mut self) -> Loaded {
        self.load_touched(None)
    }

    /// [`load`](Self::load), told which files the watcher saw written (`touched`, as
    /// [`watch`] reports them): a file read before that is not among them is not looked
    /// at again. Writing a file always makes an event naming it, so only those can
    /// differ; a hint naming anything that is not a manifest file now (a removed file,
    /// a new folder, a path spelled differently) is ignored and every file is looked at.
    pub fn load_touched(&mut self, touched: Option<&HashSet<PathBuf>>) -> Loaded {
        let (files, mut errors) = manifest::expand(&self.paths);
        let routes_before = self.store.route_counts();
        let touched = touched.filter(|t| t.iter().all(|p| files.binary_search(p).is_ok()));
        let mut changed = false;
        // Files that are gone take their objects with them (`expand` returns them sorted).
        let gone: Vec<Arc<Path>> = self
            .files
            .keys()
            .filter(|p| files.binary_search_by(|f| f.as_path().cmp(p)).is_err())
            .cloned()
            .collect();
        for file in gone {
            if let Some(state) = self.files.remove(&file) {
                for id in state.objects().keys() {
                    changed |= self.withdraw(&file, id);
                }
            }
        }
        for file in &files {
            let untouched =
                touched.is_some_and(|t| !t.contains(file)) && self.files.contains_key(&**file);
            if !untouched {
                changed |= self.load_file(file);
            }
            if let Some(state) = self.files.get(&**file) {
                errors.extend(state.errors.iter().cloned());
            }
        }
        self.store.repack_grown(routes_before);
        if errors != self.last_errors {
            changed = true;
            self.last_errors.clone_from(&errors);
        }
        Loaded { changed, errors }
    }

    /// Brings one file's objects up to date; true if the Store changed.
    fn load_file(&mut self, file: &Path) -> bool {
        let stamp = stamp(file);
        let state = self.files.entry(Arc::from(file)).or_default();
        let settled = match (stamp, state.read_at) {
            (Some((_, modified, _)), Some(read_at)) => modified + STAMP_SETTLED < read_at,
            _ => false,
        };
        if settled && state.stamp == stamp {
            return false;
        }
        state.read_at = Some(SystemTime::now());
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) => {
                state.stamp = None;
                state.errors = vec![ManifestError {
                    file: file.to_owned(),
                    line: None,
                    reason: e.to_string(),
                }];
                return false;
            }
        };
        state.stamp = stamp;
        let hash = hash_of(&text);
        if state.seen_good && state.hash == hash {
            return false;
        }
        state.hash = hash;
        let known: HashMap<u64, Option<ObjectId>> = state.docs.iter().cloned().collect();
        let mut docs = Vec::new();
        let mut parsed: HashMap<u64, Object> = HashMap::new();
        let mut errors = Vec::new();
        for (first_line, doc) in manifest::documents(&text) {
            let doc_hash = hash_of(doc);
            if let Some(id) = known.get(&doc_hash) {
                docs.push((doc_hash, id.clone()));
                continue;
            }
            match manifest::parse_document(file, first_line, doc) {
                Ok(object) => {
                    let id = object.as_ref().map(|o| o.id());
                    if let Some(object) = object {
                        parsed.insert(doc_hash, object);
                    }
                    docs.push((doc_hash, id));
                }
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            for e in &errors {
                tracing::error!(file = %e.file.display(), line = ?e.line, reason = %e.reason, "manifest error; keeping the file's last good content");
            }
            state.errors = errors;
            // A file never seen good still contributes the documents that parsed.
            if state.seen_good {
                return false;
            }
        } else {
            state.errors.clear();
            state.seen_good = true;
        }
        let before = state.objects();
        docs.shrink_to_fit();
        state.docs = docs;
        let objects = state.objects();
        let mut changed = false;
        for id in before.keys().filter(|id| !objects.contains_key(*id)) {
            changed |= self.withdraw(file, id);
        }
        for (id, doc_hash) in &objects {
            if before.get(id) == Some(doc_hash) {
                continue;
            }
            let object = match parsed.remove(doc_hash) {
                Some(o) => o,
                // The document is unchanged but now wins over another one declaring
                // the same object in this file: read it again.
                None => match self.reparse(file, id) {
                    Some(o) => o,
                    None => continue,
                },
            };
            changed |= self.declare(file, id, object, before.contains_key(id));
        }
        changed
    }

    /// `file` declares `object` (and did before if `redeclared`): the Store takes it
    /// unless a later file also declares it. `file`'s documents already name it.
    fn declare(&mut self, file: &Path, id: &ObjectId, object: Object, redeclared: bool) -> bool {
        if !self.shared.contains_key(id) {
            // The only file that declares it, or the first.
            if redeclared || !self.store.contains(id) {
                return self.store.apply_as(object, id);
            }
            // Another file declares it too (rare): find each one, in load order.
            let files = self
                .files
                .iter()
                .filter(|(_, state)| state.declares(id))
                .map(|(path, _)| Arc::clone(path))
                .collect();
            self.shared.insert(id.clone(), files);
        }
        let path = self.shared_path(file);
        let Some(files) = self.shared.get_mut(id) else {
            return false;
        };
        if let Err(at) = files.binary_search_by(|f| (**f).cmp(file)) {
            files.insert(at, path);
        }
        if let Some(last) = files.last().filter(|last| ***last != *file) {
            tracing::warn!(object = %id, file = %file.display(), served_from = %last.display(), "object declared in several files; the last file's version is served");
            return false;
        }
        self.store.apply_as(object, id)
    }

    fn shared_path(&self, file: &Path) -> Arc<Path> {
        match self.files.get_key_value(file) {
            Some((path, _)) => Arc::clone(path),
            None => Arc::from(file),
        }
    }

    /// `file` no longer declares `id`: the Store drops it, or takes the version of the
    /// file that declares it next.
    fn withdraw(&mut self, file: &Path, id: &ObjectId) -> bool {
        let Some(files) = self.shared.get_mut(id) else {
            // `file` was the only one declaring it.
            return self.store.remove(id);
        };
        let was_served = files.last().is_some_and(|f| **f == *file);
        files.retain(|f| **f != *file);
        let next = files.last().cloned();
        if files.len() < 2 {
            self.shared.remove(id);
        }
        if !was_served {
            return false;
        }
        match next.and_then(|f| self.reparse(&f, id)) {
            Some(object) => self.store.apply_as(object, id),
            None => self.store.remove(id),
        }
    }

    /// The last good version of `id` in `file`, read again (rare: an object declared
    /// more than once).
    fn reparse(&self, file: &Path, id: &ObjectId) -> Option<Object> {
        let text = std::fs::read_to_string(file).ok()?;
        manifest::parse(file, &text)
            .objects
            .into_iter()
            .rev()
            .find(|o| o.id() == *id)
    }
}

/// How old a modification time must be for an unchanged stamp to prove unchanged
/// content: well above any file system's timestamp granularity.
const STAMP_SETTLED: Duration = Duration::from_secs(2);

fn stamp(file: &Path) -> Option<(u64, SystemTime, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(file).ok()?;
    Some((meta.len(), meta.modified().ok()?, meta.ino()))
}

fn hash_of(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Watches `paths` and sends a tick on every change to a file `relevant` accepts. A
/// finished write (a file closed after writing, renamed into place, or removed) ticks at
/// once unless another relevant file is still being written: then the tick waits for
/// that write to finish too, at most `settle`, so a half-written file is never read
/// (a write elsewhere used to tick while a manifest was truncated and not yet
/// rewritten, which withdrew its routes for a moment). Events queued behind a tick are
/// folded into it.
pub fn watch(
    paths: &[PathBuf],
    settle: Duration,
    relevant: fn(&Path) -> bool,
) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<Touched>)> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<(bool, Vec<PathBuf>)>();
    let mut watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) => {
                let Some(finished) = classify(ev.kind) else {
                    return;
                };
                // An event without paths (a queue overflow) may hide anything.
                let unknown = ev.paths.is_empty();
                let paths: Vec<PathBuf> = ev.paths.into_iter().filter(|p| relevant(p)).collect();
                if !paths.is_empty() || unknown {
                    let _ = raw_tx.send((finished, paths));
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
        // Files with a write begun and not yet finished.
        let mut writing: HashSet<PathBuf> = HashSet::new();
        let note = |writing: &mut HashSet<PathBuf>,
                    touched: &mut Touched,
                    (finished, paths): (bool, Vec<PathBuf>)| {
            // An event without paths (a queue overflow) may hide anything.
            if paths.is_empty() {
                *touched = None;
            }
            for p in paths {
                if let Some(t) = touched.as_mut() {
                    t.insert(p.clone());
                }
                if finished {
                    writing.remove(&p);
                } else {
                    writing.insert(p);
                }
            }
        };
        while let Some(ev) = raw_rx.recv().await {
            let mut touched = Some(HashSet::new());
            note(&mut writing, &mut touched, ev);
            let deadline = tokio::time::sleep(settle);
            tokio::pin!(deadline);
            loop {
                while let Ok(ev) = raw_rx.try_recv() {
                    note(&mut writing, &mut touched, ev);
                }
                if writing.is_empty() {
                    break;
                }
                tokio::select! {
                    () = &mut deadline => {
                        writing.clear();
                        break;
                    }
                    ev = raw_rx.recv() => match ev {
                        Some(ev) => note(&mut writing, &mut touched, ev),
                        None => break,
                    },
                }
            }
            if tx.send(touched).await.is_err() {
                break;
            }
        }
    });
    Ok((watcher, rx))
}

/// The paths a tick of [`watch`] saw written (as the watcher spells them); `None` when
/// it cannot tell (the event queue overflowed).
pub type Touched = Option<HashSet<PathBuf>>;

/// Is `path` a manifest file, or something that may hold them (a folder, a name
/// without extension)? Other files written into a manifests folder (logs, editor
/// swap files) change nothing.
pub fn may_hold_manifests(path: &Path) -> bool {
    match path.extension() {
        None => true,
        Some(ext) => ext == "yaml" || ext == "yml",
    }
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

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
