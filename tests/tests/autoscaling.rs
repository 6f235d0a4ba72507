//! The autoscaling loop closed: a driver standing in for KEDA reads
//! `fleetroute_desired_replicas{fleet}` from fleetroute's `/metrics` every
//! 0.5 s and starts or stops simulated replicas of two DNS-sourced fleets of
//! a priority stage (`base` first, `burst` second, `hosts: {min: 1, max: 3}`
//! each). A new replica's SRV record appears only once it is up; a removed
//! one's record goes first and the replica stops only after fleetroute let
//! it go (it left `/debug/snapshot`). Streamed and non-streamed traffic
//! rises in steps past the base fleet's capacity and falls again. From the
//! driver's timeline: the base fleet grows before the burst fleet grows at
//! all, the burst fleet grows only while the signal asks for the base at its
//! maximum (the base may still be starting its last replicas), on the way
//! down the burst fleet shrinks before the base does, no request fails and
//! both fleets end at their minimum. The timeline prints with `--nocapture`.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, metric_sum};
use fleetroute_tests::harness::dns::DnsServer;
use fleetroute_tests::harness::steady_load::{LoadSpec, SteadyLoad};
use fleetroute_tests::harness::{ExtraReplicas, Lab, LabSpec, pace, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// Two requests at a time per replica, about a second each (50 tokens at
/// 20 ms): a client thread keeps about one request in flight, so two
/// threads fill a replica.
const ENGINES: &[&str] = &[
    "--prefill-tokens-per-sec",
    "10000000",
    "--decode-ms-per-token",
    "20",
    "--max-batch",
    "2",
];
const MAX_TOKENS: u32 = 50;
const MIN: usize = 1;
const MAX: usize = 3;
const FLEETS: [&str; 2] = ["base", "burst"];
/// How often the driver reads the signal and acts (KEDA's pollingInterval).
const POLL: Duration = Duration::from_millis(500);

/// `{b1}` and `{u1}` are each fleet's first member; DNS lists them. The
/// signal falls 3 s after the need does (5 s by default), to keep the
/// scenario short.
const ROUTER: &str = r#"
# First members, listed by DNS only: {b1} {u1}
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
default_stage: chat
fleets:
  - name: base
    region: us
    dns: { name: "_engine._tcp.base.test.", interval_s: 1, nameserver: "NAMESERVER" }
    capacity: { max_inflight: 2 }
    hosts: { min: 1, max: 3 }
    scaling: { scale_down_after_ms: 3000 }
  - name: burst
    region: us
    dns: { name: "_engine._tcp.burst.test.", interval_s: 1, nameserver: "NAMESERVER" }
    capacity: { max_inflight: 2 }
    hosts: { min: 1, max: 3 }
    scaling: { scale_down_after_ms: 3000 }
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    routing: { policy: priority, order: [base, burst] }
"#;

/// Client threads per load step: one replica's worth more per step up to
/// six (base full, burst full), then back down.
const STEPS: &[usize] = &[2, 4, 6, 8, 10, 12, 10, 8, 6, 4, 2];
/// Least time a step holds; it holds on until the fleets follow the signal.
const HOLD: Duration = Duration::from_secs(4);
/// Longest a step waits for the fleets to settle.
const STEP_DEADLINE: Duration = Duration::from_secs(20);

/// One fleet as the driver runs it.
struct Fleet {
    name: &'static str,
    /// Listed in DNS, oldest first: (replica name, address, its engine
    /// process; `None` for the lab's first member).
    listed: Vec<(String, String, Option<ExtraReplicas>)>,
    /// Unlisted, waiting for fleetroute to let them go before they stop.
    leaving: Vec<(String, String, ExtraReplicas)>,
    started: usize,
}

impl Fleet {
    fn addrs(&self) -> Vec<String> {
        self.listed.iter().map(|(_, a, _)| a.clone()).collect()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Change {
    Grow,
    Shrink,
}

/// A driver action: (seconds, fleet, change, [base, burst] listed after it).
/// Time, fleet, change, listed counts after it, and the desired counts the
/// driver acted on.
type Event = (f64, usize, Change, [usize; 2], [Option<usize>; 2]);

struct Row {
    t: f64,
    threads: usize,
    desired: [Option<usize>; 2],
    listed: [usize; 2],
    leaving: [usize; 2],
}

fn desired(lab: &Lab) -> [Option<usize>; 2] {
    let m = blocking_get(&format!("{}/metrics", lab.admin)).filter(|(s, _)| *s == 200);
    FLEETS.map(|f| {
        let m = &m.as_ref()?.1;
        let has = m.lines().any(|l| {
            l.starts_with("fleetroute_desired_replicas{") && l.contains(&format!("fleet=\"{f}\""))
        });
        has.then(|| {
            metric_sum(
                m,
                "fleetroute_desired_replicas",
                &[&format!("fleet=\"{f}\"")],
            ) as usize
        })
    })
}

/// fleetroute's members (leaving ones included) per fleet.
fn router_members(lab: &Lab) -> Option<BTreeMap<String, BTreeSet<String>>> {
    members_where(lab, |_| true)
}

/// The members fleetroute lists that passed their health checks.
fn ready_members(lab: &Lab) -> Option<BTreeMap<String, BTreeSet<String>>> {
    members_where(lab, |r| r["ready"] == true)
}

fn members_where(
    lab: &Lab,
    keep: impl Fn(&serde_json::Value) -> bool,
) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut out = BTreeMap::new();
    for f in v["fleets"].as_array()? {
        let addrs = f["replicas"]
            .as_array()?
            .iter()
            .filter(|r| keep(r))
            .filter_map(|r| r["addr"].as_str().map(str::to_string))
            .collect();
        out.insert(f["name"].as_str()?.to_string(), addrs);
    }
    Some(out)
}

/// The driver: reads the signal, starts or unlists one replica per fleet
/// per poll, stops the unlisted ones fleetroute has let go.
struct Driver<'a> {
    lab: &'a Lab,
    dns: &'a DnsServer,
    fleets: [Fleet; 2],
    start: Instant,
    events: Vec<Event>,
    rows: Vec<Row>,
}

impl Driver<'_> {
    fn listed(&self) -> [usize; 2] {
        [self.fleets[0].listed.len(), self.fleets[1].listed.len()]
    }

    fn poll(&mut self, threads: usize) {
        let want = desired(self.lab);
        // Stop what fleetroute no longer lists.
        if let Some(members) = router_members(self.lab) {
            for f in &mut self.fleets {
                let known = members.get(f.name).cloned().unwrap_or_default();
                f.leaving.retain(|(_, a, _)| known.contains(a));
            }
        }
        // Shrinks burst first and grows base first, as a KEDA acting on both
        // fleets in one poll would be expected to (within a poll the order
        // is the driver's, not the signal's).
        for (i, grow) in [(1, false), (0, false), (0, true), (1, true)] {
            let Some(d) = want[i] else { continue };
            let d = d.clamp(MIN, MAX);
            let n = self.fleets[i].listed.len();
            if (d > n) != grow {
                continue;
            }
            let change = if d > n {
                let f = &mut self.fleets[i];
                f.started += 1;
                let name = format!("{}{}", &f.name[..1], f.started + 1);
                let extra = self.lab.start_replicas(&[&name]);
                let addr = extra.replicas[&name].clone();
                f.listed.push((name, addr, Some(extra)));
                Change::Grow
            } else if d < n {
                let f = &mut self.fleets[i];
                let (name, addr, extra) = f.listed.pop().expect("above the minimum");
                f.leaving
                    .push((name, addr, extra.expect("not a first member")));
                Change::Shrink
            } else {
                continue;
            };
            self.dns.set_fleet(FLEETS[i], self.fleets[i].addrs().iter());
            let t = self.start.elapsed().as_secs_f64();
            self.events.push((t, i, change, self.listed(), want));
        }
        self.rows.push(Row {
            t: self.start.elapsed().as_secs_f64(),
            threads,
            desired: want,
            listed: self.listed(),
            leaving: [self.fleets[0].leaving.len(), self.fleets[1].leaving.len()],
        });
    }

    /// The last poll saw the signal met and nothing leaving.
    fn settled(&self) -> bool {
        self.rows.last().is_some_and(|r| {
            r.leaving == [0, 0]
                && (0..2).all(|i| r.desired[i].is_some_and(|d| d.clamp(MIN, MAX) == r.listed[i]))
        })
    }

    /// Polls for at least `hold`, then until settled for three polls in a
    /// row (or `deadline`).
    fn run(&mut self, threads: usize, hold: Duration, deadline: Duration) -> bool {
        let t0 = Instant::now();
        let mut calm = 0;
        loop {
            self.poll(threads);
            calm = if self.settled() { calm + 1 } else { 0 };
            if t0.elapsed() >= hold && calm >= 3 {
                return true;
            }
            if t0.elapsed() >= deadline {
                return false;
            }
            pace(POLL);
        }
    }
}

/// Direction changes of a fleet's desired count (a flapping signal shows
/// many).
fn reversals(rows: &[Row], i: usize) -> usize {
    let v: Vec<usize> = rows.iter().filter_map(|r| r.desired[i]).collect();
    let mut dirs = v.windows(2).filter(|w| w[0] != w[1]).map(|w| w[1] > w[0]);
    let Some(mut last) = dirs.next() else {
        return 0;
    };
    let mut n = 0;
    for d in dirs {
        if d != last {
            n += 1;
            last = d;
        }
    }
    n
}

#[test]
fn a_keda_like_driver_grows_base_then_burst_and_shrinks_burst_then_base() {
    let dns = DnsServer::start();
    let router = ROUTER.replace("NAMESERVER", &dns.addr.to_string());
    let first = |r: &BTreeMap<String, String>| {
        dns.set_fleet("base", [&r["b1"]]);
        dns.set_fleet("burst", [&r["u1"]]);
    };
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: ENGINES,
            before_router: Some(&first),
            ..Default::default()
        },
    );
    // Ready, not only listed: the scenario counts failures while the fleets
    // change, not while the first health checks are still running.
    wait_until(
        "fleetroute to have both first members ready",
        Duration::from_secs(30),
        || {
            ready_members(&lab).is_some_and(|m| {
                m.get("base")
                    .is_some_and(|s| s.contains(&lab.replicas["b1"]))
                    && m.get("burst")
                        .is_some_and(|s| s.contains(&lab.replicas["u1"]))
            })
        },
    );
    let fleet = |name: &'static str, first: &str| Fleet {
        name,
        listed: vec![(first.to_string(), lab.replicas[first].clone(), None)],
        leaving: Vec::new(),
        started: 0,
    };
    let mut driver = Driver {
        lab: &lab,
        dns: &dns,
        fleets: [fleet("base", "b1"), fleet("burst", "u1")],
        start: Instant::now(),
        events: Vec::new(),
        rows: Vec::new(),
    };

    // Each step is the previous one plus or minus a load of two clients.
    let mut loads: Vec<SteadyLoad> = Vec::new();
    let (mut sent, mut failed) = (0, 0);
    let mut unsettled = Vec::new();
    let mut peak_end = 0.0;
    let top = *STEPS.iter().max().unwrap();
    for (s, &threads) in STEPS.iter().enumerate() {
        let running: usize = 2 * loads.len();
        if threads > running {
            loads.push(SteadyLoad::start(
                &lab,
                LoadSpec {
                    threads: threads - running,
                    cap: 2_000,
                    keys: 16,
                    turns: 2,
                    streamed: true,
                    max_tokens: MAX_TOKENS,
                    prefix: ["l0", "l1", "l2", "l3", "l4", "l5"][loads.len()],
                    ..Default::default()
                },
            ));
        } else {
            while 2 * loads.len() > threads {
                let (s, f) = loads.pop().unwrap().finish();
                sent += s;
                failed += f;
            }
        }
        if !driver.run(threads, HOLD, STEP_DEADLINE) {
            unsettled.push(s);
        }
        if threads == top {
            peak_end = driver.start.elapsed().as_secs_f64();
        }
    }
    for l in loads.drain(..) {
        let (s, f) = l.finish();
        sent += s;
        failed += f;
    }
    // Idle: both fleets go back to their minimum.
    let idle = driver.run(0, HOLD, Duration::from_secs(30));

    eprintln!("autoscaling: time s, clients, desired base/burst, listed base/burst (leaving)");
    let mut last = None;
    for r in &driver.rows {
        let key = (r.threads, r.desired, r.listed, r.leaving);
        if last != Some(key) {
            let d = |x: Option<usize>| x.map_or("?".to_string(), |v| v.to_string());
            eprintln!(
                "autoscaling: {:6.1}  {:2}  desired {}/{}  listed {}/{} ({}/{})",
                r.t,
                r.threads,
                d(r.desired[0]),
                d(r.desired[1]),
                r.listed[0],
                r.listed[1],
                r.leaving[0],
                r.leaving[1]
            );
            last = Some(key);
        }
    }
    for (t, i, c, after, _) in &driver.events {
        eprintln!(
            "autoscaling: event {t:6.1} s {:5} {c:?} -> base {} burst {}",
            FLEETS[*i], after[0], after[1]
        );
    }
    let (rb, ru) = (reversals(&driver.rows, 0), reversals(&driver.rows, 1));
    eprintln!(
        "autoscaling: {sent} requests (half streamed), {failed} failed; {} polls; desired reversals base {rb}, burst {ru}; steps that did not settle {unsettled:?}; peak ended at {peak_end:.1} s",
        driver.rows.len()
    );

    assert_eq!(failed, 0, "requests failed while the fleets changed");
    let ev = &driver.events;
    let first_of = |fleet: usize, c: Change| ev.iter().position(|e| e.1 == fleet && e.2 == c);
    let base_grow = first_of(0, Change::Grow).expect("the base fleet never grew");
    let burst_grow = first_of(1, Change::Grow).expect("the burst fleet never grew");
    assert!(
        base_grow < burst_grow,
        "the burst fleet grew before the base: {ev:?}"
    );
    // The signal asks for the base at its maximum whenever the burst fleet
    // grows; the base may still be on its way there, as the driver starts
    // one replica per fleet per poll.
    for e in ev.iter().filter(|e| e.1 == 1 && e.2 == Change::Grow) {
        assert_eq!(
            e.4[0].map(|d| d.clamp(MIN, MAX)),
            Some(MAX),
            "the burst fleet grew with the base's desired count below its maximum: {e:?}"
        );
    }
    let peak = driver.rows.iter().map(|r| r.listed[1]).max().unwrap();
    assert!(peak >= 2, "the burst fleet peaked at {peak}");
    let falling: Vec<&Event> = ev.iter().filter(|e| e.0 >= peak_end).collect();
    let fb = falling
        .iter()
        .position(|e| e.1 == 1 && e.2 == Change::Shrink);
    let fa = falling
        .iter()
        .position(|e| e.1 == 0 && e.2 == Change::Shrink);
    assert!(
        fb.is_some() && fa.is_some(),
        "both fleets shrink as traffic falls: {falling:?}"
    );
    assert!(
        fb < fa,
        "the base shrank before the burst fleet: {falling:?}"
    );
    for e in ev.iter().filter(|e| e.1 == 0 && e.2 == Change::Shrink) {
        assert_eq!(
            e.3[1], MIN,
            "the base shrank with the burst fleet above its minimum: {e:?}"
        );
    }
    assert!(idle, "the fleets did not settle once idle");
    assert_eq!(driver.listed(), [MIN, MIN], "replica counts at the end");
}
