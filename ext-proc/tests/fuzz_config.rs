//! Properties of the router config loader: arbitrary YAML documents and
//! random mutations of the example config never panic, and every error names
//! the field path it is about.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use fleetroute::config::{ConfigError, RouterConfig};
use proptest::prelude::*;
use yaml_serde::{Mapping, Value};

const EXAMPLE: &str = include_str!("../../envoy-config/router.yaml");

/// Top-level fields: every field path starts with one of them.
const TOP: &[&str] = &[
    "health_check",
    "engine_metrics",
    "default_stage",
    "fleets",
    "stages",
];

/// The error names a field path that exists in the document: its first
/// segment is a top-level field, and an index into `fleets` or `stages`
/// points at an item the document has.
fn names_a_field(e: &ConfigError, doc: &Value) -> Result<(), String> {
    let path = e.path.as_str();
    if path.is_empty() {
        // A field without a name (`? ` or `"": x`) can only be shown by position.
        let nameless = doc.as_mapping().is_some_and(|m| {
            m.keys()
                .any(|k| k.is_null() || k.as_str().is_some_and(str::is_empty))
        });
        if nameless && e.message.starts_with("unknown field ``") && e.message.contains(" at line ")
        {
            return Ok(());
        }
        // Nor can a key that is itself a map or a list (`{}: x`).
        let composite = doc.as_mapping().is_some_and(|m| {
            m.keys()
                .any(|k| k.is_mapping() || k.is_sequence() || matches!(k, Value::Tagged(_)))
        });
        if composite && e.message.contains(" at line ") {
            return Ok(());
        }
        return Err(format!("no field path: {e}"));
    }
    let first = path.split(['.', '[']).next().unwrap_or("");
    if !TOP.contains(&first) {
        // An unknown top-level field is named as written (it may hold dots).
        let unknown_top = doc.as_mapping().is_some_and(|m| {
            m.keys().any(|k| {
                let name = match k.as_str() {
                    Some(s) => s.to_string(),
                    None => yaml_serde::to_string(k)
                        .unwrap_or_default()
                        .trim_end()
                        .to_string(),
                };
                !name.is_empty() && path.starts_with(&name)
            })
        });
        return if unknown_top {
            Ok(())
        } else {
            Err(format!("path does not start with a field: {e}"))
        };
    }
    if let Some(rest) = path.strip_prefix(first).and_then(|r| r.strip_prefix('[')) {
        let i: usize = rest
            .split(']')
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("bad index in {e}"))?;
        let len = doc
            .get(first)
            .and_then(Value::as_sequence)
            .map_or(0, Vec::len);
        if i >= len {
            return Err(format!("index past the end ({len} items): {e}"));
        }
    }
    Ok(())
}

fn check(text: &str) -> Result<(), TestCaseError> {
    let doc: Option<Value> = yaml_serde::from_str(text).ok();
    match RouterConfig::parse(text) {
        Ok(cfg) => {
            // A config that loads also loads again as written back.
            let again = yaml_serde::to_string(&cfg).unwrap();
            prop_assert!(
                RouterConfig::parse(&again).is_ok(),
                "written back:\n{}",
                again
            );
        }
        Err(errors) => {
            prop_assert!(!errors.0.is_empty());
            for e in &errors.0 {
                prop_assert!(!e.message.is_empty());
                match &doc {
                    // A document YAML itself cannot read has no fields yet:
                    // the error gives the line and column instead.
                    None => prop_assert!(
                        e.message.contains("line "),
                        "syntax error without position: {}",
                        e
                    ),
                    // A document that is not a mapping has no fields either.
                    Some(d) if !d.is_mapping() => {}
                    Some(d) => {
                        if let Err(why) = names_a_field(e, d) {
                            return Err(TestCaseError::fail(format!("{why}\n---\n{text}")));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0)
        ]
        .prop_map(Value::from),
        "[a-z0-9_./:-]{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ]
}

const FIELDS: &str = "name|region|endpoints|cost|capacity|hosts|models|fleets|stages|residency|replicas|routing|policy|order|weights|health_check|path|interval_ms|default_stage|[a-z_]{1,10}";

fn yaml_value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Sequence),
            prop::collection::vec((FIELDS, inner), 0..6).prop_map(|kv| {
                Value::Mapping(
                    kv.into_iter()
                        .map(|(k, v)| (Value::String(k), v))
                        .collect::<Mapping>(),
                )
            }),
        ]
    })
}

/// Every node's path in a document, as a list of keys and indices.
#[derive(Clone, Debug)]
enum Step {
    Key(Value),
    Index(usize),
}

fn paths(v: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(here.clone());
    match v {
        Value::Mapping(m) => {
            for (k, child) in m {
                here.push(Step::Key(k.clone()));
                paths(child, here, out);
                here.pop();
            }
        }
        Value::Sequence(s) => {
            for (i, child) in s.iter().enumerate() {
                here.push(Step::Index(i));
                paths(child, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

fn node<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(v, |v, step| match step {
        Step::Key(k) => v.get_mut(k).expect("path from this document"),
        Step::Index(i) => v.get_mut(*i).expect("path from this document"),
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Replace(Value),
    Remove,
    AddField(String, Value),
    Duplicate,
    Empty,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => prop_oneof![scalar(), yaml_value()].prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        1 => (FIELDS, scalar()).prop_map(|(k, v)| Mutation::AddField(k, v)),
        1 => Just(Mutation::Duplicate),
        1 => Just(Mutation::Empty),
    ]
}

fn mutate(doc: &mut Value, path: &[Step], m: &Mutation) {
    match m {
        Mutation::Replace(v) => *node(doc, path) = v.clone(),
        Mutation::Remove => {
            let Some((last, parent)) = path.split_last() else {
                return;
            };
            match (node(doc, parent), last) {
                (Value::Mapping(map), Step::Key(k)) => {
                    map.remove(k);
                }
                (Value::Sequence(s), Step::Index(i)) => {
                    s.remove(*i);
                }
                _ => {}
            }
        }
        Mutation::AddField(k, v) => {
            if let Value::Mapping(map) = node(doc, path) {
                map.insert(Value::String(k.clone()), v.clone());
            }
        }
        Mutation::Duplicate => {
            if let Value::Sequence(s) = node(doc, path)
                && let Some(first) = s.first().cloned()
            {
                s.push(first);
            }
        }
        Mutation::Empty => match node(doc, path) {
            Value::Sequence(s) => s.clear(),
            Value::Mapping(m) => m.clear(),
            Value::String(s) => s.clear(),
            other => *other = Value::Null,
        },
    }
}

#[test]
fn example_config_loads() {
    RouterConfig::parse(EXAMPLE).expect("the example config is valid");
}

proptest! {
    #![proptest_config(cases(256, 1))]

    /// Arbitrary text: never panics; errors give a position or a field.
    #[test]
    fn arbitrary_text(text in prop_oneof![any::<String>(), "[a-z_:\\[\\]{}, \n-]{0,200}"]) {
        check(&text)?;
    }

    /// Arbitrary YAML documents built from the config's own field names.
    #[test]
    fn arbitrary_documents(doc in yaml_value()) {
        check(&yaml_serde::to_string(&doc).unwrap())?;
    }

    /// One to three random mutations of the example config.
    #[test]
    fn mutated_example(picks in prop::collection::vec((any::<prop::sample::Index>(), mutation()), 1..4)) {
        let mut doc: Value = yaml_serde::from_str(EXAMPLE).unwrap();
        for (pick, m) in &picks {
            let mut all = Vec::new();
            paths(&doc, &mut Vec::new(), &mut all);
            let path = pick.get(&all).clone();
            mutate(&mut doc, &path, m);
        }
        check(&yaml_serde::to_string(&doc).unwrap())?;
    }
}
