//! Tables for people, from the API's typed stage view.

use comfy_table::{Table, presets::NOTHING};

use crate::admin::api::StageView;
use crate::config::Bounds;

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// `min..max`, or `-`.
fn bounds(b: Option<Bounds>) -> String {
    b.map_or("-".into(), |b| format!("{}..{}", b.min, b.max))
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(NOTHING)
        .set_header(header.iter().map(|h| h.to_string()));
    t
}

fn headline(stage: &StageView) -> String {
    let mut s = format!(
        "stage {}  policy {}  residency {}  replicas {}\n",
        stage.name,
        format!("{:?}", stage.routing.policy).to_lowercase(),
        stage.residency.join(","),
        bounds(stage.replicas)
    );
    if let Some(ab) = &stage.experiment.ab {
        let variants: Vec<String> = ab
            .variants
            .iter()
            .map(|v| format!("{} {}%", v.fleet, v.percent))
            .collect();
        s += &format!(
            "A/B test: control {}, variants {}\n",
            ab.control,
            variants.join(", ")
        );
    }
    if let Some(sh) = &stage.experiment.shadow {
        s += &format!("shadow: {}% to {}\n", sh.percent, sh.fleet);
    }
    s
}

fn replicas_table(stage: &StageView) -> Table {
    let mut t = table(&[
        "REPLICA",
        "FLEET",
        "STATE",
        "IN FLIGHT",
        "QUEUED TOKENS",
        "ENGINE WAITING",
        "KV USAGE",
    ]);
    for f in &stage.fleets {
        for r in &f.replicas {
            t.add_row(vec![
                r.addr.clone(),
                f.name.clone(),
                r.state.as_str().to_string(),
                r.inflight.to_string(),
                r.queued_tokens.to_string(),
                r.engine_waiting.to_string(),
                pct(Some(r.engine_kv_usage)),
            ]);
        }
    }
    t
}

/// `endpoint get`: how the stage routes and where its replicas stand.
pub fn render_endpoint(stage: &StageView) -> String {
    let mut t = table(&[
        "FLEET",
        "REGION",
        "WEIGHT",
        "SHARE",
        "SATURATED",
        "DESIRED",
        "HOSTS",
        "READY/TOTAL",
    ]);
    for f in &stage.fleets {
        let ready = f.replicas.iter().filter(|r| r.ready).count();
        t.add_row(vec![
            f.name.clone(),
            f.region.clone(),
            num(f.weight, 2),
            pct(f.traffic_share),
            if f.saturated { "yes" } else { "no" }.to_string(),
            f.desired_replicas.to_string(),
            bounds(f.hosts),
            format!("{ready}/{}", f.replicas.len()),
        ]);
    }
    format!("{}\n{t}\n\n{}\n", headline(stage), replicas_table(stage))
}

/// `metrics`: each fleet's share, cache hit rate, latency and cost.
pub fn render_metrics(stage: &StageView) -> String {
    let mut t = table(&[
        "FLEET",
        "SHARE",
        "HIT RATE (PREDICTED)",
        "HIT RATE (ENGINE)",
        "TTFT P95 MS",
        "MS / 1K PREFILL TOKENS",
        "ERRORS",
        "TOKENS/S",
        "$ / GPU-HOUR",
        "$ / M TOKENS",
    ]);
    for f in &stage.fleets {
        t.add_row(vec![
            f.name.clone(),
            pct(f.traffic_share),
            pct(f.hit_rate_predicted),
            pct(f.hit_rate_engine),
            num(f.ttft_p95_ms, 0),
            num(f.latency_ms_per_1k_tokens, 1),
            pct(Some(f.error_rate)),
            num(Some(f.tokens_per_sec), 0),
            num(f.cost_usd_per_gpu_hour, 2),
            num(f.cost_usd_per_million_tokens, 3),
        ]);
    }
    format!("{}\n{t}\n\n{}\n", headline(stage), replicas_table(stage))
}
