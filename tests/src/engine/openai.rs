//! OpenAI wire shapes: what the engine reads from a request, the bodies and SSE
//! events it answers with, and its error JSON.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Largest completion a request may ask for, so one request cannot make the
/// engine build an arbitrarily large answer.
pub const MAX_COMPLETION_TOKENS: u64 = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// How response ids start, as in OpenAI's.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        }
    }
}

/// The request fields the engine acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`, as the client sent it.
    pub max_tokens: Option<u64>,
    /// The canonical prompt text, as the router hashes it.
    pub canonical: Vec<u8>,
}

#[derive(Deserialize)]
struct Raw {
    model: Option<String>,
    messages: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

impl Params {
    pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Params, ApiError> {
        // As vLLM and llama.cpp read a body: a leading byte order mark is skipped.
        let body = fleetroute_filter::extract::without_bom(body);
        let raw: Raw = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
        let (field, present) = match endpoint {
            Endpoint::Chat => ("messages", raw.messages.is_some()),
            Endpoint::Completions => ("prompt", raw.prompt.is_some()),
        };
        if !present {
            return Err(ApiError::bad_request(format!("'{field}' is required")));
        }
        let canonical = fleetroute_filter::extract::canonical_text(body)
            .ok_or_else(|| ApiError::bad_request(format!("'{field}' has the wrong shape")))?;
        let model = raw
            .model
            .ok_or_else(|| ApiError::bad_request("'model' is required".into()))?;
        let max_tokens = raw.max_completion_tokens.or(raw.max_tokens);
        if max_tokens.is_some_and(|m| m > MAX_COMPLETION_TOKENS) {
            return Err(ApiError::bad_request(format!(
                "max_tokens must be at most {MAX_COMPLETION_TOKENS}"
            )));
        }
        Ok(Params {
            model,
            stream: raw.stream.unwrap_or(false),
            include_usage: raw
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            max_tokens,
            canonical,
        })
    }
}

/// An OpenAI error: `{"error": {"message", "type", "code"}}` with a status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: &'static str,
}

impl ApiError {
    pub fn bad_request(message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
            kind: "invalid_request_error",
            code: "bad_request",
        }
    }

    pub fn unknown_model(model: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model '{model}' does not exist"),
            kind: "invalid_request_error",
            code: "model_not_found",
        }
    }

    /// A missing or wrong API key, as OpenAI's API answers it.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "incorrect API key provided".into(),
            kind: "invalid_request_error",
            code: "invalid_api_key",
        }
    }

    /// The answer of a replica told to fail with `status`.
    pub fn injected(status: u16) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        ApiError {
            status,
            message: format!("replica is failing with {status} (injected fault)"),
            kind: if status.is_server_error() {
                "server_error"
            } else {
                "invalid_request_error"
            },
            code: "injected_fault",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        (self.status, Json(body)).into_response()
    }
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

impl Usage {
    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// Builds the bodies of one answer; every chunk of a stream shares id and time.
pub struct Reply {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A non-streaming answer.
    pub fn full(&self, text: &str, finish_reason: &str, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
            Endpoint::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = usage.json();
        v
    }

    /// The SSE event of token `index`; the last one carries the finish reason.
    pub fn chunk(&self, index: u64, token: &str, finish_reason: Option<&str>) -> Bytes {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = if index == 0 {
                    json!({"role": "assistant", "content": token})
                } else {
                    json!({"content": token})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": token, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        sse(&self.envelope(true, json!([choice])))
    }

    /// The closing SSE event of `stream_options.include_usage`.
    pub fn usage_chunk(&self, usage: Usage) -> Bytes {
        let mut v = self.envelope(true, json!([]));
        v["usage"] = usage.json();
        sse(&v)
    }
}

/// One SSE event carrying `value`.
pub fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

const WORDS: [&str; 32] = [
    "fleet", "route", "cache", "prefix", "token", "batch", "queue", "stage", "replica", "envoy",
    "block", "hash", "model", "prompt", "stream", "chunk", "warm", "cold", "lane", "shard", "pool",
    "drain", "probe", "pulse", "tide", "orbit", "signal", "harbor", "beacon", "vector", "lattice",
    "ember",
];

/// The deterministic output of a (model, prompt): the same at every replica.
pub struct Output {
    seed: u64,
}

impl Output {
    pub fn new(model: &str, canonical: &[u8]) -> Self {
        Output {
            seed: xxh3_64_with_seed(canonical, xxh3_64(model.as_bytes())),
        }
    }

    /// Token `i`'s text: a word, space-separated from the one before.
    pub fn token(&self, i: u64) -> String {
        let word =
            WORDS[(splitmix(self.seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 32) as usize];
        if i == 0 {
            word.to_string()
        } else {
            format!(" {word}")
        }
    }

    pub fn text(&self, tokens: u64) -> String {
        (0..tokens).map(|i| self.token(i)).collect()
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_follow_the_openai_rules() {
        let p = Params::parse(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(
            (p.model.as_str(), p.max_tokens, p.stream, p.include_usage),
            ("m", Some(5), true, true)
        );
        assert!(!p.canonical.is_empty());
        let c = Params::parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":["a","b"]}"#,
        )
        .unwrap();
        assert_eq!((c.max_tokens, c.stream), (None, false));
        for (ep, body) in [
            (Endpoint::Chat, &b"{"[..]),
            (Endpoint::Chat, br#"{"model":"m","prompt":"x"}"#),
            (Endpoint::Completions, br#"{"model":"m","messages":[]}"#),
            (Endpoint::Chat, br#"{"model":"m","messages":7}"#),
            (Endpoint::Chat, br#"{"messages":[]}"#),
            (
                Endpoint::Completions,
                br#"{"model":"m","prompt":"x","max_tokens":-1}"#,
            ),
            (
                Endpoint::Completions,
                br#"{"model":"m","prompt":"x","max_tokens":100000000}"#,
            ),
        ] {
            let e = Params::parse(ep, body).unwrap_err();
            assert_eq!(
                e.status,
                StatusCode::BAD_REQUEST,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn output_is_deterministic_per_model_and_prompt() {
        let a = Output::new("m", b"prompt").text(8);
        assert_eq!(a, Output::new("m", b"prompt").text(8));
        assert_ne!(a, Output::new("m2", b"prompt").text(8));
        assert_eq!(a.split(' ').count(), 8);
        assert!(Output::new("m", b"prompt").text(0).is_empty());
    }

    #[test]
    fn shapes() {
        let r = Reply {
            endpoint: Endpoint::Chat,
            id: "x".into(),
            created: 1,
            model: "m".into(),
        };
        let u = Usage {
            prompt_tokens: 4,
            completion_tokens: 2,
            cached_tokens: 0,
        };
        let full = r.full("a b", "length", u);
        assert_eq!(full["choices"][0]["message"]["content"], "a b");
        assert_eq!(full["usage"]["total_tokens"], 6);
        let chunk = r.chunk(0, "a", None);
        assert!(chunk.starts_with(b"data: {") && chunk.ends_with(b"}\n\n"));
        let v: Value = serde_json::from_slice(&chunk[6..]).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        let v: Value = serde_json::from_slice(&r.usage_chunk(u)[6..]).unwrap();
        assert_eq!(
            (
                v["choices"].as_array().unwrap().len(),
                &v["usage"]["prompt_tokens_details"]["cached_tokens"]
            ),
            (0, &json!(0))
        );
    }
}
