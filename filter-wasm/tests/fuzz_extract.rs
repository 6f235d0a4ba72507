//! Properties of the filter's body extraction over hostile and random input:
//! arbitrary bytes, arbitrary JSON, deep nesting, huge arrays, invalid UTF-8
//! and valid requests with random fields. The headers it writes must stay
//! bounded and header-safe, and depend only on the body, never on how it was
//! chunked, on field order or on fields routing does not read.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use fleetroute_filter::body::read_in_pieces;
use fleetroute_filter::config::{BYTES_PER_TOKEN, FilterConfig};
use fleetroute_filter::contract::{self, KeySource, ParseStatus};
use fleetroute_filter::extract::{Extraction, canonical_text, extract, model};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Small blocks so short random prompts span several of them.
fn small_blocks(max_blocks: usize) -> FilterConfig {
    FilterConfig {
        block_bytes: 16,
        max_blocks,
        ..FilterConfig::default()
    }
}

/// Checks what every extraction must satisfy, whatever the body.
fn check_headers(ex: &Extraction, cfg: &FilterConfig) -> Result<(), TestCaseError> {
    let headers = ex.headers(cfg);
    prop_assert!(ex.blocks.len() <= cfg.max_blocks);
    let mut names: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    prop_assert_eq!(names.len(), headers.len(), "a header written twice");
    let mut total = 0;
    for (name, value) in &headers {
        prop_assert!(
            contract::REQUEST_HEADERS.contains(name),
            "{} is not in the contract",
            name
        );
        // Visible ASCII only: nothing a client wrote can break the header block.
        prop_assert!(
            value.bytes().all(|b| (0x21..=0x7e).contains(&b)),
            "{}: unsafe value {:?}",
            name,
            value
        );
        if *name == contract::BLOCKS {
            prop_assert_eq!(value.len(), 16 * ex.blocks.len());
        }
        total += value.len();
    }
    // Blocks are the only value that grows with the body; the rest is small.
    prop_assert!(total <= 16 * cfg.max_blocks + 512, "{} header bytes", total);
    if ex.status != ParseStatus::Ok {
        prop_assert!(ex.blocks.is_empty() && ex.key.is_none());
    }
    Ok(())
}

/// The extraction of a body delivered in the given chunks.
fn chunked(body: &[u8], cuts: &[prop::sample::Index], cfg: &FilterConfig) -> Extraction {
    // The host hands the buffered body over in pieces of whatever size it
    // likes: end each piece at the next cut point.
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
    points.sort_unstable();
    let read = |at: usize, len: usize| {
        let next = points
            .iter()
            .copied()
            .find(|&p| p > at)
            .unwrap_or(body.len());
        Some(body[at..next.min(at + len)].to_vec())
    };
    let whole = read_in_pieces(body.len(), read).expect("bodies here are small");
    extract(&whole, cfg)
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[a-z0-9/.-]{1,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(
                "model|messages|prompt|user|prompt_cache_key|max_tokens|max_completion_tokens|stream|role|content|text|type|[a-z_]{0,10}",
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One chat message's content: a string or typed parts.
#[derive(Clone, Debug)]
enum ContentGen {
    Text(String),
    Parts(Vec<(String, Option<String>)>),
    Missing,
}

impl ContentGen {
    fn to_json(&self) -> Option<Value> {
        match self {
            ContentGen::Text(t) => Some(json!(t)),
            ContentGen::Parts(parts) => Some(Value::Array(
                parts
                    .iter()
                    .map(|(kind, text)| match text {
                        Some(t) => json!({"type": kind, "text": t}),
                        None => json!({"type": kind, "image_url": {"url": "data:x"}}),
                    })
                    .collect(),
            )),
            ContentGen::Missing => None,
        }
    }
}

#[derive(Clone, Debug)]
enum PromptGen {
    Chat(Vec<(String, ContentGen)>),
    Text(String),
    Many(Vec<String>),
}

/// A request of the expected shape with random values and unknown extras.
#[derive(Clone, Debug)]
struct RequestGen {
    model: Option<String>,
    prompt: PromptGen,
    prompt_cache_key: Option<String>,
    user: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    stream: Option<bool>,
    extras: Vec<(String, Value)>,
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,80}",
        any::<String>(),
        // Long enough for many blocks.
        "[a-z]{0,8}".prop_map(|s| s.repeat(40)),
    ]
}

fn request() -> impl Strategy<Value = RequestGen> {
    let content = prop_oneof![
        text().prop_map(ContentGen::Text),
        prop::collection::vec(
            ("text|image_url|input_audio", proptest::option::of(text())),
            0..4
        )
        .prop_map(ContentGen::Parts),
        Just(ContentGen::Missing),
    ];
    let prompt = prop_oneof![
        prop::collection::vec(("system|user|assistant|tool|[a-z]{1,6}", content), 0..6)
            .prop_map(PromptGen::Chat),
        text().prop_map(PromptGen::Text),
        prop::collection::vec(text(), 0..5).prop_map(PromptGen::Many),
    ];
    (
        proptest::option::of(prop_oneof!["[a-zA-Z0-9/._-]{1,40}", any::<String>()]),
        prompt,
        proptest::option::of(prop_oneof![Just(String::new()), any::<String>()]),
        proptest::option::of(prop_oneof![Just(String::new()), "[a-z0-9]{1,12}"]),
        proptest::option::of(any::<u64>()),
        proptest::option::of(0u64..100_000),
        proptest::option::of(any::<bool>()),
        prop::collection::vec(
            ("x_[a-z]{1,8}|temperature|tools|metadata", json_value()),
            0..4,
        ),
    )
        .prop_map(
            |(model, prompt, pck, user, mt, mct, stream, extras)| RequestGen {
                model,
                prompt,
                prompt_cache_key: pck,
                user,
                max_tokens: mt,
                max_completion_tokens: mct,
                stream,
                extras,
            },
        )
}

impl RequestGen {
    /// The body's fields, in the given order; `extras` adds the unknown fields.
    fn fields(&self, extras: bool) -> Vec<(String, Value)> {
        let mut f = Vec::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                f.push((k.to_string(), v));
            }
        };
        put("model", self.model.as_ref().map(|m| json!(m)));
        match &self.prompt {
            PromptGen::Chat(msgs) => put(
                "messages",
                Some(Value::Array(
                    msgs.iter()
                        .map(|(role, c)| match c.to_json() {
                            Some(c) => json!({"role": role, "content": c}),
                            None => json!({"role": role}),
                        })
                        .collect(),
                )),
            ),
            PromptGen::Text(t) => put("prompt", Some(json!(t))),
            PromptGen::Many(items) => put("prompt", Some(json!(items))),
        }
        put(
            "prompt_cache_key",
            self.prompt_cache_key.as_ref().map(|k| json!(k)),
        );
        put("user", self.user.as_ref().map(|u| json!(u)));
        put("max_tokens", self.max_tokens.map(|m| json!(m)));
        put(
            "max_completion_tokens",
            self.max_completion_tokens.map(|m| json!(m)),
        );
        put("stream", self.stream.map(|s| json!(s)));
        if extras {
            f.extend(self.extras.iter().cloned());
        }
        f
    }

    /// Writes the fields as a JSON object in exactly this order.
    fn body(fields: &[(String, Value)]) -> Vec<u8> {
        let parts: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}:{}", json!(k), v))
            .collect();
        format!("{{{}}}", parts.join(",")).into_bytes()
    }
}

proptest! {
    #![proptest_config(cases(256, 1))]

    /// Arbitrary bytes: no panic, bounded safe headers, same result twice and
    /// for any chunking.
    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..2048),
                       cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let cfg = small_blocks(8);
        let ex = extract(&body, &cfg);
        check_headers(&ex, &cfg)?;
        prop_assert_eq!(&extract(&body, &cfg), &ex);
        prop_assert_eq!(chunked(&body, &cuts, &cfg), ex);
    }

    /// Any JSON document is read as JSON (never `not_json`), and its model is
    /// taken whenever it is a header-safe string, whatever else is wrong.
    #[test]
    fn arbitrary_json(v in json_value(),
                      cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let cfg = small_blocks(8);
        let body = serde_json::to_vec(&v).unwrap();
        let ex = extract(&body, &cfg);
        check_headers(&ex, &cfg)?;
        prop_assert_ne!(ex.status, ParseStatus::NotJson, "{}", v);
        let want = v.get("model").and_then(Value::as_str).and_then(model::model);
        prop_assert_eq!(&ex.model, &want);
        prop_assert_eq!(chunked(&body, &cuts, &cfg), ex);
    }

    /// Valid requests with random values: every field is extracted, and
    /// neither field order nor unknown fields change a header.
    #[test]
    fn valid_requests(r in request(), order in any::<prop::sample::Index>(),
                      cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let cfg = small_blocks(16);
        let mut fields = r.fields(true);
        let body = RequestGen::body(&fields);
        let ex = extract(&body, &cfg);
        check_headers(&ex, &cfg)?;
        prop_assert_eq!(ex.status, ParseStatus::Ok, "{}", String::from_utf8_lossy(&body));
        prop_assert_eq!(&ex.model, &r.model.as_deref().and_then(model::model));
        prop_assert_eq!(ex.max_tokens, r.max_completion_tokens.or(r.max_tokens));
        prop_assert_eq!(ex.stream, r.stream.unwrap_or(false));

        let canonical = canonical_text(&body).expect("a request of the expected shape");
        prop_assert_eq!(ex.prompt_tokens, canonical.len().div_ceil(BYTES_PER_TOKEN) as u64);
        prop_assert_eq!(ex.blocks.len(), (canonical.len() / cfg.block_bytes).min(cfg.max_blocks));
        // Content keys come from the opening (first system and first user
        // message) of a chat, else the start of the prompt text.
        let has_opening = match &r.prompt {
            PromptGen::Chat(msgs) => msgs.iter().any(|(role, _)| role == "system" || role == "user"),
            _ => !canonical.is_empty(),
        };
        let want_source = if r.prompt_cache_key.as_deref().is_some_and(|k| !k.is_empty()) {
            Some(KeySource::PromptCacheKey)
        } else if r.user.as_deref().is_some_and(|u| !u.is_empty()) {
            Some(KeySource::User)
        } else {
            has_opening.then_some(KeySource::Content)
        };
        prop_assert_eq!(ex.key.map(|(_, s)| s), want_source);

        // Unknown fields and field order are irrelevant to routing.
        prop_assert_eq!(&extract(&RequestGen::body(&r.fields(false)), &cfg), &ex);
        let n = fields.len();
        if n > 1 {
            fields.rotate_left(order.index(n));
        }
        let reordered = RequestGen::body(&fields);
        prop_assert_eq!(&extract(&reordered, &cfg), &ex);
        prop_assert_eq!(chunked(&reordered, &cuts, &cfg), ex);
    }

    /// The next turn of a conversation keeps the earlier turn's key and blocks.
    #[test]
    fn next_turn_extends_the_prefix(r in request(), reply in text(), next in text()) {
        let PromptGen::Chat(msgs) = &r.prompt else { return Ok(()) };
        let cfg = small_blocks(4096);
        let first = extract(&RequestGen::body(&r.fields(false)), &cfg);
        let mut longer = msgs.clone();
        longer.push(("assistant".into(), ContentGen::Text(reply)));
        longer.push(("user".into(), ContentGen::Text(next)));
        let turn2 = RequestGen { prompt: PromptGen::Chat(longer), ..r.clone() };
        let second = extract(&RequestGen::body(&turn2.fields(false)), &cfg);
        prop_assert_eq!(first.status, ParseStatus::Ok);
        prop_assert!(second.blocks.len() >= first.blocks.len());
        prop_assert_eq!(&second.blocks[..first.blocks.len()], &first.blocks[..]);
        if msgs.iter().any(|(role, _)| role == "user") {
            prop_assert_eq!(second.key, first.key);
        }
    }

    /// Bodies that are not UTF-8 are not JSON, wherever the bad byte sits.
    #[test]
    fn invalid_utf8(r in request(), at in any::<prop::sample::Index>(),
                    bad in prop_oneof![Just(vec![0xffu8]), Just(vec![0xc3]), Just(vec![0xed, 0xa0, 0x80]), Just(vec![0xf0, 0x28])]) {
        let cfg = small_blocks(8);
        let mut body = RequestGen::body(&r.fields(true));
        let i = at.index(body.len() + 1);
        body.splice(i..i, bad);
        let ex = extract(&body, &cfg);
        check_headers(&ex, &cfg)?;
        prop_assert_eq!(ex.status, ParseStatus::NotJson);
        prop_assert_eq!(ex.model, None);
    }
}

proptest! {
    #![proptest_config(cases(8, 32))]

    /// Nesting far beyond serde_json's recursion limit, at the top, inside a
    /// message or in an unknown field: no stack overflow, nothing routed on a
    /// prompt it could not read; an unknown field (skipped without recursion)
    /// changes nothing, however deep.
    #[test]
    fn deep_nesting(depth in 1usize..20_000, place in 0usize..3, open in "[\\[{]") {
        let cfg = small_blocks(8);
        let nested = |d: usize| if open == "[" {
            format!("{}{}", "[".repeat(d), "]".repeat(d))
        } else {
            format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d))
        };
        let plain = br#"{"model":"m","messages":[{"role":"user","content":"hello world, hello world"}]}"#;
        let body = match place {
            0 => nested(depth),
            1 => format!(r#"{{"model":"m","messages":[{{"role":"user","content":{}}}]}}"#, nested(depth)),
            _ => format!(r#"{{"model":"m","x":{},"messages":[{{"role":"user","content":"hello world, hello world"}}]}}"#, nested(depth)),
        };
        let ex = extract(body.as_bytes(), &cfg);
        check_headers(&ex, &cfg)?;
        match (place, open.as_str()) {
            // An object of unknown fields: a request that asks for nothing.
            (0, "{") => prop_assert_eq!(&ex, &extract(b"{}", &cfg)),
            (0 | 1, _) if depth > 200 => prop_assert_ne!(ex.status, ParseStatus::Ok),
            _ => {}
        }
        if place == 2 {
            prop_assert_eq!(ex, extract(plain, &cfg));
        }
    }

}

proptest! {
    // Each case builds, parses and checks up to 20,000 messages.
    #![proptest_config(cases(8, 256))]

    /// Huge message and prompt arrays: blocks stop at `max_blocks`, token
    /// estimates still count the whole prompt.
    #[test]
    fn huge_arrays(n in 1usize..20_000, chat in any::<bool>(), max_blocks in 1usize..64) {
        let cfg = small_blocks(max_blocks);
        let body = if chat {
            let msgs: Vec<Value> = (0..n).map(|i| json!({"role": "user", "content": format!("m{i}")})).collect();
            json!({"model": "m", "messages": msgs})
        } else {
            let items: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            json!({"model": "m", "prompt": items})
        };
        let body = serde_json::to_vec(&body).unwrap();
        let ex = extract(&body, &cfg);
        check_headers(&ex, &cfg)?;
        prop_assert_eq!(ex.status, ParseStatus::Ok);
        let canonical = canonical_text(&body).unwrap();
        prop_assert_eq!(ex.blocks.len(), (canonical.len() / 16).min(max_blocks));
        prop_assert_eq!(ex.prompt_tokens, canonical.len().div_ceil(BYTES_PER_TOKEN) as u64);
    }
}
