//! One fleet: its names, membership source, cost, capacity and scaling bounds.

use super::Errors;
use crate::config::{Bounds, CapacityConfig, CostConfig, FleetConfig, ScalingConfig};

pub(super) fn fleet(f: &FleetConfig, p: &str, e: &mut Errors) {
    e.name(format!("{p}.name"), &f.name, b"");
    e.name(format!("{p}.region"), &f.region, b"");
    super::source::source(f, p, e);
    if let Some(c) = &f.cost {
        cost(c, &format!("{p}.cost"), e);
    }
    capacity(&f.capacity, &format!("{p}.capacity"), e);
    if let Some(b) = f.hosts {
        bounds(b, format!("{p}.hosts"), e);
    }
    scaling(&f.scaling, &format!("{p}.scaling"), e);
    engine_api(f, &format!("{p}.engine_api"), e);
    if let Some(l) = &f.lora {
        lora(l, &format!("{p}.lora"), e);
    }
    if let Some(k) = &f.packing {
        packing(k, &format!("{p}.packing"), e);
        e.ensure(
            f.lora.is_none(),
            format!("{p}.packing"),
            "a fleet holds either adapters (`lora`) or several models (`packing`), not both",
        );
    }
}

fn packing(k: &crate::config::PackingConfig, p: &str, e: &mut Errors) {
    e.in_range(format!("{p}.max_models"), k.max_models, 1..=1024);
    e.non_negative(format!("{p}.load_ms"), k.load_ms);
    e.positive(
        format!("{p}.prefill_tokens_per_sec"),
        k.prefill_tokens_per_sec,
    );
    e.in_range(
        format!("{p}.load_timeout_ms"),
        k.load_timeout_ms,
        1..=crate::config::MAX_WAIT_CAP_MS,
    );
    if let Some(pl) = &k.placement {
        let p = format!("{p}.placement");
        e.in_range(format!("{p}.interval_ms"), pl.interval_ms, 100..=60_000);
        e.in_range(format!("{p}.window_s"), pl.window_s, 1..=3600);
        e.in_range(
            format!("{p}.max_loads_per_replica_per_min"),
            pl.max_loads_per_replica_per_min,
            1..=60,
        );
    }
}

fn lora(l: &crate::config::LoraConfig, p: &str, e: &mut Errors) {
    e.in_range(format!("{p}.max_loras"), l.max_loras, 1..=1024);
    e.ensure(
        l.max_cpu_loras >= l.max_loras && l.max_cpu_loras <= 4096,
        format!("{p}.max_cpu_loras"),
        format!(
            "{} must be at least max_loras ({}) and at most 4096",
            l.max_cpu_loras, l.max_loras
        ),
    );
    e.non_negative(format!("{p}.gpu_load_ms"), l.gpu_load_ms);
    e.non_negative(format!("{p}.disk_load_ms"), l.disk_load_ms);
    e.positive(
        format!("{p}.prefill_tokens_per_sec"),
        l.prefill_tokens_per_sec,
    );
    // Envoy's timer for fleetroute's answer is extended by at most this.
    e.in_range(
        format!("{p}.load_timeout_ms"),
        l.load_timeout_ms,
        1..=crate::config::MAX_WAIT_CAP_MS,
    );
    if let Some(path) = &l.load_path {
        e.ensure(
            path.contains("{adapter}"),
            format!("{p}.load_path"),
            format!("'{path}' must hold {{adapter}}, where the adapter's name goes"),
        );
    }
}

fn engine_api(f: &FleetConfig, p: &str, e: &mut Errors) {
    let api = &f.engine_api;
    if let Some(h) = &api.health_path {
        e.url_path(format!("{p}.health_path"), h);
    }
    if let Some(m) = &api.metrics_path {
        e.url_path(format!("{p}.metrics_path"), m);
    }
    if let Some(port) = api.metrics_port {
        e.at_least(format!("{p}.metrics_port"), port, 1);
    }
    let map = &api.metric_map;
    for (name, sel) in [
        ("running", &map.running),
        ("waiting", &map.waiting),
        ("kv_usage", &map.kv_usage),
        ("prefix_cache_hits", &map.prefix_cache_hits),
        ("prefix_cache_queries", &map.prefix_cache_queries),
    ] {
        if let Some(sel) = sel {
            e.ensure(
                crate::config::MetricSelector::valid_name(&sel.metric),
                format!("{p}.metric_map.{name}.metric"),
                format!("'{}' is not a Prometheus metric name", sel.metric),
            );
        }
    }
    e.ensure(
        f.engine != crate::config::Engine::Custom
            || (map.running.is_some() && map.waiting.is_some()),
        format!("{p}.metric_map"),
        "engine: custom needs at least `running` and `waiting`",
    );
}

fn cost(c: &CostConfig, p: &str, e: &mut Errors) {
    if let Some(v) = c.gpu_hour_usd {
        e.non_negative(format!("{p}.gpu_hour_usd"), v);
    }
    if let Some(v) = c.usd_per_million_tokens {
        e.non_negative(format!("{p}.usd_per_million_tokens"), v);
    }
    if let Some(v) = c.cached_usd_per_million_tokens {
        e.non_negative(format!("{p}.cached_usd_per_million_tokens"), v);
    }
    if let Some(n) = c.gpus_per_replica {
        e.at_least(format!("{p}.gpus_per_replica"), n, 1);
    }
    e.ensure(
        c.gpu_hour_usd.is_some() || c.usd_per_million_tokens.is_some(),
        p,
        "set gpu_hour_usd or usd_per_million_tokens",
    );
    if let Some(v) = c.tokens_per_sec {
        e.positive(format!("{p}.tokens_per_sec"), v);
    }
}

fn capacity(cap: &CapacityConfig, p: &str, e: &mut Errors) {
    e.at_least(format!("{p}.kv_cache_tokens"), cap.kv_cache_tokens, 1);
    e.at_least(format!("{p}.max_inflight"), cap.max_inflight, 1);
    e.ensure(
        cap.max_kv_usage > 0.0 && cap.max_kv_usage <= 1.0,
        format!("{p}.max_kv_usage"),
        "must be in (0, 1]",
    );
}

fn scaling(s: &ScalingConfig, p: &str, e: &mut Errors) {
    e.positive(format!("{p}.target_queue"), s.target_queue);
    if let Some(v) = s.target_tokens_per_sec {
        e.positive(format!("{p}.target_tokens_per_sec"), v);
    }
    e.ensure(
        s.scale_down_after_ms <= super::MAX_SECONDS * 1000,
        format!("{p}.scale_down_after_ms"),
        format!("must be at most {} (a day)", super::MAX_SECONDS * 1000),
    );
}

/// `hosts` of a fleet, `replicas` of a stage.
pub(super) fn bounds(b: Bounds, path: String, e: &mut Errors) {
    e.ensure(
        b.min <= b.max,
        path,
        format!("min {} is above max {}", b.min, b.max),
    );
}
