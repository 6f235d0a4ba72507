use super::*;
use proptest::prelude::*;

const STREAM: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"say \\\"usage\\\": {\"}}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n\
data: [DONE]\n\n";

fn scan(chunks: &[&[u8]]) -> UsageTag {
    let mut s = UsageScanner::default();
    for c in chunks {
        s.push(c);
    }
    s.tag
}

#[test]
fn json_body() {
    let t = scan(&[br#"{"id":"x","usage": {"prompt_tokens":5,"completion_tokens":1}}"#]);
    assert_eq!(t.usage, Some((5, 1, None)), "no details: cached unknown");
    assert!(!t.done);
    assert_eq!(scan(&[b"{}"]).usage, None);
    assert_eq!(scan(&[b"not json \"usage\": {oops}"]).usage, None);
}

#[test]
fn done_only_at_a_line_start() {
    assert!(!scan(&[b"data: {\"c\":\"x data: [DONE]\"}\n"]).done);
    assert!(scan(&[b"data: [DONE]\n"]).done);
    assert!(scan(&[b"data: {}\n\ndata: [DO", b"NE]\n\n"]).done);
}

#[test]
fn a_cut_stream_counts_what_streamed() {
    let t = scan(&[
        b"data: {\"c\":1}\n\ndata:{\"c\"",
        b":2}\r\n\r\ndata: {\"c\":3}\n\n",
    ]);
    assert_eq!((t.usage, t.done, t.streamed), (None, false, 3));
    let mut s = UsageScanner::default();
    assert!(
        s.push(b"data: {}\n\n"),
        "a new event is news before any usage"
    );
    assert!(!s.push(b": keep-alive\n\n"), "a comment is not an event");
    assert_eq!(
        scan(&[br#"{"id":"x","data":1}"#]).streamed,
        0,
        "JSON bodies stream nothing"
    );
}

#[test]
fn oversized_usage_is_dropped_not_kept() {
    let mut body = b"{\"usage\":{\"x\":\"".to_vec();
    body.extend(std::iter::repeat_n(b'a', 10_000));
    body.extend_from_slice(b"\"}}");
    let mut s = UsageScanner::default();
    s.push(&body);
    assert_eq!(s.tag.usage, None);
    assert!(s.object.len() <= MAX_OBJECT);
}

fn engine_body(name: &str) -> Vec<u8> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/engines");
    std::fs::read(format!("{dir}/{name}")).expect("fixture")
}

#[test]
fn real_engine_bodies() {
    // (body, usage, done, streamed events)
    for (name, usage, done) in [
        ("llama-chat-nonstream.json", (32, 8, Some(0)), false),
        ("llama-chat-stream.sse", (32, 8, Some(31)), true),
        ("vllm-chat-nonstream.json", (32, 8, Some(0)), false),
        ("vllm-chat-stream.sse", (32, 8, Some(0)), true),
    ] {
        let body = engine_body(name);
        // Whole, and cut in 7-byte chunks: the same reading.
        for chunk in [body.len(), 7] {
            let mut s = UsageScanner::default();
            for c in body.chunks(chunk) {
                s.push(c);
            }
            assert_eq!(s.tag.usage, Some(usage), "{name} in {chunk}-byte chunks");
            assert_eq!(s.tag.done, done, "{name}");
        }
    }
}

#[test]
fn llamacpp_timings_give_the_cached_count_usage_lacks() {
    // Releases whose usage has no details: `timings.cache_n`, after it.
    let t = scan(&[br#"{"usage":{"prompt_tokens":40,"completion_tokens":2},"timings":{"cache_n":31,"prompt_n":9}}"#]);
    assert_eq!(t.usage, Some((40, 2, Some(31))));
    // Only after it, as llama.cpp writes it; details win where both are given.
    let t = scan(&[
        br#"{"timings":{"cache_n":31},"usage":{"prompt_tokens":40,"completion_tokens":2}}"#,
    ]);
    assert_eq!(t.usage, Some((40, 2, None)));
    let t = scan(&[br#"{"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}},"timings":{"cache_n":31}}"#]);
    assert_eq!(t.usage, Some((40, 2, Some(32))));
    // A `"timings"` inside generated text is escaped: never read.
    let t = scan(&[br#"{"content":"say \"timings\":{\"cache_n\":5}","usage":{"prompt_tokens":4,"completion_tokens":1}}"#]);
    assert_eq!(t.usage, Some((4, 1, None)));
}

proptest! {
    #[test]
    fn sse_whatever_the_chunking(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..12)) {
        let mut cuts = cuts;
        cuts.sort_unstable();
        let mut s = UsageScanner::default();
        let mut start = 0;
        for c in cuts.into_iter().chain([STREAM.len()]) {
            s.push(&STREAM.as_bytes()[start..c]);
            start = c;
        }
        prop_assert!(s.tag.done);
        prop_assert_eq!(s.tag.usage, Some((40, 2, Some(32))));
        prop_assert_eq!(s.tag.streamed, 2, "two data events besides [DONE]");
    }

    #[test]
    fn any_bytes_stay_bounded(body in proptest::collection::vec(any::<u8>(), 0..20_000)) {
        let mut s = UsageScanner::default();
        s.push(&body);
        prop_assert!(s.object.len() <= MAX_OBJECT);
    }
}
