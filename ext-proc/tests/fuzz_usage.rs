//! Properties of the usage reader (JSON bodies and SSE streams): any chunking
//! of a stream gives what the stream says, arbitrary bytes never panic, and a
//! stream that never ends its line cannot grow the reader past its bound.

mod common;

use common::cases;
use fleetroute::observe::usage::{self, JsonBody, MAX_JSON_BODY, MAX_LINE, SseReader, Usage};
use proptest::prelude::*;
use serde_json::json;

/// Feeds `bytes` in pieces cut at `cuts`; returns what the reader ended with.
fn read(bytes: &[u8], cuts: &[prop::sample::Index]) -> (Option<Usage>, bool) {
    let points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    read_at(bytes, points)
}

fn read_at(bytes: &[u8], mut points: Vec<usize>) -> (Option<Usage>, bool) {
    points.sort_unstable();
    let mut r = SseReader::default();
    let mut start = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        r.push(&bytes[start..p]);
        assert!(r.buffered() <= MAX_LINE);
        start = p;
    }
    (r.usage, r.done)
}

/// An engine's SSE stream: content events, odd but legal lines, the usage
/// event, maybe `[DONE]`.
#[derive(Debug, Clone)]
struct Stream {
    bytes: Vec<u8>,
    usage: Option<Usage>,
    done: bool,
}

fn usage_value() -> impl Strategy<Value = (u64, u64, Option<u64>)> {
    (
        any::<u64>(),
        any::<u64>(),
        proptest::option::of(any::<u64>()),
    )
}

fn stream() -> impl Strategy<Value = Stream> {
    let event = prop_oneof![
        // Content deltas; text may even spell "usage".
        prop_oneof![any::<String>(), Just("\"usage\": {}".to_string())].prop_map(|t| {
            json!({"choices": [{"delta": {"content": t}}], "usage": null}).to_string()
        }),
        Just(": keep-alive".to_string()),
        Just("event: message".to_string()),
        "id: [0-9]{1,5}",
    ];
    (
        prop::collection::vec(event, 0..8),
        proptest::option::of(usage_value()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(events, usage, done, crlf, space)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let data = if space { "data: " } else { "data:" };
            let mut s = String::new();
            for e in events {
                if e.starts_with('{') {
                    s.push_str(data);
                }
                s.push_str(&e);
                s.push_str(eol);
                s.push_str(eol);
            }
            let usage = usage.map(|(p, c, cached)| {
                let mut u = json!({"prompt_tokens": p, "completion_tokens": c});
                if let Some(n) = cached {
                    u["prompt_tokens_details"] = json!({"cached_tokens": n});
                }
                s.push_str(data);
                s.push_str(&json!({"choices": [], "usage": u}).to_string());
                s.push_str(eol);
                s.push_str(eol);
                serde_json::from_value::<Usage>(u).unwrap()
            });
            if done {
                s.push_str(data);
                s.push_str("[DONE]");
                s.push_str(eol);
                s.push_str(eol);
            }
            Stream {
                bytes: s.into_bytes(),
                usage,
                done,
            }
        })
}

proptest! {
    #![proptest_config(cases(256, 1))]

    /// Any chunking of a valid stream yields its usage and whether it ended.
    #[test]
    fn sse_any_chunking(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24)) {
        prop_assert_eq!(read(&s.bytes, &cuts), (s.usage, s.done));
    }

    /// Arbitrary bytes: never panics, and chunking never changes the result.
    #[test]
    fn sse_arbitrary_bytes(bytes in prop::collection::vec(prop_oneof![
                               8 => any::<u8>(), 1 => Just(b'\n'), 1 => Just(b'\r')], 0..2048),
                           cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16)) {
        prop_assert_eq!(read(&bytes, &cuts), read(&bytes, &[]));
    }

    /// A JSON body's usage is found whatever else the body holds.
    #[test]
    fn json_usage(u in usage_value(), extra in "[a-z]{1,8}", value in any::<String>()) {
        let mut want = json!({"prompt_tokens": u.0, "completion_tokens": u.1});
        if let Some(n) = u.2 {
            want["prompt_tokens_details"] = json!({"cached_tokens": n});
        }
        let mut body = json!({"id": "x", "choices": [{"message": {"content": value}}], "usage": want});
        if extra != "usage" {
            body[extra] = json!([1, {"usage": 7}]);
        }
        let got = usage::from_json(body.to_string().as_bytes()).unwrap();
        prop_assert_eq!(got, serde_json::from_value::<Usage>(want).unwrap());
        prop_assert_eq!(got.cached_tokens(), u.2);
    }

    #[test]
    fn json_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        let _ = usage::from_json(&bytes);
    }
}

proptest! {
    #![proptest_config(cases(16, 32))]

    /// Lines around the length limit: a line over it is dropped whole however
    /// it arrives, never spliced from the parts that fit.
    #[test]
    fn sse_long_lines(over in 0usize..64, fits in any::<bool>(), near_end in 1usize..64,
                      cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..8)) {
        let head = r#"data: {"usage":{"prompt_tokens":7,"completion_tokens":1},"pad":""#;
        let tail = "\"}\n\n";
        let pad = if fits { MAX_LINE - head.len() - tail.len() + 2 - over.min(16) } else { MAX_LINE + over };
        let bytes = [head.as_bytes(), &vec![b'x'; pad], tail.as_bytes(), b"data: [DONE]\n\n"].concat();
        let whole = read(&bytes, &[]);
        prop_assert_eq!(whole.0.is_some(), fits);
        prop_assert!(whole.1);
        // One cut just before the line ends: the pieces before it may pass
        // the limit while the last piece alone still fits.
        let end = bytes.iter().position(|&b| b == b'\n').unwrap();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(end)).collect();
        points.push(end.saturating_sub(near_end));
        prop_assert_eq!(read_at(&bytes, points), whole);
    }

    /// A JSON body around the size limit: read whole when it fits, dropped
    /// whole when it does not, however it is chunked.
    #[test]
    fn json_body_limit(over in 0usize..64, fits in any::<bool>(), near_end in 1usize..64,
                       cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..8)) {
        let head = r#"{"usage":{"prompt_tokens":7,"completion_tokens":1},"pad":""#;
        let pad = if fits { MAX_JSON_BODY - head.len() - 2 - over.min(16) } else { MAX_JSON_BODY + over };
        let bytes = [head.as_bytes(), &vec![b'x'; pad], b"\"}"].concat();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len())).collect();
        points.push(bytes.len() - near_end);
        points.sort_unstable();
        let mut body = JsonBody::default();
        let mut start = 0;
        for p in points.into_iter().chain([bytes.len()]) {
            body.push(&bytes[start..p]);
            prop_assert!(body.buffered() <= MAX_JSON_BODY);
            start = p;
        }
        prop_assert_eq!(body.usage().is_some(), fits);
    }

    /// An event that never ends its line: memory stays within the bound.
    #[test]
    fn sse_endless_line(chunk in 1usize..300_000, n in 1usize..64) {
        let mut r = SseReader::default();
        let piece = vec![b'a'; chunk];
        r.push(b"data: ");
        for _ in 0..n {
            r.push(&piece);
            prop_assert!(r.buffered() <= MAX_LINE);
        }
        r.push(b"\ndata: [DONE]\n");
        prop_assert!(r.done);
        prop_assert_eq!(r.usage, None);
    }
}
