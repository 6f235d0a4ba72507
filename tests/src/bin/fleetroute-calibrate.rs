//! The simulated engine against a real one: the same requests sent to a
//! llama.cpp server and to a simulated replica whose parameters are fitted
//! from the real one's batch-of-one figures, side by side: time to first
//! token by prompt length, decode time per token by batch size, and a
//! prompt sent again with its prefix cached.
//!
//! Times are the client's (non-streaming requests: `max_tokens: 1` for the
//! first token, longer ones for decode); token counts are each engine's own
//! `usage`. `cargo run --release -p fleetroute-tests --bin fleetroute-calibrate [llamacpp|vllm]`
//! (llama-server from `scripts/setup-llamacpp.sh`, vLLM from
//! `scripts/setup-vllm.sh`).

use std::process::Command;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{self, post};
use fleetroute_tests::harness::llama::{Llama, LlamaServer, MODEL};
use fleetroute_tests::harness::procs::{Proc, free_port};
use fleetroute_tests::harness::vllm::VllmServer;
use fleetroute_tests::harness::wait_until;
use serde_json::{Value, json};

const LENGTHS: [usize; 5] = [64, 256, 512, 1024, 1536];
const BATCHES: [usize; 4] = [1, 2, 4, 8];
const DECODE_TOKENS: u64 = 48;
const RUNS: usize = 3;

/// Plain English prose: about four bytes per token, as the simulator
/// counts (bytes / 4) and as chat text tokenizes.
const PROSE: [&str; 6] = [
    "The keeper climbed the narrow stairs of the lighthouse before dawn. ",
    "Below, fishing boats were leaving the harbour one after another. ",
    "She checked the lamp, wrote the weather in the log, and made tea. ",
    "By noon the wind had turned, and the sea was grey and restless. ",
    "A supply ship was due on Thursday, with letters and fresh bread. ",
    "At night the beam swept over the water every twelve seconds. ",
];

/// A prompt of about `words` words that no earlier request shares.
fn prompt(nonce: usize, words: usize) -> String {
    let mut s = format!("Request {nonce}. ");
    let mut i = nonce;
    while s.split(' ').count() < words {
        s.push_str(PROSE[i % PROSE.len()]);
        i += 1;
    }
    s
}

/// One request: wall time in ms and the engine's usage.
fn send(url: &str, text: &str, max_tokens: u64) -> (f64, Value) {
    let body = json!({ "model": MODEL, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
        "messages": [{ "role": "user", "content": text }] });
    let t = Instant::now();
    let r = post(url, body.to_string(), &[]);
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r.status, 200, "{}", r.body);
    (ms, r.json()["usage"].clone())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Curves {
    /// (prompt tokens, first-token ms)
    ttft: Vec<(f64, f64)>,
    /// (batch, ms per decoded token)
    decode: Vec<(usize, f64)>,
    /// cold and warm first-token ms, cached tokens on the warm one
    reuse: (f64, f64, f64),
}

fn measure(addr: &str, nonce0: usize) -> Curves {
    let url = format!("http://{addr}/v1/chat/completions");
    let mut nonce = nonce0;
    let mut next = || {
        nonce += 1;
        nonce
    };
    let ttft = LENGTHS
        .iter()
        .map(|&words| {
            let runs: Vec<(f64, f64)> = (0..RUNS)
                .map(|_| {
                    let (ms, u) = send(&url, &prompt(next(), words), 1);
                    (u["prompt_tokens"].as_f64().unwrap_or(0.0), ms)
                })
                .collect();
            (runs[0].0, median(runs.iter().map(|r| r.1).collect()))
        })
        .collect();
    let decode = BATCHES
        .iter()
        .map(|&b| {
            let first = median(
                (0..RUNS)
                    .map(|_| send(&url, &prompt(next(), 16), 1).0)
                    .collect(),
            );
            let texts: Vec<String> = (0..b).map(|_| prompt(next(), 16)).collect();
            let per_token: Vec<f64> = std::thread::scope(|s| {
                let handles: Vec<_> = texts
                    .iter()
                    .map(|t| s.spawn(|| send(&url, t, DECODE_TOKENS)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        let (ms, u) = h.join().expect("request");
                        let n = u["completion_tokens"].as_f64().unwrap_or(1.0).max(2.0);
                        (ms - first) / (n - 1.0)
                    })
                    .collect()
            });
            (b, median(per_token))
        })
        .collect();
    let long = prompt(next(), 900);
    let (cold, _) = send(&url, &long, 1);
    let (warm, u) = send(&url, &format!("{long} Answer briefly."), 1);
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .unwrap_or(0.0);
    Curves {
        ttft,
        decode,
        reuse: (cold, warm, cached),
    }
}

/// The simulator's parameters: prefill tokens per second between the
/// shortest and longest prompt, the batch-of-one decode time, and what each
/// other running request adds to it (between batches of one and eight).
fn fit(c: &Curves) -> (f64, f64, f64) {
    let (a, b) = (c.ttft[0], c.ttft[c.ttft.len() - 1]);
    let (one, many) = (c.decode[0], c.decode[c.decode.len() - 1]);
    let slope = ((many.1 - one.1) / (many.0 - one.0) as f64).max(0.0);
    ((b.0 - a.0) / ((b.1 - a.1) / 1000.0), one.1, slope)
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "llamacpp".into());
    let dir = tempfile::tempdir().expect("temp dir");
    let real = match which.as_str() {
        "llamacpp" => {
            let server = LlamaServer::start_with(
                &Llama::require(),
                "calibrate",
                dir.path(),
                &["--parallel", "8", "--threads", "2"],
            );
            measure(&server.addr, 0)
        }
        "vllm" => measure(&VllmServer::start("calibrate", dir.path()).addr, 0),
        other => panic!("the engine is llamacpp or vllm, not {other}"),
    };
    let (prefill, decode, slope) = fit(&real);

    let engine = std::env::current_exe()
        .expect("own path")
        .with_file_name("fleetroute-engine");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(engine);
    cmd.args(["--replica", &format!("sim={addr}")])
        .args(["--prefill-tokens-per-sec", &format!("{prefill:.1}")])
        .args(["--decode-ms-per-token", &format!("{decode:.2}")])
        .args(["--decode-ms-per-running", &format!("{slope:.2}")])
        .args(["--max-batch", "8"]);
    let mut sim = Proc::spawn("sim", &mut cmd, dir.path());
    wait_until("the simulated engine", Duration::from_secs(10), || {
        assert!(!sim.exited(), "{}", sim.log_tail(20));
        client::blocking_get(&format!("http://{addr}/health")).is_some()
    });
    let simulated = measure(&addr, 10_000);

    println!(
        "fitted: prefill {prefill:.0} tokens/s, decode {decode:.2} ms/token at a batch of one, \
         +{slope:.2} ms per other running request ({which})\n"
    );
    println!("first token by prompt length (ms)");
    println!("  prompt tokens (real/sim)        real   simulator   sim/real");
    for (r, s) in real.ttft.iter().zip(&simulated.ttft) {
        println!(
            "  {:>6.0} / {:<6.0}           {:>9.1}   {:>9.1}   {:>8.2}",
            r.0,
            s.0,
            r.1,
            s.1,
            s.1 / r.1
        );
    }
    println!("\ndecode time per token by batch size (ms)");
    println!("  batch        real   simulator   sim/real");
    for (r, s) in real.decode.iter().zip(&simulated.decode) {
        println!(
            "  {:>5}   {:>9.2}   {:>9.2}   {:>8.2}",
            r.0,
            r.1,
            s.1,
            s.1 / r.1
        );
    }
    println!("\na ~900-word prompt sent again with a suffix (first token, ms)");
    println!("             cold      warm   cached tokens");
    for (name, c) in [(which.as_str(), real.reuse), ("simulator", simulated.reuse)] {
        println!("  {name:<9} {:>6.1}   {:>7.1}   {:>13.0}", c.0, c.1, c.2);
    }
    sim.stop();
}
