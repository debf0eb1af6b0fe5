//! `--port-state FILE`: standalone mode's memory of the L4 routes' statuses, so the
//! ports a port pool handed out survive a restart exactly.
//!
//! In Kubernetes mode the API server keeps each route's status and every replica reads
//! it; standalone mode has nothing like it, and no pure function of the current routes
//! can keep every port stable when routes come and go (see
//! `aether_controller::reconcile::portpool`). The file is written atomically after a
//! reconcile that changed it, and read once at startup.

use std::path::Path;

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
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            generation: s.generation,
            status: (*s.status).clone(),
        })
        .collect();
    serde_json::to_string_pretty(&entries).unwrap_or_default()
}

/// Writes `text` to `path` atomically (a temporary file renamed over it).
pub fn save(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}
