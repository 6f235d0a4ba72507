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
        stage.routing.policy().name(),
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
                pct(r.engine_kv_usage),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage as the admin API writes it (`GET /v1/stage`).
    const STAGE: &str = r#"{
        "name": "s", "models": ["m"], "residency": ["us"], "replicas": { "min": 1, "max": 4 },
        "routing": { "policy": "weighted", "order": null, "weights": { "base": 3.0 },
                     "exploration": null, "tolerance": null, "resume_below": null },
        "experiment": { "ab": { "control": "base", "variants": [{ "fleet": "canary", "percent": 10.0 }] },
                        "shadow": { "fleet": "next", "percent": 5.0 } },
        "fleets": [{
            "name": "base", "region": "us", "weight": 3.0, "traffic_share": 0.75,
            "hit_rate_predicted": 0.6, "hit_rate_engine": 0.55, "ttft_p95_ms": 412.0,
            "latency_ms_per_1k_tokens": 10.0, "error_rate": 0.0, "tokens_per_sec": 1500.0,
            "cost_usd_per_gpu_hour": 9.5, "cost_usd_per_million_tokens": 1.234,
            "utilisation": 0.4, "saturated": false, "desired_replicas": 2,
            "hosts": { "min": 1, "max": 4 }, "prefix_blocks": 12,
            "replicas": [
                { "addr": "10.0.0.1:8000", "state": "ready", "health": "healthy", "ready": true,
                  "warm": true, "ejected": false, "draining": false, "inflight": 2, "queued_tokens": 0,
                  "engine_running": 1, "engine_waiting": 1, "engine_kv_usage": 0.12 },
                { "addr": "10.0.0.2:8000", "state": "draining", "health": "healthy", "ready": false,
                  "warm": true, "ejected": false, "draining": true, "inflight": 0, "queued_tokens": 7,
                  "engine_running": 0, "engine_waiting": 0, "engine_kv_usage": 0.0 }
            ]
        }, {
            "name": "canary", "region": "us", "weight": null, "traffic_share": null,
            "hit_rate_predicted": null, "hit_rate_engine": null, "ttft_p95_ms": null,
            "latency_ms_per_1k_tokens": null, "error_rate": 0.02, "tokens_per_sec": 0.0,
            "cost_usd_per_gpu_hour": null, "cost_usd_per_million_tokens": null,
            "utilisation": null, "saturated": true, "desired_replicas": 0, "hosts": null,
            "prefix_blocks": 0, "replicas": []
        }]
    }"#;

    fn stage() -> StageView {
        serde_json::from_str(STAGE).expect("the API's stage view")
    }

    fn rows(out: &str, first: &str) -> Vec<String> {
        out.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| l.starts_with(first))
            .collect()
    }

    #[test]
    fn metrics_show_each_fleets_figures_in_its_row() {
        let m = render_metrics(&stage());
        assert_eq!(
            rows(&m, "base "),
            ["base 75.0% 60.0% 55.0% 412 10.0 0.0% 1500 9.50 1.234"],
            "{m}"
        );
        assert_eq!(rows(&m, "canary "), ["canary - - - - - 2.0% 0 - -"], "{m}");
        assert!(
            m.contains("A/B test: control base, variants canary 10%"),
            "{m}"
        );
        assert!(m.contains("shadow: 5% to next"), "{m}");
    }

    #[test]
    fn endpoint_shows_the_split_and_each_replicas_state() {
        let e = render_endpoint(&stage());
        assert!(
            e.starts_with("stage s  policy weighted  residency us  replicas 1..4\n"),
            "{e}"
        );
        assert_eq!(
            rows(&e, "base "),
            ["base us 3.00 75.0% no 2 1..4 1/2"],
            "{e}"
        );
        assert_eq!(rows(&e, "canary "), ["canary us - - yes 0 - 0/0"], "{e}");
        assert_eq!(
            rows(&e, "10.0.0.2:8000"),
            ["10.0.0.2:8000 base draining 0 7 0 0.0%"],
            "{e}"
        );
    }
}
