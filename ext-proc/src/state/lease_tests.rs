//! Tests of `lease.rs`.

use super::*;
use crate::topology::{FleetId, ReplicaId, StageId};

const DECIDED: Decided = Decided {
    generation: 1,
    stage: StageId(0),
    fleet: FleetId(0),
    replica: ReplicaId(0),
    adapter: false,
};

fn cfg() -> LeaseConfig {
    LeaseConfig {
        min_ms: 1000,
        max_ms: 60_000,
        decode_tokens_per_sec: 20.0,
        default_max_tokens: 100,
    }
}

#[test]
fn bounds_follow_the_request_within_floor_and_ceiling() {
    let c = cfg();
    let small = LeaseInput {
        max_tokens: Some(8),
        ..Default::default()
    };
    assert_eq!(bounds(&c, &small).0, Duration::from_millis(1000), "floor");
    let long = LeaseInput {
        max_tokens: Some(100),
        ..Default::default()
    };
    // 2 × (200 ms/k × 0.256 k + 100 / 20 s) = 10.1 s
    assert_eq!(bounds(&c, &long).0, Duration::from_millis(10_102));
    let huge = LeaseInput {
        max_tokens: Some(1_000_000),
        ..Default::default()
    };
    assert_eq!(bounds(&c, &huge).0, Duration::from_secs(60), "ceiling");
    let queued = LeaseInput {
        prefill_tokens: 100_000,
        prefill_ms_per_k: Some(10.0),
        max_tokens: Some(8),
        ..Default::default()
    };
    let (whole, prefill) = bounds(&c, &queued);
    assert_eq!(prefill, Duration::from_millis(2005));
    assert!(whole >= prefill);
}

#[test]
fn a_lost_entry_cannot_leak_load() {
    let load = Arc::new(ReplicaLoad::default());
    let leases = Leases::new(Default::default(), Default::default());
    let c = LeaseConfig {
        min_ms: 30,
        max_ms: 30,
        ..cfg()
    };
    leases.hold(
        1,
        load.start(500),
        DECIDED,
        &c,
        &LeaseInput::default(),
        None,
    );
    leases.hold(
        2,
        load.start(500),
        DECIDED,
        &c,
        &LeaseInput::default(),
        None,
    );
    assert_eq!((load.inflight(), load.pending_prefill()), (2, 1000));
    assert!(leases.end(1).is_some());
    assert!(leases.end(1).is_none(), "ends once");
    assert_eq!(load.inflight(), 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while load.inflight() > 0 {
        assert!(Instant::now() < deadline, "lease 2 never expired");
        leases.run_pending();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(load.pending_prefill(), 0);
    assert!(
        leases.end(2).is_none(),
        "a late entry releases nothing twice"
    );
}

#[test]
fn the_first_byte_ends_the_prefill_share_and_keeps_the_request() {
    let load = Arc::new(ReplicaLoad::default());
    let leases = Leases::new(Default::default(), Default::default());
    // Long bounds: only the report may end the prefill share here.
    let long = LeaseInput {
        prefill_tokens: 100_000,
        ..Default::default()
    };
    leases.hold(1, load.start(700), DECIDED, &cfg(), &long, None);
    leases.hold(2, load.start(300), DECIDED, &cfg(), &long, None);
    assert!(leases.first_byte(1));
    assert!(!leases.first_byte(1), "once");
    assert!(!leases.first_byte(7), "an unknown nonce ends nothing");
    assert_eq!(
        (load.inflight(), load.prefilling(), load.pending_prefill()),
        (2, 1, 300)
    );
    assert!(leases.end(1).is_some(), "the request still runs");
    assert!(leases.end(2).is_some());
    assert!(!leases.first_byte(2), "nothing after the end");
    assert_eq!(
        (load.inflight(), load.prefilling(), load.pending_prefill()),
        (0, 0, 0)
    );
}

#[test]
fn reconcile_releases_only_the_old_surplus() {
    let load = Arc::new(ReplicaLoad::default());
    let other = Arc::new(ReplicaLoad::default());
    let leases = Leases::new(Default::default(), Default::default());
    let c = cfg();
    for n in 0..3 {
        leases.hold(n, load.start(0), DECIDED, &c, &LeaseInput::default(), None);
    }
    leases.hold(9, other.start(0), DECIDED, &c, &LeaseInput::default(), None);
    assert_eq!(
        leases.reconcile(&load, 1, Duration::from_secs(60)),
        0,
        "too young"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(leases.reconcile(&load, 1, Duration::from_millis(10)), 2);
    assert_eq!((load.inflight(), other.inflight()), (1, 1));
    assert_eq!(leases.reconcile(&load, 1, Duration::ZERO), 0);
}
