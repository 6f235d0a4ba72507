//! Several fleetroute instances in the replay, each with its own writer and
//! shared state (prefix index, load counters, figures), as separate
//! processes behind one Envoy cluster have.
//!
//! What the model keeps from a real deployment:
//! - Requests reach the instances alternately (Envoy's round robin over the
//!   ext_proc cluster: every request opens a new gRPC stream), or by a hash
//!   of the client connection (a connection-level balancer in front of the
//!   instances; a conversation keeps its connection).
//! - Each instance counts only its own requests in flight and queued; the
//!   engines' queue figures, scraped every `SimConfig::scrape_ms`, are the
//!   one load signal every instance shares.
//! - A decision's load is a lease, released when its access log entry
//!   reaches the instance that decided it, else at its bound
//!   (`state::lease::bounds`, with `max_tokens` = the trace's output, the
//!   tightest a client could set), or by reconciliation with the engine's
//!   count (the leases older than two scrapes plus 2 s beyond what the
//!   engine reports, as `Leases::reconcile` does). The prefill share ends at
//!   its own bound or with the lease, never at the first token (which
//!   fleetroute does not see).
//! - Envoy flushes access log entries every `log_flush_ms`, over
//!   `LOG_STREAMS` streams (Envoy workers) connected round robin to the
//!   instances: an entry reaches the deciding instance only when its
//!   stream happens to lead there. Without forwarding, another instance
//!   applies it by names, as a late entry.
//! - With sharing, each instance publishes its prefix changes in batches
//!   every `share_ms` (its own phase) and reads the others' on the same
//!   beat: a change reaches another instance at the sender's next flush
//!   then the receiver's next read. Forwarded access log entries take the
//!   same path to their owner.
//! - With load shared, each instance's link also reports its own
//!   per-replica load on its beat (fleetroute's `Reporter`: when it
//!   changed, or to keep it fresh), and the others count it from their next
//!   beat until it is `load_stale_ms` old (fleetroute's `PeerLoads`, the
//!   sum stored next to their own counters, where the decision reads it).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use std::time::Duration;

use fleetroute::config::LeaseConfig;
use fleetroute::peers::wire;
use fleetroute::state::Event;
use fleetroute::state::lease::{LeaseInput, bounds};
use fleetroute::state::peer::PeerUpdate;
use fleetroute::state::peer_load::{LoadReport, PeerLoads, Reporter};
use tokio::sync::mpsc::Receiver;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::fleetroute::{Fleetroute, Placement};
use super::sim::{EngineFigures, SimConfig, SimRouter, View};
use super::trace::TraceRequest;

mod sim_router;

/// Envoy workers' access log streams, spread round robin over instances.
pub const LOG_STREAMS: u64 = 8;
/// Added to two scrapes before the engine's count may end a lease.
const RECONCILE_SLACK_MS: f64 = 2000.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// Request after request to the next instance.
    Alternate,
    /// This many client connections, each hashed to an instance; a
    /// conversation (its content key) keeps its connection.
    Connection(u64),
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub routers: usize,
    pub spread: Spread,
    /// Prefix changes shared in batches every this many ms (none: each
    /// instance sees only its own decisions).
    pub share_ms: Option<f64>,
    /// Access log entries of another instance's decision are forwarded to
    /// it (needs `share_ms`: the same link and beat).
    pub forward: bool,
    /// Per-replica load is reported on the same beat and counts for this
    /// many ms after it was written (needs `share_ms`; none: not shared).
    pub load_stale_ms: Option<f64>,
    pub log_flush_ms: f64,
}

/// How the leases of all instances ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeaseCounts {
    /// The access log entry reached the deciding instance (directly or forwarded).
    pub logged: u64,
    pub expired: u64,
    pub reconciled: u64,
    /// Entries applied by another instance, by names.
    pub foreign: u64,
    /// Entries that reached their owner after the lease had ended.
    pub late: u64,
    /// Sum over requests of how long their lease outlived the request, ms.
    pub overhang_ms: f64,
}

/// Bytes the instances wrote to the link, as fleetroute encodes them.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkBytes {
    pub prefix: u64,
    pub load: u64,
    pub load_reports: u64,
}

struct Instance {
    fr: Fleetroute,
    outbox: Option<Receiver<PeerUpdate>>,
    reporter: Reporter,
    loads: PeerLoads,
}

struct Lease {
    owner: usize,
    placed: Placement,
    routed_at: f64,
    held: bool,
    finished_at: Option<f64>,
    req: TraceRequest,
}

enum Action {
    Deliver {
        to: usize,
        update: PeerUpdate,
    },
    Log {
        id: usize,
        at: usize,
        cached: u64,
        ttft: f64,
        finished: f64,
    },
    PrefillBound(usize),
    LeaseBound(usize),
    /// Instance `k`'s link reports its load.
    Beat(usize),
    LoadDeliver {
        to: usize,
        from: usize,
        report: LoadReport,
        written: f64,
    },
}

pub struct MultiRouter {
    opts: Options,
    routers: Vec<Instance>,
    leases: Vec<Option<Lease>>,
    /// Per instance and replica, request ids in the order they were routed.
    by_replica: Vec<Vec<VecDeque<usize>>>,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    actions: Vec<Option<Action>>,
    next: usize,
    lease_cfg: LeaseConfig,
    scrape_ms: f64,
    pub counts: LeaseCounts,
    pub bytes: LinkBytes,
    label: String,
}

impl MultiRouter {
    pub fn new(cfg: &SimConfig, requests: usize, opts: Options, label: &str) -> Self {
        let n = opts.routers.max(1);
        let config = super::fleetroute::config(
            cfg.replicas,
            cfg.router_cache_tokens.unwrap_or(cfg.cache_tokens),
            cfg.latency.max_batch,
            "",
            "",
        );
        let share = opts.share_ms.unwrap_or(1.0);
        let stale = opts.load_stale_ms.unwrap_or(0.0);
        let ms = |v: f64| Duration::from_secs_f64(v / 1000.0);
        let routers = (0..n)
            .map(|_| {
                let mut fr = Fleetroute::new(&config, requests, cfg.block_tokens, label);
                let outbox = opts.share_ms.map(|_| fr.share_updates());
                Instance {
                    fr,
                    outbox,
                    // As the peer link sets them up.
                    reporter: Reporter::new(ms((stale / 4.0).max(share))),
                    loads: PeerLoads::new(ms(stale)),
                }
            })
            .collect();
        let mut m = MultiRouter {
            opts: Options { routers: n, ..opts },
            routers,
            leases: (0..requests).map(|_| None).collect(),
            by_replica: vec![vec![VecDeque::new(); cfg.replicas]; n],
            heap: BinaryHeap::new(),
            actions: Vec::new(),
            next: 0,
            lease_cfg: config.leases.clone(),
            scrape_ms: cfg.scrape_ms.unwrap_or(1000.0),
            counts: LeaseCounts::default(),
            bytes: LinkBytes::default(),
            label: label.to_string(),
        };
        if opts.share_ms.is_some() && opts.load_stale_ms.is_some() && n > 1 {
            for k in 0..n {
                let first = m.beat(k, 0.0);
                m.push(first, Action::Beat(k));
            }
        }
        m
    }

    fn push(&mut self, at: f64, a: Action) {
        let seq = self.actions.len() as u64;
        self.actions.push(Some(a));
        self.heap.push(Reverse((at.max(0.0).to_bits(), seq)));
    }

    /// The first beat of instance `k`'s link strictly after `t`.
    fn beat(&self, k: usize, t: f64) -> f64 {
        let b = self.opts.share_ms.unwrap_or(1.0);
        let phase = k as f64 * b / self.opts.routers as f64;
        phase + (((t - phase) / b).floor() + 1.0) * b
    }

    /// Runs every deferred action due by `now`, in time order.
    fn advance(&mut self, now: f64) {
        while let Some(&Reverse((bits, seq))) = self.heap.peek() {
            let t = f64::from_bits(bits);
            if t > now {
                break;
            }
            self.heap.pop();
            if let Some(a) = self.actions[seq as usize].take() {
                self.run(t, a);
            }
        }
    }

    fn run(&mut self, t: f64, a: Action) {
        match a {
            Action::Beat(k) => self.beat_at(k, t),
            Action::LoadDeliver {
                to,
                from,
                report,
                written,
            } => {
                let r = &mut self.routers[to];
                let at = r.fr.at(t);
                let topo = r.fr.shared().snapshot().topo.clone();
                let age = Duration::from_secs_f64((t - written).max(0.0) / 1000.0);
                r.loads.receive(&topo, &from.to_string(), report, age, at);
                r.loads.apply(&topo, at);
            }
            Action::Deliver { to, update } => {
                self.routers[to].fr.apply(t, Event::Peer(Box::new(update)));
            }
            Action::PrefillBound(id) => {
                if let Some(l) = self.leases[id].as_ref().filter(|l| l.held) {
                    l.placed.guard.first_byte();
                }
            }
            Action::LeaseBound(id) => {
                if self.end_lease(id, t) {
                    self.counts.expired += 1;
                }
            }
            Action::Log {
                id,
                at,
                cached,
                ttft,
                finished,
            } => self.log(t, id, at, (cached, ttft, finished)),
        }
    }

    /// Instance `k`'s beat: its load report out when due, the others' in.
    fn beat_at(&mut self, k: usize, t: f64) {
        let at = self.routers[k].fr.at(t);
        let topo = self.routers[k].fr.shared().snapshot().topo.clone();
        let report = LoadReport::own(&topo);
        if self.routers[k].reporter.due(&report, at) {
            self.bytes.load += wire::encode_load(&report, 1 << 20).0.len() as u64;
            self.bytes.load_reports += 1;
            for j in (0..self.opts.routers).filter(|&j| j != k) {
                let deliver = Action::LoadDeliver {
                    to: j,
                    from: k,
                    report: report.clone(),
                    written: t,
                };
                let when = self.beat(j, t);
                self.push(when, deliver);
            }
            self.routers[k].reporter.sent(report, at);
        }
        let r = &mut self.routers[k];
        r.loads.apply(&topo, at);
        let next = self.beat(k, t);
        self.push(next, Action::Beat(k));
    }

    /// An access log entry reaching instance `at`: forwarded to its owner,
    /// or applied here. `done`: cached tokens, time to first token, end.
    fn log(&mut self, t: f64, id: usize, at: usize, done: (u64, f64, f64)) {
        let (cached, ttft, finished) = done;
        let Some(owner) = self.leases[id].as_ref().map(|l| l.owner) else {
            return;
        };
        if at != owner && self.opts.forward {
            let arrive = self.beat(owner, self.beat(at, t));
            let log = Action::Log {
                id,
                at: owner,
                cached,
                ttft,
                finished,
            };
            self.push(arrive, log);
            return;
        }
        let decided = if at == owner {
            let held = self.leases[id].as_ref().is_some_and(|l| l.held);
            if held {
                self.end_lease(id, t);
                self.counts.logged += 1;
            } else {
                self.counts.late += 1;
            }
            held.then(|| self.leases[id].as_ref().map(|l| l.placed.decided))
                .flatten()
        } else {
            self.counts.foreign += 1;
            None
        };
        let l = self.leases[id].as_ref().expect("lease kept");
        let obs = Fleetroute::observation(
            &l.placed,
            l.routed_at,
            finished,
            &l.req,
            cached,
            ttft,
            decided,
        );
        self.routers[at].fr.apply(t, Event::Observed(Box::new(obs)));
        self.pump(at, t);
    }

    /// Ends a held lease at `t`; false when it had already ended.
    fn end_lease(&mut self, id: usize, t: f64) -> bool {
        let Some(l) = self.leases[id].as_mut().filter(|l| l.held) else {
            return false;
        };
        l.held = false;
        l.placed.guard.release();
        if let Some(f) = l.finished_at {
            self.counts.overhang_ms += (t - f).max(0.0);
        }
        true
    }

    /// Takes instance `k`'s new prefix changes to the others.
    fn pump(&mut self, k: usize, now: f64) {
        let mut out = Vec::new();
        if let Some(rx) = self.routers[k].outbox.as_mut() {
            while let Ok(u) = rx.try_recv() {
                out.push(u);
            }
        }
        if out.is_empty() {
            return;
        }
        self.bytes.prefix += 3 + out.iter().map(wire::update_len).sum::<usize>() as u64;
        let sent = self.beat(k, now);
        for u in out {
            for j in (0..self.opts.routers).filter(|&j| j != k) {
                let at = self.beat(j, sent);
                self.push(
                    at,
                    Action::Deliver {
                        to: j,
                        update: u.clone(),
                    },
                );
            }
        }
    }

    fn pick(&mut self, req: &TraceRequest) -> usize {
        let n = self.opts.routers;
        match self.opts.spread {
            Spread::Alternate => {
                self.next = (self.next + 1) % n;
                self.next
            }
            Spread::Connection(conns) => {
                let conn = xxh3_64_with_seed(&req.content_key.to_le_bytes(), 11) % conns.max(1);
                (xxh3_64_with_seed(&conn.to_le_bytes(), 13) % n as u64) as usize
            }
        }
    }
}

#[cfg(test)]
#[path = "multi_tests.rs"]
mod tests;
