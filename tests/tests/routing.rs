//! Through real Envoy: every request lands where fleetroute decided, sticks
//! per sampling key, and passes through unchanged.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{HashMap, HashSet};

use fleetroute_tests::harness::client::{chat_body, post};
use fleetroute_tests::harness::scenario::{
    FAST_ENGINES as FAST, chat_url as url, two_fleets_tolerant_health,
};
use fleetroute_tests::harness::{Lab, LabSpec};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// Health checks that ride out a loaded machine: a replica flapping out on
/// a slow probe would move a key, and these scenarios are about routing.
fn lab() -> Lab {
    let router = two_fleets_tolerant_health();
    Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST,
            ..Default::default()
        },
    )
}

#[test]
fn each_request_lands_on_the_chosen_replica_and_keys_stick() {
    let lab = lab();
    let mut by_key: HashMap<String, HashSet<String>> = HashMap::new();
    let mut fleets = HashSet::new();
    for i in 0..40 {
        let user = format!("user-{i}");
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&user), "hello", false),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let id = r.header("x-request-id").expect("request id").to_string();
        let (fleet, replica) = lab.decision(&id).expect("decision recorded");
        let served = lab.replicas[r.served_by()].clone();
        assert_eq!(
            served, replica,
            "request {id} was decided for {replica} but served by {served}"
        );
        fleets.insert(fleet);
        by_key.entry(user).or_default().insert(served);
    }
    let spread: HashSet<&String> = by_key.values().flatten().collect();
    assert!(spread.len() >= 3, "40 keys reached only {spread:?}");
    assert_eq!(fleets.len(), 2, "both fleets take keys");

    // One key, 50 requests: one replica.
    let mut seen = HashSet::new();
    for _ in 0..50 {
        let r = post(
            &url(&lab),
            chat_body("m1", Some("sticky-user"), "again", false),
            &[],
        );
        assert_eq!(r.status, 200);
        seen.insert(r.served_by().to_string());
    }
    assert_eq!(seen.len(), 1, "one sampling key went to {seen:?}");
}

#[test]
fn content_derived_keys_keep_a_conversation_together() {
    let lab = lab();
    let first = post(
        &url(&lab),
        chat_body("m1", None, "plan a trip to Lisbon", false),
        &[],
    );
    assert_eq!(first.status, 200);
    for turn in 0..5 {
        let body = serde_json::json!({
            "model": "m1",
            "messages": [
                { "role": "system", "content": "You are a terse assistant." },
                { "role": "user", "content": "plan a trip to Lisbon" },
                { "role": "assistant", "content": format!("answer {turn}") },
                { "role": "user", "content": format!("follow-up {turn}") }
            ],
            "max_tokens": 2
        });
        let r = post(&url(&lab), body.to_string(), &[]);
        assert_eq!(r.served_by(), first.served_by(), "turn {turn} moved");
    }
}

/// The same bytes, sent in one piece and as many small chunks, are routed
/// identically (same sampling key and prefix headers).
#[test]
fn chunked_bodies_route_like_whole_ones() {
    let lab = lab();
    for i in 0..6 {
        let body = chat_body(
            "m1",
            None,
            &format!("chunk test {i} {}", "lorem ipsum ".repeat(200)),
            false,
        );
        let whole = post(&url(&lab), body.clone(), &[]);
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            body.as_bytes().chunks(97).map(|c| Ok(c.to_vec())).collect();
        let reader = ChunkReader {
            chunks: chunks.into_iter(),
            cur: Vec::new(),
        };
        let r = fleetroute_tests::harness::client::client()
            .post(url(&lab))
            .header("content-type", "application/json")
            .body(reqwest::blocking::Body::new(reader))
            .send()
            .expect("chunked post");
        assert_eq!(r.status(), 200);
        let served = r.headers()["x-served-by"].to_str().unwrap().to_string();
        assert_eq!(served, whole.served_by(), "body {i}");
    }
}

struct ChunkReader {
    chunks: std::vec::IntoIter<Result<Vec<u8>, std::io::Error>>,
    cur: Vec<u8>,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cur.is_empty() {
            match self.chunks.next() {
                Some(c) => self.cur = c?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur.drain(..n);
        Ok(n)
    }
}

/// What the client receives through Envoy equals what the replica returns
/// directly, for plain JSON and for SSE streams.
#[test]
fn responses_reach_the_client_unchanged() {
    let lab = lab();
    for stream in [false, true] {
        let body = chat_body("m1", Some("same-user"), "tell me about fleets", stream);
        let via_envoy = post(&url(&lab), body.clone(), &[]);
        assert_eq!(via_envoy.status, 200);
        let replica = lab.replicas[via_envoy.served_by()].clone();
        let direct = post(&format!("http://{replica}/v1/chat/completions"), body, &[]);
        assert_eq!(direct.status, 200);
        assert_eq!(
            via_envoy.header("content-type"),
            direct.header("content-type"),
            "content type (stream={stream})"
        );
        assert_eq!(
            normalise(&via_envoy.body),
            normalise(&direct.body),
            "stream={stream}"
        );
        if stream {
            assert!(via_envoy.body.trim_end().ends_with("data: [DONE]"));
            assert!(
                via_envoy.body.matches("data: ").count() >= 6,
                "{}",
                via_envoy.body
            );
        }
        assert!(
            via_envoy.header("x-fleetroute-upstream-host").is_none(),
            "internal response header leaked"
        );
    }
}

/// Ids, timestamps and cache figures differ between two calls by design;
/// everything else must be identical.
fn normalise(body: &str) -> String {
    let fix = |v: &mut serde_json::Value| {
        if let Some(o) = v.as_object_mut() {
            o.remove("id");
            o.remove("created");
            if let Some(u) = o.get_mut("usage").and_then(|u| u.as_object_mut()) {
                u.remove("prompt_tokens_details");
            }
        }
    };
    if body.starts_with("data:") {
        body.split("\n\n")
            .map(|ev| match ev.strip_prefix("data: ") {
                Some(data) if data != "[DONE]" => {
                    let mut v: serde_json::Value = serde_json::from_str(data).expect("SSE JSON");
                    fix(&mut v);
                    v.to_string()
                }
                _ => ev.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    } else {
        let mut v: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        fix(&mut v);
        v.to_string()
    }
}
