//! The Grafana dashboard against a real Prometheus: traffic through Envoy to
//! two fleets (an A/B test, a shadow, costs, rejections and a config reload
//! included), Prometheus scraping fleetroute's `/metrics` every second, then
//! every panel query of `envoy-config/grafana-dashboard.json` must evaluate
//! to at least one series, for each fleet and for all of them.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body, post};
use fleetroute_tests::harness::procs::{Proc, free_port};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_for_value, wait_until};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../envoy-config/grafana-dashboard.json"
);

const STAGE: &str = "chat/prod";
const MODEL: &str = "chat-model";
const FLEETS: [&str; 2] = ["gb200-rack", "h200-burst"];

/// Two fleets under a weighted policy, with costs (so both cost gauges
/// exist), host bounds (desired replicas), an A/B test (arms), a shadow and
/// class admission.
const ROUTER: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }
fleets:
  - name: gb200-rack
    region: us
    endpoints: ["{g1}", "{g2}"]
    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8, tokens_per_sec: 4000 }
    hosts: { min: 1, max: 4 }
  - name: h200-burst
    region: us
    endpoints: ["{h1}", "{h2}"]
    cost: { gpu_hour_usd: 4.2, gpus_per_replica: 8, tokens_per_sec: 2500 }
    hosts: { min: 0, max: 4 }
stages:
  - name: chat/prod
    models: [chat-model]
    fleets: [gb200-rack, h200-burst]
    residency: us
    replicas: { min: 1, max: 8 }
    routing: { policy: weighted, weights: { gb200-rack: 1, h200-burst: 1 } }
    experiment:
      ab: { control: gb200-rack, variants: [{ fleet: h200-burst, percent: 30 }] }
      shadow: { fleet: h200-burst, percent: 50 }
    # Objectives the test's light traffic always meets: the admission panel's series.
    admission: { ttft_ms: { critical: 60000, standard: 60000 } }
    # Never taken here; its counter's series exist from the start.
    fallbacks: [{ stage: chat/small, on: [unhealthy] }]
  - { name: chat/small, models: [small-model], fleets: [h200-burst], residency: us }
"#;

/// A real Prometheus on loopback scraping one target every second; stopped
/// (by PID) before its data directory is removed.
struct Prometheus {
    base: String,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn binary() -> PathBuf {
        if let Some(p) = std::env::var_os("PROMETHEUS") {
            return p.into();
        }
        std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join("prometheus"))
                    .find(|p| p.is_file())
            })
            .expect("prometheus not found: set PROMETHEUS or run scripts/setup.sh")
    }

    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
                 scrape_configs:\n  - job_name: fleetroute\n    metrics_path: /metrics\n    \
                 static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .expect("write prometheus config");
        let listen = format!("127.0.0.1:{}", free_port());
        let mut proc = Proc::spawn(
            "prometheus",
            Command::new(Self::binary())
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={listen}"))
                .arg("--log.level=warn"),
            dir.path(),
        );
        let base = format!("http://{listen}");
        let ready = format!("{base}/-/ready");
        wait_until("prometheus ready", Duration::from_secs(20), || {
            assert!(!proc.exited(), "prometheus exited:\n{}", proc.log_tail(30));
            blocking_get(&ready).is_some_and(|(s, _)| s == 200)
        });
        Prometheus {
            base,
            _proc: proc,
            _dir: dir,
        }
    }

    /// GETs an API path with its query parameters encoded; the parsed reply.
    fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let mut url = format!("{}{path}", self.base);
        for (i, (k, v)) in params.iter().enumerate() {
            let _ = write!(
                url,
                "{}{}={}",
                if i == 0 { '?' } else { '&' },
                encode(k),
                encode(v)
            );
        }
        let (status, body) = blocking_get(&url).unwrap_or_else(|| panic!("GET {url} failed"));
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {url}: status {status}, not JSON ({e}): {body}"))
    }

    fn query(&self, expr: &str) -> Value {
        self.api("/api/v1/query", &[("query", expr)])
    }

    /// Successful scrapes of fleetroute in the last minute.
    fn scrapes(&self) -> u64 {
        let v = self.query(r#"sum_over_time(up{job="fleetroute"}[1m])"#);
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or(0, |n| n as u64)
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn url(lab: &Lab) -> String {
    format!("{}/v1/chat/completions", lab.envoy)
}

/// One request of the mix: every third streamed (time to first token), 16
/// users (keys spread over fleets and A/B arms), a ~3 KB shared prefix
/// (prefix-cache hits, predicted and engine-reported).
fn send(lab: &Lab, i: usize) {
    let prefix = "Shared context for every conversation of this tenant. ".repeat(60);
    let stream = i.is_multiple_of(3);
    let text = format!("{prefix}\nQuestion {i}: what is {i} plus {i}?");
    let user = format!("user-{}", i % 16);
    let r = post(&url(lab), chat_body(MODEL, Some(&user), &text, stream), &[]);
    assert_eq!(r.status, 200, "request {i}: {}", r.body);
    if stream {
        assert!(
            r.body.contains("data:"),
            "request {i} not streamed: {}",
            r.body
        );
    }
}

/// Every panel target's `expr`, with its panel title, rows' panels included.
fn panel_exprs(panels: &[Value], out: &mut Vec<(String, String)>) {
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((title.clone(), e.to_string()));
            }
        }
        if let Some(inner) = p["panels"].as_array() {
            panel_exprs(inner, out);
        }
    }
}

/// What Grafana sends for one choice of the variables.
fn substitute(expr: &str, stage: &str, fleet: &str) -> String {
    let out = expr
        .replace("$__rate_interval", "1m")
        .replace("${stage}", stage)
        .replace("$stage", stage)
        .replace("${fleet}", fleet)
        .replace("$fleet", fleet);
    assert!(!out.contains('$'), "unsubstituted variable in {expr}");
    out
}

/// `label_values(SELECTOR, LABEL)` of a query variable.
fn label_values_query(dash: &Value, name: &str) -> (String, String) {
    let var = dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variable {name}"));
    let q = var["query"]["query"]
        .as_str()
        .or(var["query"].as_str())
        .unwrap_or_else(|| panic!("variable {name} has no query: {var}"));
    let inner = q
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("variable {name}: not label_values(...): {q}"));
    let (selector, label) = inner
        .rsplit_once(',')
        .expect("label_values(selector, label)");
    (selector.trim().to_string(), label.trim().to_string())
}

fn label_values(prom: &Prometheus, dash: &Value, name: &str, stage: &str) -> BTreeSet<String> {
    let (selector, label) = label_values_query(dash, name);
    let selector = selector.replace("$stage", stage);
    let v = prom.api(
        &format!("/api/v1/label/{label}/values"),
        &[("match[]", selector.as_str())],
    );
    assert_eq!(v["status"], "success", "{selector}: {v}");
    v["data"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

fn has_series(v: &Value) -> bool {
    v["status"] == "success"
        && v["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
}

/// The fleetroute series names an expression refers to.
fn identifiers(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("fleetroute_"))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_dashboard_panel_has_data_in_prometheus() {
    let started = Instant::now();
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(DASHBOARD).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}")),
    )
    .expect("dashboard JSON");
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "stage", "fleet"]);
    let mut exprs = Vec::new();
    panel_exprs(dash["panels"].as_array().expect("panels"), &mut exprs);
    assert!(exprs.len() >= 10, "too few panel queries: {exprs:?}");

    let mut lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: &[],
            ..Default::default()
        },
    );
    let prom = Prometheus::start(lab.admin.trim_start_matches("http://"));
    let metrics = format!("{}/metrics", lab.admin);

    // A config reload (the file watcher sees the size change).
    let mut text = std::fs::read_to_string(&lab.router_path).expect("router config");
    text.push_str("\n# touched to reload\n");
    std::fs::write(&lab.router_path, text).expect("rewrite router config");
    let reloaded = wait_for_value(Duration::from_secs(5), || {
        let (_, body) = blocking_get(&metrics)?;
        (fleetroute_tests::harness::client::metric_sum(
            &body,
            "fleetroute_config_reloads_total",
            &[r#"result="applied""#],
        ) >= 1.0)
            .then_some(())
    });
    assert!(reloaded.is_some(), "the config reload was not applied");
    lab.wait_router_ready();

    for i in 0..60 {
        send(&lab, i);
    }
    // Two requests fleetroute refuses in the stage: a residency outside its own.
    for i in 0..2 {
        let r = post(
            &url(&lab),
            chat_body(MODEL, Some(&format!("eu-{i}")), "hello", false),
            &[("x-residency", "eu")],
        );
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str()),
            (503, Some("residency_unsatisfiable")),
            "residency eu on a us stage: {}",
            r.body
        );
    }

    // And one naming a model no stage serves (no default stage): refused
    // before it reaches a stage.
    let r = post(
        &url(&lab),
        chat_body("no-such-model", None, "hi", false),
        &[],
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{}",
        r.body
    );

    // A few scrapes with traffic flowing, so counters have rates.
    let mut i = 60;
    let deadline = Instant::now() + Duration::from_secs(20);
    while prom.scrapes() < 5 {
        assert!(
            Instant::now() < deadline,
            "prometheus scraped fleetroute fewer than 5 times in 20 s"
        );
        for _ in 0..3 {
            send(&lab, i);
            i += 1;
        }
        pace(Duration::from_millis(200));
    }

    // The variables as Grafana resolves them.
    let stages = label_values(&prom, &dash, "stage", "");
    assert!(stages.contains(STAGE), "stage values: {stages:?}");
    let fleets = label_values(&prom, &dash, "fleet", STAGE);
    let want: BTreeSet<String> = FLEETS.iter().map(|f| f.to_string()).collect();
    assert_eq!(fleets, want, "fleet values for stage {STAGE}");
    // Each fleet alone, and "All" (a regex alternation of the values).
    let mut choices: Vec<String> = fleets.iter().cloned().collect();
    choices.push(format!(
        "({})",
        fleets.iter().cloned().collect::<Vec<_>>().join("|")
    ));

    let all: Vec<(String, String)> = choices
        .iter()
        .flat_map(|fleet| {
            exprs
                .iter()
                .map(move |(title, e)| (title.clone(), substitute(e, STAGE, fleet)))
        })
        .collect();
    // Gauges publish on the writer's tick and appear at the next scrape:
    // retry what is still empty a few times, with traffic flowing.
    let mut pending = all.clone();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        pending.retain(|(_, q)| !has_series(&prom.query(q)));
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        send(&lab, i);
        i += 1;
        pace(Duration::from_millis(500));
    }
    let failures: Vec<String> = pending
        .iter()
        .map(|(title, q)| format!("panel \"{title}\":\n  {q}\n  -> {}", prom.query(q)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} panel queries have no data:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );

    // What each query reads for the whole stage, for whoever runs this.
    for (title, q) in all.iter().skip(exprs.len() * fleets.len()) {
        let v = prom.query(q);
        let first = &v["data"]["result"][0];
        eprintln!(
            "{title}: {} series, e.g. {} = {}\n  {q}",
            v["data"]["result"].as_array().map_or(0, Vec::len),
            first["metric"],
            first["value"][1]
        );
    }

    // Every metric family fleetroute exposes is on some panel.
    let (_, exposition) = blocking_get(&metrics).expect("/metrics");
    let used: BTreeSet<String> = exprs.iter().flat_map(|(_, e)| identifiers(e)).collect();
    let missing: Vec<String> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(name, kind)| {
            let series = match kind {
                "counter" => format!("{name}_total"),
                "histogram" => format!("{name}_bucket"),
                _ => name.to_string(),
            };
            (!used.contains(&series)).then_some(series)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metrics on no dashboard panel: {missing:?}"
    );
    eprintln!(
        "{} queries, {} requests served, {:?}",
        all.len(),
        i,
        started.elapsed()
    );
}

/// Grafana keys panels by id and lays them out by `gridPos`: a repeated id or
/// two panels on the same cells hides one of them.
#[test]
fn panels_have_unique_ids_and_do_not_overlap() {
    let d: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).expect("the dashboard file"))
            .expect("the dashboard is JSON");
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut cells: Vec<(&str, [u64; 4])> = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        let id = p["id"].as_u64().expect("a numeric id");
        assert!(ids.insert(id), "panel id {id} repeats ('{title}')");
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().expect("gridPos"));
        for (other, [ox, oy, ow, oh]) in &cells {
            let apart = x + w <= *ox || ox + ow <= x || y + h <= *oy || oy + oh <= y;
            assert!(apart, "'{title}' overlaps '{other}'");
        }
        cells.push((title, [x, y, w, h]));
    }
}
