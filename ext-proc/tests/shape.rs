//! The code's shape, kept: no source file over 450 lines, and no two source
//! files that use each other, directly or around a circle (each file can be
//! read knowing only the files below it). A child module using its
//! parent (`use super::…`) is the idiom and not counted; test files are not
//! counted. The scan reads `crate::`, `super::` and `self::` paths (one level
//! of `{…}` groups) and resolves each to the longest file module it names.
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

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

/// `state/writer/mod.rs` → `[state, writer]`; `None` for test files.
fn module_of(rel: &Path) -> Option<Module> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.last()?.clone();
    if last == "tests" || last.ends_with("_tests") || parts.iter().any(|p| p == "tests") {
        return None;
    }
    if matches!(last.as_str(), "mod" | "lib" | "main") {
        parts.pop();
    }
    Some(parts)
}

/// The paths a source text names, outside comments and its test module, as
/// (root keyword, segments).
fn paths(text: &str) -> Vec<(String, Vec<String>)> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        for root in ["crate", "super", "self"] {
            let pat = format!("{root}::");
            let mut rest = line;
            while let Some(at) = rest.find(&pat) {
                let boundary = at == 0
                    || !rest[..at]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_');
                rest = &rest[at + pat.len()..];
                if !boundary {
                    continue;
                }
                let mut segs = Vec::new();
                let mut tail = rest;
                loop {
                    let name = ident(tail);
                    if name.is_empty() {
                        break;
                    }
                    tail = &tail[name.len()..];
                    segs.push(name);
                    match tail.strip_prefix("::") {
                        Some(t) => tail = t,
                        None => break,
                    }
                }
                match tail.strip_prefix('{') {
                    Some(group) => {
                        let group = group.split('}').next().unwrap_or("");
                        for item in group.split(',') {
                            let mut s = segs.clone();
                            s.extend(
                                item.split("::")
                                    .map(|x| ident(x.trim()))
                                    .filter(|x| !x.is_empty()),
                            );
                            out.push((root.to_string(), s));
                        }
                    }
                    None => out.push((root.to_string(), segs)),
                }
            }
        }
    }
    out
}

/// Every file's uses of other files (child → ancestor left out).
fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut texts = BTreeMap::new();
    for f in &files {
        if let Some(m) = module_of(f.strip_prefix(src).unwrap()) {
            texts.insert(m, fs::read_to_string(f).unwrap());
        }
    }
    let resolve = |p: &[String]| -> Option<Module> {
        (1..=p.len())
            .rev()
            .map(|i| p[..i].to_vec())
            .find(|m| texts.contains_key(m))
    };
    let mut edges = BTreeMap::new();
    for (m, text) in &texts {
        let mut used = BTreeSet::new();
        for (root, mut segs) in paths(text) {
            // The module `super`/`self` start from: a file's own module is
            // itself; its parent is one up.
            let mut start: Module = match root.as_str() {
                "crate" => Vec::new(),
                "self" => m.clone(),
                _ => m[..m.len().saturating_sub(1)].to_vec(),
            };
            while segs.first().is_some_and(|s| s == "super") {
                segs.remove(0);
                start.pop();
            }
            start.extend(segs);
            let Some(to) = resolve(&start) else { continue };
            if &to != m && !m.starts_with(&to) {
                used.insert(to);
            }
        }
        edges.insert(m.clone(), used);
    }
    edges
}

fn reaches(edges: &BTreeMap<Module, BTreeSet<Module>>, from: &Module, to: &Module) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.clone()];
    while let Some(m) = stack.pop() {
        if &m == to {
            return true;
        }
        if seen.insert(m.clone()) {
            stack.extend(edges.get(&m).into_iter().flatten().cloned());
        }
    }
    false
}

#[test]
fn no_file_uses_one_that_uses_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    let count: usize = edges.values().map(BTreeSet::len).sum();
    assert!(
        count > 200,
        "the scan found too few uses ({count}) to mean anything"
    );
    let name = |m: &Module| m.join("::");
    let mut circles = Vec::new();
    for (a, used) in &edges {
        for b in used {
            if reaches(&edges, b, a) {
                circles.push(format!("{} -> {} -> … -> {}", name(a), name(b), name(a)));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "circles between files:\n{}",
        circles.join("\n")
    );
}

/// Longest non-test source file.
const MAX_LINES: usize = 450;

#[test]
fn no_source_file_is_over_450_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    let mut seen = 0;
    for dir in [
        "src",
        "benches",
        "../filter-wasm/src",
        "../tests/src",
        "../test-kit/src",
    ] {
        let dir = root.join(dir);
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for f in files {
            if module_of(f.strip_prefix(&dir).unwrap()).is_none() {
                continue;
            }
            seen += 1;
            let lines = fs::read_to_string(&f).unwrap().lines().count();
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", f.display()));
            }
        }
    }
    assert!(seen > 100, "only {seen} source files found");
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_scan_resolves_paths_to_files() {
    let found = paths(
        "use super::{health::Health, Event};\nuse crate::state::writer::Writer;\n\
         let x = self::probe(1); // crate::admin\n#[cfg(test)]\nmod tests {\n use crate::serve;\n}\n",
    );
    let seen: Vec<String> = found
        .iter()
        .map(|(r, s)| format!("{r}::{}", s.join("::")))
        .collect();
    assert_eq!(
        seen,
        [
            "super::health::Health",
            "super::Event",
            "crate::state::writer::Writer",
            "self::probe"
        ]
    );
}
