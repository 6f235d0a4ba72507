//! Fallbacks under failure, through real Envoy: the share of client requests
//! that succeed while the primary fleet fails (its engines answer 503, hang,
//! or die mid-stream) or is saturated, at a steady arrival rate, with and
//! without the stage's fallbacks; and how many were served outside the
//! stage's residency (the fallback stage prefers a fleet in another region).
//!
//!   PROFILE=release scripts/build.sh
//!   target/release/fleetroute-fallbacks --seconds 60 --rate 20

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use fleetroute_tests::harness::client::{chat_body_tokens, client};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::{Lab, LabSpec};

/// `big` (eu, two replicas) is the stage clients name; `small` (one eu
/// replica, one us) its fallback, preferring the us fleet. `{FALLBACKS}` is
/// the stage's list, or nothing.
const ROUTER: &str = r#"
health_check: { interval_ms: 1000, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
envoy: { timeouts: { upstream_idle_ms: {IDLE_MS} } }
fleets:
  - { name: big, region: eu, endpoints: ["{b1}", "{b2}"] }
  - { name: small, region: eu, endpoints: ["{s1}", "{s2}"] }
  - { name: small-us, region: us, endpoints: ["{u1}"] }
stages:
  - name: big
    models: [big-model]
    fleets: [big]
    residency: eu
    admission: { ttft_ms: { standard: 1500 }, queue: { standard: 64 } }
    {FALLBACKS}
  - name: small
    models: [small-model]
    fleets: [small-us, small]
    routing: { policy: priority }
"#;

#[derive(Parser)]
#[command(about = "Success share with and without fallbacks while the primary fleet fails")]
struct Args {
    /// Seconds of steady load per run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Requests per second (open loop: arrivals do not wait for answers).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Tokens each request asks for (streamed).
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Scenarios to run: 503, hang, die, saturated.
    #[arg(long, value_delimiter = ',', default_value = "503,hang,die,saturated")]
    scenarios: Vec<String>,
}

#[derive(Default)]
struct Tally {
    sent: u64,
    ok: u64,
    /// Successful answers that came from a fallback, by reason.
    fell_back: BTreeMap<String, u64>,
    /// Failures by status (0: no response or a stream cut short).
    failed: BTreeMap<u16, u64>,
    /// Requests each replica answered (`x-served-by`).
    served: BTreeMap<String, u64>,
}

/// The primary fleet's fault for a scenario, the arrival rate factor, and
/// how long Envoy waits for a stream's next byte (a hang is found by it;
/// the default 60 s elsewhere).
fn fault(scenario: &str) -> (&'static str, f64, u64) {
    match scenario {
        "503" => (r#"{"status": 503}"#, 1.0, 60_000),
        "hang" => (r#"{"hang": true}"#, 1.0, 2_000),
        "die" => (r#"{"die_after_tokens": 2}"#, 1.0, 60_000),
        // Slower engines and twice the traffic: more than big can take.
        "saturated" => (r#"{"slow_factor": 4.0}"#, 2.0, 60_000),
        other => panic!("unknown scenario {other}"),
    }
}

fn one(lab: &Lab, key: u64, max_tokens: u32, tally: &Mutex<Tally>) {
    let body = chat_body_tokens(
        "big-model",
        Some(&format!("user-{key}")),
        "hello there",
        true,
        max_tokens,
    );
    let r = client()
        .post(chat_url(lab))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(30))
        .body(body)
        .send();
    let mut t = tally.lock().unwrap();
    t.sent += 1;
    match r {
        Ok(mut r) if r.status() == 200 => {
            let by = r
                .headers()
                .get("x-served-by")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_string();
            let reason = r
                .headers()
                .get("x-fleetroute-fallback")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split("reason=").nth(1))
                .map(str::to_string);
            drop(t);
            let mut text = String::new();
            let done = r.read_to_string(&mut text).is_ok() && text.contains("[DONE]");
            let mut t = tally.lock().unwrap();
            if done {
                t.ok += 1;
                *t.served.entry(by).or_default() += 1;
                if let Some(reason) = reason {
                    *t.fell_back.entry(reason).or_default() += 1;
                }
            } else {
                *t.failed.entry(0).or_default() += 1;
            }
        }
        Ok(r) => *t.failed.entry(r.status().as_u16()).or_default() += 1,
        Err(_) => *t.failed.entry(0).or_default() += 1,
    }
}

fn run(engine: &str, args: &Args, scenario: &str, fallbacks: bool) -> Tally {
    let list = if fallbacks {
        "fallbacks: [{ stage: small, on: [saturated, unhealthy, upstream] }]"
    } else {
        ""
    };
    let (fault, factor, idle_ms) = fault(scenario);
    let router = ROUTER
        .replace("{FALLBACKS}", list)
        .replace("{IDLE_MS}", &idle_ms.to_string());
    let lab = Lab::start(
        engine,
        LabSpec {
            router: Box::leak(router.into_boxed_str()),
            engine_args: &[
                "--served-model",
                "b1=big-model",
                "--served-model",
                "b2=big-model",
                "--served-model",
                "s1=small-model",
                "--served-model",
                "s2=small-model",
                "--served-model",
                "u1=small-model",
                "--prefill-tokens-per-sec",
                "20000",
                "--decode-ms-per-token",
                "10",
                "--max-batch",
                "8",
            ],
            ..Default::default()
        },
    );
    for r in ["b1", "b2"] {
        lab.fault(r, fault);
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let lab = Arc::new(lab);
    let (tx, rx) = mpsc::channel::<u64>();
    let rx = Arc::new(Mutex::new(rx));
    // Enough workers that arrivals never wait for one (bounded all the same).
    let workers: Vec<_> = (0..256)
        .map(|_| {
            let (rx, lab, tally) = (rx.clone(), lab.clone(), tally.clone());
            let max_tokens = args.max_tokens;
            thread::spawn(move || {
                loop {
                    let next = rx.lock().unwrap().recv();
                    let Ok(key) = next else { break };
                    one(&lab, key, max_tokens, &tally);
                }
            })
        })
        .collect();
    let rate = args.rate * factor;
    let start = Instant::now();
    let total = (rate * args.seconds as f64) as u64;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        tx.send(i).unwrap();
    }
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    Arc::try_unwrap(tally)
        .ok()
        .expect("workers done")
        .into_inner()
        .unwrap()
}

fn main() {
    let args = Args::parse();
    let exe = std::env::current_exe().expect("own path");
    let engine: PathBuf = exe.with_file_name("fleetroute-engine");
    let engine = engine.to_str().expect("utf-8 path");
    println!(
        "{} s at {} req/s (saturated: twice that), streamed, {} tokens each; hang: Envoy's upstream_idle_ms 2000",
        args.seconds, args.rate, args.max_tokens
    );
    println!(
        "| primary fleet | fallbacks | requests | succeeded | share | served by a fallback | failures (status: n) | outside residency |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for scenario in &args.scenarios {
        for fallbacks in [false, true] {
            let t = run(engine, &args, scenario, fallbacks);
            let share = 100.0 * t.ok as f64 / t.sent.max(1) as f64;
            let fell: Vec<String> = t
                .fell_back
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            let failed: Vec<String> = t.failed.iter().map(|(s, n)| format!("{s}: {n}")).collect();
            println!(
                "| {scenario} | {} | {} | {} | {share:.2}% | {} | {} | {} |",
                if fallbacks { "yes" } else { "no" },
                t.sent,
                t.ok,
                if fell.is_empty() {
                    "-".into()
                } else {
                    fell.join(", ")
                },
                if failed.is_empty() {
                    "-".into()
                } else {
                    failed.join(", ")
                },
                t.served.get("u1").copied().unwrap_or(0),
            );
        }
    }
}
