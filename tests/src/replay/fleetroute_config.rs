//! The router configs the replays use.

use fleetroute::config::{RouterConfig, ValidConfig};

/// The router config the replay uses: one fleet of `replicas`; the stage's
/// `replica_choice` and `outlier` blocks given as YAML (empty for defaults).
pub fn config(
    replicas: usize,
    cache_tokens: u64,
    max_batch: usize,
    replica_choice: &str,
    outlier: &str,
) -> ValidConfig {
    let mut rc = String::new();
    if !replica_choice.is_empty() {
        rc += &format!("    replica_choice: {replica_choice}\n");
    }
    if !outlier.is_empty() {
        rc += &format!("    outlier: {outlier}\n");
    }
    config_with(replicas, cache_tokens, max_batch, &rc, "")
}

/// The same fleet and stage, with `stage` lines added to the stage (each
/// indented by four spaces) and `top` sections before `fleets:`.
pub fn config_with(
    replicas: usize,
    cache_tokens: u64,
    max_batch: usize,
    stage: &str,
    top: &str,
) -> ValidConfig {
    let eps: Vec<String> = (0..replicas)
        .map(|r| format!("\"10.0.0.{}:8000\"", r + 1))
        .collect();
    let yaml = format!(
        "{top}fleets:\n  - name: pool\n    region: r\n    endpoints: [{}]\n    capacity: {{ max_inflight: {max_batch}, kv_cache_tokens: {cache_tokens} }}\n\
         stages:\n  - name: trace\n    models: [trace]\n    fleets: [pool]\n{stage}",
        eps.join(", ")
    );
    RouterConfig::parse_valid(&yaml).unwrap_or_else(|e| panic!("replay config: {e}"))
}
