//! Admission against real snapshots from the real writer, with load put on
//! replicas through their own guards. No fleet has been measured, so the
//! prediction runs at `predict::DEFAULT_MS_PER_K` (200 ms per 1000 tokens):
//! a request of `p` uncached tokens behind `q` queued ones is predicted at
//! `(p + q + 256) / 5` ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};

use super::judge::Reason;
use super::*;

use crate::config::RouterConfig;
use crate::route::decide;
use crate::state::load::RequestGuard;
use crate::state::{Event, Shared, Writer};
use crate::topology::{FleetId, NonEmpty, ReplicaId};

const CONFIG: &str = r#"
admission: { priority_header: x-priority, max_wait_ms: 5000 }
tenants:
  named:
    gold: { priority: critical }
    gold2: { priority: critical }
    batch: { priority: sheddable }
fleets:
  - name: f
    region: r
    endpoints: ["10.0.0.1:1", "10.0.0.2:1"]
    capacity: { max_inflight: 4 }
stages:
  - name: s
    models: [m]
    fleets: [f]
    admission:
      ttft_ms: { critical: 1000, standard: 3000 }
      queue: { critical: 2, standard: 2 }
  - name: open
    models: [o]
    fleets: [f]
"#;

struct Lab {
    shared: Arc<Shared>,
    admission: Admission,
    t0: Instant,
    /// Load put on replicas, held until dropped.
    guards: Vec<RequestGuard>,
}

/// Fleet 0's `replicas` pass their health checks (two probes each).
fn lab(yaml: &str) -> Lab {
    let cfg = RouterConfig::parse_valid(yaml).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let t0 = Instant::now();
    w.healthy(FleetId(0), (0..2).map(ReplicaId), t0);
    Lab {
        shared,
        admission: Admission::new(t0),
        t0,
        guards: Vec::new(),
    }
}

fn headers(priority: Option<&str>) -> HeaderMap {
    HeaderMap {
        headers: priority
            .map(|p| HeaderValue {
                key: "x-priority".into(),
                raw_value: p.as_bytes().to_vec(),
                ..Default::default()
            })
            .into_iter()
            .collect(),
    }
}

impl Lab {
    /// Queues `tokens` of prefill on replica `r`, as one request in flight.
    fn load(&mut self, r: usize, tokens: u64) {
        let snap = self.shared.snapshot();
        self.guards.push(
            snap.topo.fleets[0].replicas[ReplicaId(r)]
                .load
                .start(tokens),
        );
    }

    fn key<'a>(model: &'a str, tenant: &'a str, tokens: u32) -> RouteKey<'a> {
        RouteKey {
            model: Some(model),
            tenant: tenant.into(),
            prompt_tokens: tokens,
            key: u64::from(tokens) ^ xxh3_64(tenant.as_bytes()),
            ..Default::default()
        }
    }

    fn judge_at(
        &self,
        model: &str,
        tenant: &str,
        tokens: u32,
        priority: Option<&str>,
        at: Duration,
    ) -> Judged {
        let snap = self.shared.snapshot_full();
        let key = Self::key(model, tenant, tokens);
        let d = decide(&snap, &key, 0).unwrap();
        self.admission.judge(
            &self.shared.metrics,
            &snap,
            &headers(priority),
            &key,
            d,
            self.t0 + at,
        )
    }

    fn judge(&self, tenant: &str, tokens: u32) -> Judged {
        self.judge_at("m", tenant, tokens, None, Duration::ZERO)
    }

    fn retry(
        &self,
        t: Ticket,
        tenant: &str,
        tokens: u32,
        at: Duration,
    ) -> (Option<Ticket>, Retried) {
        let snap = self.shared.snapshot_full();
        let key = Self::key("m", tenant, tokens);
        let d = decide(&snap, &key, 0).unwrap();
        self.admission.retry(t, &snap, &key, d, self.t0 + at)
    }

    fn metric(&self, class: &str, verdict: &str) -> u64 {
        let text = self.shared.metrics.render();
        let want = format!(
            "fleetroute_admission_verdicts_total{{stage=\"s\",class=\"{class}\",verdict=\"{verdict}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(want.as_str()))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

fn refused(j: &Judged) -> Option<Reason> {
    match j {
        Judged::Refuse { refusal, .. } => Some(refusal.reason),
        _ => None,
    }
}

fn admitted(j: &Judged) -> bool {
    matches!(j, Judged::Admit(_))
}

#[test]
fn an_idle_stage_admits_every_class_and_a_stage_without_admission_is_untouched() {
    let mut l = lab(CONFIG);
    for t in ["gold", "acme", "batch"] {
        assert!(admitted(&l.judge(t, 1000)), "{t}");
    }
    assert_eq!(l.metric("critical", "admitted"), 1);
    assert_eq!(l.metric("sheddable", "admitted"), 1);
    // Overload the fleet: the stage without admission still routes all.
    for r in 0..2 {
        for _ in 0..4 {
            l.load(r, 50_000);
        }
    }
    for t in ["gold", "acme", "batch"] {
        assert!(admitted(&l.judge_at("o", t, 1000, None, Duration::ZERO)));
    }
}

#[test]
fn a_saturated_stage_sheds_sheddable_then_standard() {
    let mut l = lab(CONFIG);
    // Every replica at max_inflight, with short prefill queues.
    for r in 0..2 {
        for _ in 0..4 {
            l.load(r, 10);
        }
    }
    let j = l.judge("batch", 1000);
    assert_eq!(refused(&j), Some(Reason::Saturated));
    let Judged::Refuse { stage, refusal } = j else {
        unreachable!()
    };
    assert_eq!((stage.as_str(), refusal.retry_after_s), ("s", 1));
    // Standard and critical: every replica is full, so they are held.
    let std_ticket = match l.judge("acme", 1000) {
        Judged::Hold(t) => t,
        _ => panic!("standard held"),
    };
    let gold = match l.judge("gold", 1000) {
        Judged::Hold(t) => t,
        _ => panic!("critical held"),
    };
    // With a critical request held, standard is shed too.
    assert_eq!(refused(&l.judge("acme", 1000)), Some(Reason::Saturated));
    assert!(gold.is_head(l.t0), "critical goes first");
    assert!(!std_ticket.is_head(l.t0));
    assert_eq!(l.metric("sheddable", "saturated"), 1);
    assert_eq!(l.metric("standard", "saturated"), 1);
    // Slots free up: the critical head is released, then standard.
    l.guards.truncate(4);
    let (t, r) = l.retry(gold, "gold", 1000, Duration::from_millis(50));
    assert!(t.is_none() && matches!(r, Retried::Release(_)));
    assert!(std_ticket.is_head(l.t0));
    let (_, r) = l.retry(std_ticket, "acme", 1000, Duration::from_millis(60));
    assert!(matches!(r, Retried::Release(_)));
    assert_eq!(l.metric("critical", "admitted_after_wait"), 1);
    assert_eq!(l.metric("standard", "admitted_after_wait"), 1);
}

#[test]
fn objectives_hold_what_waiting_can_serve_and_refuse_what_it_cannot() {
    let mut l = lab(CONFIG);
    // 4000 tokens queued on each replica: a 744-token request is predicted
    // at (744 + 4000 + 256) / 5 = 1000 ms: meets critical's 1000 exactly.
    l.load(0, 4000);
    l.load(1, 4000);
    assert!(admitted(&l.judge("gold", 744)));
    // 1 ms more: refused at once, as every replica's queue alone already
    // passes the objective (queues drain no faster than time passes).
    assert_eq!(refused(&l.judge("gold", 749)), Some(Reason::Objective));
    // Standard has headroom 0.5 × 1000 = 500 ms to fill: held, as its own
    // 3000 ms objective can be met by waiting.
    let t = match l.judge("acme", 744) {
        Judged::Hold(t) => t,
        _ => panic!("held for the headroom"),
    };
    assert_eq!(t.class(), Priority::Standard);
    // Its deadline: objective less its own prefill (200 ms).
    let hold = t.deadline().duration_since(l.t0);
    assert_eq!(hold, Duration::from_millis(2800));
    // Still loaded: it waits. Drained: released.
    let (t, r) = l.retry(t, "acme", 744, Duration::from_millis(100));
    assert!(matches!(r, Retried::Wait));
    l.guards.clear();
    let (_, r) = l.retry(t.unwrap(), "acme", 744, Duration::from_millis(200));
    let Retried::Release(d) = r else {
        panic!("released once drained")
    };
    assert_eq!(d.queued_tokens, 0);
    // Sheddable has no objective: refused at once rather than held, while
    // the headroom of the classes above is taken.
    l.load(0, 4000);
    l.load(1, 4000);
    assert_eq!(refused(&l.judge("batch", 744)), Some(Reason::Reserved));
}

#[test]
fn a_fallback_replica_that_meets_the_objective_takes_the_request() {
    let mut l = lab(CONFIG);
    l.load(0, 20_000);
    // A decision that prefers the loaded replica (as a cached prefix would).
    let snap = l.shared.snapshot_full();
    let key = Lab::key("m", "gold", 744);
    let mut d = decide(&snap, &key, 0).unwrap();
    d.replicas = NonEmpty::new(vec![ReplicaId(0), ReplicaId(1)]).unwrap();
    d.queued_tokens = 20_000;
    d.cached_tokens = 500;
    d.uncached_tokens = 244;
    let j = l
        .admission
        .judge(&l.shared.metrics, &snap, &headers(None), &key, d, l.t0);
    let Judged::Admit(d) = j else {
        panic!("admitted on the other replica")
    };
    assert_eq!(&d.replicas[..], &[ReplicaId(1), ReplicaId(0)]);
    assert_eq!(
        (d.cached_tokens, d.uncached_tokens, d.queued_tokens),
        (0, 744, 0)
    );
    // When no replica of the decision meets it, it stays as decided.
    l.load(1, 20_000);
    let mut d = decide(&snap, &key, 0).unwrap();
    d.queued_tokens = 20_000;
    let j = l
        .admission
        .judge(&l.shared.metrics, &snap, &headers(None), &key, d, l.t0);
    assert_eq!(refused(&j), Some(Reason::Objective));
}

#[test]
fn held_requests_leave_in_class_order_and_a_dropped_ticket_leaves_at_once() {
    let mut l = lab(CONFIG);
    for r in 0..2 {
        for _ in 0..4 {
            l.load(r, 10);
        }
    }
    let a = match l.judge("gold", 500) {
        Judged::Hold(t) => t,
        _ => panic!(),
    };
    let b = match l.judge("gold2", 500) {
        Judged::Hold(t) => t,
        _ => panic!(),
    };
    assert!(a.is_head(l.t0) && !b.is_head(l.t0));
    drop(a);
    assert!(b.is_head(l.t0), "the client left: the next one is head");
    assert_eq!(l.metric("critical", "cancelled"), 1);
    // The queue holds 2 critical requests: a third from the same tenant is
    // refused; nobody is heavier than it.
    let _c = match l.judge("gold", 500) {
        Judged::Hold(t) => t,
        _ => panic!(),
    };
    assert_eq!(refused(&l.judge("gold", 500)), Some(Reason::QueueFull));
    // Its deadline: refused as timed out.
    let r = b.refuse(l.t0 + Duration::from_secs(1));
    assert_eq!(r.reason, Reason::TimedOut);
    assert_eq!(l.metric("critical", "timed_out"), 1);
    assert_eq!(l.metric("critical", "queue_full"), 1);
}

#[test]
fn a_flooding_tenant_cannot_crowd_out_a_trickle() {
    let mut l = lab(CONFIG);
    // The flood is admitted while there is room, and charged for it.
    for _ in 0..20 {
        assert!(admitted(&l.judge("flood", 2000)));
    }
    for r in 0..2 {
        for _ in 0..4 {
            l.load(r, 10);
        }
    }
    let mut flood: Vec<Ticket> = (0..2)
        .map(|_| match l.judge("flood", 2000) {
            Judged::Hold(t) => t,
            _ => panic!(),
        })
        .collect();
    assert_eq!(refused(&l.judge("flood", 2000)), Some(Reason::QueueFull));
    // The trickle takes the flood's newest place and is next out.
    let trickle = match l.judge("trickle", 2000) {
        Judged::Hold(t) => t,
        _ => panic!("the trickle is held, not refused"),
    };
    assert!(flood[1].evicted());
    assert_eq!(flood.pop().unwrap().refuse(l.t0).reason, Reason::QueueFull);
    assert!(trickle.is_head(l.t0));
    assert!(!flood[0].is_head(l.t0));
}

#[test]
fn the_priority_header_lowers_a_class_and_a_bad_one_is_an_error() {
    let mut l = lab(CONFIG);
    for r in 0..2 {
        for _ in 0..4 {
            l.load(r, 10);
        }
    }
    // gold lowered to sheddable: shed on the saturated stage.
    let j = l.judge_at("m", "gold", 500, Some("sheddable"), Duration::ZERO);
    assert_eq!(refused(&j), Some(Reason::Saturated));
    // batch cannot raise itself.
    let j = l.judge_at("m", "batch", 500, Some("critical"), Duration::ZERO);
    assert_eq!(refused(&j), Some(Reason::Saturated));
    let j = l.judge_at("m", "gold", 500, Some("urgent"), Duration::ZERO);
    assert!(matches!(j, Judged::Invalid(_)));
    // A stage without admission never reads the header.
    let j = l.judge_at("o", "gold", 500, Some("urgent"), Duration::ZERO);
    assert!(admitted(&j));
}

#[test]
fn queues_and_accounts_survive_a_reload() {
    let cfg = RouterConfig::parse_valid(CONFIG).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let t0 = Instant::now();
    let a = Admission::new(t0);
    let snap = shared.snapshot_full();
    let st = a.state(&shared.metrics, &snap, StageId(0)).unwrap();
    st.runtime.shares.charge(42, 1000, t0);
    assert!(a.state(&shared.metrics, &snap, StageId(1)).is_none());
    // A reload that swaps the stages' order.
    let swapped = CONFIG.replace("  - name: open\n    models: [o]\n    fleets: [f]\n", "");
    let swapped = swapped.replace(
        "stages:\n",
        "stages:\n  - name: open\n    models: [o]\n    fleets: [f]\n",
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    w.apply(
        Event::Change {
            change: Box::new(crate::state::Change::Reload {
                config: Box::new(RouterConfig::parse_valid(&swapped).unwrap()),
                source: "test".into(),
            }),
            reply: Some(tx),
        },
        t0,
    );
    w.drain(t0);
    rx.blocking_recv().unwrap().unwrap();
    let snap = shared.snapshot_full();
    assert_eq!(snap.topo.stages[1].name, "s");
    let st = a.state(&shared.metrics, &snap, StageId(1)).unwrap();
    assert_eq!(st.runtime.shares.account(42, t0), 1000);
    assert!(a.state(&shared.metrics, &snap, StageId(0)).is_none());
}

#[test]
fn headroom_is_kept_only_for_active_classes_and_never_bars_an_idle_replica() {
    let mut l = lab(CONFIG);
    l.load(0, 4000);
    l.load(1, 4000);
    // 1000 ms predicted. Nobody above sent anything yet: no headroom kept.
    assert!(admitted(&l.judge("batch", 744)));
    // Standard is active (3000 ms: headroom leaves 1500): still fits.
    assert!(matches!(
        l.judge("acme", 744),
        Judged::Hold(_) | Judged::Admit(_)
    ));
    assert!(admitted(&l.judge("batch", 744)));
    // Critical is active (1000 ms: 500 left): refused.
    assert!(admitted(&l.judge_at(
        "m",
        "gold",
        100,
        None,
        Duration::ZERO
    )));
    assert_eq!(refused(&l.judge("batch", 744)), Some(Reason::Reserved));
    // Ten seconds of critical silence give the headroom back.
    let later = predict::ACTIVE_FOR + Duration::from_millis(1);
    assert!(admitted(&l.judge_at("m", "batch", 744, None, later)));
    // A prompt longer than the headroom still runs on an idle replica.
    l.guards.clear();
    assert!(admitted(&l.judge("batch", 5000)));
}

#[test]
fn any_ready_replica_of_the_fleet_may_take_a_request_its_decision_cannot_place() {
    let four = CONFIG.replace(
        "endpoints: [\"10.0.0.1:1\", \"10.0.0.2:1\"]",
        "endpoints: [\"10.0.0.1:1\", \"10.0.0.2:1\", \"10.0.0.3:1\", \"10.0.0.4:1\"]",
    );
    let cfg = RouterConfig::parse_valid(&four).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let t0 = Instant::now();
    w.healthy(FleetId(0), (0..4).map(ReplicaId), t0);
    let snap = shared.snapshot_full();
    let _guards: Vec<_> = (0..3)
        .map(|r| {
            snap.topo.fleets[0].replicas[ReplicaId(r)]
                .load
                .start(20_000)
        })
        .collect();
    let key = Lab::key("m", "gold", 744);
    let mut d = decide(&snap, &key, 0).unwrap();
    d.replicas = NonEmpty::new(vec![ReplicaId(0), ReplicaId(1), ReplicaId(2)]).unwrap();
    d.queued_tokens = 20_000;
    let a = Admission::new(t0);
    let j = a.judge(&shared.metrics, &snap, &headers(None), &key, d, t0);
    let Judged::Admit(d) = j else {
        panic!("the idle fourth replica takes it")
    };
    assert_eq!(&d.replicas[..], &[ReplicaId(3), ReplicaId(0), ReplicaId(1)]);
}

#[test]
fn the_search_for_another_replica_skips_slots_a_member_left() {
    use crate::membership::Member;
    use std::net::SocketAddr;
    let dns = CONFIG.replace(
        "endpoints: [\"10.0.0.1:1\", \"10.0.0.2:1\"]",
        "dns: { name: pool.test, port: 80 }",
    );
    let cfg = RouterConfig::parse_valid(&dns).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let mut now = Instant::now();
    let addr = |i: u8| SocketAddr::from(([10, 0, 0, i], 80));
    let members = |w: &mut Writer, ids: &[u8], now: Instant| {
        w.apply(
            Event::Membership {
                fleet: "f".into(),
                source: cfg.fleets[0].source(),
                members: ids.iter().map(|&i| Member::by_addr(addr(i))).collect(),
            },
            now,
        );
        let topo = shared.snapshot().topo.clone();
        w.healthy(FleetId(0), topo.fleets[0].replicas.ids(), now);
    };
    members(&mut w, &[1, 2, 3, 4], now);
    // The second member leaves and is removed: slot 1 is free, slots 0, 2
    // and 3 hold members.
    members(&mut w, &[1, 3, 4], now);
    now += crate::state::TICK * 2;
    w.tick(now);
    let snap = shared.snapshot_full();
    let slots: Vec<ReplicaId> = snap.topo.fleets[0].replicas.ids().collect();
    assert_eq!(slots, [ReplicaId(0), ReplicaId(2), ReplicaId(3)]);
    let _guards: Vec<_> = [0, 2]
        .iter()
        .map(|&r| {
            snap.topo.fleets[0].replicas[ReplicaId(r)]
                .load
                .start(20_000)
        })
        .collect();
    let key = Lab::key("m", "gold", 744);
    let mut d = decide(&snap, &key, 0).unwrap();
    d.replicas = NonEmpty::new(vec![ReplicaId(0), ReplicaId(2)]).unwrap();
    d.queued_tokens = 20_000;
    let a = Admission::new(now);
    let j = a.judge(&shared.metrics, &snap, &headers(None), &key, d, now);
    let Judged::Admit(d) = j else {
        panic!("the idle member in slot 3 takes it")
    };
    assert_eq!(d.replicas.head(), &ReplicaId(3));
}
