//! Chained block hashes of the canonical prompt text (built while the body is
//! read, in `request`).
//!
//! Block `i`'s hash is seeded with block `i-1`'s, so equal hashes at position `i`
//! mean equal prompt text up to the end of block `i`. Only full blocks are hashed,
//! as an engine's prefix cache only holds full blocks.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Separates a message's role from its content.
pub const ROLE_END: u8 = 0x1f;
/// Ends a message (or one prompt of a prompt array).
pub const ITEM_END: u8 = 0x1e;

/// Chained hashes of the first `max_blocks` full blocks of `text`.
pub fn block_hashes(text: &[u8], block_bytes: usize, max_blocks: usize) -> Vec<u64> {
    let mut prev = 0u64;
    text.chunks_exact(block_bytes)
        .take(max_blocks)
        .map(|block| {
            prev = xxh3_64_with_seed(block, prev);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_full_blocks_are_hashed() {
        assert!(block_hashes(b"abc", 4, 8).is_empty());
        assert_eq!(block_hashes(b"abcdefghi", 4, 8).len(), 2);
        assert_eq!(block_hashes(&[7u8; 400], 4, 8).len(), 8);
    }

    proptest! {
        /// Equal hash at position i if and only if equal text up to block i.
        #[test]
        fn hashes_are_chained(a in proptest::collection::vec(0u8..3, 0..64),
                              b in proptest::collection::vec(0u8..3, 0..64)) {
            let (ha, hb) = (block_hashes(&a, 4, 100), block_hashes(&b, 4, 100));
            for i in 0..ha.len().min(hb.len()) {
                prop_assert_eq!(ha[i] == hb[i], a[..4 * (i + 1)] == b[..4 * (i + 1)]);
            }
        }
    }
}
