//! Every default of the router config, in one place. The generated reference
//! (docs/reference/router-config-fields.md) shows them, and a test checks
//! each one it shows against what parsing a minimal config gives
//! (`tests::the_documented_defaults_are_the_defaults`).

use super::*;

/// Latency and cost policies: share of requests sent to a random fleet.
pub const EXPLORATION: f64 = 0.05;
/// Latency and cost policies: fleets this close to the best count as tied.
pub const TOLERANCE: f64 = 0.1;
/// Priority policy: a spilling fleet takes traffic first again below this.
pub const RESUME_BELOW: f64 = 0.8;

pub fn warmup_path() -> String {
    "/v1/chat/completions".into()
}

pub fn warmup_timeout_ms() -> u64 {
    super::WarmupConfig::DEFAULT_TIMEOUT_MS
}

pub fn redis_prefix() -> String {
    "fleetroute".into()
}

pub fn redis_slice_fraction() -> f64 {
    0.05
}

pub fn redis_timeout_ms() -> u64 {
    100
}

impl Default for TenantMetricsConfig {
    fn default() -> Self {
        TenantMetricsConfig {
            top: 20,
            pinned: Vec::new(),
        }
    }
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: None,
            stdout: false,
            max_bytes: 100 << 20,
            max_files: 5,
            buffer: 8192,
        }
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            priority_header: None,
            header_may_raise: false,
            max_wait_ms: 5000,
        }
    }
}

impl Default for StageAdmission {
    fn default() -> Self {
        StageAdmission {
            ttft_ms: ClassObjectives::default(),
            headroom: 0.5,
            queue: ClassQueues::default(),
            retry_after_s: 1,
        }
    }
}

impl Default for ClassQueues {
    fn default() -> Self {
        ClassQueues {
            critical: 64,
            standard: 64,
            sheddable: 0,
        }
    }
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig::Latency(ScoredRouting {
            exploration: EXPLORATION,
            tolerance: TOLERANCE,
        })
    }
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            path: None,
            interval_ms: 1000,
            timeout_ms: 500,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        }
    }
}

impl Default for EngineMetricsConfig {
    fn default() -> Self {
        EngineMetricsConfig {
            path: "/metrics".into(),
            interval_ms: 1000,
            timeout_ms: 500,
        }
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            min_ms: 10_000,
            max_ms: 600_000,
            decode_tokens_per_sec: 20.0,
            default_max_tokens: 4096,
        }
    }
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            redis_url: None,
            prefix: "fleetroute".into(),
            timeout_ms: 100,
            flush_ms: 25,
            max_pending: 8192,
            stream_max_len: 4096,
            max_batch_bytes: 16384,
            load_stale_ms: 1000,
        }
    }
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            removal_grace_ms: 30_000,
        }
    }
}

impl Default for ScalingConfig {
    fn default() -> Self {
        ScalingConfig {
            target_queue: 4.0,
            target_tokens_per_sec: None,
            scale_down_after_ms: 5_000,
        }
    }
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            max_inflight: 64,
            max_waiting: 8,
            max_kv_usage: 0.95,
            kv_cache_tokens: 1_000_000,
        }
    }
}

impl Default for ReplicaChoiceConfig {
    fn default() -> Self {
        ReplicaChoiceConfig {
            prefix_weight: 1.5,
            load_weight: 1.0,
            engine_queue_tokens: 512.0,
            tie_tokens: 1024.0,
            load_factor: 3.0,
            load_slack_tokens: 32768.0,
            share_factor: 1.1,
            share_slack: 2.0,
            share_wait_tokens: 32768.0,
            share_floor: 0.5,
        }
    }
}

impl Default for AlarmsConfig {
    fn default() -> Self {
        AlarmsConfig {
            ttft_p95_ms: None,
            error_rate: None,
            window_s: 60,
            min_samples: 20,
        }
    }
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            enabled: true,
            factor: 2.0,
            min_error_rate_gap: 0.1,
            min_latency_gap_ms: 5.0,
            max_error_rate: 0.5,
            window_s: 30,
            min_samples: 10,
            max_ejected_share: 0.5,
            base_ejection_s: 10,
            max_ejection_s: 300,
        }
    }
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig {
            request_headers_ms: 10_000,
            request_ms: 60_000,
            stream_idle_ms: 300_000,
            connection_idle_ms: 300_000,
            upstream_idle_ms: 60_000,
            response_ms: 600_000,
        }
    }
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            max_heap_bytes: 1 << 30,
            max_connections: 10_000,
        }
    }
}

impl Default for RetriesConfig {
    fn default() -> Self {
        RetriesConfig {
            budget_percent: 100.0,
            min_concurrency: 64,
        }
    }
}

impl Default for EnvoyOutlierConfig {
    fn default() -> Self {
        EnvoyOutlierConfig {
            consecutive_5xx: 5,
            consecutive_gateway_failure: 3,
            consecutive_local_origin_failure: 2,
            interval_ms: 1000,
            base_ejection_ms: 10_000,
            max_ejection_percent: 50,
        }
    }
}

#[cfg(test)]
mod tests {
    use yaml_serde::Value;

    use crate::config::RouterConfig;

    /// Only what a config must say; everything else comes from the defaults.
    /// One stage per policy family, so each policy's defaults show.
    const MINIMAL: &str = r#"
fleets:
  - { name: f, region: r, endpoints: ["10.0.0.1:8000"] }
  - { name: d, region: r, dns: { name: d.example, port: 80 } }
  - { name: k, region: r, kubernetes: { namespace: llm, service: k } }
stages:
  - name: p
    fleets: [f]
    routing: { policy: priority }
    warmup: { prompts: [{ body: { model: m } }] }
    admission: {}
  - { name: l, fleets: [f] }
"#;

    /// `(path, leaf)` pairs; list items that are maps share one path `[]`.
    fn flatten(v: &Value, path: &str, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    let k = k.as_str().expect("string keys");
                    let p = if path.is_empty() {
                        k.to_string()
                    } else {
                        format!("{path}.{k}")
                    };
                    flatten(v, &p, out);
                }
            }
            Value::Sequence(items) if items.iter().any(Value::is_mapping) => {
                for item in items {
                    flatten(item, &format!("{path}[]"), out);
                }
            }
            leaf => out.push((path.to_string(), leaf.clone())),
        }
    }

    fn same(a: &Value, b: &Value) -> bool {
        match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        }
    }

    /// `| `path` | value | ...` rows of the generated reference that show
    /// a default (`—`: required, or a section; `[]` items, `<name>` map keys
    /// and empty maps are left to the rows below them).
    fn documented() -> Vec<(String, Value)> {
        let page = include_str!("../../../docs/reference/router-config-fields.md");
        page.lines()
            .filter(|l| l.starts_with("| `"))
            .filter_map(|l| {
                let cells: Vec<&str> = l.split(" | ").map(str::trim).collect();
                let path = cells.first()?.strip_prefix("| `")?.strip_suffix('`')?;
                // `none` in backticks is the word, bare none is no value.
                let value = match *cells.get(1)? {
                    "—" => return None,
                    "none" => Value::Null,
                    t => yaml_serde::from_str(t.trim_matches('`')).expect("a YAML value"),
                };
                let empty_map = value.as_mapping().is_some_and(|m| m.is_empty());
                (!path.contains('<') && !empty_map).then(|| (path.to_string(), value))
            })
            .collect()
    }

    #[test]
    fn the_documented_defaults_are_the_defaults() {
        let cfg = RouterConfig::parse(MINIMAL).unwrap();
        let mut actual = Vec::new();
        flatten(&yaml_serde::to_value(&cfg).unwrap(), "", &mut actual);
        let mut given = Vec::new();
        flatten(&yaml_serde::from_str(MINIMAL).unwrap(), "", &mut given);
        let docs = documented();
        assert!(docs.len() > 40, "only {} rows read", docs.len());
        for (path, value) in &docs {
            // A field the serialized config leaves out when unset is none;
            // one the minimal config sets shows no default.
            let absent = value.is_null() && !actual.iter().any(|(p, _)| p == path);
            if given.iter().any(|(p, _)| p == path) {
                continue;
            }
            // A field of an optional section the minimal config leaves off.
            if let Some((section, _)) = path.rsplit_once('.') {
                let prefix = format!("{section}.");
                if !actual.iter().any(|(p, _)| p.starts_with(&prefix)) {
                    continue;
                }
            }
            assert!(
                absent || actual.iter().any(|(p, v)| p == path && same(v, value)),
                "docs/reference/router-config-fields.md says {path} defaults to {value:?}; the code: {:?}",
                actual.iter().filter(|(p, _)| p == path).collect::<Vec<_>>()
            );
        }
        for (path, value) in &actual {
            let set_by_config = given.iter().any(|(p, _)| p == path);
            let unset = value.is_null() || value.as_sequence().is_some_and(Vec::is_empty);
            if set_by_config || unset {
                continue;
            }
            assert!(
                docs.iter().any(|(p, _)| p == path),
                "{path} defaults to {value:?} but docs/reference/router-config-fields.md omits it"
            );
        }
    }
}
