use crate::config::RouterConfig;

const GOOD: &str = r#"
fleets:
  - name: gb200-rack
    region: us
    endpoints: ["10.0.0.11:8000", "10.0.0.12:8000"]
    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8 }
  - name: h200-burst
    region: us
    endpoints: ["10.1.0.21:8000"]
    cost: { gpu_hour_usd: 4.2, gpus_per_replica: 8 }
    hosts: { min: 0, max: 4 }
  - name: eu-pool
    region: eu
    endpoints: ["10.2.0.1:8000"]
stages:
  - name: ds-flash/prod-us
    models: [ds-flash]
    fleets: [gb200-rack, h200-burst]
    residency: us
    replicas: { min: 2, max: 6 }
    routing: { policy: priority, order: [gb200-rack, h200-burst] }
"#;

fn errors(yaml: &str) -> Vec<String> {
    match RouterConfig::parse(yaml) {
        Ok(_) => vec![],
        Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn the_design_example_is_valid() {
    assert_eq!(errors(GOOD), Vec::<String>::new());
}

#[test]
#[allow(clippy::too_many_lines)] // a table of cases, one per line
fn errors_name_the_field_path() {
    let cases = [
        (
            GOOD.replace("order: [gb200-rack, h200-burst]", "order: [h200-bust]"),
            "stages[0].routing.order[0]: unknown fleet 'h200-bust'",
        ),
        (
            GOOD.replace(
                "fleets: [gb200-rack, h200-burst]",
                "fleets: [gb200-rack, eu-pool]",
            ),
            "stages[0].fleets[1]: fleet 'eu-pool' is in region 'eu', outside the stage's residency [us]",
        ),
        (
            GOOD.replace("\"10.1.0.21:8000\"", "\"burst-1:8000\""),
            "fleets[1].endpoints[0]: 'burst-1:8000' is not ip:port",
        ),
        (
            GOOD.replace("policy: priority", "policy: weighted"),
            "stages[0].routing: order is not a field of policy weighted (only of priority) at line 21 column 14",
        ),
        (
            GOOD.replace(
                "routing: { policy: priority, order: [gb200-rack, h200-burst] }",
                "routing: { policy: weighted, weights: { gb200-rack: -1 } }",
            ),
            "stages[0].routing.weights.gb200-rack: weight -1 must be finite and >= 0",
        ),
        (
            GOOD.replace(
                "routing: { policy: priority, order: [gb200-rack, h200-burst] }",
                "routing: { policy: weighted, weights: { gb200-rack: .nan } }",
            ),
            "stages[0].routing.weights.gb200-rack: weight NaN must be finite and >= 0",
        ),
        (
            GOOD.replace(
                "routing: { policy: priority, order: [gb200-rack, h200-burst] }",
                "routing:\n      policy: latency\n      weights: { gb200-rack: 2 }",
            ),
            "stages[0].routing: weights is not a field of policy latency (only of weighted) at line 22 column 7",
        ),
        (
            GOOD.replace(
                "order: [gb200-rack, h200-burst]",
                "exploration: 0.1, tolerance: 0.2",
            ),
            "stages[0].routing: exploration is not a field of policy priority (only of latency and cost); tolerance is not",
        ),
        (
            GOOD.replace(
                "routing: { policy: priority, order: [gb200-rack, h200-burst] }",
                "routing: { exploration: 0.7 }",
            ),
            "stages[0].routing.exploration: 0.7 must be between 0 and 0.5",
        ),
        (
            GOOD.replace(
                "routing: { policy: priority, order: [gb200-rack, h200-burst] }",
                "replica_choice: { share_floor: 1.5 }",
            ),
            "stages[0].replica_choice.share_floor: 1.5 must be between 0 and 1",
        ),
        (
            GOOD.replace(
                "routing: { policy: priority, order: [gb200-rack, h200-burst] }",
                "replica_choice: { share_wait_tokens: -1 }",
            ),
            "stages[0].replica_choice.share_wait_tokens: must be a finite number >= 0",
        ),
        (
            GOOD.replace("order: [gb200-rack, h200-burst]", "resume_below: 1"),
            "stages[0].routing.resume_below: must be between 0 and 1 (exclusive)",
        ),
        (
            GOOD.replace("policy: priority", "policy: priorty"),
            "stages[0].routing.policy: unknown variant `priorty`",
        ),
        (
            GOOD.replace("region: eu", "regoin: eu"),
            "fleets[2]: unknown field `regoin`",
        ),
        (
            GOOD.replace(
                "gpus_per_replica: 8 }\n  - name: h200",
                "gpus_per_replica: 0 }\n  - name: h200",
            ),
            "fleets[0].cost.gpus_per_replica: must be at least 1",
        ),
        (
            format!("{GOOD}default_stage: nope\n"),
            "default_stage: unknown stage 'nope'",
        ),
        (
            GOOD.replace(
                "replicas: { min: 2, max: 6 }",
                "replicas: { min: 7, max: 6 }",
            ),
            "stages[0].replicas: min 7 is above max 6",
        ),
        (
            GOOD.replace(
                "replicas: { min: 2, max: 6 }",
                "replicas: { min: 0, max: 1 }",
            ),
            "stages[0].replicas.max: 1 is below the 2 replicas",
        ),
        (
            format!("{GOOD}    outlier: {{ max_ejection_s: 100000 }}\n"),
            "stages[0].outlier.max_ejection_s: 100000 is more than a day",
        ),
        (
            format!("{GOOD}    outlier: {{ max_error_rate: 0 }}\n"),
            "stages[0].outlier.max_error_rate: must be more than 0 and at most 1",
        ),
        (
            format!("{GOOD}    outlier: {{ max_error_rate: 1.5, min_samples: 0 }}\n"),
            "stages[0].outlier.min_samples: must be at least 1",
        ),
        (
            format!(
                "{GOOD}    warmup: {{ timeout_ms: 0, prompts: [{{ body: {{ model: m }} }}] }}\n"
            ),
            "stages[0].warmup.timeout_ms: must be at least 1",
        ),
        (
            format!("peers: {{ flush_ms: 25, load_stale_ms: 40 }}\n{GOOD}"),
            "peers.load_stale_ms: must be 0 (load not shared) or between 2 × flush_ms and 60000",
        ),
    ];
    for (yaml, want) in cases {
        let got = errors(&yaml);
        assert!(
            got.iter().any(|g| g.starts_with(want)),
            "want {want:?}, got {got:?}"
        );
    }
}

/// The reference config in docs/reference/router-config.md is a valid config.
#[test]
fn the_readme_reference_config_is_valid() {
    let readme = include_str!("../../../../docs/reference/router-config.md");
    let start = readme
        .find("```yaml\nhealth_check:")
        .expect("reference block")
        + "```yaml\n".len();
    let end = start + readme[start..].find("```").expect("block end");
    assert_eq!(errors(&readme[start..end]), Vec::<String>::new());
}

#[test]
fn every_error_is_reported_at_once() {
    let yaml = GOOD
        .replace("order: [gb200-rack, h200-burst]", "order: [x, y]")
        .replace("\"10.0.0.12:8000\"", "\"10.0.0.11:8000\"");
    assert_eq!(errors(&yaml).len(), 3);
}

#[test]
fn envoy_bounds_are_checked_with_their_paths() {
    for (section, says) in [
        (
            "envoy: { timeouts: { request_ms: 0 } }",
            "envoy.timeouts.request_ms: 0 must be between 1 and",
        ),
        (
            "envoy: { timeouts: { upstream_idle_ms: 700000 } }",
            "envoy.timeouts.upstream_idle_ms: must not exceed envoy.timeouts.response_ms",
        ),
        (
            "envoy: { overload: { max_heap_bytes: 1000 } }",
            "envoy.overload.max_heap_bytes: must be at least",
        ),
        (
            "envoy: { retries: { budget_percent: 150 } }",
            "envoy.retries.budget_percent: 150 must be above 0",
        ),
        (
            "envoy: { outlier: { consecutive_local_origin_failure: 0 } }",
            "envoy.outlier.consecutive_local_origin_failure: must be at least 1",
        ),
        (
            "envoy: { outlier: { max_ejection_percent: 101 } }",
            "envoy.outlier.max_ejection_percent: must be at most 100",
        ),
    ] {
        let errs = errors(&format!("{section}\n{GOOD}"));
        assert!(errs.iter().any(|e| e.contains(says)), "{section}: {errs:?}");
    }
    assert!(
        errors(&format!(
            "envoy: {{ timeouts: {{ request_ms: 5000 }} }}\n{GOOD}"
        ))
        .is_empty()
    );
    let unknown = errors(&format!(
        "envoy: {{ timeouts: {{ upload_ms: 5 }} }}\n{GOOD}"
    ));
    assert!(unknown[0].contains("upload_ms"), "{unknown:?}");
}

#[test]
fn tenant_sections_are_checked_with_their_paths() {
    for (section, says) in [
        (
            "tenants: { named: { acme: { budget: { usd: -1, per: month } } } }",
            "tenants.named.acme.budget.usd: must be a finite number from 0 to",
        ),
        (
            "tenants: { default: { tokens_per_minute: 0 } }",
            "tenants.default.tokens_per_minute: must be at least 1",
        ),
        (
            "tenants: { named: { other: {} } }",
            "tenants.named.other: `other` is reserved",
        ),
        (
            "tenants: { metrics: { pinned: [\"a b\"] } }",
            "tenants.metrics.pinned[0]: tenant id must be printable ASCII",
        ),
        (
            "tenants: { metrics: { top: 5000 } }",
            "tenants.metrics: top (5000) plus pinned (0) is more than",
        ),
        (
            "tenants_redis: { url: \"redis://127.0.0.1:6379/\", instances: 0 }",
            "tenants_redis.instances: must be at least 1",
        ),
        (
            "tenants_redis: { url: \"nope://x\", instances: 2 }",
            "tenants_redis.url: ",
        ),
        (
            "tenants_redis: { url: \"redis://127.0.0.1:6379/\", instances: 2, slice_fraction: 0 }",
            "tenants_redis.slice_fraction: must be more than 0",
        ),
        (
            "audit: { max_bytes: 10 }",
            "audit.max_bytes: must be at least 4096",
        ),
        (
            "audit: { max_files: 0 }",
            "audit.max_files: 0 must be between 1 and 100",
        ),
        (
            "tenants: { default: { tokens_per_min: 5 } }",
            "tenants.default: unknown field `tokens_per_min`",
        ),
    ] {
        let errs = errors(&format!("{section}\n{GOOD}"));
        assert!(errs.iter().any(|e| e.contains(says)), "{section}: {errs:?}");
    }
    let priced = GOOD.replace(
        "cost: { gpu_hour_usd: 4.2, gpus_per_replica: 8 }",
        "cost: { gpu_hour_usd: 4.2, gpus_per_replica: 8, cached_usd_per_million_tokens: -0.1 }",
    );
    assert_eq!(
        errors(&priced),
        vec!["fleets[1].cost.cached_usd_per_million_tokens: must be a finite number >= 0"]
    );
    let ok = format!(
        "tenants:\n  default: {{ tokens_per_minute: 1000 }}\n  named:\n    acme: {{ budget: {{ usd: 5, per: day }}, priority: critical }}\n\
         tenants_redis: {{ url: \"redis://127.0.0.1:6379/\", instances: 3 }}\n\
         audit: {{ path: /tmp/audit.log }}\n{GOOD}"
    );
    let cfg = RouterConfig::parse(&ok).expect("valid");
    assert_eq!(
        cfg.tenants.limits_for("acme").budget.map(|b| b.usd),
        Some(5.0)
    );
    assert_eq!(
        cfg.tenants.limits_for("anyone").tokens_per_minute,
        Some(1000)
    );
    assert_eq!(cfg.tenants_redis.map(|r| r.timeout_ms), Some(100));
}

#[test]
fn admission_is_checked_with_its_paths() {
    let ok = format!(
        "{GOOD}    admission: {{ ttft_ms: {{ critical: 1500, standard: 4000 }} }}\n\
         admission: {{ priority_header: x-priority, header_may_raise: true }}\n"
    );
    assert_eq!(errors(&ok), Vec::<String>::new());
    for (stage, top, says) in [
        (
            "{ ttft_ms: { critical: 0 } }",
            "",
            "stages[0].admission.ttft_ms.critical: 0 must be between 1 and 600000 ms",
        ),
        (
            "{ ttft_ms: { critical: 4000, standard: 1500 } }",
            "",
            "stages[0].admission.ttft_ms.standard: 1500 is tighter than critical (4000)",
        ),
        (
            "{ headroom: 1 }",
            "",
            "stages[0].admission.headroom: must be at least 0 and below 1",
        ),
        (
            "{ queue: { standard: 5000 } }",
            "",
            "stages[0].admission.queue.standard: 5000 is above 4096",
        ),
        (
            "{ retry_after_s: 0 }",
            "",
            "stages[0].admission.retry_after_s: 0 must be between 1 and 3600",
        ),
        (
            "{ ttft_ms: { urgent: 10 } }",
            "",
            "stages[0].admission.ttft_ms: unknown field `urgent`",
        ),
        (
            "{}",
            "admission: { priority_header: x-fleetroute-priority }",
            "admission.priority_header: 'x-fleetroute-priority' is reserved",
        ),
        (
            "{}",
            "admission: { priority_header: X-Priority }",
            "admission.priority_header: 'X-Priority' must be a lowercase HTTP header name",
        ),
        (
            "{}",
            "admission: { priority_header: authorization }",
            "admission.priority_header: 'authorization' cannot name the priority class",
        ),
        (
            "{}",
            "admission: { max_wait_ms: 60000 }",
            "admission.max_wait_ms: 60000 must be between 1 and 30000",
        ),
    ] {
        let yaml = format!("{GOOD}    admission: {stage}\n{top}\n");
        let got = errors(&yaml);
        assert!(
            got.iter().any(|g| g.starts_with(says)),
            "want {says:?}, got {got:?}"
        );
    }
}

#[test]
fn adapters_need_fleets_that_hold_them_and_names_of_their_own() {
    let with = |stage: &str, lora: &str| {
        GOOD.replace(
            "    models: [ds-flash]\n",
            &format!("    models: [ds-flash]\n{stage}"),
        )
        .replace(
            "    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8 }\n",
            &format!("    cost: {{ gpu_hour_usd: 9.5, gpus_per_replica: 8 }}\n{lora}"),
        )
    };
    let lora = "    lora: { max_loras: 4, max_cpu_loras: 16 }\n";
    // Only the first fleet says how it holds adapters.
    assert_eq!(
        errors(&with("    adapters: [sql, chat]\n", lora)),
        [
            "stages[0].fleets[1]: fleet 'h200-burst' has no `lora` section: a stage with adapters needs every fleet to say how its replicas hold them"
        ]
    );
    let both = GOOD
        .replace("    models: [ds-flash]\n", "    models: [ds-flash]\n    adapters: [sql, ds-flash, \"a b\"]\n")
        .replace("    hosts: { min: 0, max: 4 }\n", &format!("    hosts: {{ min: 0, max: 4 }}\n{lora}"))
        .replace(
            "    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8 }\n",
            "    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8 }\n    lora: { max_loras: 4, max_cpu_loras: 2, load_path: /lora }\n",
        );
    assert_eq!(
        errors(&both),
        [
            "fleets[0].lora.max_cpu_loras: 2 must be at least max_loras (4) and at most 4096",
            "fleets[0].lora.load_path: '/lora' must hold {adapter}, where the adapter's name goes",
            "stages[0].adapters[1]: 'ds-flash' already names a model or adapter of stage 'ds-flash/prod-us'",
            "stages[0].adapters[2]: 'a b' must be 1-256 printable ASCII characters without spaces or '|'",
        ]
    );
}

#[test]
fn packed_fleets_are_checked_and_serve_models_by_their_stage_names() {
    let packed = GOOD
        .replace(
            "    endpoints: [\"10.2.0.1:8000\"]\n",
            "    endpoints: [\"10.2.0.1:8000\"]\n    packing: { max_models: 2, load_ms: 800 }\n",
        )
        .replace(
            "stages:\n",
            "stages:\n  - name: small\n    fleets: [eu-pool]\n  - name: tiny\n    fleets: [eu-pool]\n",
        );
    assert_eq!(errors(&packed), Vec::<String>::new());
    let bad = packed
        .replace(
            "max_models: 2, load_ms: 800",
            "max_models: 0, load_ms: -1, load_timeout_ms: 60000",
        )
        .replace(
            "  - name: tiny\n    fleets: [eu-pool]\n",
            "  - name: tiny\n    fleets: [{ name: eu-pool, model: other }]\n",
        );
    assert_eq!(
        errors(&bad),
        [
            "fleets[2].packing.max_models: 0 must be between 1 and 1024",
            "fleets[2].packing.load_ms: must be a finite number >= 0",
            "fleets[2].packing.load_timeout_ms: 60000 must be between 1 and 30000",
            "stages[1].fleets[0].model: fleet 'eu-pool' packs models: it serves this stage's model as 'tiny', not under another name",
        ]
    );
    let warm = packed.replace(
        "  - name: tiny\n    fleets: [eu-pool]\n",
        "  - name: tiny\n    fleets: [eu-pool]\n    warm_replicas: 1\n",
    );
    assert_eq!(
        errors(&warm),
        [
            "stages[1].warm_replicas: needs a fleet of the stage with `packing.placement`, which loads models ahead of requests"
        ]
    );
    let placed = warm.replace(
        "load_ms: 800 }",
        "load_ms: 800, placement: { interval_ms: 10 } }",
    );
    assert_eq!(
        errors(&placed),
        ["fleets[2].packing.placement.interval_ms: 10 must be between 100 and 60000"]
    );
    assert_eq!(
        errors(&placed.replace("interval_ms: 10", "interval_ms: 500")),
        Vec::<String>::new()
    );
    let both = packed.replace(
        "    packing: { max_models: 2, load_ms: 800 }\n",
        "    packing: { max_models: 2 }\n    lora: { max_loras: 2 }\n",
    );
    assert_eq!(
        errors(&both),
        [
            "fleets[2].packing: a fleet holds either adapters (`lora`) or several models (`packing`), not both"
        ]
    );
}
