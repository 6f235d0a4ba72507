//! Per-minute tokens shared by several instances through Redis.
//!
//! Zero Redis round trips on most decisions: each instance spends a local
//! allowance claimed from Redis in slices (one Lua script: grant at most
//! what is left of the tenant's limit for this minute, atomically), and
//! refills it in the background when it falls under half a slice. A
//! decision waits for one round trip only when the allowance cannot cover
//! it (a tenant's first request, a burst). Commits give unused estimate back
//! to the allowance.
//!
//! Error bound: Redis grants at most `tokens_per_minute` per fixed UTC
//! minute across all instances, so N instances together never pass the
//! limit within one minute; over a 60 s span straddling two minutes they can
//! reach 2× (fixed windows). Unused slices are not returned to Redis; they
//! lapse with the minute, so other instances may be refused early by up to
//! one slice per instance.
//!
//! Redis unreachable: every instance spends at most `limit ÷ instances` in
//! the minute, what Redis granted it before the outage included (counted in
//! `fallback_decisions`, logged once per transition). When Redis answers
//! again the spend made on the fallback share this minute is added to Redis
//! (catch-up) before slices are claimed again.
//!
//! Redis forgetting (restarted empty, failed over to a replica behind): each
//! instance's claims are a field of its own in the minute's hash, and every
//! claim and every catch-up raises that field to what the instance knows it
//! holds this minute. So a Redis that lost the minute learns each live
//! instance's spend back from the instance's next round trip, instead of
//! granting the limit a second time.
//!
//! Worst case in the minute of an outage: each instance spends the larger
//! of what Redis granted it before and its share, so at most the limit plus
//! (instances − 1) ÷ instances of it (all granted to one instance, then the
//! others' shares); an empty restart without an outage seen adds nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::allowance::SharedState;
use std::time::Duration;

use redis::Script;
use redis::aio::MultiplexedConnection;

use super::clock::Clock;
use super::config::TenantsConfig;
use super::ledger::{Estimate, Ledger, Refusal, Reservation, TenantState};
use crate::redis_link::RedisLink;

/// KEYS[1]: a tenant's minute, a hash of what each instance holds of it.
/// ARGV: the limit, the slice wanted, this instance, what this instance
/// holds by its own count. Raises this instance's field to its own count
/// (Redis lost it), then grants at most what the limit leaves.
/// Returns { granted, restored }.
const CLAIM: &str = r"
local own = tonumber(ARGV[4])
local mine = tonumber(redis.call('HGET', KEYS[1], ARGV[3]) or '0')
local restored = 0
if mine < own then
  redis.call('HSET', KEYS[1], ARGV[3], own)
  restored = own - mine
end
local used = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do used = used + tonumber(v) end
local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
if grant > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[3], grant)
else
  grant = 0
end
redis.call('PEXPIRE', KEYS[1], 120000)
return { grant, restored }
";
/// Raises this instance's field (ARGV[1]) to what it holds (ARGV[2]):
/// its spend on the fallback share included. Returns the tokens restored.
const RESTORE: &str = r"
local mine = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local own = tonumber(ARGV[2])
if mine >= own then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], own)
redis.call('PEXPIRE', KEYS[1], 120000)
return own - mine
";

/// `tenants_redis:` in the router config.
pub use crate::config::TenantsRedisConfig as SharedConfig;

/// A ledger whose per-minute limits are shared through Redis.
pub struct Shared {
    ledger: Ledger,
    state: Arc<SharedState>,
    cfg: SharedConfig,
    link: RedisLink,
    claim: Script,
    restore: Script,
    /// This instance's field in each minute's hash.
    instance: String,
}

impl Shared {
    pub fn new(
        tenants: TenantsConfig,
        cfg: SharedConfig,
        clock: Clock,
        instance: &str,
    ) -> redis::RedisResult<Arc<Self>> {
        let link = RedisLink::open(&cfg.url, Duration::from_millis(cfg.timeout_ms))?;
        let state = Arc::new(SharedState {
            instances: cfg.instances.max(1),
            degraded: AtomicBool::new(false),
            fallback_decisions: AtomicU64::new(0),
            refills: AtomicU64::new(0),
            redis_errors: AtomicU64::new(0),
            caught_up_tokens: AtomicU64::new(0),
            restored_tokens: AtomicU64::new(0),
        });
        let ledger = Ledger::build(
            tenants,
            clock,
            Some(state.clone()),
            super::ledger::MAX_TENANTS,
        );
        Ok(Arc::new(Shared {
            ledger,
            state,
            cfg,
            link,
            claim: Script::new(CLAIM),
            restore: Script::new(RESTORE),
            instance: instance.to_string(),
        }))
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// `Ledger::admit`, with at most one Redis round trip when the local
    /// allowance cannot cover the request.
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &str,
        est: &Estimate,
    ) -> Result<Reservation, Refusal> {
        let r = match self.ledger.admit(tenant, est) {
            Err(r) if r.refill => {
                let t = self.ledger.tenant(tenant);
                self.refill_exclusive(&t, est.tokens()).await;
                self.ledger.admit(tenant, est)
            }
            r => r,
        };
        if let Ok(res) = &r {
            self.prefetch(res.tenant());
        }
        r
    }

    fn slice(&self, t: &TenantState) -> u64 {
        let limit = t.limits().tokens_per_minute.unwrap_or(0);
        ((limit as f64 * self.cfg.slice_fraction) as u64).max(1)
    }

    /// Starts a background refill when the allowance is under half a slice.
    fn prefetch(self: &Arc<Self>, tenant: &str) {
        let t = self.ledger.tenant(tenant);
        let Some(a) = &t.allowance else { return };
        if self.state.degraded()
            || a.available(self.ledger.clock()) >= self.slice(&t) / 2
            || a.refilling.swap(true, Relaxed)
        {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            me.refill(&t, 0).await;
            if let Some(a) = &t.allowance {
                a.refilling.store(false, Relaxed);
                a.refilled.notify_waiters();
            }
        });
    }

    /// A refill on the decision's path: waits (bounded by the Redis timeout)
    /// for a background refill already in flight, else claims at least `need`.
    async fn refill_exclusive(&self, t: &TenantState, need: u64) {
        let Some(a) = &t.allowance else { return };
        let done = a.refilled.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        if a.refilling.swap(true, Relaxed) {
            let bound = Duration::from_millis(self.cfg.timeout_ms);
            let _ = tokio::time::timeout(bound, done).await;
            if a.available(self.ledger.clock()) >= need {
                return;
            }
            // The background claim was too small (or late): claim our own.
            self.refill(t, need).await;
            return;
        }
        self.refill(t, need).await;
        a.refilling.store(false, Relaxed);
        a.refilled.notify_waiters();
    }

    /// A tenant's minute: a hash by instance (`tpm-by`, not the single
    /// counter older instances kept under `tpm`).
    fn key(&self, tenant: &str, minute: u64) -> String {
        format!("{}:tpm-by:{tenant}:{minute}", self.cfg.prefix)
    }

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        self.link.connection().await
    }

    async fn failed(&self, e: &redis::RedisError) {
        self.state.redis_errors.fetch_add(1, Relaxed);
        self.link.reset().await;
        if !self.state.degraded.swap(true, Relaxed) {
            tracing::warn!(error = %e, instances = self.state.instances,
                "tenant counters: Redis unreachable, each tenant limited to its per-minute limit ÷ instances");
        }
    }

    /// Claims a slice (at least `need`) of the tenant's minute from Redis:
    /// one round trip. False when Redis did not answer.
    pub async fn refill(&self, t: &TenantState, need: u64) -> bool {
        let (Some(a), Some(limit)) = (&t.allowance, t.limits().tokens_per_minute) else {
            return true;
        };
        let m = self.ledger.clock().minute();
        let want = self.slice(t).max(need);
        let r: redis::RedisResult<(u64, u64)> = async {
            let mut c = self.connection().await?;
            self.claim
                .key(self.key(&t.id, m))
                .arg(limit)
                .arg(want)
                .arg(&self.instance)
                .arg(a.claimed.get(m))
                .invoke_async(&mut c)
                .await
        }
        .await;
        match r {
            Ok((granted, restored)) => {
                self.state.refills.fetch_add(1, Relaxed);
                self.learned_back(restored);
                a.claimed.add(m, granted);
                a.avail.add(m, granted);
                true
            }
            Err(e) => {
                self.failed(&e).await;
                false
            }
        }
    }

    /// While degraded: checks Redis, reports the spend made on fallback
    /// shares this minute, and leaves the fallback. True when healthy.
    pub async fn recover(&self) -> bool {
        if !self.state.degraded() {
            return true;
        }
        let m = self.ledger.clock().minute();
        let r: redis::RedisResult<()> = async {
            let mut c = self.connection().await?;
            for t in self
                .ledger
                .tenants()
                .into_iter()
                .chain([self.ledger.other()])
            {
                let Some(a) = &t.allowance else { continue };
                let spent = a.unsynced.get(m);
                let own = a.claimed.get(m) + spent;
                if own > 0 {
                    // Raises this instance's field to all it holds: the
                    // fallback spend, and its earlier grants should Redis
                    // have come back without them.
                    let raised: u64 = self
                        .restore
                        .key(self.key(&t.id, m))
                        .arg(&self.instance)
                        .arg(own)
                        .invoke_async(&mut c)
                        .await?;
                    a.unsynced.sub(m, spent);
                    a.claimed.add(m, spent);
                    self.state.caught_up_tokens.fetch_add(spent, Relaxed);
                    self.learned_back(raised.saturating_sub(spent));
                }
                // What is left of the fallback share is not Redis's to give.
                a.avail.sub(m, u64::MAX);
            }
            Ok(())
        }
        .await;
        match r {
            Ok(()) => {
                self.state.degraded.store(false, Relaxed);
                tracing::info!("tenant counters: Redis reachable again, local spend reported");
                true
            }
            Err(e) => {
                self.failed(&e).await;
                false
            }
        }
    }

    /// Raises this instance's field of every tenant it holds a claim of
    /// this minute to what it holds, in one round trip: a Redis that came
    /// back empty (without any error this instance saw) learns them back
    /// within one upkeep interval, before it grants them a second time to
    /// other instances.
    pub async fn refresh(&self) {
        if self.state.degraded() {
            return;
        }
        let m = self.ledger.clock().minute();
        let held: Vec<(String, u64)> = self
            .ledger
            .tenants()
            .into_iter()
            .chain([self.ledger.other()])
            .filter_map(|t| {
                let own = t.allowance.as_ref()?.claimed.get(m);
                (own > 0).then(|| (t.id.to_string(), own))
            })
            .collect();
        if held.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        // A Redis that came back empty does not know the script yet.
        pipe.load_script(&self.restore).ignore();
        for (tenant, own) in &held {
            pipe.invoke_script(
                self.restore
                    .key(self.key(tenant, m))
                    .arg(&self.instance)
                    .arg(*own),
            );
        }
        let r: redis::RedisResult<Vec<u64>> = async {
            let mut c = self.connection().await?;
            pipe.query_async(&mut c).await
        }
        .await;
        match r {
            Ok(raised) => self.learned_back(raised.iter().sum()),
            Err(e) => self.failed(&e).await,
        }
    }

    /// Counts claims Redis had lost and learned back.
    fn learned_back(&self, tokens: u64) {
        if tokens > 0 {
            self.state.restored_tokens.fetch_add(tokens, Relaxed);
            tracing::warn!(
                tokens,
                "tenant counters: Redis had lost this instance's claims this minute; restored"
            );
        }
    }

    /// Background upkeep: lease expiry and recovery from an outage, every
    /// `every`. Abort the handle to stop it.
    pub fn spawn_upkeep(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                me.ledger.sweep();
                if me.recover().await {
                    me.refresh().await;
                }
            }
        })
    }

    /// What Redis holds for a tenant's minute, all instances together
    /// (tests and diagnostics).
    pub async fn redis_count(&self, tenant: &str) -> redis::RedisResult<u64> {
        let mut c = self.connection().await?;
        let v: Vec<u64> = redis::cmd("HVALS")
            .arg(self.key(tenant, self.ledger.clock().minute()))
            .query_async(&mut c)
            .await?;
        Ok(v.iter().sum())
    }
}
