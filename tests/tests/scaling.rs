//! A DNS-sourced fleet grows 2 → 4 → 6 and shrinks 6 → 4 → 2 under a steady
//! load of streamed and non-streamed requests, through real Envoy with the
//! EDS bootstrap and a real DNS server (`harness::dns`) whose SRV records the
//! test changes. New replicas start before their records appear; removed
//! ones stop only after fleetroute let them go. After each change: requests
//! failed (0), seconds from the DNS change to the new replicas' first
//! request, the share of sampling keys whose replica moved against the ideal
//! (measured from what served them), and Envoy's members equal to
//! fleetroute's. Figures print with `--nocapture`.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{
    blocking_get, chat_body, chat_body_tokens, client, metric_sum,
};
use fleetroute_tests::harness::dns::{DnsServer, srv_name};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url};
use fleetroute_tests::harness::steady_load::{LoadSpec, SteadyLoad, served_by};
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const DNS_INTERVAL_S: f64 = 1.0;
const HEALTH_INTERVAL_S: f64 = 0.5;
const HEALTHY_THRESHOLD: f64 = 1.0;
/// No golden prompts: joiners are warm at once.
const WARMUP_S: f64 = 0.0;

/// `{r1}` and `{r2}` are the first members (the harness starts them); DNS,
/// not the config, lists them.
const ROUTER: &str = r#"
# First members, listed by DNS only: {r1} {r2}
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
default_stage: chat
fleets:
  - name: pool
    region: us
    dns: { name: "_engine._tcp.pool.test.", interval_s: 1, nameserver: "NAMESERVER" }
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
    # The engines answer in a few ms, so on a loaded machine scheduling noise
    # alone can put a new replica past twice the fleet's median and eject it;
    # this scenario measures membership, not ejection.
    outlier: { enabled: false }
"#;

/// Non-streamed and streamed requests over 200 sampling keys per client,
/// three turns each.
fn steady(threads: usize) -> LoadSpec {
    LoadSpec {
        threads,
        cap: 50_000,
        keys: 200,
        turns: 3,
        streamed: true,
        prompt: "hi there",
        ..Default::default()
    }
}

/// fleetroute's members of `pool` (leaving ones included).
fn router_members(lab: &Lab) -> Option<BTreeSet<String>> {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let f = v["fleets"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == "pool")?;
    Some(
        f["replicas"]
            .as_array()?
            .iter()
            .filter_map(|r| r["addr"].as_str().map(str::to_string))
            .collect(),
    )
}

/// Waits until fleetroute lists exactly `want` and Envoy's `pool` and
/// `fallback/chat` clusters list the same.
fn wait_members(lab: &Lab, what: &str, want: &BTreeSet<String>) {
    let mut last = None;
    let ok = wait_for_value(Duration::from_secs(60), || {
        let router = router_members(lab)?;
        let envoy = lab.envoy_members()?;
        let of = |c: &str| -> BTreeSet<String> {
            envoy
                .get(c)
                .map(|h| h.keys().cloned().collect())
                .unwrap_or_default()
        };
        let (pool, fallback) = (of("pool"), of("fallback/chat"));
        if &router == want && pool == router && fallback == router {
            return Some(());
        }
        last = Some((router, pool, fallback));
        None
    });
    assert!(
        ok.is_some(),
        "{what}: want {want:?}; fleetroute, envoy pool, envoy fallback: {last:?}"
    );
}

/// What served a probe key and why fleetroute picked that replica (the
/// decision's `pick`: `key` for the key's rendezvous choice, `load` or
/// `load_guard` when load sent it elsewhere, `prefix` for a cached prompt).
#[derive(Clone, Debug, PartialEq)]
struct Probe {
    by: String,
    pick: String,
}

/// Which replica serves each probe key now (one request per key), and
/// fleetroute's recorded pick for it (by the `x-request-id` Envoy gave it).
fn probe(lab: &Lab, keys: usize) -> (BTreeMap<String, Probe>, BTreeSet<String>) {
    let url = chat_url(lab);
    let mut unready = not_ready(lab);
    let served: Vec<(String, String, String)> = (0..keys)
        .map(|k| {
            let key = format!("probe-{k}");
            let r = client()
                .post(&url)
                .header("content-type", "application/json")
                .body(chat_body("m1", Some(&key), "probe", false))
                .send()
                .expect("probe");
            assert_eq!(r.status(), 200, "probe {key}");
            let id = r
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .expect("Envoy's x-request-id")
                .to_string();
            (key, id, served_by(&r))
        })
        .collect();
    unready.extend(not_ready(lab));
    let probes = served
        .into_iter()
        .map(|(key, id, by)| {
            let url = format!("{}/debug/decisions?id={id}", lab.admin);
            let pick = wait_for_value(Duration::from_secs(5), || {
                let (_, body) = blocking_get(&url)?;
                let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                Some(v.as_array()?.first()?["pick"].as_str()?.to_string())
            })
            .unwrap_or_else(|| panic!("no decision recorded for {key} ({id})"));
            (key, Probe { by, pick })
        })
        .collect();
    (probes, unready)
}

/// Members of `pool` fleetroute does not count ready now (a missed health
/// probe on a loaded machine changes a key's rendezvous choice).
fn not_ready(lab: &Lab) -> BTreeSet<String> {
    let snapshot = blocking_get(&format!("{}/debug/snapshot", lab.admin))
        .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
        .expect("fleetroute's snapshot");
    snapshot["fleets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["name"] == "pool")
        .flat_map(|f| f["replicas"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["ready"] != true)
        .filter_map(|r| r["addr"].as_str().map(str::to_string))
        .collect()
}

/// Keys whose replica changed: (all, those where load decided either
/// round, those the key's own rendezvous choice moved).
fn moves<'a>(
    before: &BTreeMap<String, Probe>,
    after: &'a BTreeMap<String, Probe>,
) -> (Vec<&'a String>, usize, Vec<&'a String>) {
    let moved: Vec<&String> = after
        .keys()
        .filter(|k| after[*k].by != before[*k].by)
        .collect();
    let by_key: Vec<&String> = moved
        .iter()
        .copied()
        .filter(|k| after[*k].pick == "key" && before[*k].pick == "key")
        .collect();
    (moved.clone(), moved.len() - by_key.len(), by_key)
}

/// How many probes of a round had each pick.
fn picks(p: &BTreeMap<String, Probe>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for v in p.values() {
        *out.entry(v.pick.clone()).or_default() += 1;
    }
    out
}

struct Step {
    what: String,
    failed: u64,
    first_request_s: Option<f64>,
    moved: f64,
    ideal: f64,
    /// Moved keys whose replica load chose in either round (not a stray).
    by_load: usize,
    /// Keys that moved where they should not (to an old replica on a grow,
    /// off a replica that stays on a shrink) with their rendezvous choice
    /// deciding both rounds.
    strays: usize,
    /// Moves load made that would be strays by the rule above.
    load_strays: usize,
    /// Picks of the round after the change.
    picks: BTreeMap<String, usize>,
    /// Members seen not ready around either probe round.
    unready: BTreeSet<String>,
    /// Long streams started on removed replicas: (started, served there, unfinished).
    long: Option<(usize, usize, usize)>,
}

/// Streams of ~3,000 tokens (about 3 s at 1 ms a token), one per key.
struct LongStreams {
    /// Streams whose response headers arrived.
    started: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<(String, bool)>>,
}

impl LongStreams {
    fn start(lab: &Lab, keys: &[String]) -> LongStreams {
        let started = Arc::new(AtomicU64::new(0));
        let threads = keys
            .iter()
            .map(|key| {
                let (url, key, started) = (chat_url(lab), key.clone(), started.clone());
                thread::spawn(move || {
                    let r = client()
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(chat_body_tokens("m1", Some(&key), "probe", true, 3000))
                        .send();
                    started.fetch_add(1, Ordering::Relaxed);
                    let Ok(mut r) = r else {
                        return ("?".to_string(), false);
                    };
                    let by = served_by(&r);
                    let mut body = String::new();
                    let done = r.status() == 200
                        && r.read_to_string(&mut body).is_ok()
                        && body.contains("[DONE]");
                    (by, done)
                })
            })
            .collect();
        LongStreams { started, threads }
    }

    /// (streams, served by a removed replica, unfinished).
    fn finish(self, gone: &[&str]) -> (usize, usize, usize) {
        let all: Vec<(String, bool)> = self
            .threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let on_gone = all
            .iter()
            .filter(|(by, _)| gone.contains(&by.as_str()))
            .count();
        let unfinished = all.iter().filter(|(_, done)| !done).count();
        (all.len(), on_gone, unfinished)
    }
}

#[test]
fn a_dns_fleet_grows_and_shrinks_under_load_through_envoy() {
    let mut dns = DnsServer::start();
    let router = ROUTER.replace("NAMESERVER", &dns.addr.to_string());
    let list = |r: &BTreeMap<String, String>| dns.set_fleet("pool", r.values());
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            before_router: Some(&list),
            ..Default::default()
        },
    );
    assert!(srv_name("pool").starts_with("_engine._tcp."));
    // Replica name by address, and the addresses listed now.
    let mut names: BTreeMap<String, String> = lab
        .replicas
        .iter()
        .map(|(n, a)| (a.clone(), n.clone()))
        .collect();
    let mut listed: BTreeMap<String, String> = lab.replicas.clone();
    wait_members(
        &lab,
        "at start",
        &listed.values().cloned().collect::<BTreeSet<_>>(),
    );

    let load = SteadyLoad::start(&lab, steady(3));
    wait_until("load to start", Duration::from_secs(30), || {
        load.sent() >= 30
    });
    const KEYS: usize = 60;
    let (mut before, mut unready_before) = probe(&lab, KEYS);
    let target_s = DNS_INTERVAL_S + HEALTH_INTERVAL_S * HEALTHY_THRESHOLD + WARMUP_S;
    let mut steps = Vec::new();
    let mut extras = Vec::new();
    let mut failed_so_far = 0;

    // Grow: start the replicas, then list them.
    for new in [["r3", "r4"], ["r5", "r6"]] {
        let extra = lab.start_replicas(&new);
        for (n, a) in &extra.replicas {
            names.insert(a.clone(), n.clone());
            listed.insert(n.clone(), a.clone());
        }
        let t0 = Instant::now();
        dns.set_fleet("pool", listed.values());
        let mut first = None;
        wait_until("the new replicas to serve", Duration::from_secs(60), || {
            if new.iter().all(|n| load.served(n) > 0) {
                first.get_or_insert(t0.elapsed());
                return true;
            }
            false
        });
        let want: BTreeSet<String> = listed.values().cloned().collect();
        wait_members(&lab, &format!("after growing to {}", want.len()), &want);
        let (after, unready_after) = probe(&lab, KEYS);
        let unready: BTreeSet<String> = unready_before.union(&unready_after).cloned().collect();
        let (moved, by_load, by_key) = moves(&before, &after);
        let stray = |k: &&&String| !new.contains(&after[**k].by.as_str());
        let strays = by_key.iter().filter(stray).count();
        let load_strays = moved.iter().filter(stray).count() - strays;
        let n = want.len() as f64;
        steps.push(Step {
            what: format!("{} -> {}", want.len() - 2, want.len()),
            failed: load.failed() - failed_so_far,
            first_request_s: first.map(|d| d.as_secs_f64()),
            moved: moved.len() as f64 / KEYS as f64,
            ideal: 2.0 / n,
            by_load,
            strays,
            load_strays,
            picks: picks(&after),
            unready,
            long: None,
        });
        failed_so_far = load.failed();
        before = after;
        unready_before = unready_after;
        extras.push(extra);
    }

    // Shrink: unlist, wait until fleetroute let them go, then stop them.
    for gone in [["r5", "r6"], ["r3", "r4"]] {
        let n0 = listed.len();
        for g in gone {
            listed.remove(g);
        }
        let on_gone = before
            .values()
            .filter(|p| gone.contains(&p.by.as_str()))
            .count();
        // Long streams on the replicas being removed, started before the
        // change: two keys from each, so that one of them being out of
        // rotation for a moment (an outlier ejection on a loaded machine)
        // still leaves streams on the other.
        let keys: Vec<String> = gone
            .iter()
            .flat_map(|g| {
                before
                    .iter()
                    .filter(move |(_, p)| p.by == *g)
                    .map(|(k, _)| k.clone())
                    .take(2)
            })
            .collect();
        let long = LongStreams::start(&lab, &keys);
        wait_until("the long streams to start", Duration::from_secs(30), || {
            long.started.load(Ordering::Relaxed) == keys.len() as u64
        });
        dns.set_fleet("pool", listed.values());
        let want: BTreeSet<String> = listed.values().cloned().collect();
        wait_members(&lab, &format!("after shrinking to {}", want.len()), &want);
        let long = long.finish(&gone);
        extras.pop().expect("the replicas started last");
        let (after, unready_after) = probe(&lab, KEYS);
        let unready: BTreeSet<String> = unready_before.union(&unready_after).cloned().collect();
        let (moved, by_load, by_key) = moves(&before, &after);
        let stray = |k: &&&String| !gone.contains(&before[**k].by.as_str());
        let strays = by_key.iter().filter(stray).count();
        let load_strays = moved.iter().filter(stray).count() - strays;
        steps.push(Step {
            what: format!("{n0} -> {}", want.len()),
            failed: load.failed() - failed_so_far,
            first_request_s: None,
            moved: moved.len() as f64 / KEYS as f64,
            ideal: on_gone as f64 / KEYS as f64,
            by_load,
            strays,
            load_strays,
            picks: picks(&after),
            unready,
            long: Some(long),
        });
        failed_so_far = load.failed();
        before = after;
        unready_before = unready_after;
    }
    let (sent, failed) = load.finish();
    dns.stop();

    eprintln!("scaling: {sent} requests (half streamed), {failed} failed; {KEYS} probe keys");
    eprintln!(
        "scaling: first-request target {target_s:.1} s (dns {DNS_INTERVAL_S} + health {HEALTH_INTERVAL_S} x {HEALTHY_THRESHOLD} + warmup {WARMUP_S})"
    );
    for s in &steps {
        eprintln!(
            "scaling: {:>7}: failed {}, first request {}, keys moved {:.2} (ideal {:.2}; {} of them load-picked), strays {} (load-picked {}), picks {:?}, not ready {:?}, long streams (started, on removed, unfinished) {:?}",
            s.what,
            s.failed,
            s.first_request_s
                .map_or("-".to_string(), |t| format!("{t:.2} s")),
            s.moved,
            s.ideal,
            s.by_load,
            s.strays,
            s.load_strays,
            s.picks,
            s.unready,
            s.long
        );
    }
    assert_eq!(failed, 0, "requests failed while the fleet changed");
    for s in &steps {
        if let Some((started, on_gone, unfinished)) = s.long {
            assert!(
                started > 0 && on_gone > 0,
                "{}: no long stream on a removed replica",
                s.what
            );
            assert_eq!(unfinished, 0, "{}: long streams cut", s.what);
        }
    }
    for s in &steps {
        if let Some(t) = s.first_request_s {
            // The measuring poll and the load's own pace add to the path;
            // a loaded machine gets one more interval.
            assert!(
                t <= target_s + DNS_INTERVAL_S,
                "{}: first request after {t:.2} s",
                s.what
            );
        }
    }
    // A key that its rendezvous choice placed in both rounds moves only to
    // a new replica (grow) or off a removed one (shrink). Probes run under
    // the load, so some are placed by load instead (a busy replica sends a
    // key elsewhere, `pick` says so): those are counted apart and bound the
    // share moved only loosely around the ideal.
    for s in &steps {
        // With a member not ready, its keys' rendezvous choice was another.
        if s.unready.is_empty() {
            assert_eq!(s.strays, 0, "{}: keys strayed by their own choice", s.what);
        }
        assert!(
            s.moved <= s.ideal + 0.25,
            "{}: {:.2} of keys moved, ideal {:.2}",
            s.what,
            s.moved,
            s.ideal
        );
    }
}

fn metric(lab: &Lab, name: &str) -> f64 {
    blocking_get(&format!("{}/metrics", lab.admin))
        .map_or(-1.0, |(_, m)| metric_sum(&m, name, &["fleet=\"pool\""]))
}

/// The DNS server goes away mid-run: fleetroute keeps the last good set
/// (counted as failed lookups) and no request fails. fleetroute restarted
/// while DNS is still down holds the fleet back from EDS: Envoy keeps its
/// endpoints instead of being told the fleet is empty.
#[test]
fn a_dns_outage_keeps_the_fleet_and_a_restart_during_it_keeps_envoys_endpoints() {
    let mut dns = DnsServer::start();
    let router = ROUTER.replace("NAMESERVER", &dns.addr.to_string());
    let list = |r: &BTreeMap<String, String>| dns.set_fleet("pool", r.values());
    let mut lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            before_router: Some(&list),
            ..Default::default()
        },
    );
    let want: BTreeSet<String> = lab.replicas.values().cloned().collect();
    wait_members(&lab, "at start", &want);
    let load = SteadyLoad::start(&lab, steady(2));
    wait_until("load to start", Duration::from_secs(30), || {
        load.sent() >= 20
    });

    dns.stop();
    let failures = "fleetroute_membership_failures_total";
    let base = metric(&lab, failures);
    wait_until("failed lookups", Duration::from_secs(30), || {
        metric(&lab, failures) >= base + 2.0
    });
    let before = load.sent();
    wait_until("load during the outage", Duration::from_secs(30), || {
        load.sent() >= before + 40
    });
    assert_eq!(
        router_members(&lab).as_ref(),
        Some(&want),
        "the last good set"
    );
    let (sent, failed) = load.finish();
    eprintln!("dns outage: {sent} requests, {failed} failed");
    assert_eq!(failed, 0, "requests failed while DNS was down");
    wait_members(&lab, "during the outage", &want);

    lab.restart_router();
    // The new instance's EDS stream is up and its source has failed since.
    wait_until(
        "EDS stream and a failed lookup",
        Duration::from_secs(30),
        || {
            metric(&lab, failures) >= 1.0
                && blocking_get(&format!("{}/metrics", lab.admin))
                    .is_some_and(|(_, m)| metric_sum(&m, "fleetroute_eds_streams", &[]) >= 1.0)
        },
    );
    let updates = blocking_get(&format!("{}/metrics", lab.admin)).map_or(0.0, |(_, m)| {
        metric_sum(&m, "fleetroute_eds_updates_total", &[])
    });
    let envoy = lab.envoy_members().expect("Envoy's clusters");
    let of = |c: &str| -> BTreeSet<String> {
        envoy
            .get(c)
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default()
    };
    eprintln!(
        "dns outage, fleetroute restarted: envoy pool {:?}, fallback {:?}, eds updates {updates}",
        of("pool"),
        of("fallback/chat")
    );
    assert_eq!(of("pool"), want, "Envoy lost the fleet's endpoints");
    assert_eq!(
        of("fallback/chat"),
        want,
        "Envoy lost the fail-open endpoints"
    );
}
