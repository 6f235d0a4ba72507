//! The access log and the decision leases it ends.

use prometheus_client::metrics::gauge::Gauge;

use super::labels::{ResultGauges, Results, label_values};
use super::registrar::Registrar;

label_values! {
    Entry {
        Observed => "observed",
        Untagged => "untagged",
        Late => "late",
        Foreign => "foreign",
    }
}

label_values! {
    /// How a decision's load lease ended.
    Released {
        Logged => "logged",
        Expired => "expired",
        Reconciled => "reconciled",
        Evicted => "evicted",
    }
}

label_values! {
    /// How a lease's prefill share ended.
    PrefillEnded {
        FirstByte => "first_byte",
        Estimate => "estimate",
        RequestEnd => "request_end",
    }
}

label_values! {
    /// Envoy's own access log counters.
    EnvoyLog {
        Written => "written",
        Dropped => "dropped",
    }
}

pub struct AccessLog {
    pub entries: Results<Entry>,
    /// 1 while access log entries are due and none arrive.
    pub missing: Gauge,
    pub leases_released: Results<Released>,
    pub prefill_ended: Results<PrefillEnded>,
    pub leases_held: Gauge,
    pub envoy: ResultGauges<EnvoyLog>,
}

impl AccessLog {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = AccessLog {
            entries: Results::default(),
            missing: Gauge::default(),
            leases_released: Results::default(),
            prefill_ended: Results::default(),
            leases_held: Gauge::default(),
            envoy: ResultGauges::default(),
        };
        r.results(
            "access_log_entries",
            "Envoy access log entries received, by result: observed, untagged (no decision: fail-open or rejected), late (its lease had already ended), foreign (another instance decided it: forwarded to it, or applied here by names when instances share nothing)",
            &m.entries,
        );
        r.add(
            "access_log_missing",
            "1 while access log entries are due and none arrive: over the last 5 s leases expired unlogged (or Envoy wrote entries, with --envoy-admin) and none was received",
            m.missing.clone(),
        );
        r.results(
            "leases_released",
            "Decision load leases released, by how: logged (the access log reported the end), expired (its bound passed: the entry was lost or late), reconciled (the engine reported fewer requests), evicted (too many held)",
            &m.leases_released,
        );
        r.results(
            "prefill_ended",
            "Prefill shares of decision leases ended, by how: first_byte (Envoy reported the response's first body byte), estimate (its estimated prefill passed without that report), request_end (the request ended first)",
            &m.prefill_ended,
        );
        r.add(
            "leases_held",
            "Decision load leases currently held",
            m.leases_held.clone(),
        );
        r.result_gauges(
            "envoy_access_log",
            "Envoy's own access log counters, scraped from its admin /stats (logs_written, logs_dropped), when --envoy-admin is set",
            &m.envoy,
        );
        m
    }
}
