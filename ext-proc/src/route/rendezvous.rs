//! Weighted rendezvous (highest random weight) hashing: each key ranks every
//! replica by a hash of (key, replica); the top one wins. A replica joining or
//! leaving moves only the keys it wins or held, and a weight change moves keys
//! only to or from the fleet whose weight changed.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A uniform number in (0, 1) for this key and replica.
#[inline]
pub fn unit(key: u64, seed: u64) -> f64 {
    let h = xxh3_64_with_seed(&key.to_le_bytes(), seed);
    ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// The weighted score of a replica whose unit is `u`: the highest score wins,
/// and a replica of weight `w` wins a share of keys proportional to `w`.
#[inline]
pub fn score(u: f64, weight: f64) -> f64 {
    if weight <= 0.0 {
        f64::NEG_INFINITY
    } else {
        weight / -u.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The winner of `key` among replicas `seeds` with `weights`.
    fn winner(key: u64, seeds: &[u64], weights: &[f64]) -> usize {
        (0..seeds.len())
            .max_by(|&a, &b| {
                score(unit(key, seeds[a]), weights[a])
                    .total_cmp(&score(unit(key, seeds[b]), weights[b]))
            })
            .unwrap()
    }

    #[test]
    fn shares_follow_weights() {
        let seeds = [11, 22, 33];
        let weights = [1.0, 2.0, 1.0];
        let mut counts = [0u32; 3];
        for key in 0..100_000u64 {
            counts[winner(key.wrapping_mul(0x9E37_79B9_7F4A_7C15), &seeds, &weights)] += 1;
        }
        let share = f64::from(counts[1]) / 100_000.0;
        assert!((share - 0.5).abs() < 0.01, "{counts:?}");
    }

    #[test]
    fn zero_weight_wins_nothing_and_a_new_replica_moves_only_its_keys() {
        let mut seeds = vec![1, 2, 3, 4];
        let w = vec![1.0, 0.0, 1.0, 1.0];
        let before: Vec<usize> = (0..20_000).map(|k| winner(k, &seeds, &w)).collect();
        assert!(!before.contains(&1));
        seeds.push(5);
        let w2 = vec![1.0, 0.0, 1.0, 1.0, 1.0];
        for (k, &b) in before.iter().enumerate() {
            let a = winner(k as u64, &seeds, &w2);
            assert!(
                a == b || a == 4,
                "key {k} moved from {b} to {a}, not to the newcomer"
            );
        }
    }
}
