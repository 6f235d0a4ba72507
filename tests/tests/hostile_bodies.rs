//! Through real Envoy: request bodies meant to exhaust memory. Hundreds of
//! held uploads just under the size limit, a chunked body over it and JSON
//! shaped to blow up a parser must never kill the filter's Wasm VM; the
//! uploads over the filter's per-worker budget get a JSON 503, and once the
//! attack ends every ordinary request is served again.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES as FAST, TWO_FLEETS, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_for_value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// The template's `max_body_bytes`.
const LIMIT: usize = 4 << 20;
/// Declared size of each held upload: just under the limit.
const UPLOAD: usize = LIMIT - (32 << 10);
/// What each upload sends before it holds: most of its body.
const SENT: usize = UPLOAD - 1024;
/// Concurrent held uploads, sized for a 2-core machine.
const UPLOADS: usize = 300;
/// The template's `max_buffered_bytes_per_worker`.
const BUDGET: usize = 256 << 20;
/// The filter's counter of bodies refused over the budget.
const REFUSED: &str = "wasmcustom.fleetroute_filter.over_budget";
/// How long the uploads are held once no more are refused.
const HOLD: Duration = Duration::from_secs(3);

/// One Envoy worker, so every upload lands in the same Wasm VM (each worker
/// has its own VM and its own budget).
/// Health checks tolerate a replica that is busy reading multi-megabyte
/// bodies for a moment: what is tested here is the proxy, not the engines.
fn lab() -> Lab {
    let router = TWO_FLEETS
        .replace(
            "interval_ms: 200, timeout_ms: 150",
            "interval_ms: 2000, timeout_ms: 1500",
        )
        .replace("unhealthy_threshold: 2", "unhealthy_threshold: 5");
    assert_ne!(router, TWO_FLEETS);
    Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST,
            envoy_workers: Some(1),
            ..Default::default()
        },
    )
}

fn listen_addr(lab: &Lab) -> SocketAddr {
    lab.envoy
        .trim_start_matches("http://")
        .parse()
        .expect("envoy listener address")
}

/// Envoy's resident memory in MiB, from /proc.
fn rss_mib(lab: &Lab) -> u64 {
    let pid = lab.envoy_proc.pid().expect("envoy runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("envoy's status");
    assert!(
        status
            .lines()
            .any(|l| l.trim() == "Name:\tenvoy" || l.ends_with("envoy")),
        "pid {pid} is not envoy"
    );
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        / 1024
}

/// Bytes Envoy's allocator has handed out (its admin `/memory`), in MiB.
fn allocated_mib(lab: &Lab) -> u64 {
    let (_, body) = blocking_get(&format!("{}/memory", lab.envoy_admin)).expect("envoy /memory");
    let v: serde_json::Value = serde_json::from_str(&body).expect("/memory is JSON");
    v["allocated"]
        .as_str()
        .and_then(|a| a.parse::<u64>().ok())
        .expect("allocated")
        >> 20
}

/// Lines of Envoy's log that show the Wasm VM failing.
fn wasm_failures(lab: &Lab) -> Vec<String> {
    std::fs::read_to_string(&lab.envoy_proc.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("RuntimeError")
                || l.contains("Wasm VM failed")
                || (l.contains("proxy_on_") && l.contains("failed"))
        })
        .map(str::to_string)
        .collect()
}

/// An HTTP/1.1 response read off a raw socket.
#[derive(Debug)]
struct RawReply {
    status: u16,
    head: String,
    body: String,
}

impl RawReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn json_code(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        v["error"]["code"].as_str().map(str::to_string)
    }
}

/// Reads one response (head and a content-length body of at most 64 KiB);
/// `None` if the connection ends first.
async fn read_reply(rd: &mut (impl AsyncReadExt + Unpin)) -> Option<RawReply> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 << 10 {
            return None;
        }
        let n = rd.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let mut reply = RawReply {
        status,
        head,
        body: String::new(),
    };
    let len: usize = reply
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
        .min(64 << 10);
    let mut body = buf.split_off(head_end);
    while body.len() < len {
        let n = rd.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    reply.body = String::from_utf8_lossy(&body).into_owned();
    Some(reply)
}

enum Outcome {
    /// Envoy answered before the upload was released.
    Answered(RawReply),
    /// Still held, unanswered, when released.
    Held,
    /// The connection failed without an answer.
    Broken(String),
}

/// One upload: headers and most of a body, then held open until `release`.
async fn held_upload(
    addr: SocketAddr,
    body: Arc<Vec<u8>>,
    settled: Arc<AtomicUsize>,
    mut release: watch::Receiver<bool>,
) -> Outcome {
    let stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => {
            settled.fetch_add(1, Ordering::SeqCst);
            return Outcome::Broken(format!("connect: {e}"));
        }
    };
    let (mut rd, mut wr) = stream.into_split();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: fleetroute\r\ncontent-type: application/json\r\ncontent-length: {UPLOAD}\r\n\r\n"
    );
    let reply = read_reply(&mut rd);
    tokio::pin!(reply);
    let send = async {
        wr.write_all(head.as_bytes()).await?;
        wr.write_all(&body[..SENT]).await?;
        wr.flush().await
    };
    let sent = tokio::select! {
        r = &mut reply => {
            settled.fetch_add(1, Ordering::SeqCst);
            return r.map_or_else(|| Outcome::Broken("closed while sending".into()), Outcome::Answered);
        }
        s = send => s,
    };
    settled.fetch_add(1, Ordering::SeqCst);
    // An answer may race a failed write (Envoy closes after answering).
    let wait = if sent.is_ok() {
        Duration::from_secs(120)
    } else {
        Duration::from_secs(2)
    };
    let settled = async {
        tokio::select! {
            r = &mut reply => r.map_or_else(|| Outcome::Broken(format!("closed unanswered ({sent:?})")), Outcome::Answered),
            _ = release.wait_for(|r| *r) => Outcome::Held,
        }
    };
    tokio::time::timeout(wait, settled)
        .await
        .unwrap_or_else(|_| Outcome::Broken(format!("no answer ({sent:?})")))
}

/// Samples Envoy's RSS every 100 ms until stopped; returns the peak.
fn watch_rss(lab: &Lab, stop: &AtomicBool) -> u64 {
    let mut peak = 0;
    while !stop.load(Ordering::SeqCst) {
        peak = peak.max(rss_mib(lab));
        // The sampling interval.
        pace(Duration::from_millis(100));
    }
    peak.max(rss_mib(lab))
}

/// `uploads` concurrent held uploads of `body`, held a few seconds after
/// all are sent or answered, then closed by the client; returns their
/// outcomes and Envoy's peak RSS (MiB) meanwhile.
fn attack(lab: &Lab, body: &Arc<Vec<u8>>, uploads: usize) -> (Vec<Outcome>, u64) {
    let addr = listen_addr(lab);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| watch_rss(lab, &stop));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let settled = Arc::new(AtomicUsize::new(0));
        let (release, rx) = watch::channel(false);
        let tasks: Vec<_> = (0..uploads)
            .map(|_| rt.spawn(held_upload(addr, body.clone(), settled.clone(), rx.clone())))
            .collect();
        // Every upload written (bounded)...
        let deadline = Instant::now() + Duration::from_secs(60);
        wait_for_value(Duration::from_secs(60), || {
            (settled.load(Ordering::SeqCst) >= uploads).then_some(())
        });
        // ...and read by Envoy: refusals stop coming for a while (written
        // bytes may still sit in socket buffers on a busy machine).
        let mut last = (lab.envoy_stat(REFUSED), Instant::now());
        wait_for_value(deadline.saturating_duration_since(Instant::now()), || {
            let now = lab.envoy_stat(REFUSED);
            if now != last.0 {
                last = (now, Instant::now());
            }
            (last.1.elapsed() >= HOLD).then_some(())
        });
        release.send_replace(true);
        let outcomes = rt.block_on(async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("upload task"));
            }
            out
        });
        drop(rt);
        stop.store(true, Ordering::SeqCst);
        (outcomes, sampler.join().expect("rss sampler"))
    })
}

/// Counts (held, answered 503 overloaded, broken) outcomes, checking every answer.
fn tally(outcomes: &[Outcome]) -> (usize, usize, Vec<String>) {
    let mut held = 0;
    let mut overloaded = 0;
    let mut broken = Vec::new();
    for o in outcomes {
        match o {
            Outcome::Held => held += 1,
            Outcome::Answered(r) => {
                assert_eq!(r.status, 503, "{r:?}");
                assert_eq!(r.json_code().as_deref(), Some("overloaded"), "{r:?}");
                assert!(r.header("retry-after").is_some(), "{r:?}");
                overloaded += 1;
            }
            Outcome::Broken(why) => broken.push(why.clone()),
        }
    }
    (held, overloaded, broken)
}

#[test]
fn held_uploads_never_kill_the_filter() {
    let lab = lab();
    // Warm every path once, so the baseline includes connection pools.
    let r = post(&url(&lab), chat_body("m1", Some("warm"), "hi", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let before = rss_mib(&lab);
    let allocated_before = allocated_mib(&lab);

    // A valid chat request whose content runs on past what is sent.
    let mut body = br#"{"model":"m1","messages":[{"role":"user","content":""#.to_vec();
    body.resize(SENT, b'x');
    let body = Arc::new(body);

    let (outcomes, peak) = attack(&lab, &body, UPLOADS);
    let failures = wasm_failures(&lab);
    assert!(
        failures.is_empty(),
        "the Wasm VM failed:\n{}",
        failures.join("\n")
    );
    let (held, overloaded, broken) = tally(&outcomes);
    eprintln!(
        "uploads: {held} held, {overloaded} overloaded, {} broken; envoy RSS before {before} MiB, peak {peak} MiB",
        broken.len()
    );
    // Held bodies within the budget, plus at most a socket read (1 MiB) of
    // each refused one, plus the allocator's own overhead.
    let peak_bound = before + 2 * (BUDGET >> 20) as u64;
    assert!(
        peak <= peak_bound,
        "envoy RSS peaked at {peak} MiB, over {peak_bound} MiB"
    );
    // The budget (the template's 256 MiB for the one worker) bounds what is held.
    let fits = BUDGET / SENT;
    assert!(
        held >= fits / 2 && held <= fits,
        "{held} uploads held, the budget fits {fits}"
    );
    assert!(overloaded > 0, "no upload was refused over the budget");
    // Envoy closes a refused upload's connection while the client still
    // writes, so the client may see a reset instead of the 503 it was sent;
    // the filter counted every refusal.
    assert_eq!(
        lab.envoy_stat("wasmcustom.fleetroute_filter.over_budget"),
        (overloaded + broken.len()) as u64,
        "every upload not held was refused over the budget: {broken:?}"
    );

    // After the attack: every ordinary request is served again within seconds.
    let models = format!("{}/v1/models", lab.envoy);
    wait_for_value(Duration::from_secs(10), || {
        let r = post(&url(&lab), chat_body("m1", Some("after"), "hi", false), &[]);
        (r.status == 200).then_some(())
    })
    .expect("chat served again after the attack");
    for i in 0..40 {
        let user = format!("after-{i}");
        let r = post(&url(&lab), chat_body("m1", Some(&user), "hi", false), &[]);
        assert_eq!(r.status, 200, "chat {i} after the attack: {}", r.body);
        let (status, text) = blocking_get(&models).expect("GET /v1/models");
        assert_eq!(status, 200, "models {i} after the attack: {text}");
    }
    // The held uploads ended by a reset (their clients closed): their bytes
    // were given back, so the budget holds as many again.
    let counted = lab.envoy_stat("wasmcustom.fleetroute_filter.over_budget");
    let (again, _) = attack(&lab, &body, fits + 16);
    let (held_again, _, _) = tally(&again);
    assert!(
        held_again >= fits / 2,
        "after the reset only {held_again} uploads were held"
    );
    assert!(lab.envoy_stat("wasmcustom.fleetroute_filter.over_budget") > counted);

    // Envoy frees every buffered byte (nothing leaks)...
    let freed = wait_for_value(Duration::from_secs(10), || {
        let now = allocated_mib(&lab);
        (now <= allocated_before + 32).then_some(now)
    });
    assert!(
        freed.is_some(),
        "envoy still has {} MiB allocated (before {allocated_before} MiB)",
        allocated_mib(&lab)
    );
    // ...and its RSS falls back: its allocator returns free pages to the OS
    // over time (memory_allocator_manager) but keeps some, so the bound is
    // the budget plus slack above where it started.
    let settle = wait_for_value(Duration::from_secs(30), || {
        let now = rss_mib(&lab);
        (now <= before + RSS_AFTER_MIB).then_some(now)
    });
    eprintln!(
        "envoy RSS after: {} MiB; allocated {allocated_before} MiB before, {} MiB after",
        rss_mib(&lab),
        allocated_mib(&lab)
    );
    assert!(
        settle.is_some(),
        "envoy RSS stayed at {} MiB (before {before} MiB, peak {peak} MiB)",
        rss_mib(&lab)
    );
    assert!(wasm_failures(&lab).is_empty());
}

/// Envoy's RSS after the attack, above its RSS before: one budget, plus slack.
const RSS_AFTER_MIB: u64 = (BUDGET >> 20) as u64 + 128;

#[test]
fn chunked_body_over_the_limit_gets_the_json_413() {
    let lab = lab();
    let addr = listen_addr(&lab);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Different chunk sizes: small ones reach the filter one by one, large
    // ones may pass Envoy's own buffer limit in one read.
    for chunk in [4 << 10, 64 << 10, 1 << 20] {
        let reply = rt.block_on(async {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let (mut rd, mut wr) = stream.into_split();
            let reply = read_reply(&mut rd);
            tokio::pin!(reply);
            let send = async {
                wr.write_all(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: fleetroute\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
                )
                .await?;
                let data = vec![b'x'; chunk];
                let mut sent = 0;
                while sent <= LIMIT + (512 << 10) {
                    wr.write_all(format!("{chunk:x}\r\n").as_bytes()).await?;
                    wr.write_all(&data).await?;
                    wr.write_all(b"\r\n").await?;
                    sent += chunk;
                }
                wr.write_all(b"0\r\n\r\n").await?;
                std::io::Result::Ok(())
            };
            tokio::select! {
                r = &mut reply => r,
                _ = send => tokio::time::timeout(Duration::from_secs(10), reply).await.ok().flatten(),
            }
        });
        let reply =
            reply.unwrap_or_else(|| panic!("no answer to a chunked body in {chunk}-byte chunks"));
        assert_eq!(reply.status, 413, "{chunk}-byte chunks: {reply:?}");
        assert_eq!(
            reply.json_code().as_deref(),
            Some("request_too_large"),
            "{chunk}-byte chunks: {reply:?}"
        );
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
    assert!(lab.envoy_stat("wasmcustom.fleetroute_filter.body_too_large") >= 1);
    let r = post(&url(&lab), chat_body("m1", Some("after"), "hi", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(wasm_failures(&lab).is_empty());
}

#[test]
fn hostile_json_shapes_are_read_without_failure() {
    let lab = lab();
    let fill = |open: &str, item: &str, close: &str| {
        let mut s = String::with_capacity(LIMIT);
        s.push_str(open);
        let n = (LIMIT - 4096 - open.len() - close.len()) / (item.len() + 1);
        for i in 0..n {
            if i > 0 {
                s.push(',');
            }
            s.push_str(item);
        }
        s.push_str(close);
        s
    };
    let bodies = [
        // Millions of tiny values where a string or a list of parts belongs.
        fill(
            r#"{"model":"m1","messages":[{"role":"user","content":["#,
            "1",
            "]}]}",
        ),
        fill(r#"{"model":"m1","prompt":["#, "[]", "]}"),
        // Hundreds of thousands of tiny messages and parts.
        fill(r#"{"model":"m1","messages":["#, r#"{"role":"u"}"#, "]}"),
        fill(
            r#"{"model":"m1","messages":[{"role":"user","content":["#,
            r#"{"type":"x"}"#,
            "]}]}",
        ),
        // Unread fields holding the same.
        fill(r#"{"model":"m1","tools":["#, "{}", "],\"prompt\":\"hi\"}"),
        // Deep nesting: past serde_json's 128 levels, refused (400).
        format!(
            r#"{{"model":"m1","prompt":{}1{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        ),
    ];
    let parsed_before = ["parse_ok", "parse_bad_shape", "parse_not_json"]
        .map(|c| lab.envoy_stat(&format!("wasmcustom.fleetroute_filter.{c}")))
        .iter()
        .sum::<u64>();
    for round in 0..2 {
        for (i, b) in bodies.iter().enumerate() {
            let r = post(&url(&lab), b.clone(), &[]);
            // Routed (the engine may refuse the shape), or refused by the
            // filter when no reader reads it alike; never a proxy error.
            let deep = i == bodies.len() - 1;
            let answered = if deep {
                r.status == 400 && r.json()["error"]["code"] == "invalid_json"
            } else {
                r.status < 500 && r.header("x-served-by").is_some()
            };
            assert!(
                answered,
                "hostile body {i}, round {round}: {} {}",
                r.status,
                &r.body[..r.body.len().min(300)]
            );
        }
    }
    let parsed_after = ["parse_ok", "parse_bad_shape", "parse_not_json"]
        .map(|c| lab.envoy_stat(&format!("wasmcustom.fleetroute_filter.{c}")))
        .iter()
        .sum::<u64>();
    assert_eq!(parsed_after - parsed_before, 2 * bodies.len() as u64);
    assert!(wasm_failures(&lab).is_empty(), "{:?}", wasm_failures(&lab));
    let r = post(&url(&lab), chat_body("m1", Some("after"), "hi", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
}
