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
//! Redis unreachable: every instance grants itself `limit ÷ instances` per
//! minute (counted in `fallback_decisions`, logged once per transition), on
//! top of what it already held. When Redis answers again the spend made on
//! the fallback share this minute is added to Redis (catch-up) before
//! slices are claimed again. Worst case in the minute of the outage: the
//! limit (granted before) plus the limit (shares).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use redis::Script;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;

use super::clock::Clock;
use super::config::TenantsConfig;
use super::ledger::{Estimate, Ledger, Refusal, Reservation, TenantState};
use super::window::Epoched;
use crate::redis_link::RedisLink;

/// Claims up to ARGV[2] of the limit ARGV[1] left in KEYS[1].
const CLAIM: &str = r"
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
if grant <= 0 then return 0 end
redis.call('INCRBY', KEYS[1], grant)
redis.call('PEXPIRE', KEYS[1], 120000)
return grant
";
/// Adds spend made without Redis.
const CATCH_UP: &str = r"
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], 120000)
return v
";

/// `tenants_redis:` in the router config.
pub use crate::config::TenantsRedisConfig as SharedConfig;

/// Counters and the degraded flag, read by the ledger on the hot path.
#[derive(Debug)]
pub struct SharedState {
    pub instances: u64,
    degraded: AtomicBool,
    /// Decisions taken on the fallback share (Redis unreachable).
    pub fallback_decisions: AtomicU64,
    /// Successful slice claims.
    pub refills: AtomicU64,
    /// Failed round trips.
    pub redis_errors: AtomicU64,
    /// Tokens reported to Redis after an outage.
    pub caught_up_tokens: AtomicU64,
}

impl SharedState {
    pub fn degraded(&self) -> bool {
        self.degraded.load(Relaxed)
    }
}

/// One tenant's local share of its per-minute limit (epoch = minute).
#[derive(Debug, Default)]
pub struct Allowance {
    avail: Epoched,
    /// minute + 1 when this minute's fallback share was granted.
    fallback_minute: AtomicU64,
    /// Spend on the fallback share this minute, not yet in Redis.
    unsynced: Epoched,
    /// One refill at a time per tenant: a decision that runs out while a
    /// background refill is in flight waits for it instead of claiming a
    /// second slice (which would leave one slice stranded locally while the
    /// decision is refused).
    refilling: AtomicBool,
    refilled: Notify,
}

impl Allowance {
    /// Takes `n` tokens for this minute; the minute, or how long to wait.
    pub(crate) fn take(
        &self,
        s: &SharedState,
        clock: &Clock,
        limit: u64,
        n: u64,
    ) -> Result<u64, Duration> {
        let m = clock.minute();
        let degraded = s.degraded();
        if degraded {
            s.fallback_decisions.fetch_add(1, Relaxed);
            if self.fallback_minute.swap(m + 1, Relaxed) != m + 1 {
                self.avail.add(m, limit / s.instances.max(1));
            }
        }
        if self.avail.take(m, n) {
            if degraded {
                self.unsynced.add(m, n);
            }
            return Ok(m);
        }
        Err(Duration::from_millis(60_000 - clock.now_ms() % 60_000))
    }

    /// Returns an unused estimate taken at `minute`.
    pub(crate) fn give_back(&self, minute: u64, n: u64) {
        self.avail.add_same(minute, n);
        self.unsynced.sub(minute, n);
    }

    /// Real usage beyond the estimate, charged now.
    pub(crate) fn spend(&self, s: Option<&SharedState>, clock: &Clock, n: u64) {
        let m = clock.minute();
        self.avail.sub(m, n);
        if s.is_some_and(SharedState::degraded) {
            self.unsynced.add(m, n);
        }
    }

    pub fn available(&self, clock: &Clock) -> u64 {
        self.avail.get(clock.minute())
    }
}

/// A ledger whose per-minute limits are shared through Redis.
pub struct Shared {
    ledger: Ledger,
    state: Arc<SharedState>,
    cfg: SharedConfig,
    link: RedisLink,
    claim: Script,
    catch_up: Script,
}

impl Shared {
    pub fn new(
        tenants: TenantsConfig,
        cfg: SharedConfig,
        clock: Clock,
    ) -> redis::RedisResult<Arc<Self>> {
        let link = RedisLink::open(&cfg.url, Duration::from_millis(cfg.timeout_ms))?;
        let state = Arc::new(SharedState {
            instances: cfg.instances.max(1),
            degraded: AtomicBool::new(false),
            fallback_decisions: AtomicU64::new(0),
            refills: AtomicU64::new(0),
            redis_errors: AtomicU64::new(0),
            caught_up_tokens: AtomicU64::new(0),
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
            catch_up: Script::new(CATCH_UP),
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

    fn key(&self, tenant: &str, minute: u64) -> String {
        format!("{}:tpm:{tenant}:{minute}", self.cfg.prefix)
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
        let r: redis::RedisResult<u64> = async {
            let mut c = self.connection().await?;
            self.claim
                .key(self.key(&t.id, m))
                .arg(limit)
                .arg(want)
                .invoke_async(&mut c)
                .await
        }
        .await;
        match r {
            Ok(granted) => {
                self.state.refills.fetch_add(1, Relaxed);
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
                if spent > 0 {
                    let _: u64 = self
                        .catch_up
                        .key(self.key(&t.id, m))
                        .arg(spent)
                        .invoke_async(&mut c)
                        .await?;
                    a.unsynced.sub(m, spent);
                    self.state.caught_up_tokens.fetch_add(spent, Relaxed);
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

    /// Background upkeep: lease expiry and recovery from an outage, every
    /// `every`. Abort the handle to stop it.
    pub fn spawn_upkeep(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                me.ledger.sweep();
                me.recover().await;
            }
        })
    }

    /// The value Redis holds for a tenant's minute (tests and diagnostics).
    pub async fn redis_count(&self, tenant: &str) -> redis::RedisResult<u64> {
        let mut c = self.connection().await?;
        let v: Option<u64> = redis::cmd("GET")
            .arg(self.key(tenant, self.ledger.clock().minute()))
            .query_async(&mut c)
            .await?;
        Ok(v.unwrap_or(0))
    }
}
