//! The operator commands that talk to a running fleetroute's admin API:
//! `endpoint get`, `metrics`, `split set`, `fleet scale`, `replica drain`,
//! `experiment set|clear`, `reload`. Tables for people, `--json` for scripts.

use std::time::Duration;

use comfy_table::{Table, presets::NOTHING};
use serde_json::Value;

/// Where the admin API is and how to authorise changes.
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(admin: &str, token: Option<String>) -> Client {
        let base = if admin.starts_with("http://") || admin.starts_with("https://") {
            admin.trim_end_matches('/').to_string()
        } else {
            format!("http://{admin}")
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("http client");
        Client { base, token, http }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value, String> {
        let resp = req.send().await.map_err(|e| {
            format!(
                "cannot reach the admin API at {} ({e}); set --admin or FLEETROUTE_ADMIN",
                self.base
            )
        })?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            Ok(body)
        } else {
            let msg = body["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| body.to_string());
            Err(format!("{status}: {msg}"))
        }
    }

    pub async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, String> {
        self.send(self.http.get(format!("{}{path}", self.base)).query(query))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// `{min, max}` as `min..max`, or `-`.
fn bounds(v: &Value) -> String {
    match (&v["min"], &v["max"]) {
        (Value::Number(a), Value::Number(b)) => format!("{a}..{b}"),
        _ => "-".into(),
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(NOTHING)
        .set_header(header.iter().map(|h| h.to_string()));
    t
}

fn headline(stage: &Value) -> String {
    let r = &stage["routing"];
    let replicas = bounds(&stage["replicas"]);
    let residency: Vec<&str> = stage["residency"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut s = format!(
        "stage {}  policy {}  residency {}  replicas {}\n",
        stage["name"].as_str().unwrap_or("?"),
        r["policy"].as_str().unwrap_or("?"),
        residency.join(","),
        replicas
    );
    let ex = &stage["experiment"];
    if let Some(ab) = ex.get("ab") {
        let variants: Vec<String> = ab["variants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| format!("{} {}%", v["fleet"].as_str().unwrap_or("?"), v["percent"]))
            .collect();
        s += &format!(
            "A/B test: control {}, variants {}\n",
            ab["control"].as_str().unwrap_or("?"),
            variants.join(", ")
        );
    }
    if let Some(sh) = ex.get("shadow") {
        s += &format!(
            "shadow: {}% to {}\n",
            sh["percent"],
            sh["fleet"].as_str().unwrap_or("?")
        );
    }
    s
}

fn replicas_table(stage: &Value) -> Table {
    let mut t = table(&[
        "REPLICA",
        "FLEET",
        "STATE",
        "IN FLIGHT",
        "QUEUED TOKENS",
        "ENGINE WAITING",
        "KV USAGE",
    ]);
    for f in stage["fleets"].as_array().into_iter().flatten() {
        for r in f["replicas"].as_array().into_iter().flatten() {
            t.add_row(vec![
                r["addr"].as_str().unwrap_or("?").to_string(),
                f["name"].as_str().unwrap_or("?").to_string(),
                r["state"].as_str().unwrap_or("?").to_string(),
                r["inflight"].to_string(),
                r["queued_tokens"].to_string(),
                r["engine_waiting"].to_string(),
                pct(&r["engine_kv_usage"]),
            ]);
        }
    }
    t
}

/// `endpoint get`: how the stage routes and where its replicas stand.
pub fn render_endpoint(stage: &Value) -> String {
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
    for f in stage["fleets"].as_array().into_iter().flatten() {
        let reps = f["replicas"].as_array().cloned().unwrap_or_default();
        let ready = reps.iter().filter(|r| r["ready"] == true).count();
        let hosts = bounds(&f["hosts"]);
        t.add_row(vec![
            f["name"].as_str().unwrap_or("?").to_string(),
            f["region"].as_str().unwrap_or("?").to_string(),
            num(&f["weight"], 2),
            pct(&f["traffic_share"]),
            if f["saturated"] == true { "yes" } else { "no" }.to_string(),
            f["desired_replicas"].to_string(),
            hosts,
            format!("{ready}/{}", reps.len()),
        ]);
    }
    format!("{}\n{t}\n\n{}\n", headline(stage), replicas_table(stage))
}

/// `metrics`: each fleet's share, cache hit rate, latency and cost.
pub fn render_metrics(stage: &Value) -> String {
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
    for f in stage["fleets"].as_array().into_iter().flatten() {
        t.add_row(vec![
            f["name"].as_str().unwrap_or("?").to_string(),
            pct(&f["traffic_share"]),
            pct(&f["hit_rate_predicted"]),
            pct(&f["hit_rate_engine"]),
            num(&f["ttft_p95_ms"], 0),
            num(&f["latency_ms_per_1k_tokens"], 1),
            pct(&f["error_rate"]),
            num(&f["tokens_per_sec"], 0),
            num(&f["cost_usd_per_gpu_hour"], 2),
            num(&f["cost_usd_per_million_tokens"], 3),
        ]);
    }
    format!("{}\n{t}\n\n{}\n", headline(stage), replicas_table(stage))
}

/// Parses `FLEET=PERCENT`.
pub fn fleet_percent(s: &str) -> Result<(String, f64), String> {
    let (f, p) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected FLEET=PERCENT"))?;
    let p: f64 = p
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}': percent is not a number"))?;
    Ok((f.to_string(), p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_show_the_figures() {
        let stage = serde_json::json!({
            "name": "s", "residency": ["us"], "replicas": { "min": 1, "max": 4 },
            "routing": { "policy": "weighted" },
            "experiment": { "shadow": { "fleet": "next", "percent": 5.0 } },
            "fleets": [{
                "name": "base", "region": "us", "weight": 3.0, "traffic_share": 0.75,
                "hit_rate_predicted": 0.6, "hit_rate_engine": 0.55, "ttft_p95_ms": 412.0,
                "latency_ms_per_1k_tokens": 10.0, "error_rate": 0.0, "tokens_per_sec": 1500.0,
                "cost_usd_per_gpu_hour": 9.5, "cost_usd_per_million_tokens": 1.234,
                "saturated": false, "desired_replicas": 2, "hosts": { "min": 1, "max": 4 },
                "replicas": [{ "addr": "10.0.0.1:8000", "state": "ready", "ready": true, "inflight": 2,
                               "queued_tokens": 0, "engine_waiting": 1, "engine_kv_usage": 0.12 }]
            }]
        });
        let m = render_metrics(&stage);
        for want in [
            "75.0%",
            "60.0%",
            "55.0%",
            "412",
            "9.50",
            "1.234",
            "10.0.0.1:8000",
            "shadow: 5.0% to next",
        ] {
            assert!(m.contains(want), "{want} missing from\n{m}");
        }
        let e = render_endpoint(&stage);
        for want in ["3.00", "1..4", "1/1", "policy weighted"] {
            assert!(e.contains(want), "{want} missing from\n{e}");
        }
        assert_eq!(fleet_percent("burst=10").unwrap(), ("burst".into(), 10.0));
        assert!(fleet_percent("burst").is_err());
    }
}
