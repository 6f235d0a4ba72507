//! Warmup: before a replica (re)joins, it must answer the stage's golden
//! prompts with status 200 and, where given, the expected output, so a request
//! gets the same model wherever it lands.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::{http_client, with_key};
use crate::config::WarmupConfig;
use crate::state::health::Health;
use crate::state::{Event, Shared};
use crate::topology::{Fleet, FleetId};

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
        let resp = with_key(req, to.fleet)
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
    let mut resp = with_key(req, to.fleet)
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

/// Runs the golden prompts of every stage a fleet serves against its healthy
/// replicas that have not passed warmup yet. A task of its own, so a slow or
/// hanging replica under warmup never delays anyone's health checks.
pub async fn run_warmups(shared: Arc<Shared>) {
    let client = http_client();
    loop {
        let snap = shared.snapshot_full();
        let mut warmups = Vec::new();
        for (f, fleet) in snap.topo.fleets.iter().enumerate() {
            let f = FleetId(f);
            for (r, replica) in fleet.replicas.iter() {
                let st = snap.replicas[f][r];
                if st.health != Health::Healthy || st.warm || st.leaving {
                    continue;
                }
                // Each stage's prompts under the name this fleet serves its
                // model by; without any, a short probe (a replica back from
                // an ejection must serve before it rejoins).
                let stages: Vec<_> = snap
                    .topo
                    .stages_of(f)
                    .filter_map(|s| Some((s.warmup.clone()?, s.served_as(f).map(str::to_string))))
                    .collect();
                let probe = snap
                    .topo
                    .stages_of(f)
                    .next()
                    .map(|s| (s.model.clone(), s.served_as(f).map(str::to_string)));
                let client = &client;
                let addr = replica.addr.clone();
                let name = fleet.name.clone();
                warmups.push(async move {
                    let mut result = Ok(());
                    for (w, served) in &stages {
                        let to = Target {
                            addr: &addr,
                            served: served.as_deref(),
                            fleet,
                        };
                        result = check(client, &to, w).await;
                        if result.is_err() {
                            break;
                        }
                    }
                    if let (true, Some((model, served))) = (stages.is_empty(), &probe) {
                        let to = Target {
                            addr: &addr,
                            served: served.as_deref(),
                            fleet,
                        };
                        let bound = Duration::from_millis(crate::config::WarmupConfig::DEFAULT_TIMEOUT_MS);
                        result = self::probe(client, &to, model, bound).await;
                    }
                    if let Err(e) = &result {
                        tracing::warn!(fleet = %name, replica = %addr, "warmup failed, replica stays out: {e}");
                    }
                    (f, r, result.is_ok())
                });
            }
        }
        for (fleet, replica, ok) in join_all(warmups).await {
            let generation = snap.topo.generation;
            let _ = shared
                .events()
                .send(Event::Warmup {
                    generation,
                    fleet,
                    replica,
                    ok,
                })
                .await;
        }
        tokio::time::sleep(Duration::from_millis(snap.topo.health_check.interval_ms)).await;
    }
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
