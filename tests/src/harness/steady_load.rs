//! A bounded steady load for scenarios that change a fleet while traffic
//! flows: `threads` clients send chat requests back to back through Envoy
//! (at most `cap` each) until stopped, and count what was sent, what failed
//! and which replica served each request (`x-served-by`). A request fails
//! when it errors, answers other than 200, or a stream ends without
//! `[DONE]` (a stream cut short by a replica going away).

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use super::Lab;
use super::client::{chat_body_tokens, client};
use super::scenario::chat_url;

/// What the clients send.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub threads: usize,
    /// Requests per client at most (the loop is bounded even if never stopped).
    pub cap: u64,
    /// Sampling keys per client (`{prefix}-{thread}-{n}`), in rotation.
    pub keys: u64,
    /// Consecutive requests per key before the next key (turns of a conversation).
    pub turns: u64,
    /// Every other request streamed.
    pub streamed: bool,
    pub model: &'static str,
    pub prompt: &'static str,
    pub max_tokens: u32,
    /// Key prefix: loads running side by side keep their keys apart.
    pub prefix: &'static str,
}

impl Default for LoadSpec {
    fn default() -> LoadSpec {
        LoadSpec {
            threads: 3,
            cap: 20_000,
            keys: 64,
            turns: 1,
            streamed: false,
            model: "m1",
            prompt: "hi",
            max_tokens: 4,
            prefix: "load",
        }
    }
}

pub struct SteadyLoad {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    /// Replica name → requests it served.
    served: Arc<Mutex<BTreeMap<String, u64>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

/// The simulated replica that served a response (`?` when not said).
pub fn served_by(r: &reqwest::blocking::Response) -> String {
    r.headers()
        .get("x-served-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string()
}

impl SteadyLoad {
    pub fn start(lab: &Lab, spec: LoadSpec) -> SteadyLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let served = Arc::new(Mutex::new(BTreeMap::new()));
        let threads = (0..spec.threads)
            .map(|t| {
                let (stop, sent, failed, served) =
                    (stop.clone(), sent.clone(), failed.clone(), served.clone());
                let (url, spec) = (chat_url(lab), spec.clone());
                thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) && i < spec.cap {
                        let n = (i / spec.turns.max(1)) % spec.keys.max(1);
                        let key = format!("{}-{t}-{n}", spec.prefix);
                        let stream = spec.streamed && i % 2 == 1;
                        let body = chat_body_tokens(
                            spec.model,
                            Some(&key),
                            spec.prompt,
                            stream,
                            spec.max_tokens,
                        );
                        let r = client()
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body)
                            .send();
                        sent.fetch_add(1, Ordering::Relaxed);
                        let ok = match r {
                            Ok(mut r) if r.status() == 200 => {
                                let by = served_by(&r);
                                let mut body = String::new();
                                let read = r.read_to_string(&mut body).is_ok();
                                if read && (!stream || body.contains("[DONE]")) {
                                    *served.lock().unwrap().entry(by).or_default() += 1;
                                    true
                                } else {
                                    eprintln!("load: {key}: body cut short: {body:.200}");
                                    false
                                }
                            }
                            Ok(r) => {
                                let status = r.status();
                                eprintln!(
                                    "load: {key}: status {status}: {}",
                                    r.text().unwrap_or_default()
                                );
                                false
                            }
                            Err(e) => {
                                eprintln!("load: {key}: {e}");
                                false
                            }
                        };
                        if !ok {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        SteadyLoad {
            stop,
            sent,
            failed,
            served,
            threads,
        }
    }

    /// Requests `replica` served so far.
    pub fn served(&self, replica: &str) -> u64 {
        self.served
            .lock()
            .unwrap()
            .get(replica)
            .copied()
            .unwrap_or(0)
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Stops the clients (each finishes its request in flight); (sent, failed).
    pub fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}
