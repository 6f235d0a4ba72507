//! Per-tenant series (bounded: the top tenants and pinned ones, the rest as
//! `other`), refusals, identity failures, the shared counters and the audit log.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::labels::{Results, Values, label_values};
use super::registrar::Registrar;
use crate::tenancy::identity::Unidentified;

/// A tenant with its own series (the top tenants by tokens and pinned
/// ones), or `other` for all the rest.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantRefusal {
    pub tenant: String,
    /// max_requests_in_flight | max_tokens_in_flight | tokens_per_minute | budget
    pub limit: &'static str,
}

label_values! {
    /// The shared tenant counters' events (`tenants_redis`).
    SharedCounters {
        Refills => "refills",
        Errors => "errors",
        FallbackDecisions => "fallback_decisions",
        CaughtUpTokens => "caught_up_tokens",
        RestoredTokens => "restored_tokens",
    }
}

label_values! {
    Audit {
        Written => "written",
        DroppedFull => "dropped_full",
        DroppedWrite => "dropped_write",
    }
}

impl Values for Unidentified {
    const ALL: &'static [Self] = &[
        Unidentified::MissingKey,
        Unidentified::UnknownKey,
        Unidentified::NoClaim,
    ];
    fn as_str(self) -> &'static str {
        self.code()
    }
}

pub struct Tenants {
    pub requests: Family<TenantLabel, Counter>,
    pub tokens: Family<TenantLabel, Counter>,
    pub spend: Family<TenantLabel, Counter<f64, AtomicU64>>,
    pub refused: Family<TenantRefusal, Counter>,
    pub in_flight: Family<TenantLabel, Gauge>,
    pub tracked: Gauge,
    pub shared: Results<SharedCounters>,
    pub audit: Results<Audit>,
    /// Requests refused 401: the identity source named no tenant.
    pub unidentified: Results<Unidentified>,
}

impl Tenants {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = Tenants {
            requests: Family::default(),
            tokens: Family::default(),
            spend: Family::default(),
            refused: Family::default(),
            in_flight: Family::default(),
            tracked: Gauge::default(),
            shared: Results::default(),
            audit: Results::default(),
            unidentified: Results::default(),
        };
        r.results(
            "unidentified",
            "Requests answered 401 because tenants.identity named no tenant, by result: missing_api_key, invalid_api_key (not among the keys), tenant_claim_missing (no verified token, or no tenant claim in it)",
            &m.unidentified,
        );
        r.add(
            "tenant_requests",
            "Requests admitted, by tenant (the top tenants by tokens and pinned ones; the rest as other)",
            m.requests.clone(),
        );
        r.add(
            "tenant_tokens",
            "Prompt plus completion tokens charged, by tenant (an expired lease's estimate until its late entry corrects it; corrections down are not subtracted)",
            m.tokens.clone(),
        );
        r.add(
            "tenant_spend_usd",
            "Cost charged, by tenant, at the serving fleet's price",
            m.spend.clone(),
        );
        r.add(
            "tenant_refused",
            "Requests refused with a 429, by tenant and the limit that refused them",
            m.refused.clone(),
        );
        r.add(
            "tenant_requests_in_flight",
            "Admitted requests not yet ended, by tenant",
            m.in_flight.clone(),
        );
        r.add(
            "tenants_tracked",
            "Tenants counted under their own id (at most 65536; the rest share other)",
            m.tracked.clone(),
        );
        r.results(
            "tenant_redis",
            "Shared tenant counters (tenants_redis): refills (slice claims), errors (failed round trips), fallback_decisions (decisions on the limit / instances share while Redis was unreachable), caught_up_tokens (spend reported after an outage), restored_tokens (this instance's claims a Redis had lost and learned back)",
            &m.shared,
        );
        r.results(
            "audit_records",
            "Audit log records: written, dropped_full (queue full), dropped_write (write failed, e.g. a full disk)",
            &m.audit,
        );
        m
    }
}
