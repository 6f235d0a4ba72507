//! The new-conversation share bound: conversations that all open with one
//! system prompt spread over the fleet instead of piling onto the replica
//! that cached it first, and a running conversation is never moved by it.

use std::sync::Arc;
use std::time::Instant;

use fleetroute_filter::contract::KeySource;
use futures::executor::block_on;

use super::decide;
use super::key::RouteKey;
use crate::config::{ReplicaChoiceConfig, RouterConfig};
use crate::request::place::place;
use crate::state::{Shared, Writer};
use crate::topology::{FleetId, ReplicaId};

const REPLICAS: usize = 4;
/// The system prompt's blocks, shared by every conversation.
const OPENING: u16 = 8;

fn rig(replica_choice: &str) -> (Arc<Shared>, Writer) {
    rig_of(REPLICAS, REPLICAS, replica_choice)
}

/// `replicas` members, the first `healthy` of them ready.
fn rig_of(replicas: usize, healthy: usize, replica_choice: &str) -> (Arc<Shared>, Writer) {
    let eps: Vec<String> = (0..replicas)
        .map(|r| format!("\"10.0.0.{}:80\"", r + 1))
        .collect();
    let yaml = format!(
        "fleets:\n  - {{ name: pool, region: us, endpoints: [{}], capacity: {{ max_inflight: 32 }} }}\n\
         stages: [{{ name: s, models: [m], fleets: [pool], replica_choice: {replica_choice} }}]\n",
        eps.join(", ")
    );
    let (shared, mut w) = Writer::new(&RouterConfig::parse_valid(&yaml).unwrap());
    w.healthy(FleetId(0), (0..healthy).map(ReplicaId), Instant::now());
    (shared, w)
}

/// Conversation `c`'s prompt at turn `turn`: the shared opening, then its
/// own first message and one block per earlier turn.
fn turn(c: u64, turn: u64) -> RouteKey<'static> {
    keyed(c, turn, KeySource::Content)
}

fn keyed(c: u64, turn: u64, source: KeySource) -> RouteKey<'static> {
    let mut blocks: Vec<u64> = (0..u64::from(OPENING)).collect();
    blocks.extend((0..=turn).map(|t| 1_000_000 + c * 1000 + t));
    RouteKey {
        model: Some("m"),
        key: c.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        key_source: Some(source),
        prompt_tokens: blocks.len() as u32 * 256,
        block_tokens: 256,
        opening_blocks: OPENING,
        blocks,
        ..Default::default()
    }
}

/// Places `key`, lets it finish at once (Envoy reporting its first byte, as
/// the shipped configs do), and tells the writer (which learns the prefix);
/// returns the replica.
fn route(
    shared: &Shared,
    w: &mut Writer,
    key: RouteKey<'static>,
    rng: u64,
) -> (ReplicaId, &'static str) {
    route_reported(shared, w, key, rng, true)
}

/// As [`route`]; `first_byte` false is a config without the report.
fn route_reported(
    shared: &Shared,
    w: &mut Writer,
    key: RouteKey<'static>,
    rng: u64,
    first_byte: bool,
) -> (ReplicaId, &'static str) {
    let p = block_on(place(shared, key, rng)).unwrap();
    let r = *p.decision.replicas.head();
    let pick = p.decision.pick.as_str();
    if first_byte {
        p.guard.first_byte();
    }
    p.guard.release();
    w.drain(Instant::now());
    (r, pick)
}

fn new_conversations(replica_choice: &str, source: KeySource) -> [usize; REPLICAS] {
    let (shared, mut w) = rig(replica_choice);
    let mut per = [0; REPLICAS];
    for c in 0..80 {
        per[route(&shared, &mut w, keyed(c, 0, source), c).0.0] += 1;
    }
    per
}

#[test]
fn new_conversations_spread_under_the_bound_and_pile_up_without_it() {
    // Off: every new conversation finds the opening on the first replica
    // that cached it, with no queue anywhere, and goes there.
    let off = new_conversations("{ share_factor: 0 }", KeySource::Content);
    assert_eq!(off.iter().max(), Some(&80), "{off:?}");
    // On (the default, 1.1 with slack 2): replicas past their share are
    // skipped and ties go to the fewest recent requests: an even spread.
    let content = new_conversations("{}", KeySource::Content);
    let (lo, hi) = (content.iter().min().unwrap(), content.iter().max().unwrap());
    assert!(hi - lo <= 1, "{content:?}");
    // Conversations with the client's own keys spread under the bound too
    // (each key is another conversation here), and pile up without it.
    let user = new_conversations("{}", KeySource::User);
    assert!(user.iter().max().unwrap() <= &25, "{user:?}");
    let user_off = new_conversations("{ share_factor: 0 }", KeySource::User);
    assert_eq!(user_off, off, "{user_off:?}");
}

#[test]
fn a_client_key_keeps_its_home_while_that_is_within_its_share() {
    let (shared, mut w) = rig("{}");
    // Content-keyed conversations until every replica holds the opening.
    let mut holders = std::collections::HashSet::new();
    for c in 0..40 {
        holders.insert(route(&shared, &mut w, turn(c, 0), c).0);
        if holders.len() == REPLICAS {
            break;
        }
    }
    assert_eq!(
        holders.len(),
        REPLICAS,
        "set-up: the opening did not spread"
    );
    // Every replica is tied and within its share. A new conversation under
    // the client's key goes to that key's home (where a request with no
    // blocks, decided by the key alone, goes), not to the replica with the
    // fewest recent requests, as one keyed by its content would.
    let snap = shared.snapshot();
    let mut homes = std::collections::HashSet::new();
    for k in 0..16u64 {
        let client = |c| RouteKey {
            key: k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xC0FFEE,
            ..keyed(c, 0, KeySource::PromptCacheKey)
        };
        let conversation = client(900 + k);
        let bare = RouteKey {
            blocks: Vec::new(),
            opening_blocks: 0,
            ..client(900 + k)
        };
        let home = *decide(&snap, &bare, k).unwrap().replicas.head();
        let d = decide(&snap, &conversation, k).unwrap();
        assert_eq!(
            *d.replicas.head(),
            home,
            "key {k} left its home ({})",
            d.pick
        );
        homes.insert(home);
    }
    assert!(homes.len() > 1, "set-up: every key had the same home");
}

#[test]
fn no_replica_is_left_without_new_conversations() {
    // On eight replicas the opening spreads only as its holders pass their
    // share; once seven hold it, each can stay within 1.1 × the mean + 2
    // while the eighth has none, and on cost (the opening's prefill) it
    // would never be chosen. Well under its share, it is scored as if it
    // held the opening.
    let (shared, mut w) = rig_of(8, 8, "{}");
    let mut per = [0; 8];
    for c in 0..140 {
        per[route(&shared, &mut w, turn(c, 0), c).0.0] += 1;
    }
    let (lo, hi) = (per.iter().min().unwrap(), per.iter().max().unwrap());
    assert!(hi - lo <= 2, "{per:?}");
}

#[test]
fn a_running_conversation_stays_on_its_cache_past_its_share() {
    let (shared, mut w) = rig("{}");
    let (home, _) = route(&shared, &mut w, turn(7, 0), 7);
    // Its next turns push its replica far past its share of recent requests.
    for t in 1..30 {
        let (r, pick) = route(&shared, &mut w, turn(7, t), t);
        assert_eq!(r, home, "turn {t} left its cache ({pick})");
    }
    // A new conversation whose key's choice is that replica is moved, and
    // says why.
    let moved = (100..400)
        .map(|c| decide(&shared.snapshot(), &turn(c, 0), c).unwrap())
        .find(|d| d.pick == crate::topology::Pick::Share)
        .expect("some new conversation was moved by the share bound");
    assert_ne!(*moved.replicas.head(), home);
}

/// A first turn with no full block past the opening: the blocks the router
/// would see are the opening's alone.
fn short(c: u64) -> RouteKey<'static> {
    let mut k = turn(c, 0);
    k.blocks.truncate(usize::from(OPENING));
    k
}

#[test]
fn prompts_with_nothing_past_their_opening_spread_but_keep_their_key_home() {
    // Off: every short prompt finds the opening on the first replica that
    // cached it and goes there. On: no replica but a prompt's key home
    // takes it past its share, so distinct short prompts spread.
    let placed = |replica_choice: &str| {
        let (shared, mut w) = rig(replica_choice);
        let mut per = [0; REPLICAS];
        let mut moved = 0;
        for c in 0..80 {
            let (r, pick) = route(&shared, &mut w, short(c), c);
            per[r.0] += 1;
            moved += usize::from(pick == "share");
        }
        (per, moved)
    };
    let (off, moved) = placed("{ share_factor: 0 }");
    assert_eq!((off.iter().max(), moved), (Some(&80), 0), "{off:?}");
    let (on, moved) = placed("{}");
    assert!(on.iter().max().unwrap() <= &28, "{on:?}");
    // Sent past the replica holding the opening, they say why.
    assert!(moved > 0, "no short prompt was labelled as moved by share");
    // One short conversation (the same key, nothing past the opening) stays
    // on its key's home far past that replica's share.
    let (shared, mut w) = rig("{}");
    let (home, _) = route(&shared, &mut w, short(5), 0);
    for t in 1..30 {
        let (r, pick) = route(&shared, &mut w, short(5), t);
        assert_eq!(r, home, "turn {t} of a short conversation moved ({pick})");
    }
}

#[test]
fn a_conversation_the_bound_placed_follows_its_short_cache_next_turn() {
    let (shared, mut w) = rig("{}");
    // Enough conversations for the bound to move some off their key's home.
    for c in 0..40 {
        route(&shared, &mut w, turn(c, 0), c);
    }
    let mut moved = 0;
    for c in 100..200 {
        let (r, pick) = route(&shared, &mut w, turn(c, 0), c);
        if pick != "share" {
            continue;
        }
        moved += 1;
        // One block of its own is within `tie_tokens` of any replica that
        // holds the opening: the tie goes to its cache, not to its key.
        let (next, why) = route(&shared, &mut w, turn(c, 1), c);
        assert_eq!(
            next, r,
            "conversation {c}'s second turn left its cache ({why})"
        );
    }
    assert!(moved > 0, "the bound moved no conversation");
}

#[test]
fn a_chat_holding_a_reply_keeps_to_its_opening_whatever_its_key() {
    // One conversation whose client sends another `user` every turn and
    // whose turns add less than a block: only its opening, on the replica
    // of its first turn, shows where it lives. Turns marked as holding a
    // reply stay there far past its share; the same turns unmarked look
    // like new short prompts, which the bound spreads.
    let moved = |continues: bool| {
        let (shared, mut w) = rig("{}");
        let at = |t: u64| RouteKey {
            key: (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            key_source: Some(KeySource::User),
            continues: continues && t > 0,
            ..short(5)
        };
        let (home, _) = route(&shared, &mut w, at(0), 0);
        (1..30)
            .filter(|&t| route(&shared, &mut w, at(t), t).0 != home)
            .count()
    };
    assert_eq!(moved(true), 0, "a continued chat left its opening");
    assert!(moved(false) > 0, "set-up: the bound moved no unmarked turn");
}

#[test]
fn the_share_makes_a_request_wait_at_most_share_wait_tokens() {
    // Where a new conversation goes when the only replica past its share has
    // an empty queue and every other one has `queued` prefill tokens;
    // `first_byte`: whether Envoy reports first bytes (else queues are
    // estimates, not trusted to be short).
    let placed_on_busy = |queued: u32, first_byte: bool| {
        let (shared, mut w) = rig("{}");
        // One running conversation takes its replica far past its share.
        let (busy, _) = route_reported(&shared, &mut w, turn(7, 0), 7, first_byte);
        for t in 1..30 {
            route_reported(&shared, &mut w, turn(7, t), t, first_byte);
        }
        // Every other replica is given a long prefill, held.
        let mut held = Vec::new();
        for c in 100..100 + REPLICAS as u64 - 1 {
            let mut k = turn(c, 0);
            k.prompt_tokens = queued;
            let p = block_on(place(&shared, k, c)).unwrap();
            assert_ne!(
                *p.decision.replicas.head(),
                busy,
                "set-up: queued on the busy one"
            );
            held.push(p.guard);
            w.drain(Instant::now());
        }
        let d = decide(&shared.snapshot(), &turn(200, 0), 200).unwrap();
        drop(held);
        (*d.replicas.head() == busy, d.pick)
    };
    let wait = ReplicaChoiceConfig::default().share_wait_tokens as u32;
    // Behind more than `share_wait_tokens`: the empty queue, past its share.
    let (on_busy, pick) = placed_on_busy(wait + 8_000, true);
    assert!(
        on_busy,
        "the bound made a request wait past the limit ({pick})"
    );
    // Behind less: the bound holds and the request waits.
    let (on_busy, pick) = placed_on_busy(wait - 8_000, true);
    assert!(!on_busy, "the bound let a short wait through ({pick})");
    assert_eq!(pick, crate::topology::Pick::Share);
    // Without first-byte reports the empty queue may be an estimate: the
    // bound holds however long the others' queues read.
    let (on_busy, pick) = placed_on_busy(wait + 8_000, false);
    assert!(!on_busy, "an estimated queue was trusted ({pick})");
}
