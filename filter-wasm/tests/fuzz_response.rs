//! Properties of the response scanner, which reads every response chunk
//! inside Envoy: the usage of a valid SSE stream or JSON body is what the
//! engine sent and `done` is true exactly when a `data: [DONE]` line came,
//! however the body was chunked; arbitrary bytes never panic; the bytes held
//! between chunks stay within their bound however long the body, and a usage
//! object over the bound gives no usage rather than a truncated one.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use fleetroute_filter::contract::UsageTag;
use fleetroute_filter::response::{MAX_OBJECT, TAIL, UsageScanner};
use proptest::prelude::*;
use serde_json::{Value, json};

/// (prompt, completion, cached) as the tag carries it.
type Tokens = (u64, u64, Option<u64>);

/// Feeds `bytes` cut at `cuts`, checking the bound after every chunk.
fn scan(bytes: &[u8], cuts: &[prop::sample::Index]) -> Result<UsageTag, TestCaseError> {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut s = UsageScanner::default();
    let mut start = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        s.push(&bytes[start..p]);
        prop_assert!(s.retained() <= MAX_OBJECT + TAIL, "{} held", s.retained());
        start = p;
    }
    Ok(s.tag)
}

/// Feeds `bytes` one byte at a time.
fn scan_bytewise(bytes: &[u8]) -> UsageTag {
    let mut s = UsageScanner::default();
    for b in bytes {
        s.push(std::slice::from_ref(b));
    }
    s.tag
}

/// Text a model may write, including what the scanner looks for.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z{}:\"\\\\ ]{0,40}",
        Just("\"usage\": {\"prompt_tokens\": 1}".to_string()),
        Just("\ndata: [DONE]\n".to_string()),
        Just("usage".to_string()),
    ]
}

/// A usage object as engines write it, and what it says.
fn usage() -> impl Strategy<Value = (Value, Tokens)> {
    (
        any::<u64>(),
        any::<u64>(),
        0u8..4,
        any::<u64>(),
        any::<bool>(),
        proptest::option::of(text()),
    )
        .prop_map(|(p, c, details, k, reasoning, note)| {
            let mut u = json!({"prompt_tokens": p, "completion_tokens": c});
            let cached = match details {
                0 => None,
                1 => {
                    u["prompt_tokens_details"] = Value::Null;
                    None
                }
                2 => {
                    u["prompt_tokens_details"] = json!({});
                    None
                }
                _ => {
                    u["prompt_tokens_details"] = json!({"cached_tokens": k});
                    Some(k)
                }
            };
            if reasoning {
                u["completion_tokens_details"] = json!({"reasoning_tokens": k / 2});
            }
            // An unknown string field: braces and quotes inside the object.
            if let Some(n) = note {
                u["note"] = json!(n);
            }
            (u, (p, c, cached))
        })
}

/// An engine's SSE stream and what it says: content events (maybe with
/// `"usage": null`, or a running usage), comments and other fields, maybe a
/// usage event, maybe `data: [DONE]`.
#[derive(Clone, Debug)]
struct Stream {
    bytes: Vec<u8>,
    usage: Option<Tokens>,
    done: bool,
    /// Data events, `[DONE]` not counted.
    events: u64,
}

#[derive(Clone, Debug)]
enum Event {
    Content(String, Option<Option<(Value, Tokens)>>),
    Other(String),
}

fn stream() -> impl Strategy<Value = Stream> {
    let event = prop_oneof![
        4 => (text(), proptest::option::of(proptest::option::weighted(0.2, usage())))
            .prop_map(|(t, u)| Event::Content(t, u)),
        1 => prop_oneof![Just(": keep-alive"), Just("event: message"), Just("id: 7"), Just("retry: 10")]
            .prop_map(|s| Event::Other(s.to_string())),
    ];
    (
        prop::collection::vec(event, 0..8),
        proptest::option::of(usage()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(events, last, done, crlf, space)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let data = if space { "data: " } else { "data:" };
            let mut s = String::new();
            let mut usage = None;
            let mut count = 0;
            for e in events {
                match e {
                    Event::Content(t, u) => {
                        let mut v =
                            json!({"id": "c", "choices": [{"index": 0, "delta": {"content": t}}]});
                        match u {
                            None => {}
                            Some(None) => v["usage"] = Value::Null,
                            Some(Some((u, tokens))) => {
                                v["usage"] = u;
                                usage = Some(tokens);
                            }
                        }
                        s.push_str(data);
                        s.push_str(&v.to_string());
                        count += 1;
                    }
                    Event::Other(line) => s.push_str(&line),
                }
                s.push_str(eol);
                s.push_str(eol);
            }
            if let Some((u, tokens)) = last {
                s.push_str(data);
                s.push_str(&json!({"id": "c", "choices": [], "usage": u}).to_string());
                s.push_str(eol);
                s.push_str(eol);
                usage = Some(tokens);
                count += 1;
            }
            if done {
                s.push_str("data: [DONE]");
                s.push_str(eol);
                s.push_str(eol);
            }
            Stream {
                bytes: s.into_bytes(),
                usage,
                done,
                events: count,
            }
        })
}

/// A non-streamed response body: its fields in any order, compact or
/// pretty, with unknown fields, and what its usage says.
fn json_body() -> impl Strategy<Value = (Vec<u8>, Option<Tokens>)> {
    let extra = (
        "x_[a-z]{1,6}",
        prop_oneof![
            text().prop_map(Value::String),
            any::<i64>().prop_map(Value::from),
            text().prop_map(|t| json!({"x_a": [t, {"x_b": null}]})),
        ],
    );
    (
        text(),
        proptest::option::of(usage()),
        prop::collection::vec(extra, 0..4),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(content, usage, extras, order, pretty)| {
            let mut fields = vec![
                ("id".to_string(), json!("chatcmpl-1")),
                ("object".to_string(), json!("chat.completion")),
                (
                    "choices".to_string(),
                    json!([{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]),
                ),
            ];
            let want = usage.map(|(u, tokens)| {
                fields.push(("usage".to_string(), u));
                tokens
            });
            fields.extend(extras);
            let n = fields.len();
            fields.rotate_left(order.index(n));
            let write = |v: &Value| {
                if pretty {
                    serde_json::to_string_pretty(v).unwrap()
                } else {
                    v.to_string()
                }
            };
            let sep = if pretty { ": " } else { ":" };
            let parts: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}{sep}{}", json!(k), write(v)))
                .collect();
            let body = if pretty {
                format!("{{\n  {}\n}}\n", parts.join(",\n  "))
            } else {
                format!("{{{}}}", parts.join(","))
            };
            (body.into_bytes(), want)
        })
}

/// Pieces of what the scanner looks for, mixed into arbitrary bytes.
const NEEDLES: &[&[u8]] = &[
    b"\"usage\"",
    b":",
    b" ",
    b"{",
    b"}",
    b"\"",
    b"\\",
    b"\n",
    b"data: [DONE]",
    b"\"prompt_tokens\":1",
    b"\"usage\": ",
    b"\"usage\":{",
    b"\"usage\":{\"prompt_tokens\":1}",
    b"null",
];

/// Whether `bytes` (which begin a line) hold a `data: [DONE]` line.
fn has_done_line(bytes: &[u8]) -> bool {
    [b"\n", bytes]
        .concat()
        .windows(13)
        .any(|w| w == b"\ndata: [DONE]")
}

proptest! {
    #![proptest_config(cases(256, 1))]

    /// A valid stream: its last usage and whether it ended, for any chunking.
    #[test]
    fn sse_any_chunking(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24)) {
        let tag = scan(&s.bytes, &cuts)?;
        prop_assert_eq!(tag.usage, s.usage, "{}", String::from_utf8_lossy(&s.bytes));
        prop_assert_eq!(tag.done, s.done);
        prop_assert_eq!(tag.streamed, s.events);
        prop_assert_eq!(scan_bytewise(&s.bytes), tag);
    }

    /// A valid JSON body: its usage (or none), never `done`, for any chunking.
    #[test]
    fn json_any_chunking((body, want) in json_body(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24)) {
        let tag = scan(&body, &cuts)?;
        prop_assert_eq!(tag.usage, want, "{}", String::from_utf8_lossy(&body));
        prop_assert!(!tag.done);
        prop_assert_eq!(tag.streamed, 0);
        prop_assert_eq!(scan_bytewise(&body), tag);
    }

    /// Arbitrary bytes, rich in what the scanner looks for: no panic, the
    /// bound holds after every chunk, and `done` exactly when a line is
    /// `data: [DONE]`, however chunked.
    #[test]
    fn arbitrary_bytes(pieces in prop::collection::vec(prop_oneof![
                           1 => prop::collection::vec(any::<u8>(), 0..16),
                           1 => prop::sample::select(NEEDLES).prop_map(<[u8]>::to_vec),
                       ], 0..64),
                       cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16)) {
        let bytes = pieces.concat();
        let tag = scan(&bytes, &cuts)?;
        prop_assert_eq!(tag.done, has_done_line(&bytes));
    }
}

proptest! {
    // Each case scans about 4 KB byte by byte, several times.
    #![proptest_config(cases(64, 8))]

    /// A usage object at and over [`MAX_OBJECT`] bytes, in a JSON body or an
    /// SSE event, its padding ending in braces, quotes or a usage of its own: read whole when it
    /// fits, no usage at all when it does not, however chunked.
    #[test]
    fn usage_object_bound(over in any::<bool>(), by in 0usize..64, sse in any::<bool>(),
                          noise in prop_oneof!["[a-z{}:,\"\\\\]{0,64}", Just("\",\"usage\":{\"prompt_tokens\":9}}".to_string())],
                          cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16)) {
        let object = |pad: &str| json!({"prompt_tokens": 7, "completion_tokens": 1, "pad": pad}).to_string();
        let target = if over { MAX_OBJECT + 1 + by } else { MAX_OBJECT - by };
        // The noise ends the padding: past the bound when over it.
        let pad = format!("{}{noise}", "x".repeat(target - object(&noise).len()));
        let u = object(&pad);
        prop_assert_eq!(u.len(), target);
        let body = if sse {
            format!("data: {{\"choices\":[],\"usage\":{u}}}\n\ndata: [DONE]\n\n")
        } else {
            format!("{{\"id\":\"x\",\"usage\":{u}}}")
        };
        let tag = scan(body.as_bytes(), &cuts)?;
        prop_assert_eq!(tag.usage, (!over).then_some((7, 1, None)));
        prop_assert_eq!(tag.done, sse);
    }
}

proptest! {
    // Each case pushes up to 480 KB.
    #![proptest_config(cases(16, 64))]

    /// Endless input: a huge usage object, endless nesting, a stream of
    /// `"usage"` keys. The scanner never holds more than its bound (no more
    /// than [`TAIL`] bytes while no object is open), still sees the end, and
    /// reports only a usage object that fits.
    #[test]
    fn endless_input(kind in 0usize..7, chunk in prop_oneof![1usize..32, 1usize..20_000], n in 1usize..24) {
        let (prefix, unit, want): (&str, &str, Option<Tokens>) = [
            ("{\"usage\":{\"a\":\"", "a", None),
            ("{\"usage\":", "{\"a\":", None),
            ("", "\"usage\"", None),
            ("", "\"usage\": ", None),
            ("", "\"usage\":null,", None),
            ("", "\"usage\":{", None),
            ("", "\"usage\":{\"prompt_tokens\":1},", Some((1, 0, None))),
        ][kind];
        let opens = unit.contains('{') || prefix.contains('{');
        // The units back to back, pushed `chunk` bytes at a time.
        let body: Vec<u8> = unit.bytes().cycle().take(chunk * n).collect();
        let mut s = UsageScanner::default();
        s.push(prefix.as_bytes());
        for piece in body.chunks(chunk) {
            s.push(piece);
            prop_assert!(s.retained() <= MAX_OBJECT + TAIL, "{} held", s.retained());
            if !opens {
                prop_assert!(s.retained() <= TAIL, "{} held with no object open", s.retained());
            }
        }
        s.push(b"\ndata: [DONE]\n");
        prop_assert!(s.tag.done);
        // Only a unit that holds a whole object yields one, once it closed.
        let closed = unit.rfind('}').is_some_and(|i| body.len() > i);
        prop_assert_eq!(s.tag.usage, want.filter(|_| closed));
    }
}
