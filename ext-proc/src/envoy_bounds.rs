//! Writes the router config's `envoy:` bounds and `health_check` into the
//! rendered bootstrap: timeouts on the connection manager and routes, the
//! overload manager's limits, the retry budgets, and the fail-open clusters'
//! health checks and outlier detection. The template holds the defaults, so rendering
//! the shipped router config reproduces it exactly.

use yaml_serde::Value;

use crate::config::{Engine, EnvoyConfig, RouterConfig, StageConfig};
use crate::fail_open::{self, duration};

fn at<'a>(v: &'a mut Value, path: &[&str]) -> Result<&'a mut Value, String> {
    let mut cur = v;
    for p in path {
        cur = match p.parse::<usize>() {
            Ok(i) => cur.get_mut(i),
            Err(_) => cur.get_mut(*p),
        }
        .ok_or_else(|| format!("template: missing '{}'", path.join(".")))?;
    }
    Ok(cur)
}

fn set(v: &mut Value, path: &[&str], value: Value) -> Result<(), String> {
    *at(v, path)? = value;
    Ok(())
}

fn int(n: u64) -> Value {
    Value::Number(n.into())
}

/// A whole number stays an integer (as the template writes it).
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x >= 0.0 && x < u32::MAX as f64 {
        int(x as u64)
    } else {
        Value::Number(x.into())
    }
}

/// The listener's connection manager.
pub fn connection_manager(hcm: &mut Value, e: &EnvoyConfig) -> Result<(), String> {
    let t = &e.timeouts;
    set(
        hcm,
        &["request_headers_timeout"],
        duration(t.request_headers_ms),
    )?;
    set(hcm, &["request_timeout"], duration(t.request_ms))?;
    set(hcm, &["stream_idle_timeout"], duration(t.stream_idle_ms))?;
    set(
        hcm,
        &["common_http_protocol_options", "idle_timeout"],
        duration(t.connection_idle_ms),
    )
}

/// The routes fleetroute chose a fleet for: the template's streaming route,
/// and the same without the idle bound for non-streaming requests.
pub fn chosen_routes(template_route: &Value, e: &EnvoyConfig) -> Result<[Value; 2], String> {
    let mut streaming = template_route.clone();
    set(
        &mut streaming,
        &["route", "timeout"],
        duration(e.timeouts.response_ms),
    )?;
    set(
        &mut streaming,
        &["route", "retry_policy", "per_try_idle_timeout"],
        duration(e.timeouts.upstream_idle_ms),
    )?;
    let mut plain = streaming.clone();
    at(&mut plain, &["match", "headers"])?
        .as_sequence_mut()
        .ok_or("template: the first route's headers are not a list")?
        .retain(|h| {
            h.get("name").and_then(Value::as_str) != Some(fleetroute_filter::contract::STREAM)
        });
    at(&mut plain, &["route", "retry_policy"])?
        .as_mapping_mut()
        .ok_or("template: retry_policy is not a mapping")?
        .remove("per_try_idle_timeout");
    Ok([streaming, plain])
}

/// Envoy's overload manager limits.
pub fn overload(doc: &mut Value, e: &EnvoyConfig) -> Result<(), String> {
    let monitors = at(doc, &["overload_manager", "resource_monitors"])?
        .as_sequence_mut()
        .ok_or("template: resource_monitors is not a list")?;
    for m in monitors {
        match m.get("name").and_then(Value::as_str) {
            Some("envoy.resource_monitors.fixed_heap") => set(
                m,
                &["typed_config", "max_heap_size_bytes"],
                int(e.overload.max_heap_bytes),
            )?,
            Some("envoy.resource_monitors.global_downstream_max_connections") => set(
                m,
                &["typed_config", "max_active_downstream_connections"],
                int(e.overload.max_connections),
            )?,
            _ => {}
        }
    }
    Ok(())
}

fn retry_budget(c: &mut Value, e: &EnvoyConfig) -> Result<(), String> {
    let b = &["circuit_breakers", "thresholds", "0", "retry_budget"];
    let mut path = b.to_vec();
    path.extend(["budget_percent", "value"]);
    set(c, &path, number(e.retries.budget_percent))?;
    let mut path = b.to_vec();
    path.push("min_retry_concurrency");
    set(c, &path, int(e.retries.min_concurrency.into()))
}

/// A fleet cluster: its retry budget.
pub fn fleet_cluster(c: &mut Value, cfg: &RouterConfig) -> Result<(), String> {
    retry_budget(c, &cfg.envoy)
}

/// One cluster has one health path: its first fleet's (the fleets of a stage
/// that spans engines with different paths share `health_check.path`).
fn stage_health_path(cfg: &RouterConfig, stage: &StageConfig) -> String {
    let hc = &cfg.health_check;
    let first = stage
        .fleets
        .first()
        .and_then(|sf| cfg.fleets.iter().find(|f| f.name == sf.name));
    let fallback = || {
        hc.path
            .as_deref()
            .unwrap_or(Engine::default().health_path())
    };
    first
        .map_or_else(fallback, |f| f.health_path(hc))
        .to_string()
}

/// A stage's fail-open cluster: its name, health checks, outlier detection
/// and retry budget (its members: `bootstrap`).
pub fn fallback_cluster(
    c: &mut Value,
    cfg: &RouterConfig,
    stage: &StageConfig,
) -> Result<(), String> {
    let name = Value::String(fail_open::cluster_name(&stage.name));
    set(c, &["name"], name)?;
    let hc = &cfg.health_check;
    let h = at(c, &["health_checks", "0"])?;
    set(h, &["timeout"], duration(hc.timeout_ms))?;
    set(h, &["interval"], duration(hc.interval_ms))?;
    set(h, &["no_traffic_interval"], duration(hc.interval_ms))?;
    set(h, &["healthy_threshold"], int(hc.healthy_threshold.into()))?;
    set(
        h,
        &["unhealthy_threshold"],
        int(hc.unhealthy_threshold.into()),
    )?;
    set(
        h,
        &["http_health_check", "path"],
        Value::String(stage_health_path(cfg, stage)),
    )?;
    let o = &cfg.envoy.outlier;
    let od = at(c, &["outlier_detection"])?;
    set(od, &["consecutive_5xx"], int(o.consecutive_5xx.into()))?;
    set(
        od,
        &["consecutive_gateway_failure"],
        int(o.consecutive_gateway_failure.into()),
    )?;
    set(
        od,
        &["consecutive_local_origin_failure"],
        int(o.consecutive_local_origin_failure.into()),
    )?;
    set(od, &["interval"], duration(o.interval_ms))?;
    set(od, &["base_ejection_time"], duration(o.base_ejection_ms))?;
    set(
        od,
        &["max_ejection_percent"],
        int(o.max_ejection_percent.into()),
    )?;
    retry_budget(c, &cfg.envoy)
}
