//! The peer link: what several instances of one deployment share through
//! Redis. Three things, all lossy by design and never on a decision's path:
//!
//! - Prefix changes. Each instance's writer hands its own (a routed
//!   request's blocks, a cache seen lost) to a bounded outbox; every
//!   `flush_ms` this task writes them as batches to one Redis stream and,
//!   in the same round trip, reads what the other instances wrote since
//!   its last read. Its own batches (by instance id) are skipped; the
//!   others' go to the writer as `Event::Peer`.
//! - Forwarded access log entries. Envoy's log stream of a worker leads to
//!   any instance; an entry of another instance's decision is sent to that
//!   instance's own stream, read by it on its next round, where it ends
//!   the lease and counts the outcome (`observe::forward`).
//! - Load. Every round, when its own per-replica load changed (or to keep
//!   a busy report fresh), an instance writes it to one more stream; the
//!   others keep each instance's latest report for `load_stale_ms` after
//!   it was written (by Redis's clock: `TIME` in the same round trip
//!   against the entry's id) and store the sum of the fresh ones next to
//!   their own counters (`state::peer_load`), which is what decisions read.
//!
//! Redis slow or gone: a round trip is bounded by `timeout_ms`; the
//! instance routes on its own decisions alone, says so once in the log and
//! in `fleetroute_peers_up`, counts the peers' load until their reports go
//! stale (then its own only: `fleetroute_peer_load_peers` 0), keeps the
//! newest `max_pending` changes and
//! entries, and sends them (and reads what it missed, as far as the stream
//! still holds it) when Redis answers again. Memory in Redis is bounded by
//! `stream_max_len` batches per stream of at most `max_batch_bytes` each.
//!
//! This file holds the task and its round; `outbox.rs` writes and reads the
//! prefix changes and forwarded entries, `load.rs` the load reports, and
//! `wire.rs` encodes all three.

mod load;
mod outbox;
pub mod wire;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::streams::StreamReadReply;
use tokio::sync::mpsc;

use crate::config::PeersConfig;
use crate::metrics::{Direction, Forwarded, LoadExchange, PrefixUpdate};
use crate::redis_link::RedisLink;
use crate::state::peer::PeerUpdate;
use crate::state::peer_load::{LoadReport, PeerLoads, Received, Reporter};
use crate::state::{Event, Shared};
use crate::topology::Topology;

/// Batches read per stream per round; more wait for the next round.
const READ_PER_ROUND: usize = 256;
/// Batches written per round, so one round trip stays small.
const WRITE_PER_ROUND: usize = 32;
/// Owners a round forwards to (each has its own stream).
const OWNERS_PER_ROUND: usize = 64;
/// An instance that starts reads the changes of the last minute.
const CATCH_UP: Duration = Duration::from_secs(60);
/// Streams of instances that stopped vanish after this.
const STREAM_TTL_MS: u64 = 600_000;
/// Load reports the load stream keeps: only each instance's latest counts,
/// so this is a backlog for a reader a few rounds late, not history.
const LOAD_STREAM_LEN: u64 = 1024;

/// An instance's name on the link and in its decisions' route tags.
pub fn valid_instance_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// A name no other instance will pick: 16 random hex digits.
pub fn random_instance_id() -> String {
    format!("{:016x}", crate::clock::random_u64())
}

/// What the access log hands the link.
struct Forward {
    owner: String,
    bytes: Vec<u8>,
}

/// The access log's handle: forwards entries to the instance that decided them.
#[derive(Clone)]
pub struct PeerLink {
    forwards: mpsc::Sender<Forward>,
    shared: Arc<Shared>,
}

impl PeerLink {
    /// Queues `bytes` for instance `owner`; never waits (a full queue drops it).
    pub fn forward(&self, owner: &str, bytes: Vec<u8>) {
        if bytes.len() > wire::MAX_ITEM_BYTES || !valid_instance_id(owner) {
            self.shared
                .metrics
                .peers
                .forwards
                .add(Forwarded::Dropped, 1);
            return;
        }
        let f = Forward {
            owner: owner.to_string(),
            bytes,
        };
        if self.forwards.try_send(f).is_err() {
            self.shared
                .metrics
                .peers
                .forwards
                .add(Forwarded::Dropped, 1);
        }
    }
}

/// A started link: the handle for the access log, and the entries other
/// instances forwarded to this one.
pub struct Started {
    pub link: PeerLink,
    pub forwarded: mpsc::Receiver<Vec<u8>>,
}

/// Starts the link's task. `updates` is the writer's outbox
/// (`Writer::share_updates`). Fails only on a config the validation refuses.
pub fn start(
    shared: Arc<Shared>,
    cfg: &PeersConfig,
    instance: &str,
    updates: mpsc::Receiver<PeerUpdate>,
) -> Result<Started, String> {
    let url = cfg.redis_url.as_deref().ok_or("peers.redis_url: not set")?;
    let redis = RedisLink::open(url, Duration::from_millis(cfg.timeout_ms))
        .map_err(|e| format!("peers.redis_url: {:?}", e.kind()))?;
    let (ftx, frx) = mpsc::channel(cfg.max_pending);
    let (in_tx, in_rx) = mpsc::channel(cfg.max_pending);
    let stale = Duration::from_millis(cfg.load_stale_ms);
    // Unchanged busy figures are refreshed four times per bound, so one or
    // two late rounds do not let them lapse.
    let refresh = (stale / 4).max(Duration::from_millis(cfg.flush_ms));
    let task = Task {
        shared: shared.clone(),
        redis,
        cfg: cfg.clone(),
        instance: instance.to_string(),
        prefix_key: format!("{}:peers:prefix", cfg.prefix),
        own_key: log_key(&cfg.prefix, instance),
        load_key: format!("{}:peers:load", cfg.prefix),
        updates,
        forwards: frx,
        forwarded: in_tx,
        pending: VecDeque::new(),
        pending_fwd: VecDeque::new(),
        last_prefix: start_id(CATCH_UP),
        last_own: start_id(CATCH_UP),
        // Older reports are stale anyway; live peers refresh theirs.
        last_load: start_id(stale),
        reporter: Reporter::new(refresh),
        loads: PeerLoads::new(stale),
        up: None,
    };
    tokio::spawn(task.run());
    Ok(Started {
        link: PeerLink {
            forwards: ftx,
            shared,
        },
        forwarded: in_rx,
    })
}

fn log_key(prefix: &str, instance: &str) -> String {
    format!("{prefix}:peers:log:{instance}")
}

/// A stream id `ago` before now (Redis ids are milliseconds since the epoch).
fn start_id(ago: Duration) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(ago);
    format!("{}-0", now.as_millis())
}

/// The milliseconds of a stream entry id (`ms-seq`).
fn id_ms(id: &str) -> Option<u64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

struct Task {
    shared: Arc<Shared>,
    redis: RedisLink,
    cfg: PeersConfig,
    instance: String,
    prefix_key: String,
    own_key: String,
    load_key: String,
    updates: mpsc::Receiver<PeerUpdate>,
    forwards: mpsc::Receiver<Forward>,
    forwarded: mpsc::Sender<Vec<u8>>,
    pending: VecDeque<PeerUpdate>,
    pending_fwd: VecDeque<Forward>,
    last_prefix: String,
    last_own: String,
    last_load: String,
    reporter: Reporter,
    /// The other instances' latest load reports.
    loads: PeerLoads,
    /// Whether the last round trip succeeded (none before the first).
    up: Option<bool>,
}

/// What one round wrote, to drop from the pending queues once Redis took it.
struct Written {
    updates: usize,
    forwards: Vec<usize>,
    bytes: u64,
}

impl Task {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.flush_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.collect() {
                return;
            }
            self.round().await;
        }
    }

    /// Moves what the writer and the access log queued into the bounded
    /// pending queues, dropping the oldest beyond `max_pending`. False when
    /// the process is shutting down (the writer is gone).
    fn collect(&mut self) -> bool {
        let m = &self.shared.metrics;
        loop {
            match self.updates.try_recv() {
                Ok(u) => {
                    if self.pending.len() >= self.cfg.max_pending {
                        self.pending.pop_front();
                        m.peers.updates.inc(PrefixUpdate::Dropped);
                    }
                    self.pending.push_back(u);
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
        while let Ok(f) = self.forwards.try_recv() {
            if self.pending_fwd.len() >= self.cfg.max_pending {
                self.pending_fwd.pop_front();
                m.peers.forwards.add(Forwarded::Dropped, 1);
            }
            self.pending_fwd.push_back(f);
        }
        true
    }

    fn share_load(&self) -> bool {
        self.cfg.load_stale_ms > 0
    }

    async fn round(&mut self) {
        let topo = self.shared.snapshot().topo.clone();
        let now = crate::clock::now();
        let mut pipe = redis::pipe();
        let mut written = self.write(&mut pipe);
        let report = self
            .share_load()
            .then(|| LoadReport::own(&topo))
            .filter(|r| self.reporter.due(r, now));
        if let Some(r) = &report {
            written.bytes += self.write_load(&mut pipe, r);
        }
        // Redis's clock, to age the load reports read below by one clock.
        pipe.cmd("TIME");
        pipe.cmd("XREAD")
            .arg("COUNT")
            .arg(READ_PER_ROUND)
            .arg("STREAMS")
            .arg(&self.prefix_key)
            .arg(&self.own_key);
        if self.share_load() {
            pipe.arg(&self.load_key);
        }
        pipe.arg(&self.last_prefix).arg(&self.last_own);
        if self.share_load() {
            pipe.arg(&self.last_load);
        }
        let reply: redis::RedisResult<((u64, u64), Option<StreamReadReply>)> = async {
            let mut c = self.redis.connection().await?;
            pipe.query_async(&mut c).await
        }
        .await;
        match reply {
            Ok(((secs, micros), read)) => {
                self.sent(written);
                if let Some(r) = report {
                    self.reporter.sent(r, now);
                    self.shared
                        .metrics
                        .peers
                        .load_reports
                        .add(LoadExchange::Sent, 1);
                }
                if let Some(read) = read {
                    self.read(read, &topo, secs * 1000 + micros / 1000);
                }
                if self.up != Some(true) {
                    if self.up.is_some() {
                        tracing::info!(
                            "peer link: Redis answers again; sharing prefixes and access log entries with the other instances"
                        );
                    }
                    self.shared.metrics.peers.up.set(1);
                }
                self.up = Some(true);
            }
            Err(e) => {
                self.redis.reset().await;
                if self.up != Some(false) {
                    tracing::warn!(error = %e,
                        "peer link: Redis unreachable; this instance routes on its own decisions until it answers");
                    self.shared.metrics.peers.up.set(0);
                }
                self.up = Some(false);
            }
        }
        // Every round, answered or not: reports past their bound stop
        // counting even while Redis is gone.
        if self.share_load() {
            // The topology now, not the round's: membership may have changed
            // during the round trip, and figures go to the current slots.
            let topo = self.shared.snapshot().topo.clone();
            let peers = self.loads.apply(&topo, crate::clock::now());
            self.shared.metrics.peers.load_peers.set(peers as i64);
        }
    }
}
