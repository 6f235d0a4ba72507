//! Checks that need the whole file: names resolve, residency holds, numbers
//! make sense. Collects every error rather than stopping at the first.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use super::{ConfigError, PolicyKind, RouterConfig};

/// Replicas per fleet; the prefix index keeps one bit per replica.
pub const MAX_REPLICAS_PER_FLEET: usize = 64;
/// Longest window or ejection a config may ask for.
const MAX_SECONDS: u64 = 86_400;

struct Errors(Vec<ConfigError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Fleet names are Envoy cluster names and travel in headers.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Stage names may also hold '/', e.g. `ds-flash/prod-us`.
fn valid_stage_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
}

fn finite_non_negative(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

pub fn validate(cfg: &RouterConfig) -> Vec<ConfigError> {
    let mut e = Errors(Vec::new());
    let hc = &cfg.health_check;
    if !hc.path.starts_with('/') {
        e.push(
            "health_check.path",
            format!("'{}' must start with '/'", hc.path),
        );
    }
    if hc.interval_ms < 10 {
        e.push("health_check.interval_ms", "must be at least 10");
    }
    if hc.timeout_ms == 0 || hc.timeout_ms > hc.interval_ms.max(10) {
        e.push(
            "health_check.timeout_ms",
            "must be between 1 and interval_ms",
        );
    }
    if hc.healthy_threshold == 0 {
        e.push("health_check.healthy_threshold", "must be at least 1");
    }
    if hc.unhealthy_threshold == 0 {
        e.push("health_check.unhealthy_threshold", "must be at least 1");
    }
    let em = &cfg.engine_metrics;
    if !em.path.starts_with('/') {
        e.push(
            "engine_metrics.path",
            format!("'{}' must start with '/'", em.path),
        );
    }
    if em.interval_ms != 0 && (em.timeout_ms == 0 || em.timeout_ms > em.interval_ms) {
        e.push(
            "engine_metrics.timeout_ms",
            "must be between 1 and interval_ms",
        );
    }
    let ls = &cfg.leases;
    if ls.min_ms == 0 || ls.min_ms > ls.max_ms {
        e.push("leases.min_ms", "must be between 1 and max_ms");
    }
    if !(ls.decode_tokens_per_sec.is_finite() && ls.decode_tokens_per_sec > 0.0) {
        e.push("leases.decode_tokens_per_sec", "must be above 0");
    }

    let mut regions: HashMap<&str, &str> = HashMap::new();
    for (i, f) in cfg.fleets.iter().enumerate() {
        let p = format!("fleets[{i}]");
        if !valid_name(&f.name) {
            e.push(
                format!("{p}.name"),
                format!("'{}' must be 1-128 of [A-Za-z0-9._-]", f.name),
            );
        }
        if regions.insert(&f.name, &f.region).is_some() {
            e.push(format!("{p}.name"), format!("duplicate fleet '{}'", f.name));
        }
        if !valid_name(&f.region) {
            e.push(
                format!("{p}.region"),
                format!("'{}' must be 1-128 of [A-Za-z0-9._-]", f.region),
            );
        }
        if f.endpoints.len() > MAX_REPLICAS_PER_FLEET {
            e.push(
                format!("{p}.endpoints"),
                format!(
                    "{} endpoints; a fleet holds at most {MAX_REPLICAS_PER_FLEET}",
                    f.endpoints.len()
                ),
            );
        }
        let mut seen = HashSet::new();
        for (j, ep) in f.endpoints.iter().enumerate() {
            if ep.parse::<SocketAddr>().is_err() {
                e.push(
                    format!("{p}.endpoints[{j}]"),
                    format!("'{ep}' is not ip:port"),
                );
            } else if !seen.insert(ep) {
                e.push(
                    format!("{p}.endpoints[{j}]"),
                    format!("duplicate endpoint '{ep}'"),
                );
            }
        }
        if let Some(c) = &f.cost {
            for (field, v) in [
                ("gpu_hour_usd", c.gpu_hour_usd),
                ("usd_per_million_tokens", c.usd_per_million_tokens),
            ] {
                if v.is_some_and(|v| !finite_non_negative(v)) {
                    e.push(format!("{p}.cost.{field}"), "must be a finite number >= 0");
                }
            }
            if c.gpus_per_replica == Some(0) {
                e.push(format!("{p}.cost.gpus_per_replica"), "must be at least 1");
            }
            if c.gpu_hour_usd.is_none() && c.usd_per_million_tokens.is_none() {
                e.push(
                    format!("{p}.cost"),
                    "set gpu_hour_usd or usd_per_million_tokens",
                );
            }
        }
        let cap = &f.capacity;
        if cap.kv_cache_tokens == 0 {
            e.push(
                format!("{p}.capacity.kv_cache_tokens"),
                "must be at least 1",
            );
        }
        if let Some(c) = &f.cost
            && c.tokens_per_sec
                .is_some_and(|v| !(v.is_finite() && v > 0.0))
        {
            e.push(
                format!("{p}.cost.tokens_per_sec"),
                "must be a positive number",
            );
        }
        if cap.max_inflight == 0 {
            e.push(format!("{p}.capacity.max_inflight"), "must be at least 1");
        }
        if !(cap.max_kv_usage > 0.0 && cap.max_kv_usage <= 1.0) {
            e.push(format!("{p}.capacity.max_kv_usage"), "must be in (0, 1]");
        }
        if let Some(b) = f.hosts
            && b.min > b.max
        {
            e.push(
                format!("{p}.hosts"),
                format!("min {} is above max {}", b.min, b.max),
            );
        }
        if !(f.scaling.target_queue.is_finite() && f.scaling.target_queue > 0.0) {
            e.push(
                format!("{p}.scaling.target_queue"),
                "must be a positive number",
            );
        }
        if f.scaling
            .target_tokens_per_sec
            .is_some_and(|v| !(v.is_finite() && v > 0.0))
        {
            e.push(
                format!("{p}.scaling.target_tokens_per_sec"),
                "must be a positive number",
            );
        }
    }

    let mut stage_names = HashSet::new();
    let mut models: HashMap<&str, usize> = HashMap::new();
    for (i, s) in cfg.stages.iter().enumerate() {
        let p = format!("stages[{i}]");
        if !valid_stage_name(&s.name) {
            e.push(
                format!("{p}.name"),
                format!("'{}' must be 1-128 of [A-Za-z0-9._/-]", s.name),
            );
        }
        if !stage_names.insert(s.name.as_str()) {
            e.push(format!("{p}.name"), format!("duplicate stage '{}'", s.name));
        }
        for (j, m) in s.models.iter().enumerate() {
            if let Some(other) = models.insert(m, i) {
                e.push(
                    format!("{p}.models[{j}]"),
                    format!(
                        "model '{m}' already belongs to stage '{}'",
                        cfg.stages[other].name
                    ),
                );
            }
        }
        if s.fleets.is_empty() {
            e.push(format!("{p}.fleets"), "a stage needs at least one fleet");
        }
        let residency = s.residency.as_ref().map(|r| r.to_vec());
        if residency.as_ref().is_some_and(|r| r.is_empty()) {
            e.push(format!("{p}.residency"), "must name at least one region");
        }
        let mut stage_fleets = HashSet::new();
        for (j, name) in s.fleets.iter().enumerate() {
            let fp = format!("{p}.fleets[{j}]");
            if !stage_fleets.insert(name.as_str()) {
                e.push(fp, format!("fleet '{name}' listed twice"));
                continue;
            }
            match regions.get(name.as_str()) {
                None => e.push(fp, format!("unknown fleet '{name}'")),
                Some(region) => {
                    if let Some(r) = &residency
                        && !r.iter().any(|x| x == region)
                    {
                        e.push(
                            fp,
                            format!(
                                "fleet '{name}' is in region '{region}', outside the stage's residency [{}]",
                                r.join(", ")
                            ),
                        );
                    }
                }
            }
        }
        if let Some(b) = s.replicas
            && b.min > b.max
        {
            e.push(
                format!("{p}.replicas"),
                format!("min {} is above max {}", b.min, b.max),
            );
        }
        let rp = format!("{p}.routing");
        let r = &s.routing;
        let misplaced = |field: &str, set: bool, own: PolicyKind, e: &mut Errors| {
            if set && r.policy != own {
                e.push(
                    format!("{rp}.{field}"),
                    format!("belongs to policy {own:?}, not {:?}", r.policy).to_lowercase(),
                );
            }
        };
        misplaced("order", r.order.is_some(), PolicyKind::Priority, &mut e);
        misplaced("weights", r.weights.is_some(), PolicyKind::Weighted, &mut e);
        misplaced(
            "resume_below",
            r.resume_below.is_some(),
            PolicyKind::Priority,
            &mut e,
        );
        for (field, set) in [
            ("exploration", r.exploration.is_some()),
            ("tolerance", r.tolerance.is_some()),
        ] {
            if set && !matches!(r.policy, PolicyKind::Latency | PolicyKind::Cost) {
                e.push(
                    format!("{rp}.{field}"),
                    format!("belongs to policies latency and cost, not {:?}", r.policy)
                        .to_lowercase(),
                );
            }
        }
        if !(0.0..=0.5).contains(&r.exploration()) {
            e.push(format!("{rp}.exploration"), "must be between 0 and 0.5");
        }
        if !(0.0..=1.0).contains(&r.tolerance()) {
            e.push(format!("{rp}.tolerance"), "must be between 0 and 1");
        }
        if !(r.resume_below() > 0.0 && r.resume_below() < 1.0) {
            e.push(
                format!("{rp}.resume_below"),
                "must be between 0 and 1 (exclusive)",
            );
        }
        if r.policy == PolicyKind::Cost {
            for (j, name) in s.fleets.iter().enumerate() {
                if let Some(f) = cfg.fleets.iter().find(|f| &f.name == name)
                    && f.cost.is_none()
                {
                    e.push(
                        format!("{p}.fleets[{j}]"),
                        format!("the cost policy needs a cost for fleet '{name}'"),
                    );
                }
            }
        }
        let rc = &s.replica_choice;
        for (field, v) in [
            ("prefix_weight", rc.prefix_weight),
            ("load_weight", rc.load_weight),
            ("engine_queue_tokens", rc.engine_queue_tokens),
            ("tie_tokens", rc.tie_tokens),
            ("load_slack_tokens", rc.load_slack_tokens),
        ] {
            if !finite_non_negative(v) {
                e.push(
                    format!("{p}.replica_choice.{field}"),
                    "must be a finite number >= 0",
                );
            }
        }
        if !(rc.load_factor.is_finite() && rc.load_factor >= 1.0) {
            e.push(
                format!("{p}.replica_choice.load_factor"),
                "must be a finite number >= 1",
            );
        }
        let a = &s.alarms;
        if a.ttft_p95_ms.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            e.push(
                format!("{p}.alarms.ttft_p95_ms"),
                "must be a positive number",
            );
        }
        if a.error_rate.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            e.push(format!("{p}.alarms.error_rate"), "must be between 0 and 1");
        }
        if a.window_s == 0 {
            e.push(format!("{p}.alarms.window_s"), "must be at least 1");
        }
        let o = &s.outlier;
        if !(o.factor.is_finite() && o.factor > 1.0) {
            e.push(format!("{p}.outlier.factor"), "must be a finite number > 1");
        }
        if !(0.0..=1.0).contains(&o.max_ejected_share) {
            e.push(
                format!("{p}.outlier.max_ejected_share"),
                "must be between 0 and 1",
            );
        }
        if !(0.0..=1.0).contains(&o.min_error_rate_gap) {
            e.push(
                format!("{p}.outlier.min_error_rate_gap"),
                "must be between 0 and 1",
            );
        }
        if !(o.max_error_rate > 0.0 && o.max_error_rate <= 1.0) {
            e.push(
                format!("{p}.outlier.max_error_rate"),
                "must be more than 0 and at most 1",
            );
        }
        if o.min_samples == 0 {
            e.push(format!("{p}.outlier.min_samples"), "must be at least 1");
        }
        if o.window_s == 0 || o.base_ejection_s == 0 || o.max_ejection_s < o.base_ejection_s {
            e.push(
                format!("{p}.outlier"),
                "window_s and base_ejection_s must be >= 1 and max_ejection_s >= base_ejection_s",
            );
        }
        for (field, v) in [
            ("window_s", o.window_s),
            ("max_ejection_s", o.max_ejection_s),
        ] {
            if v > MAX_SECONDS {
                e.push(
                    format!("{p}.outlier.{field}"),
                    format!("{v} is more than a day ({MAX_SECONDS})"),
                );
            }
        }
        if a.window_s > MAX_SECONDS {
            e.push(
                format!("{p}.alarms.window_s"),
                format!("{} is more than a day ({MAX_SECONDS})", a.window_s),
            );
        }
        // The autoscaling signal keeps every fleet at its minimum: the minimums
        // must fit in the stage's maximum.
        if let Some(b) = s.replicas {
            let mins: u32 = s
                .fleets
                .iter()
                .filter_map(|n| cfg.fleets.iter().find(|f| &f.name == n))
                .map(|f| f.hosts.map_or(f.endpoints.len() as u32, |h| h.min))
                .sum();
            if mins > b.max {
                e.push(
                    format!("{p}.replicas.max"),
                    format!("{} is below the {mins} replicas its fleets' minimums (hosts.min, else their endpoints) add up to", b.max),
                );
            }
        }
        let ex = &s.experiment;
        if let Some(ab) = &ex.ab {
            let ap = format!("{p}.experiment.ab");
            if !stage_fleets.contains(ab.control.as_str()) {
                e.push(
                    format!("{ap}.control"),
                    format!("unknown fleet '{}' (not in {p}.fleets)", ab.control),
                );
            }
            if ab.variants.is_empty() {
                e.push(format!("{ap}.variants"), "list at least one variant");
            }
            let mut total = 0.0;
            let mut seen_variants = HashSet::new();
            for (j, v) in ab.variants.iter().enumerate() {
                let vp = format!("{ap}.variants[{j}]");
                if !stage_fleets.contains(v.fleet.as_str()) {
                    e.push(
                        format!("{vp}.fleet"),
                        format!("unknown fleet '{}' (not in {p}.fleets)", v.fleet),
                    );
                }
                if v.fleet == ab.control || !seen_variants.insert(v.fleet.as_str()) {
                    e.push(
                        format!("{vp}.fleet"),
                        format!("'{}' is already an arm of this test", v.fleet),
                    );
                }
                if !(v.percent.is_finite() && v.percent > 0.0 && v.percent <= 100.0) {
                    e.push(
                        format!("{vp}.percent"),
                        format!("{} must be in (0, 100]", v.percent),
                    );
                } else {
                    total += v.percent;
                }
            }
            if total > 100.0 {
                e.push(
                    format!("{ap}.variants"),
                    format!("percentages sum to {total}, more than 100"),
                );
            }
        }
        if let Some(sh) = &ex.shadow {
            let sp = format!("{p}.experiment.shadow");
            match regions.get(sh.fleet.as_str()) {
                None => e.push(
                    format!("{sp}.fleet"),
                    format!("unknown fleet '{}'", sh.fleet),
                ),
                Some(region) => {
                    let allowed = match &residency {
                        Some(r) => r.iter().any(|x| x == region),
                        // Without a residency the stage's regions are its fleets' regions.
                        None => s
                            .fleets
                            .iter()
                            .any(|f| regions.get(f.as_str()) == Some(region)),
                    };
                    if !allowed {
                        e.push(
                            format!("{sp}.fleet"),
                            format!(
                                "fleet '{}' is in region '{region}', outside the stage's residency",
                                sh.fleet
                            ),
                        );
                    }
                }
            }
            if !(sh.percent.is_finite() && (0.0..=100.0).contains(&sh.percent)) {
                e.push(
                    format!("{sp}.percent"),
                    format!("{} must be between 0 and 100", sh.percent),
                );
            }
        }
        if let Some(w) = &s.warmup {
            if w.prompts.is_empty() {
                e.push(
                    format!("{p}.warmup.prompts"),
                    "must list at least one prompt",
                );
            }
            if !w.path.starts_with('/') {
                e.push(
                    format!("{p}.warmup.path"),
                    format!("'{}' must start with '/'", w.path),
                );
            }
            if w.timeout_ms == 0 {
                e.push(format!("{p}.warmup.timeout_ms"), "must be at least 1");
            }
            for (j, g) in w.prompts.iter().enumerate() {
                if !g.body.is_object() {
                    e.push(
                        format!("{p}.warmup.prompts[{j}].body"),
                        "must be a JSON object (a request body)",
                    );
                }
            }
        }
        if let Some(order) = &r.order {
            for (j, name) in order.iter().enumerate() {
                if !stage_fleets.contains(name.as_str()) {
                    e.push(
                        format!("{rp}.order[{j}]"),
                        format!("unknown fleet '{name}' (not in {p}.fleets)"),
                    );
                }
            }
        }
        if let Some(weights) = &r.weights {
            for (name, w) in weights {
                if !stage_fleets.contains(name.as_str()) {
                    e.push(
                        format!("{rp}.weights.{name}"),
                        format!("unknown fleet '{name}' (not in {p}.fleets)"),
                    );
                }
                if !finite_non_negative(*w) {
                    e.push(
                        format!("{rp}.weights.{name}"),
                        format!("weight {w} must be finite and >= 0"),
                    );
                }
            }
        }
    }
    if let Some(d) = &cfg.default_stage
        && !stage_names.contains(d.as_str())
    {
        e.push("default_stage", format!("unknown stage '{d}'"));
    }
    validate_envoy(&cfg.envoy, &mut e);
    e.0
}

/// The smallest heap the overload manager may be given: Envoy with the Wasm
/// runtime idles at tens of MiB, so less would refuse every request.
const MIN_HEAP_BYTES: u64 = 64 << 20;

/// The `envoy:` section: every bound must be set (0 would disable it).
fn validate_envoy(v: &super::EnvoyConfig, e: &mut Errors) {
    let t = &v.timeouts;
    for (field, ms) in [
        ("request_headers_ms", t.request_headers_ms),
        ("request_ms", t.request_ms),
        ("stream_idle_ms", t.stream_idle_ms),
        ("connection_idle_ms", t.connection_idle_ms),
        ("upstream_idle_ms", t.upstream_idle_ms),
        ("response_ms", t.response_ms),
    ] {
        if !(1..=MAX_SECONDS * 1000).contains(&ms) {
            e.push(
                format!("envoy.timeouts.{field}"),
                format!("{ms} must be between 1 and {}", MAX_SECONDS * 1000),
            );
        }
    }
    if t.upstream_idle_ms > t.response_ms {
        e.push(
            "envoy.timeouts.upstream_idle_ms",
            "must not exceed envoy.timeouts.response_ms",
        );
    }
    let o = &v.overload;
    if o.max_heap_bytes < MIN_HEAP_BYTES {
        e.push(
            "envoy.overload.max_heap_bytes",
            format!("must be at least {MIN_HEAP_BYTES} (64 MiB)"),
        );
    }
    if o.max_connections == 0 {
        e.push("envoy.overload.max_connections", "must be at least 1");
    }
    let r = &v.retries;
    if !(r.budget_percent.is_finite() && r.budget_percent > 0.0 && r.budget_percent <= 100.0) {
        e.push(
            "envoy.retries.budget_percent",
            format!("{} must be above 0 and at most 100", r.budget_percent),
        );
    }
    if r.min_concurrency == 0 {
        e.push("envoy.retries.min_concurrency", "must be at least 1");
    }
    let od = &v.outlier;
    for (field, n) in [
        ("consecutive_5xx", od.consecutive_5xx),
        (
            "consecutive_gateway_failure",
            od.consecutive_gateway_failure,
        ),
        (
            "consecutive_local_origin_failure",
            od.consecutive_local_origin_failure,
        ),
    ] {
        if n == 0 {
            e.push(format!("envoy.outlier.{field}"), "must be at least 1");
        }
    }
    for (field, ms) in [
        ("interval_ms", od.interval_ms),
        ("base_ejection_ms", od.base_ejection_ms),
    ] {
        if !(1..=MAX_SECONDS * 1000).contains(&ms) {
            e.push(
                format!("envoy.outlier.{field}"),
                format!("{ms} must be between 1 and {}", MAX_SECONDS * 1000),
            );
        }
    }
    if od.max_ejection_percent > 100 {
        e.push("envoy.outlier.max_ejection_percent", "must be at most 100");
    }
}

#[cfg(test)]
mod tests {
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
                "stages[0].routing.order: belongs to policy priority, not weighted",
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
        ];
        for (yaml, want) in cases {
            let got = errors(&yaml);
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "want {want:?}, got {got:?}"
            );
        }
    }

    /// The reference config in README.md is a valid config.
    #[test]
    fn the_readme_reference_config_is_valid() {
        let readme = include_str!("../../../README.md");
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
}
