//! The overload replay: a trace's conversations given to tenants of each
//! priority class, replayed through fleetroute with admission off (every
//! request routed as it comes) and on (shed, held or refused by class), and
//! the figures per class.
//!
//! Tenants are assigned per conversation (by its content key), so every turn
//! of a conversation has one tenant: 20% `gold` (critical), 30% `acme` and
//! 20% `globex` (standard), 30% `batch` (sheddable).

use fleetroute::config::Priority;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::fleetroute::{Fleetroute, config_with};
use super::pct;
use super::sim::{self, Outcome, SimConfig};
use super::trace::TraceRequest;

/// (tenant, class, share of conversations).
pub const TENANTS: [(&str, Priority, f64); 4] = [
    ("gold", Priority::Critical, 0.2),
    ("acme", Priority::Standard, 0.3),
    ("globex", Priority::Standard, 0.2),
    ("batch", Priority::Sheddable, 0.3),
];

/// Time to first token objectives, ms (sheddable has none), and the
/// stage's `headroom`.
#[derive(Clone, Copy, Debug)]
pub struct Objectives {
    pub critical_ms: f64,
    pub standard_ms: f64,
    pub headroom: f64,
}

impl Objectives {
    pub fn get(&self, c: Priority) -> Option<f64> {
        match c {
            Priority::Critical => Some(self.critical_ms),
            Priority::Standard => Some(self.standard_ms),
            Priority::Sheddable => None,
        }
    }
}

/// Gives every conversation a tenant, by its content key.
pub fn assign_tenants(reqs: &mut [TraceRequest]) {
    for r in reqs {
        let u = (xxh3_64_with_seed(&r.content_key.to_le_bytes(), 99) >> 11) as f64
            / (1u64 << 53) as f64;
        let mut acc = 0.0;
        let mut name = TENANTS[TENANTS.len() - 1].0;
        for (t, _, share) in TENANTS {
            acc += share;
            if u < acc {
                name = t;
                break;
            }
        }
        r.tenant = name.to_string();
    }
}

pub fn class_of(tenant: &str) -> Priority {
    TENANTS
        .iter()
        .find(|(t, _, _)| *t == tenant)
        .map_or(Priority::Standard, |(_, c, _)| *c)
}

/// fleetroute with the tenants' classes, and admission on the stage when
/// `admission` is set.
pub fn router(cfg: &SimConfig, requests: usize, o: Objectives, admission: bool) -> Fleetroute {
    // Held at most as long as standard's objective allows.
    let max_wait = o.standard_ms.clamp(1.0, 30_000.0);
    let mut top = format!("admission: {{ max_wait_ms: {max_wait} }}\ntenants:\n  named:\n");
    for (t, c, _) in TENANTS {
        top += &format!("    {t}: {{ priority: {} }}\n", c.as_str());
    }
    let stage = if admission {
        format!(
            "    admission: {{ ttft_ms: {{ critical: {}, standard: {} }}, headroom: {}, queue: {{ critical: 256, standard: 256 }} }}\n",
            o.critical_ms, o.standard_ms, o.headroom
        )
    } else {
        String::new()
    };
    let cache = cfg.router_cache_tokens.unwrap_or(cfg.cache_tokens);
    let label = if admission {
        "admission on"
    } else {
        "admission off"
    };
    Fleetroute::new(
        &config_with(cfg.replicas, cache, cfg.latency.max_batch, &stage, &top),
        requests,
        cfg.block_tokens,
        label,
    )
}

/// One class's figures in one run.
#[derive(Clone, Debug)]
pub struct ClassRow {
    pub run: String,
    pub class: Priority,
    pub requests: usize,
    pub served: usize,
    /// Of served requests, ms.
    pub ttft: [f64; 3],
    /// Share of all the class's requests served within its objective
    /// (refused and rejected ones count as misses).
    pub attainment: Option<f64>,
    /// The same among served requests only.
    pub attainment_served: Option<f64>,
    /// Served requests whose own prefill alone took longer than the
    /// objective (no router could have met it for them).
    pub unattainable: usize,
    /// Refused by admission (429).
    pub refused: usize,
    /// Refused by a replica's full queue.
    pub rejected: usize,
    pub held: usize,
    /// Of held requests (routed or refused in the end), ms: p50, p90, max.
    pub wait: [f64; 3],
    /// Admission's refusals by reason (`reason=count`, from its metrics).
    pub reasons: String,
}

/// Admission's refusals of `class` by reason, from fleetroute's metrics.
fn reasons(metrics: &str, class: Priority) -> String {
    let mut out = Vec::new();
    for reason in [
        "saturated",
        "reserved",
        "queue_full",
        "objective",
        "timed_out",
    ] {
        let want = format!("class=\"{}\",verdict=\"{reason}\"}} ", class.as_str());
        let n: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("fleetroute_admission_verdicts_total{") && l.contains(&want))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if n > 0.0 {
            out.push(format!("{reason} {n}"));
        }
    }
    out.join(", ")
}

pub fn rows(
    run: &str,
    reqs: &[TraceRequest],
    o: &Outcome,
    obj: Objectives,
    metrics: &str,
) -> Vec<ClassRow> {
    Priority::ALL
        .iter()
        .map(|&class| {
            let mine: Vec<&sim::RequestOutcome> = reqs
                .iter()
                .zip(&o.requests)
                .filter(|(r, _)| class_of(&r.tenant) == class)
                .map(|(_, x)| x)
                .collect();
            let mut ttft: Vec<f64> = mine
                .iter()
                .map(|x| x.ttft_ms)
                .filter(|t| !t.is_nan())
                .collect();
            ttft.sort_by(f64::total_cmp);
            let mut wait: Vec<f64> = mine
                .iter()
                .filter(|x| x.held)
                .map(|x| x.waited_ms)
                .collect();
            wait.sort_by(f64::total_cmp);
            let within = obj
                .get(class)
                .map(|limit| ttft.iter().filter(|&&t| t <= limit).count());
            ClassRow {
                run: run.to_string(),
                class,
                requests: mine.len(),
                served: ttft.len(),
                ttft: [pct(&ttft, 0.5), pct(&ttft, 0.9), pct(&ttft, 0.99)],
                attainment: within.map(|w| w as f64 / mine.len().max(1) as f64),
                attainment_served: within.map(|w| w as f64 / ttft.len().max(1) as f64),
                unattainable: obj.get(class).map_or(0, |limit| {
                    mine.iter()
                        .filter(|x| !x.ttft_ms.is_nan() && x.prefill_ms > limit)
                        .count()
                }),
                refused: mine.iter().filter(|x| x.refused).count(),
                rejected: mine.iter().filter(|x| x.rejected).count(),
                held: wait.len(),
                wait: [
                    pct(&wait, 0.5),
                    pct(&wait, 0.9),
                    wait.last().copied().unwrap_or(f64::NAN),
                ],
                reasons: reasons(metrics, class),
            }
        })
        .collect()
}

/// Runs fleetroute with admission off and on over the same requests.
pub fn compare(cfg: &SimConfig, reqs: &[TraceRequest], obj: Objectives) -> Vec<ClassRow> {
    let mut out = Vec::new();
    for admission in [false, true] {
        let mut r = router(cfg, reqs.len(), obj, admission);
        let o = sim::run(cfg, reqs, &mut r);
        let run = if admission { "on" } else { "off" };
        out.extend(rows(run, reqs, &o, obj, &r.metrics()));
    }
    out
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else {
        format!("{v:.0}")
    }
}

fn share(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{:.3}", v))
}

pub fn table(rows: &[ClassRow]) -> String {
    let mut s = String::from(
        "| admission | class | requests | served | TTFT p50 / p90 / p99 ms | within objective (all / served; served with own prefill > objective) | refused (429) | rejected (queue) | held | wait p50 / p90 / max ms | refusals by reason |\n|---|---|---:|---:|---|---|---:|---:|---:|---|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} / {} / {} | {} / {}; {} | {} | {} | {} | {} / {} / {} | {} |\n",
            r.run,
            r.class.as_str(),
            r.requests,
            r.served,
            ms(r.ttft[0]),
            ms(r.ttft[1]),
            ms(r.ttft[2]),
            share(r.attainment),
            share(r.attainment_served),
            r.unattainable,
            r.refused,
            r.rejected,
            r.held,
            ms(r.wait[0]),
            ms(r.wait[1]),
            ms(r.wait[2]),
            r.reasons,
        );
    }
    s
}
