//! Running the fleets' membership sources (`fleetroute serve`): one task per
//! fleet whose config names `dns` or `kubernetes`, started when the fleet
//! appears, restarted when its source config changes, stopped when the fleet
//! goes or turns static (a reload that leaves the source as it was keeps it
//! running). Each set a source publishes becomes one `Event::Membership`,
//! applied in the writer's order; `members` turns it into joins and leaves.
//!
//! A source that cannot start (no resolver configuration, no Kubernetes
//! credentials) is retried with backoff and counted as a failure; the fleet
//! keeps the members it has meanwhile (none at start: its stages fail over
//! to their other fleets, else answer 503 `no_ready_replica`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::config::{RouterConfig, Source};
use crate::membership::dns::DnsWatch;
use crate::membership::kubernetes::{self, KubeWatch};
use crate::membership::{self, MembershipRx, SourceCounters};
use crate::state::{Event, Shared};

const FIRST_RETRY: Duration = Duration::from_millis(500);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// A task that ends with its owner.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Running {
    source: Source,
    _task: AbortOnDrop,
}

/// Keeps every dynamic fleet's source running, following the config in effect.
pub async fn run_sources(shared: Arc<Shared>) {
    let mut changes = shared.watch_replicas();
    let mut running: HashMap<String, Running> = HashMap::new();
    loop {
        let cfg = shared.snapshot().config.clone();
        reconcile(&shared, &cfg, &mut running);
        if changes.changed().await.is_err() {
            return;
        }
    }
}

fn reconcile(shared: &Arc<Shared>, cfg: &RouterConfig, running: &mut HashMap<String, Running>) {
    let wanted: HashMap<&str, Source> = cfg
        .fleets
        .iter()
        .map(|f| (f.name.as_str(), f.source()))
        .filter(|(_, s)| s.is_dynamic())
        .collect();
    // Dropping a `Running` stops its source.
    running.retain(|fleet, r| {
        let keep = wanted.get(fleet.as_str()) == Some(&r.source);
        if !keep {
            tracing::info!(
                fleet,
                "membership source stopped (fleet gone or source changed)"
            );
        }
        keep
    });
    shared.metrics.sources.retain(|f| wanted.contains_key(f));
    for (fleet, source) in wanted {
        if running.contains_key(fleet) {
            continue;
        }
        tracing::info!(fleet, source = ?source, "membership source started");
        let counters = shared.metrics.sources.counters(fleet);
        let task = tokio::spawn(forward(
            shared.clone(),
            fleet.to_string(),
            source.clone(),
            counters,
        ));
        running.insert(
            fleet.to_string(),
            Running {
                source,
                _task: AbortOnDrop(task),
            },
        );
    }
}

/// Starts the fleet's source and hands each set it publishes to the writer.
async fn forward(
    shared: Arc<Shared>,
    fleet: String,
    source: Source,
    counters: Arc<SourceCounters>,
) {
    let (mut rx, _source) = start(&fleet, &source, &counters).await;
    loop {
        if rx.changed().await.is_err() {
            tracing::error!(
                fleet,
                "membership source ended; the fleet keeps its members until a reload restarts it"
            );
            return;
        }
        let Some(update) = rx.borrow_and_update().clone() else {
            continue;
        };
        let event = Event::Membership {
            fleet: fleet.clone(),
            source: source.clone(),
            members: update.members,
        };
        // Membership is never dropped: wait for room in the writer's queue.
        if shared.events().send(event).await.is_err() {
            return;
        }
    }
}

/// Retries until the source runs.
async fn start(
    fleet: &str,
    source: &Source,
    counters: &Arc<SourceCounters>,
) -> (MembershipRx, AbortOnDrop) {
    let mut retry = FIRST_RETRY;
    loop {
        let (tx, rx) = membership::channel(fleet);
        let started = match source {
            Source::Dns(d) => DnsWatch::from_source(d)
                .spawn(tx, counters.clone())
                .map_err(|e| format!("dns resolver: {e}")),
            Source::Kubernetes(k) => match kubernetes::client_from_env().await {
                Ok(client) => Ok(KubeWatch::from_source(k).spawn(client, tx, counters.clone())),
                Err(e) => Err(format!("kubernetes client: {e}")),
            },
            // Never started for a static fleet; nothing to wait for.
            Source::Static => return (rx, AbortOnDrop(tokio::spawn(async {}))),
        };
        match started {
            Ok(task) => return (rx, AbortOnDrop(task)),
            Err(e) => {
                SourceCounters::bump(&counters.failures);
                tracing::warn!(fleet, error = %e, retry_ms = retry.as_millis() as u64, "membership source cannot start; the fleet keeps its members");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(LAST_RETRY);
            }
        }
    }
}
