use std::path::Path;

use aether_controller::ObjectKey;

use super::FileSource;

fn service(name: &str, port: u16) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{port: {port}}}]}}\n"
    )
}

fn port_of(source: &FileSource, name: &str) -> Option<i32> {
    let svc = source
        .store()
        .services
        .get(&ObjectKey::new("default", name))?;
    Some(svc.spec.as_ref()?.ports.as_ref()?.first()?.port)
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

#[test]
fn a_change_applies_only_its_differences_and_a_no_op_reports_no_change() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.yaml",
        &(service("a", 80) + &service("b", 81)),
    );
    write(dir.path(), "c.yaml", &service("c", 82));
    let mut source = FileSource::new(vec![dir.path().to_owned()]);
    let first = source.load();
    assert!(
        first.changed && first.errors.is_empty(),
        "{:?}",
        first.errors
    );
    assert_eq!(port_of(&source, "b"), Some(81));

    // One document edited, one removed; the other file untouched.
    write(dir.path(), "a.yaml", &service("a", 90));
    assert!(source.load().changed);
    assert_eq!(port_of(&source, "a"), Some(90));
    assert_eq!(
        port_of(&source, "b"),
        None,
        "a removed document is withdrawn"
    );
    assert_eq!(port_of(&source, "c"), Some(82));

    // The same text again, the same documents reformatted, and a file that is not YAML.
    write(dir.path(), "a.yaml", &service("a", 90));
    assert!(
        !source.load().changed,
        "rewriting the same text changed something"
    );
    write(
        dir.path(),
        "a.yaml",
        &format!("# a comment\n{}\n\n", service("a", 90)),
    );
    assert!(!source.load().changed, "reformatting changed something");
    write(dir.path(), "notes.txt", "kind: [not yaml");
    let loaded = source.load();
    assert!(!loaded.changed && loaded.errors.is_empty());

    // A removed file takes its objects with it.
    std::fs::remove_file(dir.path().join("c.yaml")).unwrap();
    assert!(source.load().changed);
    assert_eq!(port_of(&source, "c"), None);
}

#[test]
fn an_object_in_two_files_is_served_from_the_last_and_falls_back_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &service("s", 80));
    write(dir.path(), "b.yaml", &service("s", 81));
    let mut source = FileSource::new(vec![dir.path().to_owned()]);
    source.load();
    assert_eq!(port_of(&source, "s"), Some(81), "the later file wins");

    // The shadowed file's edit is not served while the later file still declares it.
    write(dir.path(), "a.yaml", &service("s", 82));
    source.load();
    assert_eq!(port_of(&source, "s"), Some(81));

    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    assert!(source.load().changed);
    assert_eq!(
        port_of(&source, "s"),
        Some(82),
        "the other file's version is served"
    );
    std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
    source.load();
    assert_eq!(port_of(&source, "s"), None);
}

#[test]
fn a_broken_edit_keeps_the_last_good_content_and_a_fix_applies() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.yaml",
        &(service("a", 80) + &service("b", 81)),
    );
    let mut source = FileSource::new(vec![dir.path().to_owned()]);
    source.load();

    write(
        dir.path(),
        "a.yaml",
        &(service("a", 90) + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: [unclosed\n"),
    );
    let broken = source.load();
    assert!(broken.changed, "new errors are news");
    assert_eq!(broken.errors.len(), 1, "{:?}", broken.errors);
    assert_eq!(
        port_of(&source, "a"),
        Some(80),
        "the good document was applied"
    );
    assert_eq!(port_of(&source, "b"), Some(81));
    let again = source.load();
    assert!(!again.changed && again.errors.len() == 1);

    write(dir.path(), "a.yaml", &service("a", 90));
    let fixed = source.load();
    assert!(fixed.changed && fixed.errors.is_empty());
    assert_eq!(port_of(&source, "a"), Some(90));
    assert_eq!(port_of(&source, "b"), None);
}

/// With the watcher's paths, a load reads only the files written since (every write
/// makes an event naming its file); a hint it cannot trust (a path that is not one of
/// the manifest files now) makes it look at every file.
#[test]
fn a_load_told_what_was_written_reads_only_that() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &service("a", 80));
    write(dir.path(), "b.yaml", &service("b", 81));
    let mut source = FileSource::new(vec![dir.path().to_owned()]);
    assert!(source.load().changed);

    write(dir.path(), "a.yaml", &service("a", 90));
    write(dir.path(), "b.yaml", &service("b", 91));
    let only_b: std::collections::HashSet<_> = [dir.path().join("b.yaml")].into();
    assert!(source.load_touched(Some(&only_b)).changed);
    assert_eq!(port_of(&source, "b"), Some(91));
    assert_eq!(
        port_of(&source, "a"),
        Some(80),
        "a file not named is not read"
    );

    let gone: std::collections::HashSet<_> = [dir.path().join("gone.yaml")].into();
    assert!(source.load_touched(Some(&gone)).changed);
    assert_eq!(
        port_of(&source, "a"),
        Some(90),
        "an untrusted hint reads everything"
    );
}

/// Random writes and removals of three files declaring overlapping objects: after each
/// load the Store serves, per object, the version of the last file (in load order)
/// that declares it, and nothing no file declares.
#[test]
fn objects_declared_by_several_files_follow_the_last_file_through_any_edits() {
    const FILES: [&str; 3] = ["a.yaml", "b.yaml", "c.yaml"];
    const NAMES: [&str; 3] = ["s0", "s1", "s2"];
    let dir = tempfile::tempdir().unwrap();
    let mut source = FileSource::new(vec![dir.path().to_owned()]);
    // Per file, what it declares now: (name, port).
    let mut declared: [Option<Vec<(usize, u16)>>; 3] = Default::default();
    let mut rng = fastrand::Rng::with_seed(7);
    for step in 0..300 {
        let f = rng.usize(..FILES.len());
        if rng.u8(..4) == 0 {
            let _ = std::fs::remove_file(dir.path().join(FILES[f]));
            declared[f] = None;
        } else {
            let mut objects: Vec<(usize, u16)> = Vec::new();
            for n in 0..NAMES.len() {
                if rng.bool() {
                    objects.push((n, rng.u16(1..60_000)));
                }
            }
            let text: String = objects.iter().map(|&(n, p)| service(NAMES[n], p)).collect();
            write(dir.path(), FILES[f], &text);
            declared[f] = Some(objects);
        }
        source.load();
        for (n, name) in NAMES.iter().enumerate() {
            let want = declared
                .iter()
                .flatten()
                .rev()
                .find_map(|objects| objects.iter().find(|o| o.0 == n))
                .map(|o| i32::from(o.1));
            assert_eq!(port_of(&source, name), want, "{name} after step {step}");
        }
    }
}
