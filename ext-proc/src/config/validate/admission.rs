//! `admission:` and `stages[].admission:`: a priority header a client may
//! send and ext-proc may read, objectives and queues in range.

use super::Errors;
use crate::config::{AdmissionConfig, MAX_QUEUE, MAX_WAIT_CAP_MS, Priority, StageAdmission};

/// Headers that would carry credentials to ext-proc, or that the router
/// already reads for something else.
const NOT_A_PRIORITY_HEADER: &[&str] = &["authorization", "cookie", "x-request-id"];

pub(super) fn admission(a: &AdmissionConfig, e: &mut Errors) {
    if let Some(h) = &a.priority_header {
        let p = "admission.priority_header";
        if let Err(why) = super::client_header_name(h) {
            e.push(p, why);
        } else if NOT_A_PRIORITY_HEADER.contains(&h.as_str()) {
            e.push(p, format!("'{h}' cannot name the priority class"));
        }
    }
    e.in_range("admission.max_wait_ms", a.max_wait_ms, 1..=MAX_WAIT_CAP_MS);
}

pub(super) fn stage(a: &StageAdmission, p: &str, e: &mut Errors) {
    for c in Priority::ALL {
        if let Some(v) = a.ttft_ms.get(c) {
            e.ensure(
                v.is_finite() && (1.0..=600_000.0).contains(&v),
                format!("{p}.ttft_ms.{}", c.as_str()),
                format!("{v} must be between 1 and 600000 ms"),
            );
        }
        e.ensure(
            a.queue.get(c) <= MAX_QUEUE,
            format!("{p}.queue.{}", c.as_str()),
            format!("{} is above {MAX_QUEUE}", a.queue.get(c)),
        );
    }
    // A higher class with a looser objective than a lower one would let the
    // lower class fill replicas past what the higher one tolerates.
    let mut tighter: Option<(Priority, f64)> = None;
    for c in Priority::ALL {
        if let Some(v) = a.ttft_ms.get(c) {
            if let Some((h, hv)) = tighter
                && v < hv
            {
                e.push(
                    format!("{p}.ttft_ms.{}", c.as_str()),
                    format!(
                        "{v} is tighter than {} ({hv}): a lower class may not have a tighter objective",
                        h.as_str()
                    ),
                );
            }
            tighter = Some((c, v));
        }
    }
    e.ensure(
        a.headroom.is_finite() && (0.0..1.0).contains(&a.headroom),
        format!("{p}.headroom"),
        "must be at least 0 and below 1",
    );
    e.in_range(format!("{p}.retry_after_s"), a.retry_after_s, 1..=3600);
}
