//! The `envoy:` section: every bound must be set (0 would disable it).

use super::{Errors, MAX_SECONDS};
use crate::config::{
    EnvoyConfig, EnvoyOutlierConfig, OverloadConfig, RetriesConfig, TimeoutsConfig,
};

/// The smallest heap the overload manager may be given: Envoy with the Wasm
/// runtime idles at tens of MiB, so less would refuse every request.
const MIN_HEAP_BYTES: u64 = 64 << 20;
/// Longest timeout or interval, in milliseconds.
const MAX_MS: u64 = MAX_SECONDS * 1000;

pub(super) fn envoy(v: &EnvoyConfig, e: &mut Errors) {
    timeouts(&v.timeouts, e);
    overload(&v.overload, e);
    retries(&v.retries, e);
    outlier(&v.outlier, e);
}

fn timeouts(t: &TimeoutsConfig, e: &mut Errors) {
    for (field, ms) in [
        ("request_headers_ms", t.request_headers_ms),
        ("request_ms", t.request_ms),
        ("stream_idle_ms", t.stream_idle_ms),
        ("connection_idle_ms", t.connection_idle_ms),
        ("upstream_idle_ms", t.upstream_idle_ms),
        ("response_ms", t.response_ms),
    ] {
        e.in_range(format!("envoy.timeouts.{field}"), ms, 1..=MAX_MS);
    }
    e.ensure(
        t.upstream_idle_ms <= t.response_ms,
        "envoy.timeouts.upstream_idle_ms",
        "must not exceed envoy.timeouts.response_ms",
    );
}

fn overload(o: &OverloadConfig, e: &mut Errors) {
    e.ensure(
        o.max_heap_bytes >= MIN_HEAP_BYTES,
        "envoy.overload.max_heap_bytes",
        format!("must be at least {MIN_HEAP_BYTES} (64 MiB)"),
    );
    e.at_least("envoy.overload.max_connections", o.max_connections, 1);
}

fn retries(r: &RetriesConfig, e: &mut Errors) {
    e.ensure(
        r.budget_percent.is_finite() && r.budget_percent > 0.0 && r.budget_percent <= 100.0,
        "envoy.retries.budget_percent",
        format!("{} must be above 0 and at most 100", r.budget_percent),
    );
    e.at_least("envoy.retries.min_concurrency", r.min_concurrency, 1);
}

fn outlier(od: &EnvoyOutlierConfig, e: &mut Errors) {
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
        e.at_least(format!("envoy.outlier.{field}"), n, 1);
    }
    for (field, ms) in [
        ("interval_ms", od.interval_ms),
        ("base_ejection_ms", od.base_ejection_ms),
    ] {
        e.in_range(format!("envoy.outlier.{field}"), ms, 1..=MAX_MS);
    }
    e.ensure(
        od.max_ejection_percent <= 100,
        "envoy.outlier.max_ejection_percent",
        "must be at most 100",
    );
}
