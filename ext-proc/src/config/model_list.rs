//! What clients may ask for, as `GET /v1/models` answers it (OpenAI's list
//! shape): every stage's model names and aliases, then the stage's own name,
//! then its LoRA adapters (with `parent`, as vLLM lists them), in config
//! order. Built once per config: by the topology for ext-proc's answer, and
//! by `fleetroute bootstrap` for Envoy's answer while fleetroute is
//! unreachable, so both say the same.

use std::collections::HashSet;

use serde_json::json;

use super::RouterConfig;

/// Who `owned_by` names in the list.
pub const OWNER: &str = "fleetroute";

/// The names, each once, with the model an adapter belongs to.
pub fn names(cfg: &RouterConfig) -> Vec<(&str, Option<&str>)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for s in &cfg.stages {
        let base = s.models.first().unwrap_or(&s.name).as_str();
        let models = s.models.iter().chain([&s.name]).map(|n| (n, None));
        let adapters = s.adapters.iter().map(|n| (n, Some(base)));
        for (n, parent) in models.chain(adapters) {
            if seen.insert(n.as_str()) {
                out.push((n.as_str(), parent));
            }
        }
    }
    out
}

/// The response body.
pub fn body(cfg: &RouterConfig) -> String {
    let data: Vec<serde_json::Value> = names(cfg)
        .into_iter()
        .map(|(id, parent)| {
            let mut m = json!({ "id": id, "object": "model", "created": 0, "owned_by": OWNER });
            if let Some(p) = parent {
                m["parent"] = json!(p);
            }
            m
        })
        .collect();
    json!({ "object": "list", "data": data }).to_string()
}
