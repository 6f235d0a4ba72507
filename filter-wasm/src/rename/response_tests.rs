//! Tests of `response.rs`.

use super::*;

fn run(format: Format, to: &str, chunks: &[&[u8]]) -> Vec<u8> {
    let mut r = ModelRewriter::new(format, to);
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        match r.push(c, i + 1 == chunks.len()) {
            Emit::Same => out.extend_from_slice(c),
            Emit::Bytes(b) => out.extend_from_slice(&b),
        }
        assert!(r.retained() <= MAX_MODEL_VALUE);
    }
    out
}

const EVENT: &str = r#"data: {"id":"c1","object":"chat.completion.chunk","model":"served/x","choices":[{"delta":{"content":"\"model\":\"no\""},"model":"nested"}]}"#;

#[test]
fn sse_events_get_the_clients_name_whatever_the_cuts() {
    let stream = format!("{EVENT}\n\n: comment \"model\":\"c\"\n{EVENT}\r\n\r\ndata: [DONE]\n\n");
    let want = stream.replace(r#""model":"served/x""#, r#""model":"m1""#);
    assert_ne!(want, stream);
    let bytes = stream.as_bytes();
    assert_eq!(run(Format::Sse, "m1", &[bytes]), want.as_bytes());
    for cut in 0..bytes.len() {
        let (a, b) = bytes.split_at(cut);
        assert_eq!(
            run(Format::Sse, "m1", &[a, b]),
            want.as_bytes(),
            "cut at {cut}"
        );
    }
    let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(run(Format::Sse, "m1", &bytewise), want.as_bytes());
}

#[test]
fn a_json_body_gets_the_clients_name_once() {
    let body = r#"{"id":"x","model" : "served","usage":{"model":"keep"},"model_x":"k"}"#;
    let want = body.replace(r#""served""#, r#""m1""#);
    assert_eq!(run(Format::Json, "m1", &[body.as_bytes()]), want.as_bytes());
    // A chunk after the object passes without a copy.
    let mut r = ModelRewriter::new(Format::Json, "m1");
    assert!(matches!(r.push(body.as_bytes(), false), Emit::Bytes(_)));
    assert_eq!(r.push(b"  ", true), Emit::Same);
    assert_eq!(r.renamed, 1);
}

#[test]
fn what_is_not_a_name_passes_as_it_came() {
    let long = format!(r#"{{"model":"{}","x":1}}"#, "a".repeat(MAX_MODEL_VALUE + 5));
    let bytes = long.as_bytes();
    for cut in [0, 9, 500, 1030, bytes.len()] {
        let (a, b) = bytes.split_at(cut);
        assert_eq!(run(Format::Json, "m1", &[a, b]), bytes, "cut {cut}");
    }
    for body in [
        r#"[{"model":"a"}]"#,
        r#"{"model":7}"#,
        r#"{"mo\u0064el":"a"}"#,
        "not json \"model\":\"a\"",
    ] {
        assert_eq!(
            run(Format::Json, "m1", &[body.as_bytes()]),
            body.as_bytes(),
            "{body}"
        );
    }
    // A stream cut inside a value, then ended: the held bytes go out.
    let cut = r#"data: {"model":"serv"#;
    assert_eq!(
        run(Format::Sse, "m1", &[cut.as_bytes(), b""]),
        cut.as_bytes()
    );
}
