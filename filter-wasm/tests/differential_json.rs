//! One reading of a body: what the filter extracts from a request body must
//! be what it extracts from that body as an engine reads it, or the filter
//! must refuse the body. Engines parse with Python's `json` (vLLM, SGLang:
//! duplicate keys keep the last value, a byte order mark is skipped, `NaN`
//! is a number) or with readers of the same rules; serde_json's generic
//! `Value` keeps the last duplicate too. Each reading is written back as
//! plain JSON (unique keys, no mark, standard spacing) and extracted again:
//! an extraction of the original that differs from the extraction of an
//! engine's reading is a body the router would route as one request while
//! the engine serves another.
//!
//! Bodies come from a generator of the shapes that tell readers apart:
//! duplicate keys (also spelled with escapes), byte order marks, escapes,
//! odd whitespace, deep nesting, numbers at the edges, Python's own literals.
//! Python runs once for the whole batch. A missing `python3` fails the test.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use fleetroute_filter::config::FilterConfig;
use fleetroute_filter::contract::ParseStatus;
use fleetroute_filter::extract::{Extraction, extract};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// The fields the filter reads at the top level of a request.
const READ: [&str; 8] = [
    "model",
    "messages",
    "prompt",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "user",
    "prompt_cache_key",
];

/// Reads each line (hex of a body) as an engine would and prints, per line,
/// `err` (not JSON to Python) or `ok <fields> <model>`: the fields the filter
/// reads, as plain JSON, and the model when it is a string, each in hex, or
/// `-` when UTF-8 cannot carry them (a lone surrogate) or there is no model.
const PYTHON: &str = r#"
import json, sys
READ = sys.argv[1].split(",")
def enc(v):
    try:
        return v.encode("utf-8").hex()
    except Exception:
        return "-"
for line in sys.stdin:
    body = bytes.fromhex(line.strip())
    try:
        value = json.loads(body)
    except Exception:
        print("err"); continue
    read = {k: value[k] for k in READ if k in value} if isinstance(value, dict) else {}
    model = read.get("model")
    print("ok", enc(json.dumps(read, ensure_ascii=False)) or "7b7d",
          enc(model) if isinstance(model, str) and model else "-")
"#;

/// What an engine read of a body: the fields the filter reads (as plain
/// JSON) and the model, `None` where UTF-8 cannot carry them; or nothing.
#[derive(Debug)]
enum Reading {
    Json {
        fields: Option<Vec<u8>>,
        model: Option<String>,
    },
    NotJson,
}

fn unhex(hex: &str) -> Option<Vec<u8>> {
    (hex != "-").then(|| {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    })
}

fn python_readings(bodies: &[Vec<u8>]) -> Vec<Reading> {
    let mut child = Command::new("python3")
        .args(["-c", PYTHON, &READ.join(",")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is needed for this test (scripts/setup.sh installs it)");
    let mut input = String::new();
    for b in bodies {
        for byte in b {
            input.push_str(&format!("{byte:02x}"));
        }
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "python3 failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let readings: Vec<Reading> = text
        .lines()
        .map(|l| match l.split(' ').collect::<Vec<_>>()[..] {
            ["ok", fields, model] => Reading::Json {
                fields: unhex(fields),
                model: unhex(model).map(|m| String::from_utf8(m).unwrap()),
            },
            ["err"] => Reading::NotJson,
            _ => panic!("unexpected python output {l:?}"),
        })
        .collect();
    assert_eq!(readings.len(), bodies.len());
    readings
}

/// serde_json's generic reading of the fields the filter reads: each a
/// `Value`, the last of duplicate keys winning (as `Value`'s own map does);
/// the other fields skipped, as serde_json skips what a type does not read.
fn serde_reading(body: &[u8]) -> Reading {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Fields(serde_json::Map<String, serde_json::Value>);
    impl<'de> serde::Deserialize<'de> for Fields {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Fields;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Fields, A::Error> {
                    let mut read = serde_json::Map::new();
                    while let Some(k) = m.next_key::<String>()? {
                        if READ.contains(&k.as_str()) {
                            read.insert(k, m.next_value()?);
                        } else {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(Fields(read))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut s: A,
                ) -> Result<Fields, A::Error> {
                    while s.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(Fields(serde_json::Map::new()))
                }
                fn visit_str<E>(self, _: &str) -> Result<Fields, E> {
                    Ok(Fields(serde_json::Map::new()))
                }
                fn visit_f64<E>(self, _: f64) -> Result<Fields, E> {
                    Ok(Fields(serde_json::Map::new()))
                }
                fn visit_u64<E>(self, _: u64) -> Result<Fields, E> {
                    Ok(Fields(serde_json::Map::new()))
                }
                fn visit_i64<E>(self, _: i64) -> Result<Fields, E> {
                    Ok(Fields(serde_json::Map::new()))
                }
                fn visit_bool<E>(self, _: bool) -> Result<Fields, E> {
                    Ok(Fields(serde_json::Map::new()))
                }
                fn visit_unit<E>(self) -> Result<Fields, E> {
                    Ok(Fields(serde_json::Map::new()))
                }
            }
            d.deserialize_any(V)
        }
    }
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let Ok(Fields(read)) = serde_json::from_slice::<Fields>(body) else {
        return Reading::NotJson;
    };
    Reading::Json {
        fields: Some(serde_json::to_vec(&read).unwrap()),
        model: read
            .get("model")
            .and_then(|m| m.as_str())
            .filter(|m| !m.is_empty())
            .map(str::to_string),
    }
}

fn refused(e: &Extraction) -> bool {
    matches!(e.status, ParseStatus::NotJson | ParseStatus::DuplicateKey)
}

/// `None` when the filter and this reading agree: the filter refused the
/// body; or it read every field and they are the engine's; or it read only
/// the model (a body of another shape) and that is the engine's.
fn disagreement(body: &[u8], reading: &Reading, cfg: &FilterConfig) -> Option<String> {
    let ours = extract(body, cfg);
    if refused(&ours) {
        return None;
    }
    let Reading::Json { fields, model } = reading else {
        return Some(format!(
            "the filter routed it ({:?}) but the engine cannot read it",
            ours.status
        ));
    };
    if ours.status == ParseStatus::BadShape {
        let theirs = model
            .as_deref()
            .and_then(fleetroute_filter::extract::model::model);
        return (ours.model != theirs)
            .then(|| format!("filter read model {:?}, the engine {theirs:?}", ours.model));
    }
    let Some(fields) = fields else {
        return Some("the engine read text the filter cannot have read".into());
    };
    let theirs = extract(fields, cfg);
    (ours != theirs).then(|| {
        format!(
            "filter read {ours:?}\n  engine's reading {:?} reads as {theirs:?}",
            String::from_utf8_lossy(fields)
        )
    })
}

// === The generator ===

/// Whitespace, now and then of a kind JSON does not allow.
fn ws() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        60 => prop::sample::select(vec!["", "", "", " ", "\n", "\t", "\r\n", "  "]),
        1 => prop::sample::select(vec!["\u{c}", "\u{a0}", "\u{feff}"]),
    ]
}

fn key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "model",
        "model",
        "mod\\u0065l",
        "Model",
        "model ",
        "messages",
        "prompt",
        "stream",
        "max_tokens",
        "max_tok\\u0065ns",
        "max_completion_tokens",
        "user",
        "prompt_cache_key",
        "stream_options",
        "temperature",
        "metadata",
    ])
}

fn number() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        12 => prop::sample::select(vec![
            "0",
            "1",
            "7",
            "-0",
            "-1",
            "1.0",
            "1e2",
            "4294967295",
            "4294967296",
            "18446744073709551615",
            "18446744073709551616",
        ]),
        1 => prop::sample::select(vec!["1E400", "NaN", "Infinity", "-Infinity", "01"]),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "m1", "premium", "cheap", "a b", "caf\\u00e9", "\\ud83d\\ude00", "x\\u0000y",
            "\\\"q\\\"", "tab\\tend", "",
        ])
        .prop_map(str::to_string),
        8 => "[a-z0-9/._-]{1,12}",
        1 => prop::sample::select(vec!["\\ud800", "\\udc00x", "bad\\x"]).prop_map(str::to_string),
    ]
}

fn string() -> impl Strategy<Value = String> {
    text().prop_map(|t| format!("\"{t}\""))
}

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        string(),
        number().prop_map(str::to_string),
        prop::sample::select(vec!["true", "false", "null", "True", "\"true\""])
            .prop_map(str::to_string),
    ]
}

fn message() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        prop::sample::select(vec!["system", "user", "assistant", "tool"])
            .prop_map(|r| format!("\"role\":\"{r}\"")),
        string().prop_map(|t| format!("\"content\":{t}")),
        string().prop_map(|t| format!("\"content\":[{{\"type\":\"text\",\"text\":{t}}}]")),
        string().prop_map(|t| format!(
            "\"content\":[{{\"type\":\"text\",\"text\":{t},\"text\":\"y\"}}]"
        )),
        Just("\"name\":\"n\"".to_string()),
    ];
    prop::collection::vec(field, 1..4).prop_map(|f| format!("{{{}}}", f.join(",")))
}

fn value_for(k: &str) -> BoxedStrategy<String> {
    let k = k.replace("\\u0065", "e");
    match k.as_str() {
        "messages" => prop_oneof![
            4 => prop::collection::vec(message(), 0..4).prop_map(|m| format!("[{}]", m.join(","))),
            1 => scalar(),
        ]
        .boxed(),
        "prompt" => prop_oneof![
            string(),
            prop::collection::vec(string(), 0..3).prop_map(|p| format!("[{}]", p.join(","))),
            Just("[1,2,3]".to_string()),
        ]
        .boxed(),
        "metadata" => prop_oneof![
            (1usize..200).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
            Just("{\"model\":\"inner\"}".to_string()),
        ]
        .boxed(),
        "stream_options" => {
            Just("{\"include_usage\":true,\"include_usage\":false}".to_string()).boxed()
        }
        _ => scalar().boxed(),
    }
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let field = key().prop_flat_map(|k| (Just(k), value_for(k), ws(), ws()));
    (
        prop::bool::weighted(0.2),
        ws(),
        prop::collection::vec(field, 0..8),
        ws(),
        prop::bool::weighted(0.03),
    )
        .prop_map(|(bom, lead, fields, tail, truncate)| {
            let inner: Vec<String> = fields
                .iter()
                .map(|(k, v, a, b)| format!("{a}\"{k}\"{b}:{a}{v}{b}"))
                .collect();
            let mut s = format!("{lead}{{{}}}{tail}", inner.join(","));
            if truncate {
                s.pop();
            }
            let mut out = Vec::new();
            if bom {
                out.extend_from_slice(b"\xEF\xBB\xBF");
            }
            out.extend_from_slice(s.as_bytes());
            out
        })
}

/// The bodies that made the filter and the engines disagree before, and
/// their near relatives.
fn known() -> Vec<Vec<u8>> {
    [
        &br#"{"model":"cheap","model":"premium"}"#[..],
        br#"{"model":"cheap","messages":[{"role":"user","content":"hi"}],"model":"served-internal"}"#,
        b"\xEF\xBB\xBF{\"model\":\"premium\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        br#"{"model":"m1","max_tokens":1,"max_tokens":100000}"#,
        br#"{"model":"m1","temperature":NaN}"#,
        br#"{"model":"m1","mod\u0065l":"premium"}"#,
    ]
    .iter()
    .map(|b| b.to_vec())
    .collect()
}

#[test]
fn the_filter_reads_a_body_as_engines_do_or_refuses_it() {
    let cases = common::cases(3000, 1).cases as usize;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = body();
    let mut bodies = known();
    for _ in 0..cases {
        bodies.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    let cfg = FilterConfig {
        block_bytes: 16,
        ..FilterConfig::default()
    };
    let python = python_readings(&bodies);
    let mut bad = Vec::new();
    let mut refusals = 0;
    for (body, py) in bodies.iter().zip(&python) {
        refusals += usize::from(refused(&extract(body, &cfg)));
        for (who, reading) in [("python", py), ("serde_json", &serde_reading(body))] {
            if let Some(why) = disagreement(body, reading, &cfg) {
                bad.push(format!(
                    "{who}: {:?}\n  {why}",
                    String::from_utf8_lossy(body)
                ));
            }
        }
    }
    println!(
        "{} bodies, {refusals} refused, {} disagreements",
        bodies.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} disagreements, the first:\n{}",
        bad.len(),
        bad.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    // The generator reaches both sides: bodies read and bodies refused.
    assert!(
        refusals > cases / 20 && refusals < cases,
        "{refusals} refused"
    );
    // The known smuggling bodies are refused (duplicates, NaN) or read as
    // the engine reads them (the byte order mark).
    let known = known();
    for b in &known[..2] {
        assert_eq!(extract(b, &cfg).status, ParseStatus::DuplicateKey);
    }
    assert_eq!(extract(&known[2], &cfg).model.as_deref(), Some("premium"));
    assert_eq!(extract(&known[3], &cfg).status, ParseStatus::DuplicateKey);
    assert_eq!(extract(&known[4], &cfg).status, ParseStatus::NotJson);
}
