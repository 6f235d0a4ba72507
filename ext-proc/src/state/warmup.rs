//! Warmup: before a replica (re)joins, it must answer the stage's golden
//! prompts with status 200 and, where given, the expected output, so a request
//! gets the same model wherever it lands.

use std::time::Duration;

use crate::config::WarmupConfig;
use crate::topology::Fleet;

/// The replica a warmup runs against.
pub struct Target<'a> {
    pub addr: &'a str,
    /// The name its fleet serves the stage's model under, if its own: the
    /// golden prompts' `model` is replaced by it, as the filter renames
    /// routed requests.
    pub served: Option<&'a str>,
    pub fleet: &'a Fleet,
}

/// Runs every golden prompt against one replica; `Err` says which failed.
pub async fn check(
    client: &reqwest::Client,
    to: &Target<'_>,
    cfg: &WarmupConfig,
) -> Result<(), String> {
    let url = format!("http://{}{}", to.addr, cfg.path);
    for (i, g) in cfg.prompts.iter().enumerate() {
        let mut body = g.body.clone();
        if let (Some(name), Some(obj)) = (to.served, body.as_object_mut()) {
            obj.insert("model".into(), name.into());
        }
        let req = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(Duration::from_millis(cfg.timeout_ms));
        let resp = super::health::with_key(req, to.fleet)
            .send()
            .await
            .map_err(|e| format!("golden prompt {i}: {e}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("golden prompt {i}: {e}"))?;
        if !status.is_success() {
            return Err(format!("golden prompt {i}: status {status}"));
        }
        if let Some(expect) = &g.expect {
            let out = answer_text(&text);
            if !out.contains(expect.as_str()) {
                return Err(format!(
                    "golden prompt {i}: answer {out:?} does not contain {expect:?}"
                ));
            }
        }
    }
    Ok(())
}

/// Largest answer a probe reads.
const MAX_PROBE_BODY: usize = 256 << 10;

/// A replica back from an ejection, in a stage without golden prompts, must
/// still serve before it takes traffic again: one short streamed chat
/// completion for `model` that answers 200 and ends with `[DONE]` (a replica
/// that breaks its streams fails it, where `/health` would pass).
pub async fn probe(
    client: &reqwest::Client,
    to: &Target<'_>,
    model: &str,
    timeout: Duration,
) -> Result<(), String> {
    let body = serde_json::json!({
        "model": to.served.unwrap_or(model),
        "messages": [{ "role": "user", "content": "Say OK." }],
        "max_tokens": 16,
        "stream": true,
    });
    let req = client
        .post(format!("http://{}/v1/chat/completions", to.addr))
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(timeout);
    let mut resp = super::health::with_key(req, to.fleet)
        .send()
        .await
        .map_err(|e| format!("probe: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("probe: status {}", resp.status()));
    }
    let mut seen = Vec::new();
    while let Some(piece) = resp.chunk().await.map_err(|e| format!("probe: {e}"))? {
        seen.extend_from_slice(&piece);
        if seen.len() > MAX_PROBE_BODY {
            return Err("probe: the answer is too long".into());
        }
    }
    if !seen.windows(6).any(|w| w == b"[DONE]") {
        return Err("probe: the stream ended without [DONE]".into());
    }
    Ok(())
}

/// The generated text of a chat or completions response.
fn answer_text(body: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return String::new();
    };
    let choice = &v["choices"][0];
    choice["message"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_text_of_both_apis() {
        assert_eq!(
            answer_text(r#"{"choices":[{"message":{"content":"hi"}}]}"#),
            "hi"
        );
        assert_eq!(answer_text(r#"{"choices":[{"text":"yo"}]}"#), "yo");
        assert_eq!(answer_text("nope"), "");
    }
}
