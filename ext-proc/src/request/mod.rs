//! A request's path through fleetroute, in order: its headers read into a
//! key (the filter parsed the body), its tenant named by the configured
//! identity source, the pure decision (`route`), class admission
//! (`admission`), the tenant's limits on the chosen fleet ([`tenant`]), the
//! decision committed ([`place`]: load counted, the writer told), its load
//! held under a lease, and the reply ([`reply`]). The ext_proc stream
//! (`stream.rs`) is only its transport. The trace replay runs [`admit`] and
//! [`release`] on the same decisions with its simulated clock.

pub mod audit;
pub mod fallback;
#[cfg(test)]
mod fallback_tests;
pub mod place;
pub mod reply;
pub mod tenant;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingResponse};
use tracing::Instrument;

use crate::admission::class::BadPriority;
use crate::admission::judge::Refusal;
use crate::admission::{Admission, Judged, Retried, Ticket};
use crate::config::Condition;
use crate::decision_trace::DecisionSpan;
use crate::metrics::AdapterLoad;
use crate::route::{Decision, Reject, key::RouteKey};
use crate::state::lease::LeaseInput;
use crate::state::{Shared, Snapshot};
use crate::tenancy::identity::tenant as identify;
use place::{Placed, admit_and_commit, decide_on};

/// What the request path answers a request's headers with.
pub enum Answer<'a> {
    Now(Reply),
    /// Admission holds it: try again at its ticket's turns.
    Held(Held<'a>),
}

/// Envoy's answer and, when it routed the request, the nonce its lease is
/// held by (the stream's later messages report on that request).
pub struct Reply {
    pub response: ProcessingResponse,
    pub nonce: Option<u64>,
    /// The adapter registration to wait for before `response` is sent.
    pub load: Option<Box<crate::state::registrations::Pending>>,
}

impl From<ProcessingResponse> for Reply {
    fn from(response: ProcessingResponse) -> Self {
        Reply {
            response,
            nonce: None,
            load: None,
        }
    }
}

impl Reply {
    /// Waits for the adapter registration it needs, if any: the route as
    /// decided, with the wait, or the 503 that ends its lease.
    pub async fn loaded(self, shared: &Shared) -> (Reply, Option<Duration>) {
        let Some(p) = self.load.as_deref() else {
            return (self, None);
        };
        match shared.registrations.run(p).await {
            Ok(waited) => {
                loads(shared, p).inc(AdapterLoad::Ok);
                let waited = Some(waited).filter(|w| !w.is_zero());
                (Reply { load: None, ..self }, waited)
            }
            Err(why) => {
                loads(shared, p).inc(AdapterLoad::Failed);
                tracing::warn!(name = %p.name, %why, "adapter or model load failed");
                if let Some(n) = self.nonce {
                    shared.leases.end(n);
                }
                let (stage, name) = (p.stage.clone(), p.name.to_string());
                let reject = if p.is_model() {
                    Reject::ModelUnavailable {
                        stage,
                        model: name,
                        why,
                    }
                } else {
                    Reject::AdapterUnavailable {
                        stage,
                        adapter: name,
                        why,
                    }
                };
                (reply::reject(&reject).into(), None)
            }
        }
    }
}

/// The counter of loads of `p`'s kind.
fn loads<'a>(
    shared: &'a Shared,
    p: &crate::state::registrations::Pending,
) -> &'a crate::metrics::Results<AdapterLoad> {
    if p.is_model() {
        &shared.metrics.routing.model_loads
    } else {
        &shared.metrics.routing.adapter_loads
    }
}

/// A request admission holds, with its key for the next try.
pub struct Held<'a> {
    pub ticket: Ticket,
    pub key: RouteKey<'a>,
}

/// What class admission and the tenant's limits made of a decision.
pub enum Admitted<'a> {
    /// Committed: its load counts from now.
    Placed(Placed, Asked<'a>),
    /// The tenant's limits refused it on the chosen fleet (counted, audited).
    Rejected(Reject),
    /// Class admission refused it (audited).
    Overloaded {
        stage: String,
        refusal: Refusal,
    },
    Held(Held<'a>),
    /// The priority header names no class.
    Invalid(BadPriority),
}

/// What the client asked for that its answer needs after the key is spent.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    max_tokens: Option<u32>,
    model: Option<&'a str>,
}

impl<'a> Asked<'a> {
    fn of(key: &RouteKey<'a>) -> Self {
        Asked {
            max_tokens: key.max_tokens,
            model: key.model,
        }
    }
}

/// Decides one request from its headers: the fleet and replica, then
/// admission (its class on the stage, then its tenant's limits on the
/// chosen fleet), then its lease and reply.
pub async fn route_request<'a>(
    shared: &Shared,
    admission: &Admission,
    headers: &'a HttpHeaders,
    metadata: Option<&'a Metadata>,
) -> Answer<'a> {
    let Some(map) = headers.headers.as_ref() else {
        return Answer::Now(reply::pass().into());
    };
    if !crate::state::readiness::deciding(shared) {
        // Not ready yet: what Envoy does when no instance answers.
        shared.metrics.control.before_ready.inc();
        return Answer::Now(reply::pass().into());
    }
    let trace = DecisionSpan::start();
    let mut key = RouteKey::from_headers(map);
    if key.list_models {
        return Answer::Now(reply::model_list(&shared.snapshot().topo).into());
    }
    crate::route::stage::adapter(&shared.snapshot().topo, &mut key);
    // Who the tenant is, by the configured source only.
    let identity = &shared.snapshot().topo.identity;
    let typed = std::mem::take(&mut key.tenant);
    match identify(identity, typed, key.key_hash, metadata) {
        Ok(tenant) => key.tenant = tenant,
        Err(why) => {
            shared.metrics.tenants.unidentified.inc(why);
            let reject = Reject::Unidentified(why);
            trace.rejected(&reject);
            return Answer::Now(reply::reject(&reject).into());
        }
    }
    key.spread_anonymous(crate::clock::random_u64());
    let snapshot = shared.snapshot_full();
    let from = crate::route::stage::resolve(&snapshot.topo, key.model)
        .ok()
        .map(|(i, _)| i);
    // A prompt longer than the stage takes: a longer-context fallback first.
    if let Some(from) = from
        && crate::route::fallback::over_context(&snapshot.topo.stages[from], &key)
        && let Some((p, asked)) = fallback::fall_back(
            shared,
            admission,
            &snapshot,
            &key,
            map,
            from,
            Condition::Context,
        )
        .await
    {
        trace.routed(&p.snapshot, &p.decision);
        return Answer::Now(routed(shared, p, asked, Duration::ZERO));
    }
    let decided = {
        let _entered = trace.span().enter();
        crate::route::decide(&snapshot, &key, crate::clock::random_u64())
    };
    let decision = match decided {
        Ok(d) => d,
        Err(reject) => {
            let unhealthy = crate::route::fallback::condition_of(&reject);
            if let (Some(from), Some(c)) = (from, unhealthy)
                && let Some((p, asked)) =
                    fallback::fall_back(shared, admission, &snapshot, &key, map, from, c).await
            {
                trace.routed(&p.snapshot, &p.decision);
                return Answer::Now(routed(shared, p, asked, Duration::ZERO));
            }
            audit::rejected(shared, &snapshot, None, &key, &reject);
            trace.rejected(&reject);
            return Answer::Now(reply::reject(&reject).into());
        }
    };
    let now = crate::clock::now();
    let admitted = admit(shared, admission, snapshot, decision, key, map, now)
        .instrument(trace.span().clone())
        .await;
    match admitted {
        Admitted::Placed(p, asked) => {
            trace.routed(&p.snapshot, &p.decision);
            Answer::Now(routed(shared, p, asked, Duration::ZERO))
        }
        Admitted::Held(held) => Answer::Held(held),
        other => {
            if let Admitted::Rejected(reject) = &other {
                trace.rejected(reject);
            }
            Answer::Now(answer(other).into())
        }
    }
}

/// Class admission, then the tenant's limits on the chosen fleet, then the
/// commit: what a decision becomes.
pub async fn admit<'a>(
    shared: &Shared,
    admission: &Admission,
    snapshot: std::sync::Arc<Snapshot>,
    decision: Decision,
    key: RouteKey<'a>,
    headers: &HeaderMap,
    now: Instant,
) -> Admitted<'a> {
    match admission.judge(&shared.metrics, &snapshot, headers, &key, decision, now) {
        Judged::Admit(decision) => {
            if fallback::saturated_without_admission(&snapshot, &decision)
                && let Some(a) = saturated(shared, admission, &snapshot, &key, headers).await
            {
                return a;
            }
            commit(shared, snapshot, decision, key).await
        }
        Judged::Refuse { stage, refusal } => {
            match saturated(shared, admission, &snapshot, &key, headers).await {
                Some(a) => a,
                None => overloaded(shared, &key, stage, refusal),
            }
        }
        Judged::Hold(ticket) => Admitted::Held(Held { ticket, key }),
        Judged::Invalid(bad) => Admitted::Invalid(bad),
    }
}

/// The request's stage is saturated: placed on a `saturated` fallback of
/// the stage it named, if one takes it now.
async fn saturated<'a>(
    shared: &Shared,
    admission: &Admission,
    snapshot: &std::sync::Arc<Snapshot>,
    key: &RouteKey<'a>,
    headers: &HeaderMap,
) -> Option<Admitted<'a>> {
    let (from, _) = crate::route::stage::resolve(&snapshot.topo, key.model).ok()?;
    let reason = Condition::Saturated;
    let (p, asked) =
        fallback::fall_back(shared, admission, snapshot, key, headers, from, reason).await?;
    Some(Admitted::Placed(p, asked))
}

/// One turn of a held request, on a new decision: released, it meets its
/// tenant's limits like any other. `Err`: still held, with its ticket back.
#[allow(clippy::too_many_arguments)]
pub async fn release<'a>(
    shared: &Shared,
    admission: &Admission,
    ticket: Ticket,
    snapshot: std::sync::Arc<Snapshot>,
    decision: Decision,
    key: &mut RouteKey<'a>,
    headers: &HeaderMap,
    now: Instant,
) -> Result<Admitted<'a>, Ticket> {
    let stage = ticket.stage_name().to_string();
    match admission.retry(ticket, &snapshot, key, decision, now) {
        (_, Retried::Release(decision)) => {
            Ok(commit(shared, snapshot, decision, std::mem::take(key)).await)
        }
        (_, Retried::Refuse(refusal)) => Ok(
            match saturated(shared, admission, &snapshot, key, headers).await {
                Some(a) => a,
                None => overloaded(shared, key, stage, refusal),
            },
        ),
        (Some(t), Retried::Wait) => Err(t),
        (None, Retried::Wait) => unreachable!("a waiting request keeps its ticket"),
    }
}

async fn commit<'a>(
    shared: &Shared,
    snapshot: std::sync::Arc<Snapshot>,
    decision: Decision,
    key: RouteKey<'a>,
) -> Admitted<'a> {
    let asked = Asked::of(&key);
    match admit_and_commit(shared, snapshot, decision, key).await {
        Ok(p) => Admitted::Placed(p, asked),
        Err(reject) => Admitted::Rejected(reject),
    }
}

/// Class admission's refusal, written to the audit log like every answer.
fn overloaded<'a>(
    shared: &Shared,
    key: &RouteKey<'_>,
    stage: String,
    refusal: Refusal,
) -> Admitted<'a> {
    audit::audit_overloaded(shared, key, &stage, refusal.reason.as_str());
    Admitted::Overloaded { stage, refusal }
}

/// The immediate answer of a request that was not placed.
fn answer(a: Admitted<'_>) -> ProcessingResponse {
    match a {
        Admitted::Rejected(reject) => reply::reject(&reject),
        Admitted::Overloaded { stage, refusal } => reply::refused(&stage, &refusal),
        Admitted::Invalid(bad) => reply::bad_priority(&bad),
        Admitted::Placed(..) | Admitted::Held(_) => {
            unreachable!("placed and held requests are answered by their callers")
        }
    }
}

/// Holds a decision's load (and its tenant's charge) under its lease and
/// answers Envoy. `held`: how long admission held it.
fn routed(shared: &Shared, p: Placed, asked: Asked<'_>, held: Duration) -> Reply {
    // The access log entry ends the lease (and commits the tenant's charge)
    // by this nonce, which only fleetroute writes (a client can send any
    // x-request-id).
    let d = &p.decision;
    let input = LeaseInput {
        prefill_tokens: d.uncached_tokens + d.queued_tokens,
        max_tokens: asked.max_tokens,
        prefill_ms_per_k: p.snapshot.fleets[d.fleet].figures.latency,
        held,
    };
    let decided = p.decided();
    let response = reply::route(
        &p.snapshot.topo,
        &p.decision,
        p.nonce,
        &shared.instance,
        asked.model,
    );
    shared.hold_load(p.nonce, p.guard, decided, &input, Some(p.charge));
    Reply {
        response,
        nonce: Some(p.nonce),
        load: p.load,
    }
}

/// One turn of a held request: decide again and ask admission. `Err`:
/// still held, with its ticket back.
pub async fn attempt(
    shared: &Shared,
    admission: &Admission,
    key: &mut RouteKey<'_>,
    headers: &HeaderMap,
    ticket: Ticket,
) -> Result<Reply, Ticket> {
    let (snapshot, decision) = match decide_on(shared, key, crate::clock::random_u64()) {
        Ok(d) => d,
        // No ready replica any more (or the stage went away): answered as
        // any rejection; dropping the ticket leaves the queue.
        Err(reject) => return Ok(reply::reject(&reject).into()),
    };
    let now = crate::clock::now();
    let held = now.saturating_duration_since(ticket.arrived());
    match release(
        shared, admission, ticket, snapshot, decision, key, headers, now,
    )
    .await?
    {
        Admitted::Placed(p, asked) => Ok(routed(shared, p, asked, held)),
        other => Ok(answer(other).into()),
    }
}

/// A held request given up (its deadline, an eviction, a shutdown): placed
/// on a `saturated` fallback that takes it now, else its 429, audited.
pub async fn give_up(
    shared: &Shared,
    admission: &Admission,
    held: Held<'_>,
    headers: &HeaderMap,
    now: Instant,
) -> Reply {
    let Held { ticket, key } = held;
    let stage = ticket.stage_name().to_string();
    let waited = now.saturating_duration_since(ticket.arrived());
    let refusal = ticket.refuse(now);
    let snapshot = shared.snapshot_full();
    if let Some(Admitted::Placed(p, asked)) =
        saturated(shared, admission, &snapshot, &key, headers).await
    {
        return routed(shared, p, asked, waited);
    }
    answer(overloaded(shared, &key, stage, refusal)).into()
}
