//! Everything routing needs from a request body, extracted in one pass.

pub mod key;
pub mod model;
pub mod prefix;
pub mod request;
pub mod tenant;

#[cfg(test)]
mod memory_tests;

use crate::config::{BYTES_PER_TOKEN, FilterConfig};
use crate::contract::{self, KeySource, ParseStatus};
use request::{Request, TopLevel};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extraction {
    pub status: ParseStatus,
    pub model: Option<String>,
    pub key: Option<(u64, KeySource)>,
    pub blocks: Vec<u64>,
    /// Of `blocks`, how many end before the first user message.
    pub opening_blocks: usize,
    /// The chat holds a reply: it continues a conversation.
    pub continues: bool,
    pub prompt_tokens: u64,
    pub max_tokens: Option<u64>,
    pub stream: bool,
}

impl Extraction {
    fn empty(status: ParseStatus, model: Option<String>) -> Self {
        Extraction {
            status,
            model,
            key: None,
            blocks: Vec::new(),
            opening_blocks: 0,
            continues: false,
            prompt_tokens: 0,
            max_tokens: None,
            stream: false,
        }
    }

    /// The route headers this extraction writes, in the contract's encoding.
    pub fn headers(&self, cfg: &FilterConfig) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        if let Some(m) = &self.model {
            h.push((contract::MODEL, m.clone()));
        }
        if let Some((k, source)) = self.key {
            h.push((contract::KEY, contract::encode_u64(k)));
            h.push((contract::KEY_SOURCE, source.as_str().to_string()));
        }
        if self.status == ParseStatus::Ok {
            h.push((contract::BLOCKS, contract::encode_blocks(&self.blocks)));
            h.push((contract::BLOCK_TOKENS, cfg.block_tokens().to_string()));
            h.push((contract::PROMPT_TOKENS, self.prompt_tokens.to_string()));
            h.push((
                contract::STREAM,
                if self.stream { "1" } else { "0" }.to_string(),
            ));
            if self.opening_blocks > 0 {
                h.push((contract::OPENING_BLOCKS, self.opening_blocks.to_string()));
            }
            if self.continues {
                h.push((contract::CONTINUES, "1".to_string()));
            }
            if let Some(m) = self.max_tokens {
                h.push((contract::MAX_TOKENS, m.to_string()));
            }
        }
        h
    }
}

/// A UTF-8 byte order mark: engines skip it (Python's `json.loads` on bytes,
/// nlohmann's parser in llama.cpp), so the filter reads what follows it.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The body as engines read it: without a leading byte order mark.
pub fn without_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(BOM).unwrap_or(body)
}

/// Reads a whole request body. Never fails: a body it cannot read yields an
/// extraction whose status says how far it got.
pub fn extract(body: &[u8], cfg: &FilterConfig) -> Extraction {
    let body = without_bom(body);
    // serde_json skips unread strings without checking them; a body that is not
    // UTF-8 is not JSON, whichever field holds the bad bytes.
    if std::str::from_utf8(body).is_err() {
        return Extraction::empty(ParseStatus::NotJson, None);
    }
    // A request is a JSON object. serde also reads a struct from an array,
    // field by field in order, which would find a model in `["m"]`.
    if !is_object(body) {
        return Extraction::empty(not_read(body), None);
    }
    let req: Request<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) if is_duplicate(&e) => return Extraction::empty(ParseStatus::DuplicateKey, None),
        Err(_) => {
            // Wrong shape is still worth its model, so the stage can be found.
            let m = match serde_json::from_slice::<TopLevel<'_>>(body) {
                Ok(top) => top
                    .model
                    .and_then(|m| m.0)
                    .as_deref()
                    .and_then(model::model),
                Err(e) if is_duplicate(&e) => {
                    return Extraction::empty(ParseStatus::DuplicateKey, None);
                }
                Err(_) => None,
            };
            let status = not_read(body);
            let m = m.filter(|_| status == ParseStatus::BadShape);
            return Extraction::empty(status, m);
        }
    };
    let canonical = canonical(&req);
    let blocks = prefix::block_hashes(canonical, cfg.block_bytes, cfg.max_blocks);
    Extraction {
        status: ParseStatus::Ok,
        model: req.model.as_deref().and_then(model::model),
        key: key::sampling_key(&req, canonical, cfg.block_bytes),
        opening_blocks: opening_blocks(&req, cfg.block_bytes).min(blocks.len()),
        continues: req.messages.as_ref().is_some_and(|m| m.answered),
        blocks,
        prompt_tokens: canonical.len().div_ceil(BYTES_PER_TOKEN) as u64,
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        stream: req.stream.unwrap_or(false),
    }
}

/// Why a body whose fields could not be read was not read: valid JSON of
/// another shape, or not JSON at all. Valid means strictly so (numbers in
/// range, escapes that make text): such a body is routed on its model
/// alone, so it must be one that every reader reads the same.
fn not_read(body: &[u8]) -> ParseStatus {
    match serde_json::from_slice::<request::Strict>(body) {
        Ok(_) => ParseStatus::BadShape,
        Err(_) => ParseStatus::NotJson,
    }
}

/// A key of a struct the filter reads, twice in one object. serde's derive
/// reports it as a data error with this wording (pinned by a test), the only
/// error of that kind whose message starts so.
fn is_duplicate(e: &serde_json::Error) -> bool {
    e.is_data() && e.to_string().starts_with("duplicate field `")
}

/// The canonical prompt text of a body (chat or completions), as the filter
/// hashes it; `None` when the body is not a request of the expected shape.
/// Engines that model a prefix cache use this to agree with the router.
pub fn canonical_text(body: &[u8]) -> Option<Vec<u8>> {
    let body = without_bom(body);
    if !is_object(body) {
        return None;
    }
    let req: Request<'_> = serde_json::from_slice(body).ok()?;
    Some(canonical(&req).to_vec())
}

/// Full blocks that end before the first user message starts; none for a
/// completions prompt or a chat without a user message.
fn opening_blocks(req: &Request<'_>, block_bytes: usize) -> usize {
    req.messages
        .as_ref()
        .and_then(|m| m.first_user.as_ref())
        .map_or(0, |user| user.start / block_bytes.max(1))
}

fn is_object(body: &[u8]) -> bool {
    body.trim_ascii_start().first() == Some(&b'{')
}

/// The prompt text that is hashed: the chat messages, else the completions prompt.
fn canonical<'r>(req: &'r Request<'_>) -> &'r [u8] {
    match (&req.messages, &req.prompt) {
        (Some(m), _) => &m.text,
        (None, Some(p)) => &p.0,
        (None, None) => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// The canonical text by its definition, from a generic JSON tree.
    fn reference_canonical(v: &Value) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(ms) = v.get("messages").filter(|m| !m.is_null()) {
            for m in ms.as_array()? {
                out.extend_from_slice(m.get("role")?.as_str()?.as_bytes());
                out.push(prefix::ROLE_END);
                match m.get("content") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(t)) => out.extend_from_slice(t.as_bytes()),
                    Some(Value::Array(parts)) => {
                        for p in parts {
                            let kind = p.get("type")?.as_str()?;
                            let text = match p.get("text") {
                                None | Some(Value::Null) => kind,
                                Some(t) => t.as_str()?,
                            };
                            out.extend_from_slice(text.as_bytes());
                            out.push(b'\n');
                        }
                    }
                    Some(_) => return None,
                }
                out.push(prefix::ITEM_END);
            }
        } else if let Some(p) = v.get("prompt").filter(|p| !p.is_null()) {
            match p {
                Value::String(t) => out.extend_from_slice(t.as_bytes()),
                Value::Array(items) => {
                    for t in items {
                        out.extend_from_slice(t.as_str()?.as_bytes());
                        out.push(prefix::ITEM_END);
                    }
                }
                _ => return None,
            }
        }
        Some(out)
    }

    fn text() -> impl Strategy<Value = String> {
        "[a-z \"\\\n\u{e9}\u{1f600}]{0,40}"
    }

    fn content() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(Value::from),
            Just(Value::Null),
            proptest::collection::vec(
                (text(), proptest::option::of(text())).prop_map(|(k, t)| match t {
                    Some(t) => json!({"type": k, "text": t}),
                    None => json!({"type": k, "image_url": {"url": "x"}}),
                }),
                0..4
            )
            .prop_map(Value::from),
            Just(json!(7)),
        ]
    }

    fn body() -> impl Strategy<Value = Value> {
        let message = (
            prop_oneof![
                Just("system"),
                Just("user"),
                Just("assistant"),
                Just("tool")
            ],
            content(),
        )
            .prop_map(|(r, c)| json!({"content": c, "role": r, "name": "n"}));
        prop_oneof![
            proptest::collection::vec(message, 0..6)
                .prop_map(|ms| json!({"model": "m", "messages": ms, "tools": [{"a": [1, 2]}]})),
            text().prop_map(|p| json!({"prompt": p, "model": "m"})),
            proptest::collection::vec(text(), 0..5).prop_map(|ps| json!({"prompt": ps})),
            Just(json!({"prompt": [1, 2, 3]})),
            Just(json!({"messages": null, "prompt": "p"})),
        ]
    }

    proptest! {
        /// The streaming parse yields exactly the canonical text its definition gives.
        #[test]
        fn canonical_text_matches_its_definition(v in body()) {
            let bytes = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(canonical_text(&bytes), reference_canonical(&v));
        }
    }

    fn cfg() -> FilterConfig {
        FilterConfig {
            block_bytes: 16,
            ..FilterConfig::default()
        }
    }

    fn chat(turns: &[(&str, &str)], extra: &str) -> Vec<u8> {
        let msgs: Vec<String> = turns
            .iter()
            .map(|(r, c)| format!(r#"{{"role":"{r}","content":"{c}"}}"#))
            .collect();
        format!(r#"{{"model":"m1","messages":[{}]{extra}}}"#, msgs.join(",")).into_bytes()
    }

    #[test]
    fn key_precedence() {
        let c = cfg();
        let base = chat(&[("user", "hello there")], "");
        let by_content = extract(&base, &c);
        assert_eq!(by_content.key.unwrap().1, KeySource::Content);
        let by_user = extract(&chat(&[("user", "hello there")], r#","user":"u1""#), &c);
        assert_eq!(by_user.key.unwrap().1, KeySource::User);
        let by_pck = extract(
            &chat(
                &[("user", "hello there")],
                r#","user":"u1","prompt_cache_key":"k""#,
            ),
            &c,
        );
        assert_eq!(by_pck.key.unwrap().1, KeySource::PromptCacheKey);
        assert_ne!(by_user.key, by_pck.key);
    }

    #[test]
    fn turns_of_a_conversation_share_key_and_prefix() {
        let c = cfg();
        let t1 = extract(
            &chat(
                &[
                    ("system", "be brief and exact"),
                    ("user", "what is a fleet?"),
                ],
                "",
            ),
            &c,
        );
        let t2 = extract(
            &chat(
                &[
                    ("system", "be brief and exact"),
                    ("user", "what is a fleet?"),
                    ("assistant", "a set of replicas"),
                    ("user", "and a stage?"),
                ],
                "",
            ),
            &c,
        );
        assert_eq!(t1.key, t2.key);
        // "system" ROLE_END "be brief and exact" ITEM_END: 26 bytes, one
        // full 16-byte block before the first user message.
        assert_eq!((t1.opening_blocks, t2.opening_blocks), (1, 1));
        assert!(!t1.blocks.is_empty());
        assert_eq!(t1.blocks[..], t2.blocks[..t1.blocks.len()]);
        assert!(t2.blocks.len() > t1.blocks.len());
        assert!(t2.prompt_tokens > t1.prompt_tokens);
        // Only the second turn holds a reply, and says so.
        assert_eq!((t1.continues, t2.continues), (false, true));
        let continues = |e: &Extraction| {
            e.headers(&c)
                .iter()
                .any(|(h, v)| *h == contract::CONTINUES && v == "1")
        };
        assert!(!continues(&t1) && continues(&t2));
    }

    #[test]
    fn fields_are_extracted() {
        let body = br#"{"model":"ds-flash","prompt":"abcdefghijklmnopqrstuvwxyz0123456789","max_tokens":7,"stream":true}"#;
        let e = extract(body, &cfg());
        assert_eq!(e.status, ParseStatus::Ok);
        assert_eq!(e.model.as_deref(), Some("ds-flash"));
        assert_eq!(e.blocks.len(), 2);
        assert_eq!(e.max_tokens, Some(7));
        assert!(e.stream);
        assert_eq!(e.prompt_tokens, 9);
        assert_eq!(e.opening_blocks, 0, "a completions prompt has no opening");
        assert!(!e.continues, "a completions prompt continues nothing known");
        let parts = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        assert_eq!(extract(parts, &cfg()).status, ParseStatus::Ok);
    }

    #[test]
    fn a_key_read_twice_is_a_duplicate_wherever_it_is() {
        let c = cfg();
        for body in [
            r#"{"model":"cheap","model":"premium"}"#,
            r#"{"model":"cheap","messages":[{"role":"user","content":"hi"}],"model":"premium"}"#,
            r#"{"model":"m","mod\u0065l":"n"}"#,
            r#"{"model":"m","max_tokens":1,"max_tokens":9000}"#,
            r#"{"model":"m","stream":false,"stream":true}"#,
            r#"{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","role":"system","content":"a"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
            r#"{"model":"m","messages":7,"model":"n"}"#,
        ] {
            let e = extract(body.as_bytes(), &c);
            assert_eq!(e.status, ParseStatus::DuplicateKey, "{body}");
            assert!(e.headers(&c).is_empty(), "{body}");
        }
        // Keys the filter skips may repeat: the engine's reading of them is
        // none of routing's business.
        let e = extract(br#"{"model":"m","temperature":0,"temperature":1}"#, &c);
        assert_eq!(e.status, ParseStatus::Ok);
    }

    #[test]
    fn a_byte_order_mark_is_skipped_as_engines_skip_it() {
        let c = cfg();
        let body = br#"{"model":"m1","prompt":"hello","max_tokens":3}"#;
        let with_bom = [BOM, &body[..]].concat();
        assert_eq!(extract(&with_bom, &c), extract(body, &c));
        assert_eq!(extract(&with_bom, &c).status, ParseStatus::Ok);
        assert_eq!(canonical_text(&with_bom), canonical_text(body));
        // Only one, only at the start.
        assert_eq!(
            extract(&[BOM, BOM, &body[..]].concat(), &c).status,
            ParseStatus::NotJson
        );
    }

    #[test]
    fn unreadable_bodies_degrade() {
        let c = cfg();
        assert_eq!(extract(b"not json", &c).status, ParseStatus::NotJson);
        assert_eq!(
            extract(b"{\"model\":\"m\xff\"}", &c).status,
            ParseStatus::NotJson
        );
        let bad = extract(br#"{"model":"m1","messages":7}"#, &c);
        assert_eq!(
            (bad.status, bad.model.as_deref()),
            (ParseStatus::BadShape, Some("m1"))
        );
        assert_eq!(
            bad.headers(&c),
            vec![(contract::MODEL, "m1".to_string())],
            "only the model"
        );
        assert_eq!(extract(b"[1,2]", &c).status, ParseStatus::BadShape);
        let array = extract(br#"["m1", [{"role": "user", "content": "hi"}]]"#, &c);
        assert_eq!((array.status, array.model), (ParseStatus::BadShape, None));
    }
}
