//! The Prometheus metrics of `/metrics`: typed, registered once, labelled only
//! by names from the config (stage, fleet, replica address) and small fixed
//! sets (class, kind, state, source, result), so cardinality stays bounded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::membership::{CounterSnapshot, SourceCounters};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageFleet {
    pub stage: String,
    pub fleet: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageFleetArm {
    pub stage: String,
    pub fleet: String,
    /// `none` outside an A/B test, else `control` or `variant`.
    pub arm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub stage: String,
    pub fleet: String,
    pub arm: String,
    /// ok | client_error | server_error | ended_early | no_response
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Tokens {
    pub stage: String,
    pub fleet: String,
    /// prompt | completion | cached (engine-reported) | predicted_cached
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HitRate {
    pub stage: String,
    pub fleet: String,
    /// predicted (the router's prefix index) | engine (reported cached tokens)
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Rejected {
    pub stage: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetLabel {
    pub fleet: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaStates {
    pub fleet: String,
    /// ready | unhealthy | warming | ejected | draining | leaving | unknown
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Replica {
    pub fleet: String,
    pub replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

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
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageClass {
    pub stage: String,
    /// critical | standard | sheddable
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionVerdict {
    pub stage: String,
    pub class: String,
    /// See `ADMISSION_VERDICTS`.
    pub verdict: String,
}

/// What admission did with a request: routed at once or after a hold;
/// refused because the stage is saturated, because the capacity is kept for
/// a higher class, because its class queue was full (or a lighter tenant
/// took its place), because even waiting could not meet its objective, or
/// because its hold ran out; or the client left while it was held.
pub const ADMISSION_VERDICTS: [&str; 8] = [
    "admitted",
    "admitted_after_wait",
    "saturated",
    "reserved",
    "queue_full",
    "objective",
    "timed_out",
    "cancelled",
];

#[derive(Clone)]
pub struct Buckets(fn() -> Histogram);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        (self.0)()
    }
}

fn seconds() -> Histogram {
    // 5 ms to ~164 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

fn wait_seconds() -> Histogram {
    // 1 ms to ~33 s: holds are bounded by admission.max_wait_ms (30 s at most).
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

type GaugeF = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    /// Every family as registered: (name without the prefix, type, help).
    catalog: Vec<(&'static str, &'static str, &'static str)>,
    pub requests: Family<StageFleetArm, Counter>,
    pub responses: Family<Outcome, Counter>,
    pub rejected: Family<Rejected, Counter>,
    pub shadowed: Family<StageFleet, Counter>,
    pub ttft: Family<StageFleet, Histogram, Buckets>,
    pub duration: Family<StageFleet, Histogram, Buckets>,
    pub tokens: Family<Tokens, Counter>,
    pub traffic_share: Family<StageFleet, GaugeF>,
    pub hit_rate: Family<HitRate, GaugeF>,
    pub cost_gpu_hour: Family<FleetLabel, GaugeF>,
    pub cost_mtok: Family<FleetLabel, GaugeF>,
    pub tokens_per_sec: Family<FleetLabel, GaugeF>,
    pub replicas: Family<ReplicaStates, Gauge>,
    pub utilisation: Family<FleetLabel, GaugeF>,
    pub saturated: Family<FleetLabel, Gauge>,
    pub desired: Family<FleetLabel, Gauge>,
    pub inflight: Family<Replica, Gauge>,
    pub queued_tokens: Family<Replica, Gauge>,
    pub reloads: Family<ResultLabel, Counter>,
    pub admin_changes: Counter,
    pub events_dropped: Counter,
    pub access_log_entries: Family<ResultLabel, Counter>,
    pub leases_released: Family<ResultLabel, Counter>,
    pub prefill_ended: Family<ResultLabel, Counter>,
    pub leases_held: Gauge,
    /// 1 while access log entries are due and none arrive.
    pub access_log_missing: Gauge,
    pub envoy_access_log: Family<ResultLabel, Gauge>,
    pub eds_streams: Gauge,
    pub eds_requests: Family<ResultLabel, Counter>,
    pub eds_updates: Counter,
    /// gRPC calls refused for want of the token, by result.
    pub grpc_refused: Family<ResultLabel, Counter>,
    /// Requests refused 401: the identity source named no tenant.
    pub unidentified: Family<ResultLabel, Counter>,
    /// Routing calls let through undecided before the instance was ready.
    pub before_ready: Counter,
    /// Prefix-index changes shared with other instances (`peers`).
    pub peer_updates: Family<ResultLabel, Counter>,
    /// Bytes written to and read from the peer link.
    pub peer_bytes: Family<ResultLabel, Counter>,
    /// 1 while the peer link (Redis) answers, 0 while this instance is alone.
    pub peers_up: Gauge,
    /// Access log entries of other instances' decisions, by what became of them.
    pub access_log_forwards: Family<ResultLabel, Counter>,
    /// Members per fleet (leaving ones not counted).
    pub fleet_members: Family<FleetLabel, Gauge>,
    /// Members a source lists beyond the fleet's slots.
    pub members_ignored: Family<FleetLabel, Gauge>,
    /// The membership sources' own counters, read at each scrape.
    pub sources: Arc<SourceMetrics>,
    pub tenant_requests: Family<TenantLabel, Counter>,
    pub tenant_tokens: Family<TenantLabel, Counter>,
    pub tenant_spend: Family<TenantLabel, Counter<f64, AtomicU64>>,
    pub tenant_refused: Family<TenantRefusal, Counter>,
    pub tenant_in_flight: Family<TenantLabel, Gauge>,
    pub tenants_tracked: Gauge,
    pub tenant_redis: Family<ResultLabel, Counter>,
    pub audit_records: Family<ResultLabel, Counter>,
    /// Load reports exchanged with other instances, by result.
    pub peer_load_reports: Family<ResultLabel, Counter>,
    /// Other instances whose load reports count here now.
    pub peer_load_peers: Gauge,
    pub admission_verdicts: Family<AdmissionVerdict, Counter>,
    pub admission_queue_depth: Family<StageClass, Gauge>,
    pub admission_wait: Family<StageClass, Histogram, Buckets>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers a family and notes it in the catalog (the generated metrics
/// reference lists every family, with or without series).
fn register<M>(
    r: &mut Registry,
    catalog: &mut Vec<(&'static str, &'static str, &'static str)>,
    name: &'static str,
    help: &'static str,
    metric: M,
) where
    M: prometheus_client::registry::Metric + prometheus_client::metrics::TypedMetric,
{
    catalog.push((name, M::TYPE.as_str(), help));
    r.register(name, help, metric);
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("fleetroute");
        let mut catalog = Vec::new();
        let m = Metrics {
            requests: Family::default(),
            responses: Family::default(),
            rejected: Family::default(),
            shadowed: Family::default(),
            ttft: Family::new_with_constructor(Buckets(seconds)),
            duration: Family::new_with_constructor(Buckets(seconds)),
            tokens: Family::default(),
            traffic_share: Family::default(),
            hit_rate: Family::default(),
            cost_gpu_hour: Family::default(),
            cost_mtok: Family::default(),
            tokens_per_sec: Family::default(),
            replicas: Family::default(),
            utilisation: Family::default(),
            saturated: Family::default(),
            desired: Family::default(),
            inflight: Family::default(),
            queued_tokens: Family::default(),
            reloads: Family::default(),
            admin_changes: Counter::default(),
            events_dropped: Counter::default(),
            access_log_entries: Family::default(),
            leases_released: Family::default(),
            prefill_ended: Family::default(),
            leases_held: Gauge::default(),
            access_log_missing: Gauge::default(),
            envoy_access_log: Family::default(),
            eds_streams: Gauge::default(),
            eds_requests: Family::default(),
            grpc_refused: Family::default(),
            unidentified: Family::default(),
            before_ready: Counter::default(),
            eds_updates: Counter::default(),
            peer_updates: Family::default(),
            peer_bytes: Family::default(),
            peers_up: Gauge::default(),
            access_log_forwards: Family::default(),
            fleet_members: Family::default(),
            members_ignored: Family::default(),
            sources: Arc::default(),
            tenant_requests: Family::default(),
            tenant_tokens: Family::default(),
            tenant_spend: Family::default(),
            tenant_refused: Family::default(),
            tenant_in_flight: Family::default(),
            tenants_tracked: Gauge::default(),
            tenant_redis: Family::default(),
            audit_records: Family::default(),
            peer_load_reports: Family::default(),
            peer_load_peers: Gauge::default(),
            admission_verdicts: Family::default(),
            admission_queue_depth: Family::default(),
            admission_wait: Family::new_with_constructor(Buckets(wait_seconds)),
            registry: Registry::default(),
            catalog: Vec::new(),
        };
        register(
            &mut r,
            &mut catalog,
            "requests",
            "Requests routed, by stage, fleet and A/B arm",
            m.requests.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "responses",
            "Responses observed, by outcome class",
            m.responses.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "rejected",
            "Requests answered by fleetroute with an error, by reason",
            m.rejected.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "shadow_requests",
            "Requests mirrored to a shadow fleet (never served to clients)",
            m.shadowed.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "time_to_first_token_seconds",
            "Time to first token of streamed responses",
            m.ttft.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "request_duration_seconds",
            "Time from routing to the end of the response",
            m.duration.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tokens",
            "Tokens by kind: prompt, completion, cached (engine-reported), predicted_cached",
            m.tokens.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "traffic_share",
            "Share of the stage's routed requests (decaying, ~30 s)",
            m.traffic_share.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "kv_cache_hit_rate",
            "Prompt tokens served from KV cache, predicted and engine-reported (decaying, ~30 s)",
            m.hit_rate.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "cost_usd_per_gpu_hour",
            "Configured price per GPU-hour",
            m.cost_gpu_hour.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "cost_usd_per_million_tokens",
            "Provider price, or GPU-hour price over measured throughput",
            m.cost_mtok.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "fleet_tokens_per_second",
            "Tokens (prompt + completion) the fleet served per second over the alarms window",
            m.tokens_per_sec.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "replicas",
            "Replicas by state",
            m.replicas.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "fleet_utilisation",
            "Highest of in-flight, queue and KV-usage ratios to capacity",
            m.utilisation.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "fleet_saturated",
            "1 while the fleet is saturated (priority spills past it)",
            m.saturated.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "desired_replicas",
            "Replicas the fleet should run, for an autoscaler",
            m.desired.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "replica_inflight",
            "Requests in flight per replica",
            m.inflight.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "replica_queued_tokens",
            "Prefill tokens routed and not yet answered, per replica",
            m.queued_tokens.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "config_reloads",
            "Config reloads by result",
            m.reloads.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "admin_changes",
            "Changes applied through the admin API",
            m.admin_changes.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "events_dropped",
            "State events dropped because the writer was behind",
            m.events_dropped.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "access_log_entries",
            "Envoy access log entries received, by result: observed, untagged (no decision: fail-open or rejected), late (its lease had already ended), foreign (another instance decided it: forwarded to it, or applied here by names when instances share nothing)",
            m.access_log_entries.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "access_log_missing",
            "1 while access log entries are due and none arrive: over the last 5 s leases expired unlogged (or Envoy wrote entries, with --envoy-admin) and none was received",
            m.access_log_missing.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "leases_released",
            "Decision load leases released, by how: logged (the access log reported the end), expired (its bound passed: the entry was lost or late), reconciled (the engine reported fewer requests), evicted (too many held)",
            m.leases_released.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "prefill_ended",
            "Prefill shares of decision leases ended, by how: first_byte (Envoy reported the response's first body byte), estimate (its estimated prefill passed without that report), request_end (the request ended first)",
            m.prefill_ended.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "leases_held",
            "Decision load leases currently held",
            m.leases_held.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "envoy_access_log",
            "Envoy's own access log counters, scraped from its admin /stats (logs_written, logs_dropped), when --envoy-admin is set",
            m.envoy_access_log.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "eds_streams",
            "EDS streams open (one per Envoy and config source)",
            m.eds_streams.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "eds_requests",
            "EDS requests from Envoy, by result: subscribe (a stream's first), ack, nack (Envoy refused a response and kept its endpoints), stale (answers an older response), unsupported (another type on ADS, ignored), invalid (ended the stream), silent (no request within 10 s: ended), refused (too many streams, or too many from one peer address)",
            m.eds_requests.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "grpc_refused",
            "gRPC calls refused before any service saw them (grpc.token_file), by result: missing (no authorization), wrong (another token)",
            m.grpc_refused.clone(),
        );
        for result in ["missing", "wrong"] {
            drop(m.grpc_refused.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        for result in ["missing_api_key", "invalid_api_key", "tenant_claim_missing"] {
            drop(m.unidentified.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        register(
            &mut r,
            &mut catalog,
            "before_ready",
            "Routing calls let through undecided (to Envoy's fail-open routes) because this instance was not ready yet: Envoy called it before its health checks saw it ready",
            m.before_ready.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "unidentified",
            "Requests answered 401 because tenants.identity named no tenant, by result: missing_api_key, invalid_api_key (not among the keys), tenant_claim_missing (no verified token, or no tenant claim in it)",
            m.unidentified.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "eds_updates",
            "Changes of the served endpoint set (membership, locality weights or health status of some cluster)",
            m.eds_updates.clone(),
        );
        for result in [
            "subscribe",
            "ack",
            "nack",
            "stale",
            "unsupported",
            "invalid",
            "silent",
            "refused",
        ] {
            drop(m.eds_requests.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        register(
            &mut r,
            &mut catalog,
            "peer_prefix_updates",
            "Prefix-index changes shared between instances, by result: queued (for other instances), dropped (outbox or link buffer full), sent, applied (another instance's, applied here), unknown (names no fleet or replica here), bad (an undecodable batch)",
            m.peer_updates.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "peer_bytes",
            "Bytes this instance wrote to (sent) and read from (received) the peer link",
            m.peer_bytes.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "peers_up",
            "1 while the peer link (Redis) answers; 0 while this instance routes alone",
            m.peers_up.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "access_log_forwards",
            "Access log entries of decisions another instance made, by result: sent (to their owner), dropped (link buffer full or down too long), received (from another instance, for this one's decisions), bad (undecodable)",
            m.access_log_forwards.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "fleet_members",
            "Members of the fleet in routing (joined, not leaving), from its endpoints, DNS or Kubernetes",
            m.fleet_members.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "fleet_members_ignored",
            "Members a fleet's source lists beyond its 64 slots, ignored until a slot frees",
            m.members_ignored.clone(),
        );
        r.register_collector(Box::new(m.sources.clone()));
        register(
            &mut r,
            &mut catalog,
            "tenant_requests",
            "Requests admitted, by tenant (the top tenants by tokens and pinned ones; the rest as other)",
            m.tenant_requests.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tenant_tokens",
            "Prompt plus completion tokens charged, by tenant (an expired lease's estimate until its late entry corrects it; corrections down are not subtracted)",
            m.tenant_tokens.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tenant_spend_usd",
            "Cost charged, by tenant, at the serving fleet's price",
            m.tenant_spend.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tenant_refused",
            "Requests refused with a 429, by tenant and the limit that refused them",
            m.tenant_refused.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tenant_requests_in_flight",
            "Admitted requests not yet ended, by tenant",
            m.tenant_in_flight.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tenants_tracked",
            "Tenants counted under their own id (at most 65536; the rest share other)",
            m.tenants_tracked.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "tenant_redis",
            "Shared tenant counters (tenants_redis): refills (slice claims), errors (failed round trips), fallback_decisions (decisions on the limit / instances share while Redis was unreachable), caught_up_tokens (spend reported after an outage), restored_tokens (this instance's claims a Redis had lost and learned back)",
            m.tenant_redis.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "audit_records",
            "Audit log records: written, dropped_full (queue full), dropped_write (write failed, e.g. a full disk)",
            m.audit_records.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "peer_load_reports",
            "Per-replica load reports shared between instances, by result: sent (this instance's), received (another's, counted here), stale (written longer than peers.load_stale_ms before it was read), ignored (from more peers than are kept), unknown (names a fleet or replica not here), truncated (this instance's, cut to max_batch_bytes), bad (undecodable)",
            m.peer_load_reports.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "peer_load_peers",
            "Other instances whose load reports count in this instance's decisions now (0: it routes on its own load)",
            m.peer_load_peers.clone(),
        );
        for result in [
            "sent",
            "received",
            "stale",
            "ignored",
            "unknown",
            "truncated",
            "bad",
        ] {
            drop(m.peer_load_reports.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        register(
            &mut r,
            &mut catalog,
            "admission_verdicts",
            "Admission verdicts in stages with admission, by class: admitted, admitted_after_wait, saturated, reserved, queue_full, objective, timed_out, cancelled",
            m.admission_verdicts.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "admission_queue_depth",
            "Requests held by admission now, by stage and class",
            m.admission_queue_depth.clone(),
        );
        register(
            &mut r,
            &mut catalog,
            "admission_wait_seconds",
            "Time held requests waited, whatever became of them",
            m.admission_wait.clone(),
        );
        for result in ["observed", "untagged", "late", "foreign"] {
            drop(m.access_log_entries.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        for result in ["queued", "dropped", "sent", "applied", "unknown", "bad"] {
            drop(m.peer_updates.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        for result in ["sent", "dropped", "received", "bad"] {
            drop(m.access_log_forwards.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        for result in ["sent", "received"] {
            drop(m.peer_bytes.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        // At zero until tenants_redis / audit are configured, so their
        // dashboard panel always has series.
        for result in [
            "refills",
            "errors",
            "fallback_decisions",
            "caught_up_tokens",
            "restored_tokens",
        ] {
            drop(m.tenant_redis.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        for result in ["written", "dropped_full", "dropped_write"] {
            drop(m.audit_records.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        Metrics {
            registry: r,
            catalog,
            ..m
        }
    }

    /// Counts one prefix-index change shared between instances.
    pub fn peer_update(&self, result: &str) {
        self.peer_updates
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts a labelled event of a result family.
    pub fn count(family: &Family<ResultLabel, Counter>, result: &str, n: u64) {
        family
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc_by(n);
    }

    /// A request refused 401 for want of a tenant (`code`: why).
    pub fn count_unidentified(&self, code: &str) {
        self.unidentified
            .get_or_create(&ResultLabel {
                result: code.into(),
            })
            .inc();
    }

    /// Every family: (name with its prefix and, for a counter, `_total`,
    /// type, help), sorted by name.
    pub fn catalog(&self) -> Vec<(String, &'static str, &'static str)> {
        let mut out: Vec<_> = self
            .catalog
            .iter()
            .map(|&(name, kind, help)| {
                let suffix = if kind == "counter" { "_total" } else { "" };
                (format!("fleetroute_{name}{suffix}"), kind, help)
            })
            .collect();
        out.sort();
        out
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encode to string");
        out
    }

    /// Creates every counter series the config can produce, at zero, so the
    /// first event of each shows in `rate()` and `increase()` (a series that
    /// appears already at 1 does not).
    pub fn prime(&self, topo: &crate::topology::Topology) {
        for result in ["applied", "refused"] {
            drop(self.reloads.get_or_create(&ResultLabel {
                result: result.into(),
            }));
        }
        for reason in ["model_required", "model_not_found"] {
            drop(self.rejected.get_or_create(&Rejected {
                stage: String::new(),
                reason: reason.into(),
            }));
        }
        for stage in &topo.stages {
            let limits = crate::tenancy::ledger::Limit::ALL.map(|l| l.as_str());
            for reason in [
                "no_ready_replica",
                "residency_unsatisfiable",
                "no_acceptable_fleet",
            ]
            .into_iter()
            .chain(limits)
            {
                drop(self.rejected.get_or_create(&Rejected {
                    stage: stage.name.clone(),
                    reason: reason.into(),
                }));
            }
            let arms: &[&str] = if stage.experiment.ab.is_some() {
                &["none", "control", "variant"]
            } else {
                &["none"]
            };
            for &f in &stage.fleets {
                let fleet = topo.fleets[f].name.clone();
                for arm in arms {
                    let sfa = StageFleetArm {
                        stage: stage.name.clone(),
                        fleet: fleet.clone(),
                        arm: arm.to_string(),
                    };
                    drop(self.requests.get_or_create(&sfa));
                    for class in [
                        "ok",
                        "client_error",
                        "server_error",
                        "ended_early",
                        "no_response",
                    ] {
                        drop(self.responses.get_or_create(&Outcome {
                            stage: stage.name.clone(),
                            fleet: fleet.clone(),
                            arm: arm.to_string(),
                            class: class.into(),
                        }));
                    }
                }
            }
            if stage.admission.is_some() {
                for class in crate::config::Priority::ALL {
                    let sc = StageClass {
                        stage: stage.name.clone(),
                        class: class.as_str().into(),
                    };
                    drop(self.admission_queue_depth.get_or_create(&sc));
                    drop(self.admission_wait.get_or_create(&sc));
                    for verdict in ADMISSION_VERDICTS {
                        drop(self.admission_verdicts.get_or_create(&AdmissionVerdict {
                            stage: stage.name.clone(),
                            class: class.as_str().into(),
                            verdict: verdict.into(),
                        }));
                    }
                }
            }
            if let Some((f, _)) = stage.experiment.shadow {
                let sf = StageFleet {
                    stage: stage.name.clone(),
                    fleet: topo.fleets[f].name.clone(),
                };
                drop(self.shadowed.get_or_create(&sf));
            }
        }
    }

    /// Forgets every config-labelled series (counters restart from zero,
    /// which Prometheus reads as a restart); used when names change.
    pub fn clear_config_series(&self) {
        self.requests.clear();
        self.responses.clear();
        self.rejected.clear();
        self.shadowed.clear();
        self.ttft.clear();
        self.duration.clear();
        self.tokens.clear();
        self.traffic_share.clear();
        self.hit_rate.clear();
        self.cost_gpu_hour.clear();
        self.cost_mtok.clear();
        self.tokens_per_sec.clear();
        self.replicas.clear();
        self.utilisation.clear();
        self.saturated.clear();
        self.desired.clear();
        self.inflight.clear();
        self.queued_tokens.clear();
        self.fleet_members.clear();
        self.members_ignored.clear();
        self.admission_verdicts.clear();
        self.admission_queue_depth.clear();
        self.admission_wait.clear();
    }
}

/// `fleetroute_membership_{updates,failures,empty_answers,relists}_total{fleet}`:
/// each running source's [`SourceCounters`], read live at every scrape (the
/// sources count without knowing about Prometheus). One entry per fleet with
/// a `dns` or `kubernetes` source, kept across source restarts.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    fleets: Mutex<BTreeMap<String, Arc<SourceCounters>>>,
}

impl SourceMetrics {
    /// The counters of `fleet`'s source, created on first use.
    pub fn counters(&self, fleet: &str) -> Arc<SourceCounters> {
        let mut map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(fleet.to_string()).or_default().clone()
    }

    /// Lookups or watch calls of `fleet`'s source that failed so far (0 for
    /// a fleet with no source).
    pub fn failures(&self, fleet: &str) -> u64 {
        let map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.get(fleet)
            .map_or(0, |c| c.failures.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Forgets the fleets no longer served by a source.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|f, _| keep(f));
    }
}

impl Collector for SourceMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows: Vec<(String, CounterSnapshot)> = {
            let map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
            map.iter().map(|(f, c)| (f.clone(), c.snapshot())).collect()
        };
        type Read = fn(&CounterSnapshot) -> u64;
        let families: [(&str, &str, Read); 4] = [
            (
                "membership_updates",
                "Member sets a fleet's source published because membership changed",
                |c| c.updates,
            ),
            (
                "membership_failures",
                "Failed lookups or watch calls of a fleet's source (the last good set was kept)",
                |c| c.failures,
            ),
            (
                "membership_empty_answers",
                "Empty DNS answers (the fleet empties on the second in a row)",
                |c| c.empty_answers,
            ),
            (
                "membership_relists",
                "Full re-lists of a Kubernetes source (the first list, and after 410 Gone or a lost watch)",
                |c| c.relists,
            ),
        ];
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (fleet, c) in &rows {
                let label = FleetLabel {
                    fleet: fleet.clone(),
                };
                ConstCounter::new(value(c)).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}
