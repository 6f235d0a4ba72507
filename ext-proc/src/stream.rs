//! The ext_proc gRPC service: the routing filter's streams. A request's
//! headers get a decision; a routed request's response headers, which the
//! rename root holds until the first body byte, end its replica's prefill
//! share. Outcomes come back through the access log (`observe::access_log`),
//! not through ext_proc.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse, processing_request::Request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::Instrument;

use crate::admission::judge::Refusal;
use crate::admission::{Admission, Judged, Retried, Ticket, reply};
use crate::decision_trace::DecisionSpan;
use crate::route::place::{Placed, admit_and_commit, audit_overloaded, decide_on};
use crate::route::{Reject, key::RouteKey, mutation};
use crate::shutdown::Phase;
use crate::state::Shared;
use crate::state::lease::LeaseInput;
use crate::stream_limit::FIRST_MESSAGE;
use crate::tenancy::identity::tenant;

pub struct Service {
    shared: Arc<Shared>,
    admission: Arc<Admission>,
}

impl Service {
    pub fn new(shared: Arc<Shared>) -> Self {
        Service {
            shared,
            admission: Arc::new(Admission::new(Instant::now())),
        }
    }
}

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
}

impl From<ProcessingResponse> for Reply {
    fn from(response: ProcessingResponse) -> Self {
        Reply {
            response,
            nonce: None,
        }
    }
}

pub struct Held<'a> {
    pub ticket: Ticket,
    key: RouteKey<'a>,
}

/// Decides one request from its headers: the fleet and replica, then
/// admission (its class on the stage, then its tenant's limits on the
/// chosen fleet).
pub async fn route_request<'a>(
    shared: &Shared,
    admission: &Admission,
    headers: &'a HttpHeaders,
    metadata: Option<&'a Metadata>,
) -> Answer<'a> {
    let Some(map) = headers.headers.as_ref() else {
        return Answer::Now(mutation::pass().into());
    };
    if !crate::state::readiness::deciding(shared) {
        // Not ready yet: what Envoy does when no instance answers.
        shared.metrics.control.before_ready.inc();
        return Answer::Now(mutation::pass().into());
    }
    let trace = DecisionSpan::start();
    let mut key = RouteKey::from_headers(map);
    if key.list_models {
        return Answer::Now(mutation::model_list(&shared.snapshot().topo).into());
    }
    // Who the tenant is, by the configured source only.
    let identity = &shared.snapshot().topo.identity;
    match tenant(
        identity,
        std::mem::take(&mut key.tenant),
        key.key_hash,
        metadata,
    ) {
        Ok(tenant) => key.tenant = tenant,
        Err(why) => {
            shared.metrics.tenants.unidentified.inc(why);
            let reject = Reject::Unidentified(why);
            trace.rejected(&reject);
            return Answer::Now(mutation::reject(&reject).into());
        }
    }
    key.spread_anonymous(fastrand::u64(..));
    let decided = {
        let _entered = trace.span().enter();
        decide_on(shared, &key, fastrand::u64(..))
    };
    let (snapshot, decision) = match decided {
        Ok(d) => d,
        Err(reject) => {
            trace.rejected(&reject);
            return Answer::Now(mutation::reject(&reject).into());
        }
    };
    let now = Instant::now();
    match admission.judge(&shared.metrics, &snapshot, map, &key, decision, now) {
        Judged::Admit(decision) => {
            let asked = Asked::of(&key);
            let placed = admit_and_commit(shared, snapshot, decision, key)
                .instrument(trace.span().clone())
                .await;
            match placed {
                Ok(p) => {
                    trace.routed(&p.snapshot, &p.decision);
                    Answer::Now(routed(shared, p, asked, Duration::ZERO))
                }
                Err(reject) => {
                    trace.rejected(&reject);
                    Answer::Now(mutation::reject(&reject).into())
                }
            }
        }
        Judged::Refuse { stage, refusal } => {
            Answer::Now(overloaded(shared, &key, &stage, &refusal).into())
        }
        Judged::Hold(ticket) => Answer::Held(Held { ticket, key }),
        Judged::Invalid(bad) => Answer::Now(reply::bad_priority(&bad).into()),
    }
}

/// Class admission's 429, written to the audit log like every answer.
fn overloaded(
    shared: &Shared,
    key: &RouteKey<'_>,
    stage: &str,
    refusal: &Refusal,
) -> ProcessingResponse {
    audit_overloaded(shared, key, stage, refusal.reason.as_str());
    reply::refused(stage, refusal)
}

/// What the client asked for that its answer needs after the key is spent.
#[derive(Clone, Copy)]
struct Asked<'a> {
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
    let response = mutation::route(
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
    }
}

/// One turn of a held request: decide again and ask admission; a released
/// request then meets its tenant's limits like any other. `Err`: still
/// held, with its ticket back.
async fn attempt(
    shared: &Shared,
    admission: &Admission,
    key: &mut RouteKey<'_>,
    ticket: Ticket,
) -> Result<Reply, Ticket> {
    let (snapshot, decision) = match decide_on(shared, key, fastrand::u64(..)) {
        Ok(d) => d,
        // No ready replica any more (or the stage went away): answered as
        // any rejection; dropping the ticket leaves the queue.
        Err(reject) => return Ok(mutation::reject(&reject).into()),
    };
    let stage = ticket.stage_name().to_string();
    let now = Instant::now();
    let held = now.saturating_duration_since(ticket.arrived());
    match admission.retry(ticket, &snapshot, key, decision, now) {
        (_, Retried::Release(decision)) => {
            let asked = Asked::of(key);
            match admit_and_commit(shared, snapshot, decision, std::mem::take(key)).await {
                Ok(p) => Ok(routed(shared, p, asked, held)),
                Err(reject) => Ok(mutation::reject(&reject).into()),
            }
        }
        (_, Retried::Refuse(r)) => Ok(overloaded(shared, key, &stage, &r).into()),
        (Some(t), Retried::Wait) => Err(t),
        (None, Retried::Wait) => unreachable!("a waiting request keeps its ticket"),
    }
}

/// Waits out a held request: its answer, or `None` when Envoy's stream ended
/// (the client went away); the ticket is then dropped and the request leaves
/// its queue at once.
async fn hold(
    shared: &Shared,
    admission: &Admission,
    held: Held<'_>,
    inbound: &mut Streaming<ProcessingRequest>,
) -> Option<Reply> {
    let Held {
        mut ticket,
        mut key,
    } = held;
    loop {
        let deadline = tokio::time::Instant::from_std(ticket.deadline());
        tokio::select! {
            biased;
            // Envoy ends the stream when the client resets; any other message
            // here is outside the protocol (nothing else is sent before the
            // request is answered), so the request is given up too.
            _ = inbound.message() => return None,
            // Stopping: answered now rather than held past the grace.
            () = shared.shutdown.reached(Phase::Closing) => {
                let stage = ticket.stage_name().to_string();
                return Some(overloaded(shared, &key, &stage, &ticket.refuse(Instant::now())).into());
            }
            _ = tokio::time::sleep_until(deadline) => {
                let stage = ticket.stage_name().to_string();
                return Some(overloaded(shared, &key, &stage, &ticket.refuse(Instant::now())).into());
            }
            _ = ticket.turn() => {}
        }
        if ticket.evicted() {
            let stage = ticket.stage_name().to_string();
            return Some(overloaded(shared, &key, &stage, &ticket.refuse(Instant::now())).into());
        }
        if !ticket.is_head(Instant::now()) {
            continue;
        }
        match attempt(shared, admission, &mut key, ticket).await {
            Ok(answer) => return Some(answer),
            Err(t) => ticket = t,
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let shared = self.shared.clone();
        let admission = self.admission.clone();
        tokio::spawn(async move {
            // The request this stream routed, whose lease later messages
            // report on.
            let mut routed: Option<u64> = None;
            // Envoy opens a stream to send a request's headers at once: one
            // that stays silent is not Envoy, and holds no task for long.
            let mut next = match tokio::time::timeout(FIRST_MESSAGE, inbound.message()).await {
                Ok(Ok(Some(msg))) => Some(msg),
                _ => return,
            };
            // A reset stream ends the loop like a clean close.
            while let Some(msg) = match next.take() {
                Some(m) => Some(m),
                None => inbound.message().await.ok().flatten(),
            } {
                // An observing filter from an older bootstrap: outcomes now come
                // from the access log. Envoy ignores replies in this mode; end
                // the call with the response rather than hold it open.
                if msg.observability_mode {
                    let end = match &msg.request {
                        Some(Request::ResponseHeaders(h)) => h.end_of_stream,
                        Some(Request::ResponseBody(b)) => b.end_of_stream,
                        Some(Request::ResponseTrailers(_)) => true,
                        _ => false,
                    };
                    if end {
                        break;
                    }
                    continue;
                }
                let reply = match &msg.request {
                    Some(Request::RequestHeaders(h)) => {
                        let metadata = msg.metadata_context.as_ref();
                        let answer = match route_request(&shared, &admission, h, metadata).await {
                            Answer::Now(r) => r,
                            Answer::Held(held) => {
                                // Without this Envoy gives up after its
                                // message_timeout and fails the request open.
                                let bound = held
                                    .ticket
                                    .deadline()
                                    .saturating_duration_since(Instant::now());
                                if tx.send(Ok(reply::extend_timer(bound))).await.is_err() {
                                    break;
                                }
                                match hold(&shared, &admission, held, &mut inbound).await {
                                    Some(r) => r,
                                    None => break,
                                }
                            }
                        };
                        routed = answer.nonce;
                        answer.response
                    }
                    // The first body byte is on its way to the client: the
                    // replica has finished the prompt.
                    Some(other @ Request::ResponseHeaders(_)) => {
                        if let Some(nonce) = routed.take() {
                            shared.leases.first_byte(nonce);
                        }
                        mutation::continue_unchanged(other)
                    }
                    // Nothing else is asked for; anything else is let through
                    // so Envoy never waits on us.
                    Some(other) => mutation::continue_unchanged(other),
                    None => continue,
                };
                if tx.send(Ok(reply)).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}
