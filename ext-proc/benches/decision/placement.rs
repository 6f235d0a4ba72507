//! Rendezvous placement: balance over 1M keys, and keys moved when a
//! replica joins or a weight changes.

use super::*;

/// Rendezvous placement: balance over 1M keys on 8 equal replicas, keys
/// moved when a 9th joins, and keys moved when one fleet's weight changes.
pub fn placement() {
    let seeds: Vec<u64> = (0..9)
        .map(|r| xxhash_rust::xxh3::xxh3_64(format!("f/10.0.0.{r}:8000").as_bytes()))
        .collect();
    let n = 1_000_000u64;
    let best = |k: u64, m: usize, w: &dyn Fn(usize) -> f64| {
        (0..m)
            .max_by(|&a, &b| {
                score(unit(k, seeds[a]), w(a)).total_cmp(&score(unit(k, seeds[b]), w(b)))
            })
            .unwrap()
    };
    let mut counts = [0u64; 8];
    let mut moved = 0u64;
    let mut s = 99u64;
    for _ in 0..n {
        let k = splitmix(&mut s);
        let a = best(k, 8, &|_| 1.0);
        counts[a] += 1;
        if best(k, 9, &|_| 1.0) != a {
            moved += 1;
        }
    }
    let mean = n as f64 / 8.0;
    let max = *counts.iter().max().unwrap() as f64;
    println!(
        "rendezvous, 8 equal replicas, 1M keys: max/mean load {:.4}; a 9th replica joining moves {:.2}% of keys (ideal 11.11%)",
        max / mean,
        moved as f64 / n as f64 * 100.0
    );
    // Two fleets of 4 (replicas 0-3 and 4-7), weights 1:1 → 1:2.
    let w_before = |r: usize| 1.0 + 0.0 * r as f64;
    let w_after = |r: usize| if r < 4 { 1.0 } else { 2.0 };
    let mut moved = 0u64;
    let mut s = 7u64;
    for _ in 0..n {
        let k = splitmix(&mut s);
        if best(k, 8, &w_before) != best(k, 8, &w_after) {
            moved += 1;
        }
    }
    println!(
        "rendezvous, weights 1:1 → 1:2 over two fleets of 4: {:.2}% of keys moved (minimum possible 16.67%)",
        moved as f64 / n as f64 * 100.0
    );
}
