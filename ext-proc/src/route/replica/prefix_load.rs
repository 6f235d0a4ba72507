//! KV-prefix locality balanced against load.
//!
//! Each ready replica is scored in prompt tokens, lower is better:
//!
//! ```text
//! queued = prefill tokens the router has sent it and not yet seen answered
//!        + requests the engine reports waiting × engine_queue_tokens
//! cost   = load_weight × queued − prefix_weight × prompt tokens it holds
//! ```
//!
//! With both weights at 1 the cost is this request's time to first token in
//! prefill-token units, up to a constant: the prefill waiting ahead of it
//! plus its own, less what its cached prefix saves.
//!
//! The prefix weight adapts to load (see [`load_adapted_prefix_weight`]): a
//! cached token saves its prefill for this request and, while the fleet has
//! work queued, for the requests that will wait behind it, so under load a
//! hit is capacity and is worth more; on an idle fleet it is worth only this
//! request's prefill, and the load term spreads.
//!
//! A bounded-load guard keeps a hot prefix from piling onto one replica: a
//! replica whose queued tokens exceed `load_factor` × the fleet's mean plus
//! `load_slack_tokens`, whose requests in flight exceed 1.25 × the fleet's
//! mean plus an eighth of `max_inflight` (at least 2), or that is at its `max_inflight`, is used only when every
//! replica is. Replicas within `tie_tokens` of the best cost are tied,
//! and ties go to the replica holding most of the conversation's own blocks
//! (past its opening), then to the sampling key's rendezvous order, so a
//! request with no cached prefix anywhere, on a balanced fleet, lands where
//! its key hashes and a new conversation keeps a home, and a conversation
//! placed elsewhere keeps to its cache even while that is too short to win
//! on cost.
//!
//! With `share_factor` set (1.1 by default; 0 turns it off), a new
//! conversation (no replica holds more of it than its opening blocks, the
//! system prompt and tools every conversation shares, and it has at least
//! one full block past them, which its next turn will find) also skips a
//! replica whose recent requests exceed `share_factor` × the fleet's mean
//! plus `share_slack`: where a conversation starts decides where all its
//! turns go, so this is where the fleet's request share is balanced,
//! without moving any conversation off its cache. Without it, the replicas
//! that first cached a shared system prompt keep drawing new conversations
//! while their queues stay short. Among tied replicas, a new conversation
//! keyed by its content goes to the one with the fewest recent requests (its
//! key names only this prompt, so its rendezvous home means nothing yet);
//! one with the client's own key (`prompt_cache_key`, `user`) goes to its
//! key's home, which the bound skips only past its share. A chat that holds
//! a reply (the filter's `x-fleetroute-continues`) is never placed as a new
//! conversation, whatever its key says. A replica well under its share is
//! scored as if it held the opening (it pays for that once, not per
//! conversation). A prompt with nothing past its opening is not taken by a
//! replica past its share, unless that replica is its key's home. Any other
//! waits at most `share_wait_tokens` of prefill for the share: a replica
//! past it whose queue is shorter, by more than that, than every replica
//! within it is not skipped, where Envoy reports first bytes (the queue is
//! then not an estimate).

use super::{FALLBACKS, ReplicaChoice};
use crate::config::ReplicaChoiceConfig;
use crate::route::eligible::{CandidateFleet, cached_tokens};
use crate::route::key::RouteKey;
use crate::state::prefix_index::Matches;
use crate::topology::{Fleet, NonEmpty, Pick, ReplicaId};
use fleetroute_filter::contract::KeySource;
use smallvec::SmallVec;

struct Scored {
    replica: ReplicaId,
    overloaded: bool,
    /// Every GPU adapter slot serves other adapters' running requests: the
    /// request would wait for one to drain, however short the queue.
    slots_taken: bool,
    inflight: f64,
    queued: f64,
    cost: f64,
    /// Within `tie_tokens` of the best cost.
    tied: bool,
    unit: f64,
    cached: u64,
    /// Blocks it holds past the request's opening: the conversation's own.
    own: u16,
    /// Past the share bound (and not already overloaded).
    over_share: bool,
    /// Requests routed here lately (the share bound's measure).
    recent: f64,
    /// Its prefill queue ends requests at their first token (Envoy reports
    /// first bytes), so `queued` is not an estimate of when they end.
    first_byte: bool,
    /// Prefill tokens' worth of loading the request's adapter here
    /// (`topology::resident`); 0 without one.
    adapter: f64,
}

/// A replica with more requests in flight than this many times the fleet's
/// mean (plus the slack) takes new ones only when every replica does. A
/// prefix that every request shares (a system prompt) otherwise keeps
/// drawing new conversations to the few replicas that cached it first, as
/// long as their prefill queues stay short; spilling a few seeds the prefix
/// on the others, after which it is no signal and load and the key spread.
/// Running requests share a replica's decode, so they are load too.
/// The slack is an eighth of the replica's `max_inflight`, at least 2: a
/// lease outlives its request until Envoy's access log reports the end, so a
/// conversation sending turn after turn briefly holds a few leases on its
/// replica, and a slack smaller than that would move it off its cache.
const INFLIGHT_FACTOR: f64 = 1.25;
const INFLIGHT_SLACK_SHARE: f64 = 0.125;
const INFLIGHT_SLACK_MIN: f64 = 2.0;

/// Prompts shorter than this count as this long when weighing queued work
/// against them, so a tiny prompt on a busy fleet does not get an unbounded
/// weight.
const MIN_PROMPT_TOKENS: f64 = 2048.0;

/// The weight of a cached prompt token at this load: `base` on an idle fleet,
/// growing with the prefill queued per replica (in units of this prompt), as
/// each queued prompt's worth of work is another request the saved prefill
/// would have delayed.
pub fn load_adapted_prefix_weight(base: f64, mean_queued: f64, prompt_tokens: u32) -> f64 {
    base * (1.0 + mean_queued / f64::from(prompt_tokens).max(MIN_PROMPT_TOKENS))
}

pub fn choose(
    fleet: &Fleet,
    cand: &CandidateFleet,
    key: &RouteKey<'_>,
    cfg: &ReplicaChoiceConfig,
) -> ReplicaChoice {
    // On the stack, filled in place (a fleet has at most `Matches::SLOTS`
    // replicas; returned by value it would be copied).
    let mut scored: SmallVec<[Scored; Matches::SLOTS]> = SmallVec::new();
    score(&mut scored, fleet, cand, key, cfg);
    let mean = scored.iter().map(|s| s.queued).sum::<f64>() / scored.len().max(1) as f64;
    let bound = cfg.load_factor * mean + cfg.load_slack_tokens;
    let mean_inflight = scored.iter().map(|s| s.inflight).sum::<f64>() / scored.len().max(1) as f64;
    let slack =
        (f64::from(fleet.capacity.max_inflight) * INFLIGHT_SLACK_SHARE).max(INFLIGHT_SLACK_MIN);
    let inflight_bound = INFLIGHT_FACTOR * mean_inflight + slack;
    let prefix_weight = load_adapted_prefix_weight(cfg.prefix_weight, mean, key.prompt_tokens);
    // A client's key (`prompt_cache_key`, `user`) names its own replica: its
    // rendezvous home wins the ties, and the share bound moves it only off a
    // home past its share. A key derived from the content names nothing but
    // this prompt, so its ties go to the fewest recent requests.
    let client_key = matches!(
        key.key_source,
        Some(KeySource::PromptCacheKey | KeySource::User)
    );
    // A chat holding a reply continues a conversation whose earlier turns
    // went somewhere, even while its text past the opening is too short to
    // show where (and a client may change its key every turn): it is never
    // placed as new, so it keeps to the replicas holding what it has.
    let placed_by_share = cfg.share_factor > 0.0
        && !key.continues
        && cand.ready.iter().all(|r| r.matched <= key.opening_blocks);
    // A prompt with no full block past its opening leaves nothing on its
    // replica for its next turn to find: its key's home is never skipped
    // for share (so a short conversation's turns stay together), but no
    // other replica past its share takes it. Without that, short prompts
    // chase the replica with the shortest queue, which is short because it
    // serves short prompts.
    let short = key.blocks.len() <= usize::from(key.opening_blocks);
    let new_conversation = placed_by_share && !short;
    let mean_recent = scored.iter().map(|s| s.recent).sum::<f64>() / scored.len().max(1) as f64;
    // The key's rendezvous home: the highest unit.
    let home = scored
        .iter()
        .max_by(|a, b| a.unit.total_cmp(&b.unit))
        .map(|s| s.replica);
    // What a new conversation finds is its opening, which every
    // conversation repeats: a replica pays for it once, not once per
    // conversation. A replica well under its share (recent requests below
    // `share_floor` × the mean − `share_slack`) is scored as if it held the
    // opening, so one that missed the first conversations is not kept out
    // of every later one while the fleet's queues stay short; the others
    // keep the opening's weight, which matters when there are several.
    let (opening_cached, under_share) = if new_conversation {
        (
            scored.iter().map(|s| s.cached).max().unwrap_or(0),
            cfg.share_floor * mean_recent - cfg.share_slack,
        )
    } else {
        (0, f64::NEG_INFINITY)
    };
    let models = fleet.hold.as_ref().is_some_and(|h| h.is_models()) && key.adapter.is_some();
    for s in &mut scored {
        s.overloaded |= past_bounds(s, bound, inflight_bound, models);
        let cached = if s.recent < under_share {
            s.cached.max(opening_cached)
        } else {
            s.cached
        };
        // Loading an adapter delays this request like prefill queued ahead.
        s.cost = cfg.load_weight * (s.queued + s.adapter) - prefix_weight * cached as f64;
    }
    if placed_by_share {
        bound_shares(
            &mut scored,
            cfg,
            mean_recent,
            short,
            home,
            key.adapter.is_some(),
        );
    }
    mark_ties(&mut scored, cfg.tie_tokens);
    let with_adapter = key.adapter.is_some();
    let rank = |a: &Scored, b: &Scored| {
        a.overloaded
            .cmp(&b.overloaded)
            // When every replica is past a bound, one that can start the
            // request at all before one whose adapter slots are taken.
            .then_with(|| a.slots_taken.cmp(&b.slots_taken))
            .then_with(|| b.tied.cmp(&a.tied))
            .then_with(|| {
                // Both tied or neither, by the line above.
                if a.tied {
                    // A replica holding the adapter, then the
                    // conversation's own cache: a turn whose prefix is too
                    // short to win on cost still follows it rather than its
                    // key (the share bound or the load guard may have
                    // placed it off its key's home).
                    let own = by_adapter(with_adapter, a, b).then_with(|| b.own.cmp(&a.own));
                    // A new conversation's rendezvous home is no better
                    // than any tied replica: the fewest recent requests win.
                    let fewer = if new_conversation && !client_key {
                        a.recent.total_cmp(&b.recent)
                    } else {
                        std::cmp::Ordering::Equal
                    };
                    own.then(fewer).then(b.unit.total_cmp(&a.unit))
                } else {
                    a.cost.total_cmp(&b.cost)
                }
            })
            .then(b.unit.total_cmp(&a.unit))
    };
    // Only the chosen replica and its fallbacks need an order.
    let head = FALLBACKS.min(scored.len() - 1);
    if scored.len() > head + 1 {
        scored.select_nth_unstable_by(head, rank);
    }
    scored[..=head].sort_unstable_by(rank);
    // A replica that would have won on cost was skipped for share.
    let pick = pick(
        &scored,
        home,
        cfg.tie_tokens,
        new_conversation && !client_key,
    );
    ReplicaChoice {
        pick,
        cached_tokens: scored.first().map_or(0, |s| s.cached),
        queued_tokens: scored.first().map_or(0, |s| s.queued as u64),
        adapter_tokens: scored.first().map_or(0.0, |s| s.adapter),
        // One score per ready replica, and a candidate fleet has one.
        order: NonEmpty::new(
            scored
                .iter()
                .take(1 + FALLBACKS)
                .map(|s| s.replica)
                .collect(),
        )
        .expect("a candidate fleet has a ready replica"),
    }
}

/// The replica with less of the adapter's load first, when the request
/// names an adapter (`with`); else no order.
fn by_adapter(with: bool, a: &Scored, b: &Scored) -> std::cmp::Ordering {
    if with {
        a.adapter.total_cmp(&b.adapter)
    } else {
        std::cmp::Ordering::Equal
    }
}

/// Each ready replica's load and cached prefix, before any cost.
fn score(
    scored: &mut SmallVec<[Scored; Matches::SLOTS]>,
    fleet: &Fleet,
    cand: &CandidateFleet,
    key: &RouteKey<'_>,
    cfg: &ReplicaChoiceConfig,
) {
    // Its load time, and whether every GPU slot is taken by running ones.
    let adapter = |load: &crate::topology::load::ReplicaLoad| match (key.adapter, &fleet.hold) {
        (Some(id), Some(hold)) => (
            load.adapters
                .get()
                .map_or_else(|| hold.tokens(hold.load_ms), |r| r.load_tokens(id, hold)),
            load.adapters.active().is_some_and(|a| a.slots_taken(id)),
        ),
        _ => (0.0, false),
    };
    scored.extend(cand.ready.iter().map(|r| {
        let load = &fleet.replicas[r.replica].load;
        let queued = load.pending_prefill() as f64
            + f64::from(load.engine_waiting()) * cfg.engine_queue_tokens;
        let cached = cached_tokens(r.matched, key);
        let (adapter, slots_taken) = adapter(load);
        Scored {
            replica: r.replica,
            // A request whose adapter finds no free GPU slot waits there
            // like on a full replica.
            overloaded: load.inflight() >= fleet.capacity.max_inflight || slots_taken,
            slots_taken,
            inflight: f64::from(load.inflight()),
            queued,
            cost: 0.0,
            tied: false,
            // An adapter's requests share a home, whatever their keys:
            // where one is loaded, the next finds it.
            unit: key.adapter.map_or(r.unit, |a| {
                crate::route::rendezvous::unit(a.0, fleet.replicas[r.replica].seed)
            }),
            cached,
            own: r.matched.saturating_sub(key.opening_blocks),
            over_share: false,
            recent: load.recent(),
            first_byte: load.first_byte_reported(),
            adapter,
        }
    }));
}

/// New conversations: a replica past its share of recent requests counts as
/// overloaded, unless it is the key's home of a short prompt, holds the
/// request's adapter (`adapter`: it has one), or its queue is shorter, by
/// more than `share_wait_tokens`, than every one within its share.
fn bound_shares(
    scored: &mut [Scored],
    cfg: &ReplicaChoiceConfig,
    mean_recent: f64,
    short: bool,
    home: Option<ReplicaId>,
    adapter: bool,
) {
    let share_bound = cfg.share_factor * mean_recent + cfg.share_slack;
    for s in scored.iter_mut() {
        // An adapter's requests gather where it is loaded: the load guard,
        // not request counts, spreads a popular one to a second replica.
        let exempt = (short && Some(s.replica) == home) || (adapter && s.adapter == 0.0);
        s.over_share = !s.overloaded && !exempt && s.recent > share_bound;
    }
    // The share balances the turns to come; it makes this request wait
    // at most `share_wait_tokens` for it. A replica past its share whose
    // queue is shorter, by more than that, than every replica within its
    // share is not skipped: with prompts of very different lengths
    // (one-shot requests), equal request counts are unequal work, and
    // skipping the short queue would put the request behind a longer one.
    // Only a queue that ends requests at their first byte
    // (`Leases::first_byte`) is trusted to be short: one that ends them
    // at an estimate reads short while it is not, and trusting it piled
    // requests onto such replicas. A prompt with nothing past its opening
    // keeps the rule above (no replica past its share but its key's home
    // takes it): those chase short queues.
    let shortest_within = scored
        .iter()
        .filter(|s| !s.overloaded && !s.over_share)
        .map(|s| s.queued)
        .fold(f64::INFINITY, f64::min);
    for s in scored.iter_mut() {
        let waits_less =
            s.first_byte && !short && s.queued + cfg.share_wait_tokens < shortest_within;
        s.over_share &= !waits_less;
        s.overloaded |= s.over_share;
    }
}

/// Past the load bounds: more prefill queued than `bound`, or more requests
/// in flight than `inflight`. A packed replica's model load (`models`) takes
/// seconds: it counts against the bound like queued work, and a replica
/// holding the model is not moved off for its batch alone (a full one,
/// `max_inflight`, still is).
fn past_bounds(s: &Scored, bound: f64, inflight: f64, models: bool) -> bool {
    if models {
        s.queued + s.adapter > bound || (s.adapter > 0.0 && s.inflight > inflight)
    } else {
        s.queued > bound || s.inflight > inflight
    }
}

/// Replicas within `tie_tokens` of the best cost among those not overloaded
/// (of all, when every one is) are tied.
fn mark_ties(scored: &mut [Scored], tie_tokens: f64) {
    let best = scored
        .iter()
        .filter(|s| !s.overloaded)
        .map(|s| s.cost)
        .fold(f64::INFINITY, f64::min);
    let best = if best.is_finite() {
        best
    } else {
        scored.iter().map(|s| s.cost).fold(f64::INFINITY, f64::min)
    };
    for s in scored.iter_mut() {
        s.tied = s.cost <= best + tie_tokens;
    }
}

/// Why the first of `scored` was chosen over the key's `home`. `by_recent`:
/// a new conversation whose ties go to the fewest recent requests.
fn pick(scored: &[Scored], home: Option<ReplicaId>, tie_tokens: f64, by_recent: bool) -> Pick {
    // A replica that would have won on cost was skipped for share.
    let skipped = scored
        .iter()
        .any(|s| s.over_share && s.cost < scored[0].cost - tie_tokens);
    match (
        scored.first(),
        scored.iter().find(|s| Some(s.replica) == home),
    ) {
        _ if skipped => Pick::Share,
        (Some(chosen), Some(home)) if chosen.replica != home.replica => {
            if chosen.cached > home.cached {
                Pick::Prefix
            } else if home.over_share || (by_recent && chosen.recent < home.recent) {
                Pick::Share
            } else if home.overloaded {
                Pick::LoadGuard
            } else {
                Pick::Load
            }
        }
        _ => Pick::Key,
    }
}

#[cfg(test)]
mod tests {
    use super::load_adapted_prefix_weight as w;

    #[test]
    fn prefix_weight_is_the_base_when_idle_and_grows_with_queued_prompts() {
        assert_eq!(w(1.5, 0.0, 8192), 1.5);
        // Two of this prompt queued per replica: it saves prefill for them too.
        assert_eq!(w(1.5, 16384.0, 8192), 4.5);
        // Tiny prompts are weighed as MIN_PROMPT_TOKENS long.
        assert_eq!(w(1.0, 4096.0, 16), w(1.0, 4096.0, 2048));
        assert!(w(1.0, 4096.0, 16) < 3.0 + 1e-9);
    }
}
