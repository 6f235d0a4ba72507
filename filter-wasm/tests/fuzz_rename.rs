//! Properties of the model renaming, both directions. Request: the body is
//! the client's with only the top-level `model` value replaced, it parses to
//! the same JSON but for that field, and what is not one request object is
//! left byte for byte. Response: for any chunking, the bytes out are the
//! engine's with every top-level `model` value replaced by the client's name
//! (and nothing else changed), arbitrary bytes come out the same however they
//! are cut, and no more than `MAX_MODEL_VALUE` bytes are ever held.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use fleetroute_filter::rename::MAX_MODEL_VALUE;
use fleetroute_filter::rename::request::{Untouched, rename};
use fleetroute_filter::rename::response::{Emit, Format, ModelRewriter};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// A model name as configs and clients write them.
fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._/:-]{1,60}"
}

/// Text that tempts a scanner: quotes, braces, escapes and the key itself.
fn tricky_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("\"model\": \"x\"".to_string()),
            Just("{\"model\":".to_string()),
            Just("\\".to_string()),
            Just("data: {".to_string()),
            Just("}]".to_string()),
            "[a-z ]{0,12}",
            "\\PC{0,4}",
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat())
}

/// A JSON value without a top-level meaning: nested objects may hold
/// their own `model`, which must survive.
fn nested() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        tricky_text().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(
                (prop_oneof![Just("model".to_string()), "[a-z]{1,6}"], inner),
                0..4
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// An object with a top-level `model` at some position among other fields.
fn object(model: &str, others: &[(String, Value)], at: usize) -> String {
    let mut fields: Vec<String> = others
        .iter()
        .map(|(k, v)| format!("{}:{}", json!(k), v))
        .collect();
    fields.insert(
        at.min(fields.len()),
        format!("\"model\" : {}", json!(model)),
    );
    format!("{{ {} }}", fields.join(" , "))
}

fn fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec(
        (
            "[a-z_]{1,10}".prop_filter("not model", |k| k != "model"),
            nested(),
        ),
        0..5,
    )
}

/// Arbitrary bytes, a quarter of them turned into the bytes the rewriter
/// acts on (quotes, braces, colons, newlines, escapes, `d` of `data:`).
fn structural(mut bytes: Vec<u8>) -> Vec<u8> {
    for b in &mut bytes {
        if *b < 64 {
            *b = b"\"{}:\n\\d,["[usize::from(*b) % 8];
        }
    }
    bytes
}

/// Runs a response through the rewriter cut at `cuts`.
fn rewrite(
    format: Format,
    to: &str,
    bytes: &[u8],
    cuts: &[prop::sample::Index],
) -> Result<Vec<u8>, TestCaseError> {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    points.sort_unstable();
    points.push(bytes.len());
    let mut r = ModelRewriter::new(format, to);
    let mut out = Vec::new();
    let mut start = 0;
    for (n, p) in points.iter().enumerate() {
        let chunk = &bytes[start..*p];
        match r.push(chunk, n + 1 == points.len()) {
            Emit::Same => out.extend_from_slice(chunk),
            Emit::Bytes(b) => out.extend_from_slice(&b),
        }
        prop_assert!(
            r.retained() <= MAX_MODEL_VALUE,
            "{} bytes held",
            r.retained()
        );
        start = *p;
    }
    prop_assert_eq!(r.retained(), 0, "bytes left held after the end");
    Ok(out)
}

proptest! {
    #![proptest_config(cases(256, 1))]

    #[test]
    fn a_request_changes_only_its_model(client in name(), served in name(), others in fields(), at in 0usize..6) {
        let body = object(&client, &others, at);
        let mut bytes = body.clone().into_bytes();
        let len = rename(&mut bytes, &served).unwrap();
        prop_assert_eq!(len, bytes.len());
        let text = String::from_utf8(bytes).unwrap();
        prop_assert_eq!(&text, &object(&served, &others, at));
        let mut want: Map<String, Value> = serde_json::from_str(&body).unwrap();
        want.insert("model".into(), Value::from(served));
        prop_assert_eq!(serde_json::from_str::<Map<String, Value>>(&text).unwrap(), want);
    }

    #[test]
    fn what_is_not_one_request_object_is_left_byte_for_byte(bytes in prop::collection::vec(any::<u8>(), 0..400), served in name()) {
        let mut b = bytes.clone();
        if rename(&mut b, &served).is_err() {
            prop_assert_eq!(b, bytes);
        }
    }

    /// Near-valid flat bodies over JSON's structural alphabet (no escapes,
    /// control bytes or nesting: the scanner checks the top level, and skips
    /// nested values and string contents, which the filter's first root has
    /// already read with a JSON parser before ext-proc asks for a rename): a
    /// body is renamed only if JSON reads it as an object with a string model.
    #[test]
    fn only_an_object_with_a_string_model_is_renamed(
        client in "[a-z]{1,8}",
        others in prop::collection::vec(("[a-z_]{1,6}", prop_oneof!["[a-z ]{0,6}".prop_map(Value::from), any::<i32>().prop_map(Value::from), Just(Value::Null), any::<bool>().prop_map(Value::from)]), 0..5),
        at in 0usize..6,
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(b"}\":,0123456789.-+eEtrufalsn ".to_vec())), 1..4),
    ) {
        let others: Vec<(String, Value)> = others.into_iter().filter(|(k, _)| k != "model").collect();
        let mut bytes = object(&client, &others, at).into_bytes();
        for (i, c) in edits {
            let i = i.index(bytes.len());
            bytes[i] = c;
        }
        let mut b = bytes.clone();
        match rename(&mut b, "served") {
            Ok(_) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => prop_assert!(v.get("model").is_some_and(Value::is_string)),
                // Valid JSON that serde_json does not take (e.g. 1e400): not a
                // shape question.
                Err(e) if e.to_string().starts_with("number out of range") => {}
                Err(e) => prop_assert!(false, "renamed a body JSON refuses: {e}: {}", String::from_utf8_lossy(&bytes)),
            },
            Err(_) => prop_assert_eq!(b, bytes),
        }
    }

    #[test]
    fn a_duplicate_or_unparseable_body_is_untouched(client in name(), others in fields()) {
        let body = format!("{},\"model\":\"again\"}}", object(&client, &others, 0).trim_end_matches('}'));
        let mut b = body.clone().into_bytes();
        prop_assert_eq!(rename(&mut b, "x"), Err(Untouched::Duplicate));
        prop_assert_eq!(b, body.into_bytes());
    }

    #[test]
    fn sse_streams_get_the_clients_name_for_any_chunking(
        events in prop::collection::vec((fields(), 0usize..6, any::<bool>()), 1..6),
        served in name(), client in name(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let (mut stream, mut want) = (String::new(), String::new());
        for (others, at, crlf) in &events {
            let nl = if *crlf { "\r\n" } else { "\n" };
            stream += &format!("data: {}{nl}{nl}", object(&served, others, *at));
            want += &format!("data: {}{nl}{nl}", object(&client, others, *at));
        }
        stream += ": keep-alive \"model\":\"x\"\n\ndata: [DONE]\n\n";
        want += ": keep-alive \"model\":\"x\"\n\ndata: [DONE]\n\n";
        let out = rewrite(Format::Sse, &client, stream.as_bytes(), &cuts)?;
        prop_assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn a_json_body_gets_the_clients_name_for_any_chunking(
        others in fields(), at in 0usize..6, served in name(), client in name(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let body = object(&served, &others, at);
        let out = rewrite(Format::Json, &client, body.as_bytes(), &cuts)?;
        prop_assert_eq!(String::from_utf8(out).unwrap(), object(&client, &others, at));
    }

}

proptest! {
    // Long inputs rewritten twice per case: fewer cases.
    #![proptest_config(cases(64, 4))]

    #[test]
    fn any_bytes_come_out_the_same_however_cut(
        bytes in prop::collection::vec(any::<u8>(), 0..1200).prop_map(structural),
        sse in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let format = if sse { Format::Sse } else { Format::Json };
        let whole = rewrite(format, "m1", &bytes, &[])?;
        prop_assert_eq!(rewrite(format, "m1", &bytes, &cuts)?, whole);
    }
}

#[test]
fn a_long_model_value_is_never_held_past_the_bound() {
    let body = format!("data: {{\"model\":\"{}\"}}\n\n", "m".repeat(100_000));
    let bytes = body.as_bytes();
    let mut r = ModelRewriter::new(Format::Sse, "m1");
    let mut out = Vec::new();
    for c in bytes.chunks(7) {
        match r.push(c, false) {
            Emit::Same => out.extend_from_slice(c),
            Emit::Bytes(b) => out.extend_from_slice(&b),
        }
        assert!(r.retained() <= MAX_MODEL_VALUE);
    }
    assert_eq!(out, bytes, "a value too long to be a name passes unchanged");
}
