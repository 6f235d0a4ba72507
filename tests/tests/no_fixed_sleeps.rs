//! Scenarios wait for conditions, never for fixed times: only the harness's
//! time module may sleep (polling with a deadline, and `pace` for time that is
//! the scenario itself).

use std::path::Path;

/// Files allowed to sleep, relative to the tests crate.
const ALLOWED: &[&str] = &["src/harness/time.rs"];

fn sleeps_in(dir: &Path, root: &Path, found: &mut Vec<String>) {
    // Built at run time so this file does not match itself.
    let needle = ["sle", "ep("].concat();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sleeps_in(&path, root, found);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(root).expect("under the crate");
        if ALLOWED.iter().any(|a| Path::new(a) == rel) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read source");
        for (n, line) in text.lines().enumerate() {
            if line.contains(&needle) {
                found.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
}

#[test]
fn scenarios_and_harness_have_no_fixed_sleeps() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in ["tests", "src/harness"] {
        sleeps_in(&root.join(dir), root, &mut found);
    }
    assert!(
        found.is_empty(),
        "wait for a condition (harness::wait_until / wait_for_value) or, for time \
         that is the scenario itself, harness::pace:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_a_planted_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sub = dir.path().join("tests");
    std::fs::create_dir(&sub).expect("mkdir");
    std::fs::write(
        sub.join("x.rs"),
        ["fn f() { std::thread::sle", "ep(D); }\n"].concat(),
    )
    .expect("write");
    let mut found = Vec::new();
    sleeps_in(&sub, dir.path(), &mut found);
    let want = ["tests/x.rs:1: fn f() { std::thread::sle", "ep(D); }"].concat();
    assert_eq!(found, vec![want]);
}
