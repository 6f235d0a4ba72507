//! What clients may ask for, as `GET /v1/models` answers it (OpenAI's list
//! shape): every stage's model names and aliases, then the stage's own name,
//! in config order. Built once per config: by the topology for ext-proc's
//! answer, and by `fleetroute bootstrap` for Envoy's answer while fleetroute
//! is unreachable, so both say the same.

use serde_json::json;

use super::RouterConfig;

/// Who `owned_by` names in the list.
pub const OWNER: &str = "fleetroute";

/// The names, each once.
pub fn names(cfg: &RouterConfig) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for s in &cfg.stages {
        for n in s.models.iter().chain([&s.name]) {
            if !out.contains(&n.as_str()) {
                out.push(n);
            }
        }
    }
    out
}

/// The response body.
pub fn body(cfg: &RouterConfig) -> String {
    let data: Vec<serde_json::Value> = names(cfg)
        .into_iter()
        .map(|id| json!({ "id": id, "object": "model", "created": 0, "owned_by": OWNER }))
        .collect();
    json!({ "object": "list", "data": data }).to_string()
}
