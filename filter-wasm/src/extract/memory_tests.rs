//! Extraction's memory on hostile bodies, measured by a counting allocator:
//! whatever the body's shape, what extraction allocates stays within
//! `EXTRACTION_OVERHEAD` times the body, the headroom the host reserves
//! before it parses.
// The counting allocator is the one unsafe code of the workspace.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::extract;
use crate::body::EXTRACTION_OVERHEAD;
use crate::config::FilterConfig;
use crate::contract::ParseStatus;

/// Counts this thread's live bytes and their peak (tests run on threads side by side).
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get().saturating_add(n);
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn shrank(n: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(n)));
}

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        shrank(layout.size());
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            // Old and new may both be live while the bytes move.
            grew(new_size);
            shrank(layout.size());
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak bytes allocated by `f` above what was live when it started.
fn peak_of<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let r = f();
    (r, PEAK.with(Cell::get) - start)
}

/// A body of about `size` bytes: `open`, then `item` repeated, then `close`.
fn filled(open: &str, item: &str, close: &str, size: usize) -> Vec<u8> {
    let n = (size - open.len() - close.len()) / (item.len() + 1);
    let mut s = String::with_capacity(size);
    s.push_str(open);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item);
    }
    s.push_str(close);
    s.into_bytes()
}

#[test]
fn hostile_shapes_stay_within_the_reserved_headroom() {
    let cfg = FilterConfig::default();
    let size = 1 << 20;
    let cases = [
        // Arrays of tiny values where a string or parts belong: an untagged
        // enum would first copy each into a generic tree (about 16x the body).
        (
            filled(r#"{"model":"m","messages":[{"role":"user","content":["#, "1", "]}]}", size),
            ParseStatus::BadShape,
        ),
        (filled(r#"{"model":"m","prompt":["#, "[]", "]}", size), ParseStatus::BadShape),
        (filled(r#"{"model":"m","prompt":["#, "1", "]}", size), ParseStatus::BadShape),
        // Very many tiny messages, parts and prompts, all valid.
        (filled(r#"{"model":"m","messages":["#, r#"{"role":"u"}"#, "]}", size), ParseStatus::Ok),
        (
            filled(r#"{"model":"m","messages":[{"role":"user","content":["#, r#"{"type":"x"}"#, "]}]}", size),
            ParseStatus::Ok,
        ),
        (filled(r#"{"model":"m","prompt":["#, r#""""#, "]}", size), ParseStatus::Ok),
        // Escaped text cannot be borrowed and is copied once.
        (
            filled(r#"{"model":"m","messages":[{"role":"user","content":""#, r"\n", r#""}]}"#, size),
            ParseStatus::Ok,
        ),
        (
            format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"{}"}}]}}"#,
                r"\t".repeat(size / 5),
                r"\t".repeat(size / 5)
            )
            .into_bytes(),
            ParseStatus::Ok,
        ),
        // Unread fields are skipped, not built.
        (filled(r#"{"model":"m","prompt":"p","tools":["#, "{}", "]}", size), ParseStatus::Ok),
        (filled(r#"{"model":"m","x":["#, "[[[]]]", "]}", size), ParseStatus::Ok),
        // Deep nesting stops at serde_json's recursion limit and is refused
        // (Python's reader stops at a limit of its own).
        (
            format!(r#"{{"model":"m","prompt":{}1{}}}"#, "[".repeat(size / 2 - 40), "]".repeat(size / 2 - 40)).into_bytes(),
            ParseStatus::NotJson,
        ),
    ];
    for (i, (body, status)) in cases.iter().enumerate() {
        let (ex, peak) = peak_of(|| extract(body, &cfg));
        assert_eq!(ex.status, *status, "case {i}");
        assert!(
            peak <= EXTRACTION_OVERHEAD * body.len(),
            "case {i}: extraction took {peak} bytes for a {}-byte body",
            body.len()
        );
    }
}
