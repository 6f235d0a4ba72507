//! Which loads to start now, from each model's demand and what each replica
//! holds: a pure function, so every instance given the same view plans the
//! same loads on the same replicas.
//!
//! A model is wanted on as many replicas as its share of the fleet's
//! requests fills (a quarter of a replica of slack before a second one, so a
//! share hovering at a boundary does not load and evict in turn), and on at
//! least its stage's `warm_replicas`. A replica is chosen in the model's own
//! rendezvous order (the order requests for it follow), among those with a
//! free slot or whose least recently used model is not wanted there (more
//! holders than it needs, or no demand and no warm minimum), and with loads
//! left this minute. One load per model per round.

use crate::route::rendezvous;
use crate::topology::AdapterId;

/// A model's demand on one fleet.
#[derive(Clone, Copy, Debug)]
pub struct Demand {
    pub id: AdapterId,
    /// Requests per second, averaged.
    pub rate: f64,
    /// Replicas that keep it loaded whatever its demand.
    pub warm: u32,
}

/// One ready replica as placement sees it.
#[derive(Clone, Debug)]
pub struct Holder {
    /// Its models, most recently used first.
    pub held: Vec<AdapterId>,
    /// Its rendezvous seed.
    pub seed: u64,
    /// Placement loads it may still take this minute.
    pub loads_left: u32,
}

/// Share of a replica a model's demand must pass before it is wanted on
/// one more.
const SLACK: f64 = 0.25;

/// Replicas `d` is wanted on, of `replicas`.
fn wanted(d: &Demand, total_rate: f64, replicas: usize) -> usize {
    let fill = if total_rate > 0.0 && d.rate > 0.0 {
        (d.rate / total_rate * replicas as f64 - SLACK)
            .ceil()
            .max(1.0) as usize
    } else {
        0
    };
    fill.max(d.warm as usize).min(replicas)
}

/// The loads to start: (index into `holders`, model). `slots`: models a
/// replica holds at once.
pub fn plan(demand: &[Demand], holders: &mut [Holder], slots: usize) -> Vec<(usize, AdapterId)> {
    let slots = slots.max(1);
    let total: f64 = demand.iter().map(|d| d.rate).sum();
    let want: Vec<(AdapterId, usize)> = demand
        .iter()
        .map(|d| (d.id, wanted(d, total, holders.len())))
        .collect();
    let want_of = |id: AdapterId| want.iter().find(|w| w.0 == id).map_or(0, |w| w.1);
    let have = |holders: &[Holder], id: AdapterId| {
        holders
            .iter()
            .filter(|h| h.held.iter().take(slots).any(|&m| m == id))
            .count()
    };
    // The largest shortfall first, then the busiest model.
    let mut order: Vec<&Demand> = demand.iter().collect();
    order.sort_by(|a, b| {
        let short = |d: &Demand| want_of(d.id).saturating_sub(have(holders, d.id));
        short(b).cmp(&short(a)).then(b.rate.total_cmp(&a.rate))
    });
    let mut loads = Vec::new();
    for d in order {
        if have(holders, d.id) >= want_of(d.id) {
            continue;
        }
        let mut candidates: Vec<usize> = (0..holders.len())
            .filter(|&r| holders[r].loads_left > 0)
            .filter(|&r| !holders[r].held.iter().take(slots).any(|&m| m == d.id))
            .collect();
        candidates.sort_by(|&a, &b| {
            let u = |r: usize| rendezvous::unit(d.id.0, holders[r].seed);
            u(b).total_cmp(&u(a))
        });
        let room = candidates.into_iter().find(|&r| {
            let held = &holders[r].held;
            if held.len() < slots {
                return true;
            }
            // What a load there evicts: its least recently used model.
            let victim = held[slots - 1];
            have(holders, victim) > want_of(victim)
        });
        if let Some(r) = room {
            let h = &mut holders[r];
            h.held.insert(0, d.id);
            h.held.truncate(slots);
            h.loads_left -= 1;
            loads.push((r, d.id));
        }
    }
    loads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &str) -> AdapterId {
        AdapterId::of(n)
    }

    fn holders(n: usize, held: &[&[&str]]) -> Vec<Holder> {
        (0..n)
            .map(|r| Holder {
                held: held
                    .get(r)
                    .map_or(vec![], |h| h.iter().map(|m| id(m)).collect()),
                seed: r as u64 * 7919 + 1,
                loads_left: 2,
            })
            .collect()
    }

    fn demand(m: &str, rate: f64, warm: u32) -> Demand {
        Demand {
            id: id(m),
            rate,
            warm,
        }
    }

    #[test]
    fn a_popular_model_spreads_and_a_warm_one_is_loaded_without_demand() {
        // Four replicas, two slots each; "head" takes 70% of requests:
        // wanted on ceil(2.8 - 0.25) = 3 replicas; "tail" (30%) on
        // ceil(1.2 - 0.25) = 1; "cold" has no requests but a warm minimum.
        let mut h = holders(4, &[&["head"], &["tail"]]);
        let d = [
            demand("head", 7.0, 0),
            demand("tail", 3.0, 0),
            demand("cold", 0.0, 1),
        ];
        let loads = plan(&d, &mut h, 2);
        let count = |m: &str| loads.iter().filter(|l| l.1 == id(m)).count();
        // One load per model per round.
        assert_eq!((count("head"), count("tail"), count("cold")), (1, 0, 1));
        // Rounds until nothing is left to do: head ends on three replicas.
        for _ in 0..4 {
            for l in &mut h {
                l.loads_left = 2;
            }
            plan(&d, &mut h, 2);
        }
        let on = |m: &str| h.iter().filter(|x| x.held.contains(&id(m))).count();
        assert_eq!((on("head"), on("tail"), on("cold")), (3, 1, 1));
        assert!(plan(&d, &mut h, 2).is_empty(), "settled");
    }

    #[test]
    fn it_never_evicts_what_is_needed_and_keeps_to_the_churn_cap() {
        // One slot each, both models wanted once and held: nothing to do,
        // and a third model with no room waits rather than evict.
        let mut h = holders(2, &[&["a"], &["b"]]);
        let d = [
            demand("a", 5.0, 0),
            demand("b", 5.0, 0),
            demand("c", 0.0, 1),
        ];
        assert!(plan(&d, &mut h, 1).is_empty());
        // A replica out of loads for this minute takes none.
        let mut h = holders(3, &[]);
        h[0].loads_left = 0;
        h[1].loads_left = 0;
        let loads = plan(&[demand("a", 1.0, 0), demand("b", 1.0, 0)], &mut h, 1);
        assert_eq!(loads.len(), 1);
        assert_eq!(loads[0].0, 2);
    }

    #[test]
    fn the_same_view_gives_the_same_plan() {
        let d = [
            demand("a", 3.0, 1),
            demand("b", 1.0, 0),
            demand("c", 0.5, 0),
        ];
        let mut h1 = holders(5, &[&["b"]]);
        let mut h2 = holders(5, &[&["b"]]);
        assert_eq!(plan(&d, &mut h1, 2), plan(&d, &mut h2, 2));
    }
}
