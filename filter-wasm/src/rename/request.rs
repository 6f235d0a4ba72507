//! The served name into a request body: the value of the body's top-level
//! `model` is replaced, every other byte is kept as the client sent it. The
//! whole body is scanned (strings by substring search) so that only a JSON
//! object with exactly one top-level `model` string is changed; anything else
//! passes untouched and the fleet answers it as it would without the router.

use std::ops::Range;

use super::json::{Bad, skip_ws, string_end, value_end};
use super::{MAX_MODEL_VALUE, json_string};

/// Why a body was left as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untouched {
    NotAnObject,
    NoModel,
    /// `model` is there but not a string (or a string too long to be a name).
    NotAName,
    /// Two top-level `model` keys: which one an engine reads is its choice.
    Duplicate,
    Malformed,
    TooDeep,
}

impl From<Bad> for Untouched {
    fn from(b: Bad) -> Self {
        match b {
            Bad::Malformed => Untouched::Malformed,
            Bad::TooDeep => Untouched::TooDeep,
        }
    }
}

/// Where the top-level `model` string is (quotes included).
pub fn find_model(b: &[u8]) -> Result<Range<usize>, Untouched> {
    // After a byte order mark, as engines (and the extraction) read the body.
    let start = if b.starts_with(crate::extract::BOM) {
        crate::extract::BOM.len()
    } else {
        0
    };
    let mut i = skip_ws(b, start);
    if b.get(i) != Some(&b'{') {
        return Err(Untouched::NotAnObject);
    }
    i = skip_ws(b, i + 1);
    let mut found: Option<Result<Range<usize>, Untouched>> = None;
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            if b.get(i) != Some(&b'"') {
                return Err(Untouched::Malformed);
            }
            let key_end = string_end(b, i)?;
            let is_model = is_model_key(b.get(i..key_end).unwrap_or_default());
            i = skip_ws(b, key_end);
            if b.get(i) != Some(&b':') {
                return Err(Untouched::Malformed);
            }
            i = skip_ws(b, i + 1);
            let end = value_end(b, i)?;
            if is_model {
                if found.is_some() {
                    return Err(Untouched::Duplicate);
                }
                let name = b.get(i) == Some(&b'"') && end - i <= MAX_MODEL_VALUE;
                found = Some(if name {
                    Ok(i..end)
                } else {
                    Err(Untouched::NotAName)
                });
            }
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err(Untouched::Malformed),
            }
        }
    }
    if skip_ws(b, i) != b.len() {
        return Err(Untouched::Malformed);
    }
    found.unwrap_or(Err(Untouched::NoModel))
}

/// A key (quotes included) that reads `model`, escapes decoded as a JSON
/// parser would (the filter's first root read the model through one).
fn is_model_key(raw: &[u8]) -> bool {
    if raw == b"\"model\"" {
        return true;
    }
    // Six bytes per escaped character at most: a longer key is something else.
    raw.contains(&b'\\')
        && raw.len() <= 2 + 6 * 5
        && serde_json::from_slice::<String>(raw).is_ok_and(|k| k == "model")
}

/// Replaces the top-level `model` of `body` with `served`, in place; returns
/// the body's new length. The tail moves once; `body` grows only if it has
/// no spare capacity for a longer name.
pub fn rename(body: &mut Vec<u8>, served: &str) -> Result<usize, Untouched> {
    let at = find_model(body)?;
    body.splice(at, json_string(served));
    Ok(body.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn renamed(body: &str, to: &str) -> Result<String, Untouched> {
        let mut b = body.as_bytes().to_vec();
        rename(&mut b, to)?;
        Ok(String::from_utf8(b).unwrap())
    }

    #[test]
    fn only_the_top_level_model_changes() {
        let body = r#" {"messages":[{"role":"user","content":"say \"model\": \"x\""}],
            "model" : "m1", "metadata":{"model":"keep"},"max_tokens":3} "#;
        let out = renamed(body, "meta-llama/Llama-3.1-70B-Instruct").unwrap();
        assert_eq!(
            out,
            body.replace("\"m1\"", "\"meta-llama/Llama-3.1-70B-Instruct\"")
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["model"], "meta-llama/Llama-3.1-70B-Instruct");
        assert_eq!(v["metadata"]["model"], "keep");
    }

    #[test]
    fn a_byte_order_mark_is_kept_and_the_model_after_it_renamed() {
        let mut b = b"\xEF\xBB\xBF {\"model\":\"m1\"}".to_vec();
        rename(&mut b, "served").unwrap();
        assert_eq!(b, b"\xEF\xBB\xBF {\"model\":\"served\"}");
    }

    #[test]
    fn an_escaped_key_is_still_the_model_and_a_name_is_escaped() {
        let out = renamed(r#"{"mod\u0065l":"a"}"#, r#"we"ird\"#).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["model"], r#"we"ird\"#);
    }

    #[test]
    fn bodies_that_are_not_one_request_object_are_untouched() {
        for (body, why) in [
            (r#"["model","m"]"#, Untouched::NotAnObject),
            (r#"{"messages":[]}"#, Untouched::NoModel),
            (r#"{"model":7}"#, Untouched::NotAName),
            (r#"{"model":"a","model":"b"}"#, Untouched::Duplicate),
            (r#"{"model":"a","x":[1,2}"#, Untouched::Malformed),
            (r#"{"model":"a"} trailing"#, Untouched::Malformed),
            (r#"{"model":"a",}"#, Untouched::Malformed),
            (r#"{"model":"a""#, Untouched::Malformed),
            ("not json", Untouched::NotAnObject),
        ] {
            let mut b = body.as_bytes().to_vec();
            assert_eq!(rename(&mut b, "x"), Err(why), "{body}");
            assert_eq!(b, body.as_bytes(), "{body} changed");
        }
        let deep = format!(
            r#"{{"model":"a","x":{}{}}}"#,
            "[".repeat(300),
            "]".repeat(300)
        );
        assert_eq!(find_model(deep.as_bytes()), Err(Untouched::TooDeep));
        let long = format!(r#"{{"model":"{}"}}"#, "a".repeat(MAX_MODEL_VALUE));
        assert_eq!(find_model(long.as_bytes()), Err(Untouched::NotAName));
    }
}
