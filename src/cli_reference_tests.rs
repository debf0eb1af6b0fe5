//! Keeps `docs/cli.md` equal to what `--help` prints: the flag sections there are
//! clap's own rendering of `src/cli.rs`, so a flag, a default or a help line changed
//! in the code without the docs fails here. To regenerate the committed blocks:
//!
//! ```sh
//! AETHER_BLESS=1 cargo test -p aether-edge --lib cli_reference
//! ```

use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;

/// The commands whose help `docs/cli.md` carries, as typed after `aether-edge`.
const COMMANDS: &[&[&str]] = &[&[], &["run"], &["echo"]];

/// What `aether-edge <path> --help` prints: clap's own answer to parsing those
/// arguments, so the choice between short and long help is clap's too.
fn help(path: &[&str]) -> String {
    let mut args = vec!["aether-edge"];
    args.extend_from_slice(path);
    args.push("--help");
    let answer = match Cli::command().try_get_matches_from(&args) {
        Ok(_) => panic!("{args:?} parsed without printing help"),
        Err(e) => e,
    };
    assert_eq!(
        answer.kind(),
        clap::error::ErrorKind::DisplayHelp,
        "{args:?}"
    );
    let text = answer.render().to_string();
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

fn marker(path: &[&str]) -> String {
    let mut words = vec!["aether-edge"];
    words.extend_from_slice(path);
    words.push("--help");
    format!("<!-- generated: {} -->", words.join(" "))
}

/// The block after `marker`: (index of its first line, index of its closing fence).
fn block(lines: &[&str], marker: &str) -> Option<(usize, usize)> {
    let at = lines.iter().position(|l| l.trim() == marker)?;
    if lines.get(at + 1).map(|l| l.trim()) != Some("```text") {
        return None;
    }
    let end = (at + 2..lines.len()).find(|&i| lines[i].trim() == "```")?;
    Some((at + 2, end))
}

#[test]
fn cli_reference_matches_help() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
    let text = std::fs::read_to_string(&file).unwrap();
    let bless = std::env::var_os("AETHER_BLESS").is_some();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut problems = Vec::new();
    for path in COMMANDS {
        let marker = marker(path);
        let help = help(path);
        let borrowed: Vec<&str> = lines.iter().map(String::as_str).collect();
        let Some((first, end)) = block(&borrowed, &marker) else {
            problems.push(format!(
                "docs/cli.md has no block `{marker}` followed by a ```text fence"
            ));
            continue;
        };
        let committed: Vec<&str> = borrowed[first..end].to_vec();
        let rendered: Vec<&str> = help.lines().collect();
        if committed == rendered {
            continue;
        }
        if bless {
            lines.splice(first..end, rendered.iter().map(|l| l.to_string()));
            continue;
        }
        let differs = (0..committed.len().max(rendered.len()))
            .find(|&i| committed.get(i) != rendered.get(i))
            .unwrap_or(0);
        problems.push(format!(
            "docs/cli.md line {}, in `{marker}`:\n  committed: {:?}\n  --help:    {:?}",
            first + differs + 1,
            committed.get(differs).copied().unwrap_or("(end of block)"),
            rendered.get(differs).copied().unwrap_or("(end of help)"),
        ));
    }
    if bless {
        let mut out = lines.join("\n");
        out.push('\n');
        if out != text {
            std::fs::write(&file, out).unwrap();
        }
    }
    assert!(
        problems.is_empty(),
        "docs/cli.md differs from the CLI's --help; regenerate it with \
         `AETHER_BLESS=1 cargo test -p aether-edge --lib cli_reference` and review the diff\n{}",
        problems.join("\n")
    );
}
