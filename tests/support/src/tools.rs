//! Test tools that install scripts provide (`tests/<tool>/install.sh`,
//! `tests/k8s/build.sh`, `tests/chart/tools.sh`, `tests/mesh/envoy.sh`): each prints
//! a path; some exit 3 when the tool cannot be had on this machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{BoxError, err};

/// The repository's root (where the workspace Cargo.toml is).
pub fn repo_root() -> &'static Path {
    // tests/support -> the root.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().and_then(Path::parent).unwrap_or(here)
}

/// Runs `script` (relative to the repository root) and returns the path it prints.
/// None, with `missing` printed as the reason, when it exits 3 (the tool cannot be had
/// on this machine), unless CI's AETHER_REQUIRE_K8S=1 requires the test tools: then
/// that is an error, not a quietly green suite.
pub fn test_tool(script: &str, missing: &str) -> Result<Option<PathBuf>, BoxError> {
    let out = run(script)?;
    match out.status.code() {
        Some(0) => Ok(Some(PathBuf::from(String::from_utf8(out.stdout)?.trim()))),
        Some(3) if std::env::var("AETHER_REQUIRE_K8S").is_ok_and(|v| v == "1") => {
            Err(err(format!("{missing}, and AETHER_REQUIRE_K8S=1")))
        }
        Some(3) => {
            eprintln!("SKIPPED: {missing}");
            Ok(None)
        }
        _ => Err(err(format!("{script} failed: {}", out.status))),
    }
}

/// Runs `script` (relative to the repository root), which must succeed, and returns
/// the path it prints: for tools every machine can have.
pub fn required_tool(script: &str) -> Result<PathBuf, BoxError> {
    let out = run(script)?;
    if !out.status.success() {
        return Err(err(format!("{script} failed: {}", out.status)));
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// The script's output; what it says on stderr goes to the test's.
fn run(script: &str) -> Result<std::process::Output, BoxError> {
    Ok(Command::new("bash")
        .arg(repo_root().join(script))
        .stderr(Stdio::inherit())
        .output()?)
}
