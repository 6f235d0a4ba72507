//! The crate reads top-down: the transport (`stream`) over the request path
//! (`request`, `observe`) over admission over the decision (`route`) over
//! state (`state`) over the topology, metrics and config. A module may use modules of lower floors only; this test fails
//! when a lower floor names a higher one (`crate::…` outside test modules).
//! The process floor (`serve`, `admin`, `cli`, `bootstrap`, `reload`) wires everything
//! and is not ordered within itself.
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level modules, lowest floor first. Equal floors may not use each other.
const FLOORS: &[(&str, u32)] = &[
    ("config", 0),
    ("clock", 0),
    ("listen", 0),
    ("shutdown", 0),
    ("stream_limit", 0),
    ("redis_link", 0),
    ("membership", 1),
    ("topology", 2),
    ("engine", 1),
    ("fail_open", 1),
    ("metrics", 3),
    ("envoy_bounds", 3),
    ("tenancy", 1),
    ("state", 4),
    ("route", 5),
    ("observe", 7),
    ("eds", 7),
    ("decision_trace", 6),
    ("peers", 6),
    ("placement", 6),
    ("admission", 6),
    ("request", 7),
    ("stream", 8),
    ("peer_auth", 7),
    ("serve", 9),
    ("admin", 9),
    ("cli", 9),
    ("bootstrap", 9),
    ("reference", 9),
    ("reload", 9),
];
const PROCESS: u32 = 9;

fn floor(module: &str) -> Option<u32> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|&(_, f)| f)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source text names through `crate::`, outside
/// comments and its test module.
fn used_modules(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut used = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for n in names {
                let ident: String = n
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !ident.is_empty() {
                    used.insert(ident);
                }
            }
        }
    }
    used
}

#[test]
fn lower_floors_never_use_higher_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .unwrap_or_default();
        // Entry points, and test modules kept beside the code they test
        // (a test may set up through a higher floor).
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let test_file = stem == "tests" || stem.ends_with("_tests");
        if top == "lib" || top == "main" || test_file {
            continue;
        }
        let from = floor(&top).unwrap_or_else(|| {
            panic!("{} is on no floor: add its module to FLOORS", rel.display())
        });
        let text = fs::read_to_string(file).expect("read source");
        for used in used_modules(&text) {
            let Some(to) = floor(&used) else {
                continue;
            };
            checked += 1;
            let up = to > from || (to == from && used != top && from < PROCESS);
            if up {
                wrong.push(format!(
                    "{} (floor {from}) uses crate::{used} (floor {to})",
                    rel.display()
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "the scan found too few imports to mean anything"
    );
    assert!(
        wrong.is_empty(),
        "imports up the floors:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_scan_sees_grouped_and_plain_imports() {
    let used = used_modules(
        "use crate::state::Snapshot;\nuse crate::{route, topology::Fleet};\n// crate::admin\n\
         #[cfg(test)]\nmod tests {\n use crate::serve;\n}\n",
    );
    let names: Vec<&str> = used.iter().map(String::as_str).collect();
    assert_eq!(names, ["route", "state", "topology"]);
}
