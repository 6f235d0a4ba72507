//! Load signals from the engines themselves: each replica's Prometheus
//! endpoint, read on an interval through its fleet's engine dialect
//! (`crate::engine`). A signal the engine should export and did not is
//! reported (metric, and one log line when it goes missing), never read as
//! zero; an engine that does not answer keeps its last figures.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use crate::config::EngineMetricsConfig;
use crate::engine::{self, Dialect, EngineReport, ScrapeError, Signals};
use crate::metrics::{FleetEngine, ScrapeResult};
use crate::state::Shared;
use crate::topology::{AdapterId, Fleet};

/// Added to a lease's age before the engine's count can end it.
const RECONCILE_SLACK: Duration = Duration::from_secs(2);

/// One replica's scrape.
enum Outcome {
    Read(EngineReport),
    Failed(ScrapeResult, String),
}

pub async fn run_scrapes(shared: Arc<Shared>) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    // What each fleet lacked last round, to log a change once.
    let mut last: HashMap<String, (Signals, bool)> = HashMap::new();
    loop {
        let snap = shared.snapshot();
        let cfg = snap.topo.engine_metrics.clone();
        if cfg.interval_ms == 0 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            continue;
        }
        // Older than two scrapes and a log flush: has reached the engine.
        let grace = Duration::from_millis(2 * cfg.interval_ms) + RECONCILE_SLACK;
        let rounds = snap
            .topo
            .fleets
            .iter()
            .map(|f| scrape_fleet(&client, f, &cfg, &shared, grace));
        let rounds = join_all(rounds).await;
        for (f, (mut round, failure)) in snap.topo.fleets.iter().zip(rounds) {
            // No body read this round: what was missing still is, as far as
            // anyone knows.
            if round.scrapes[ScrapeResult::Ok as usize] == 0 {
                round.missing = last.get(&f.name).map(|l| l.0).unwrap_or_default();
            }
            report_changes(f, &round, failure, &mut last);
            shared.metrics.engines.record(&f.name, round);
        }
        let names: Vec<&str> = snap.topo.fleets.iter().map(|f| f.name.as_str()).collect();
        shared.metrics.engines.retain(|f| names.contains(&f));
        last.retain(|f, _| names.contains(&f.as_str()));
        drop(snap);
        tokio::time::sleep(Duration::from_millis(cfg.interval_ms)).await;
    }
}

/// Scrapes every replica of one fleet; its figures, and one failure's
/// message if any failed.
async fn scrape_fleet(
    client: &reqwest::Client,
    f: &Fleet,
    cfg: &EngineMetricsConfig,
    shared: &Shared,
    grace: Duration,
) -> (FleetEngine, Option<String>) {
    let dialect = Dialect::new(f.engine, &f.engine_api.metric_map);
    let path = f.engine_api.metrics_path.as_deref().unwrap_or(&cfg.path);
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let scrapes = f.replicas.values().map(|r| {
        let url = format!("http://{}{path}", metrics_addr(&r.addr, f));
        let req = super::with_key(client.get(&url).timeout(timeout), f);
        let dialect = &dialect;
        let load = r.load.clone();
        let key = f.key.as_ref().map(|k| k.authorization().to_vec());
        let (addr, hold) = (r.addr.clone(), f.hold.as_ref());
        async move {
            // A packed replica's models, as the engine lists them: what it
            // evicted or another instance loaded.
            if let Some(h) = hold.filter(|h| h.is_models()) {
                let call = crate::state::engine_call::EngineCall {
                    client,
                    addr: &addr,
                    authorization: key.as_deref(),
                    timeout,
                };
                if let Some((loaded, loading)) = crate::state::model_load::held(&call).await {
                    let ids = |v: &[String]| v.iter().map(|m| AdapterId::of(m)).collect::<Vec<_>>();
                    load.adapters
                        .engine_holds(&ids(&loaded), &ids(&loading), h.kept);
                }
            }
            let outcome = fetch(req, dialect).await;
            if let Outcome::Read(report) = &outcome {
                load.apply_report(report, f.hold.as_ref());
                // Leases the engine no longer knows of were lost in the
                // access log: end them now rather than at their bound.
                if let (Some(run), Some(wait)) = (report.running, report.waiting) {
                    shared.leases.reconcile(&load, (run + wait) as u32, grace);
                }
            }
            outcome
        }
    });
    let mut round = FleetEngine {
        engine: f.engine.as_str(),
        expected: dialect.expected(),
        ..FleetEngine::default()
    };
    let mut failure = None;
    let mut cache = (0u64, 0u64);
    for outcome in join_all(scrapes).await {
        match outcome {
            Outcome::Read(r) => {
                round.scrapes[ScrapeResult::Ok as usize] += 1;
                for s in r.missing.iter() {
                    round.missing.insert(s);
                }
                if let Some((h, q)) = r.prefix_cache {
                    cache = (cache.0 + h as u64, cache.1 + q as u64);
                    round.prefix_cache = Some(cache);
                }
            }
            Outcome::Failed(result, why) => {
                round.scrapes[result as usize] += 1;
                failure.get_or_insert(why);
            }
        }
    }
    (round, failure)
}

async fn fetch(req: reqwest::RequestBuilder, dialect: &Dialect) -> Outcome {
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(ScrapeResult::Unreachable, e.to_string()),
    };
    if !resp.status().is_success() {
        let why = format!("status {}", resp.status());
        return Outcome::Failed(ScrapeResult::HttpError, why);
    }
    // Bounded: an endpoint that streams forever costs at most this.
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) if body.len() + c.len() <= engine::MAX_BODY => body.extend_from_slice(&c),
            Ok(Some(_)) => {
                let why = format!("body over {} bytes", engine::MAX_BODY);
                return Outcome::Failed(ScrapeResult::Unparsable, why);
            }
            Ok(None) => break,
            Err(e) => return Outcome::Failed(ScrapeResult::Unreachable, e.to_string()),
        }
    }
    // Off the runtime's workers, which also serve the routing calls: a body
    // is up to MAX_BODY of whatever the engine sends.
    let dialect = dialect.clone();
    let read = tokio::task::spawn_blocking(move || {
        engine::read(&String::from_utf8_lossy(&body), &dialect)
    })
    .await;
    let Ok(read) = read else {
        return Outcome::Failed(ScrapeResult::Unparsable, "the parse panicked".into());
    };
    match read {
        Ok(r) => Outcome::Read(r),
        Err(ScrapeError::TooLarge) => {
            Outcome::Failed(ScrapeResult::Unparsable, "body too large".into())
        }
        Err(ScrapeError::Unparsable(e)) => Outcome::Failed(
            ScrapeResult::Unparsable,
            format!("not the Prometheus text format: {e}"),
        ),
    }
}

/// `ip:port` of a replica's metrics: its own, or on `metrics_port`.
fn metrics_addr(addr: &str, f: &Fleet) -> String {
    match (
        f.engine_api.metrics_port,
        addr.parse::<std::net::SocketAddr>(),
    ) {
        (Some(port), Ok(mut a)) => {
            a.set_port(port);
            a.to_string()
        }
        _ => addr.to_string(),
    }
}

/// One log line when a fleet's engine starts lacking a signal, or its
/// scrapes start failing; one when it is back.
fn report_changes(
    f: &Fleet,
    round: &FleetEngine,
    failure: Option<String>,
    last: &mut HashMap<String, (Signals, bool)>,
) {
    let (was_missing, was_failing) = last.get(&f.name).copied().unwrap_or_default();
    let newly = round.missing.iter().filter(|s| !was_missing.contains(*s));
    let names: Vec<&str> = newly.map(|s| s.as_str()).collect();
    if !names.is_empty() {
        tracing::warn!(
            fleet = %f.name,
            engine = f.engine.as_str(),
            signals = %names.join(","),
            "the engine's metrics lack what its dialect names: set `engine` or `engine_api.metric_map` for this fleet"
        );
    }
    if round.missing.is_empty() && !was_missing.is_empty() {
        tracing::info!(fleet = %f.name, "the engine's metrics are complete again");
    }
    match (&failure, was_failing) {
        (Some(why), false) => {
            tracing::warn!(fleet = %f.name, error = %why, "engine metrics scrape failed")
        }
        (None, true) => tracing::info!(fleet = %f.name, "engine metrics scrapes succeed again"),
        _ => {}
    }
    last.insert(f.name.clone(), (round.missing, failure.is_some()));
}
