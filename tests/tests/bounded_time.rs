//! Through real Envoy: no client and no replica can hold a stream longer than
//! the router config's `envoy.timeouts` allow, while ordinary requests and
//! long streams that keep sending are served.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{chat_body, chat_body_tokens, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, TWO_FLEETS, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec, pace};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

fn lab(envoy_section: &str, engine_args: &[&str]) -> Lab {
    let router = format!("{envoy_section}\n{TWO_FLEETS}");
    Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args,
            ..Default::default()
        },
    )
}

/// How a slow client misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Slow {
    /// Sends the headers and part of the body, then nothing.
    IdleBody,
    /// Sends the headers, then one body byte every second.
    DribbleBody,
    /// Sends the headers one byte every second.
    DribbleHeaders,
}

struct SlowClient {
    kind: Slow,
    sock: TcpStream,
    /// Bytes still to dribble.
    rest: Vec<u8>,
    closed_after: Option<Duration>,
}

const HEAD: &str = "POST /v1/chat/completions HTTP/1.1\r\nhost: fleetroute\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n";

impl SlowClient {
    fn open(addr: &str, kind: Slow) -> SlowClient {
        let mut sock = TcpStream::connect(addr).expect("connect to Envoy");
        let body = format!(
            "{{\"model\":\"m1\",\"messages\":[{{\"role\":\"user\",\"content\":\"{}",
            "x".repeat(200)
        );
        let rest = match kind {
            Slow::IdleBody => {
                sock.write_all(format!("{HEAD}{body}").as_bytes()).unwrap();
                Vec::new()
            }
            Slow::DribbleBody => {
                sock.write_all(HEAD.as_bytes()).unwrap();
                body.into_bytes()
            }
            Slow::DribbleHeaders => HEAD.as_bytes().to_vec(),
        };
        sock.set_nonblocking(true).unwrap();
        SlowClient {
            kind,
            sock,
            rest,
            closed_after: None,
        }
    }

    /// True once Envoy has closed the connection (after any answer it sent).
    fn poll_closed(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    fn dribble(&mut self) {
        if !self.rest.is_empty() {
            let b = self.rest.remove(0);
            let _ = self.sock.write(&[b]);
        }
    }
}

/// 200 slow uploads are all closed by Envoy within the upload bound while
/// ordinary requests keep succeeding. Without the bounds (the former
/// `request_timeout: 0s` and a 600 s idle timeout) they all stayed open.
#[test]
fn slow_uploads_are_closed_within_the_bound() {
    let lab = lab(
        "envoy: { timeouts: { request_headers_ms: 2000, request_ms: 3000, stream_idle_ms: 2000 } }",
        FAST_ENGINES,
    );
    let addr = lab.envoy.trim_start_matches("http://").to_string();
    let start = Instant::now();
    let mut clients: Vec<SlowClient> = (0..200)
        .map(|i| {
            let kind = match i % 5 {
                0 | 1 => Slow::IdleBody,
                2 | 3 => Slow::DribbleBody,
                _ => Slow::DribbleHeaders,
            };
            SlowClient::open(&addr, kind)
        })
        .collect();
    let mut served = 0;
    let mut last_dribble = Instant::now();
    let deadline = Duration::from_secs(15);
    while clients.iter().any(|c| c.closed_after.is_none()) && start.elapsed() < deadline {
        for c in clients.iter_mut().filter(|c| c.closed_after.is_none()) {
            if c.poll_closed() {
                c.closed_after = Some(start.elapsed());
            }
        }
        if last_dribble.elapsed() >= Duration::from_secs(1) {
            last_dribble = Instant::now();
            for c in clients.iter_mut().filter(|c| c.closed_after.is_none()) {
                c.dribble();
            }
            // Ordinary requests are served meanwhile.
            let r = post(
                &url(&lab),
                chat_body("m1", Some(&format!("ordinary-{served}")), "hi", false),
                &[],
            );
            assert_eq!(r.status, 200, "{}", r.body);
            served += 1;
        }
        // The slow clients' own rhythm: each is polled and dribbles on time.
        pace(Duration::from_millis(20));
    }
    for kind in [Slow::IdleBody, Slow::DribbleBody, Slow::DribbleHeaders] {
        let times: Vec<Duration> = clients
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.closed_after.unwrap_or(deadline))
            .collect();
        let slowest = times.iter().max().unwrap();
        println!(
            "{kind:?}: {} connections, all closed by {:.2} s",
            times.len(),
            slowest.as_secs_f64()
        );
        // The bound (3 s for the whole request) plus a scheduling margin.
        assert!(
            *slowest < Duration::from_secs(6),
            "{kind:?} connections stayed open for {slowest:?}"
        );
    }
    assert!(served >= 2, "ordinary requests were served meanwhile");
    assert!(
        lab.envoy_stat("http.inference.downstream_rq_timeout")
            + lab.envoy_stat("http.inference.downstream_rq_idle_timeout")
            + lab.envoy_stat("http.inference.downstream_rq_header_timeout")
            >= 200,
        "Envoy counted the timeouts"
    );
}

/// A hung replica answers nothing: a streaming request fails after the
/// upstream idle bound and a non-streaming one after the response bound, not
/// after 600 s. A stream that keeps sending tokens runs past both.
#[test]
fn a_hung_replica_fails_within_the_bounds() {
    let lab = lab(
        "envoy: { timeouts: { upstream_idle_ms: 1500, response_ms: 4000 } }",
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "20",
        ],
    );
    // 150 tokens × 20 ms = 3 s: twice the idle bound, but a token arrives
    // every 20 ms, so only the response bound (4 s) could end it.
    let t = Instant::now();
    let r = post(
        &url(&lab),
        chat_body_tokens("m1", Some("long"), "tell a story", true, 150),
        &[],
    );
    let long = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("[DONE]"), "the stream was cut: {}", r.body);
    assert!(long > Duration::from_millis(2500), "{long:?}");
    println!(
        "streaming answer of {:.2} s served in full",
        long.as_secs_f64()
    );

    for replica in ["b1", "b2", "u1", "u2"] {
        lab.fault(replica, r#"{"hang": true}"#);
    }
    let t = Instant::now();
    let r = post(
        &url(&lab),
        chat_body("m1", Some("hung-stream"), "hi", true),
        &[],
    );
    let streaming = t.elapsed();
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(
        streaming >= Duration::from_millis(1400) && streaming < Duration::from_millis(3500),
        "a streaming request to a hung replica took {streaming:?}"
    );
    let t = Instant::now();
    let r = post(
        &url(&lab),
        chat_body("m1", Some("hung-whole"), "hi", false),
        &[],
    );
    let whole = t.elapsed();
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(
        whole >= Duration::from_millis(3900) && whole < Duration::from_secs(6),
        "a non-streaming request to a hung replica took {whole:?}"
    );
    println!(
        "hung replica: streaming request failed after {:.2} s, non-streaming after {:.2} s",
        streaming.as_secs_f64(),
        whole.as_secs_f64()
    );
    for replica in ["b1", "b2", "u1", "u2"] {
        lab.clear_fault(replica);
    }
}

/// Heap in use as a percentage of the overload manager's bound.
fn heap_pressure(lab: &Lab) -> u64 {
    lab.envoy_stat("overload.envoy.resource_monitors.fixed_heap.pressure")
}

/// 100 clients each upload 3.5 MB of a 4 MB body and stop (unbounded, Envoy
/// buffers 350 MB and more per extra client). With a 256 MiB heap bound the
/// overload manager refuses new requests with a 503 once the heap passes 95%,
/// the heap stops growing with the streams already buffering (at most their
/// body limit each), and Envoy serves again once the uploads are gone.
#[test]
fn the_heap_stays_bounded_under_an_upload_attack() {
    const MAX_HEAP: u64 = 256 << 20;
    let lab = lab(
        &format!(
            "envoy: {{ overload: {{ max_heap_bytes: {MAX_HEAP} }}, timeouts: {{ request_ms: 30000, stream_idle_ms: 30000 }} }}"
        ),
        FAST_ENGINES,
    );
    let addr = lab.envoy.trim_start_matches("http://").to_string();
    let before = lab.envoy_stat("server.memory_heap_size") >> 20;
    let body = std::sync::Arc::new(vec![b'x'; 3_500_000]);
    let socks: Vec<TcpStream> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..100)
            .map(|_| {
                let body = body.clone();
                let addr = addr.clone();
                s.spawn(move || {
                    let mut sock = TcpStream::connect(&addr).ok()?;
                    sock.set_write_timeout(Some(Duration::from_secs(10))).ok()?;
                    sock.write_all(
                        b"POST /v1/chat/completions HTTP/1.1\r\nhost: fleetroute\r\ncontent-type: application/json\r\ncontent-length: 4000000\r\n\r\n{\"model\":\"m1\",\"messages\":[{\"role\":\"user\",\"content\":\"",
                    )
                    .ok()?;
                    let _ = sock.write_all(&body);
                    Some(sock)
                })
            })
            .collect();
        clients
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .collect()
    });
    // The overload manager samples every 250 ms.
    fleetroute_tests::harness::wait_until(
        "stop_accepting_requests",
        Duration::from_secs(10),
        || lab.envoy_stat("overload.envoy.overload_actions.stop_accepting_requests.active") == 1,
    );
    let peak = heap_pressure(&lab);
    // Pressure moves around the threshold as Envoy frees memory: poll for a
    // refusal (Envoy's overload 503) rather than expect the first one.
    let mut tries = 0;
    fleetroute_tests::harness::wait_for_value(Duration::from_secs(10), || {
        tries += 1;
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("during-{tries}")), "hi", false),
            &[],
        );
        (r.status == 503).then_some(())
    })
    .expect("new requests are refused with a 503 while the heap is over the bound");
    println!(
        "heap {before} MiB before; {peak}% of the 256 MiB bound with 100 uploads of 3.5 MB held; new requests refused with 503"
    );
    // The streams already buffering may finish their bodies (4 MiB each at
    // most); nothing beyond that.
    assert!(
        peak * MAX_HEAP / 100 < MAX_HEAP + 100 * (4 << 20),
        "heap grew to {peak}% of the bound"
    );
    drop(socks);
    fleetroute_tests::harness::wait_for_value(Duration::from_secs(15), || {
        let r = post(&url(&lab), chat_body("m1", Some("after"), "hi", false), &[]);
        (r.status == 200).then_some(())
    })
    .expect("Envoy serves again after the attack");
}
