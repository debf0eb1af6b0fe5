//! `--port-state FILE`: standalone mode's memory of the L4 routes' statuses, so the
//! ports a port pool handed out survive a restart exactly.
//!
//! In Kubernetes mode the API server keeps each route's status and every replica reads
//! it; standalone mode has nothing like it, and no pure function of the current routes
//! can keep every port stable when routes come and go (see
//! `aether_controller::reconcile::portpool`). The file is written atomically and
//! synced after a reconcile that changed it, and read once at startup.

use std::io::Write;
use std::path::{Path, PathBuf};

use aether_controller::Statuses;
use aether_controller::l4route::{L4Kind, L4RouteStatus as HttpRouteStatus};
use aether_controller::status::ObjectStatus;
use aether_controller::store::ObjectKey;
use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Entry {
    kind: L4Kind,
    namespace: String,
    name: String,
    generation: i64,
    status: HttpRouteStatus,
}

/// The L4 route statuses saved in `path` (none when the file does not exist yet).
pub fn load(path: &Path) -> anyhow::Result<Statuses> {
    let mut out = Statuses::default();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let entries: Vec<Entry> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a port state file", path.display()))?;
    for e in entries {
        out.l4_routes.insert(
            (e.kind, ObjectKey::new(e.namespace, e.name)),
            ObjectStatus::new(e.generation, e.status),
        );
    }
    Ok(out)
}

/// The file's content for `statuses`.
pub fn render(statuses: &Statuses) -> String {
    let entries: Vec<Entry> = statuses
        .l4_routes
        .iter()
        .map(|((kind, key), s)| Entry {
            kind: *kind,
            namespace: key.namespace().to_string(),
            name: key.name().to_string(),
            generation: s.generation,
            status: (*s.status).clone(),
        })
        .collect();
    serde_json::to_string_pretty(&entries).unwrap_or_default()
}

/// Writes `text` to `path` atomically and durably: a temporary file beside it, synced,
/// renamed over it, and the directory synced so the rename itself survives a crash
/// (without both syncs a power loss can leave an empty or missing file, and every
/// route would lose its port). Blocking: call from a blocking thread.
pub fn save(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    // Hidden and in the same directory: a rename within one file system is atomic.
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let written = write_synced(&tmp, text)
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot replace {}", path.display()))
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync the directory {}", dir.display()))
}

fn write_synced(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// `save` on a blocking thread, for async callers.
pub async fn save_in_background(path: PathBuf, text: String) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || save(&path, &text))
        .await
        .context("port state task failed")?
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn save_writes_then_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ports.json");
        save(&path, "[1]").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "[1]");
        save(&path, "[2, 3]").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "[2, 3]");
        assert_eq!(names(dir.path()), ["ports.json"]);
    }

    #[test]
    fn a_failed_save_keeps_the_old_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: the rename over it fails.
        let path = dir.path().join("ports.json");
        std::fs::create_dir(&path).unwrap();
        assert!(save(&path, "[1]").is_err());
        assert!(path.is_dir());
        assert_eq!(names(dir.path()), ["ports.json"]);
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        save(&path, &render(&Statuses::default())).unwrap();
        assert!(load(&path).unwrap().l4_routes.is_empty());
        assert_eq!(names(dir.path()), ["state"]);
    }
}
