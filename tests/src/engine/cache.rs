//! A replica's prefix (KV) cache: an LRU of chained block hashes.
//!
//! Only full blocks are cached, as in vLLM. A prompt's blocks are touched from the
//! last to the first, so every block is more recently used than its successor:
//! eviction takes tails before heads and the cached set stays closed under
//! prefixes, which is what makes a leading-run lookup meaningful.

use std::num::NonZeroUsize;

use lru::LruCache;

pub struct PrefixCache {
    /// `None` when the capacity is below one block: nothing is ever cached.
    lru: Option<LruCache<u64, ()>>,
    block_tokens: usize,
}

impl PrefixCache {
    /// A cache holding `capacity_tokens / block_tokens` blocks.
    pub fn new(capacity_tokens: usize, block_tokens: usize) -> Self {
        let block_tokens = block_tokens.max(1);
        let lru = NonZeroUsize::new(capacity_tokens / block_tokens).map(LruCache::new);
        PrefixCache { lru, block_tokens }
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn capacity_blocks(&self) -> usize {
        self.lru.as_ref().map_or(0, |l| l.cap().get())
    }

    pub fn used_blocks(&self) -> usize {
        self.lru.as_ref().map_or(0, LruCache::len)
    }

    pub fn capacity_tokens(&self) -> usize {
        self.capacity_blocks() * self.block_tokens
    }

    pub fn used_tokens(&self) -> usize {
        self.used_blocks() * self.block_tokens
    }

    /// Used share of the capacity, 0..=1 (0 for a zero-capacity cache).
    pub fn usage(&self) -> f64 {
        match self.capacity_blocks() {
            0 => 0.0,
            cap => self.used_blocks() as f64 / cap as f64,
        }
    }

    /// How many leading blocks are cached, stopping at the first miss. Does not
    /// change recency: only serving a prompt ([`insert`](Self::insert)) does.
    pub fn lookup(&self, blocks: &[u64]) -> usize {
        let Some(lru) = &self.lru else { return 0 };
        blocks.iter().take_while(|h| lru.contains(*h)).count()
    }

    /// Caches all of a prompt's blocks, the first one most recently used.
    pub fn insert(&mut self, blocks: &[u64]) {
        let Some(lru) = &mut self.lru else { return };
        for h in blocks.iter().rev() {
            lru.put(*h, ());
        }
    }

    /// Serves a prompt: the cached leading blocks before it ran, then caches it.
    pub fn serve(&mut self, blocks: &[u64]) -> usize {
        let hit = self.lookup(blocks);
        self.insert(blocks);
        hit
    }

    /// Cached prompt tokens for `matched` leading blocks of a prompt of
    /// `prompt_tokens` tokens.
    pub fn cached_tokens(&self, matched: usize, prompt_tokens: u64) -> u64 {
        ((matched * self.block_tokens) as u64).min(prompt_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetroute_filter::extract::prefix::block_hashes;
    use proptest::prelude::*;

    const BLOCK_BYTES: usize = 16;
    const BLOCK_TOKENS: usize = BLOCK_BYTES / 4;

    fn blocks(text: &[u8]) -> Vec<u64> {
        block_hashes(text, BLOCK_BYTES, usize::MAX)
    }

    /// Prompts over a tiny alphabet, so random prompts share prefixes often.
    fn prompts() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(proptest::collection::vec(b'a'..b'c', 0..160), 1..40)
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut c = PrefixCache::new(BLOCK_TOKENS - 1, BLOCK_TOKENS);
        let b = blocks(&[b'x'; 64]);
        c.insert(&b);
        assert_eq!((c.lookup(&b), c.used_tokens(), c.usage()), (0, 0, 0.0));
    }

    #[test]
    fn eviction_removes_tails_first() {
        // Room for 4 blocks; a 3-block prompt, then a 2-block prompt of other text.
        let mut c = PrefixCache::new(4 * BLOCK_TOKENS, BLOCK_TOKENS);
        let a = blocks(&[b'a'; 3 * BLOCK_BYTES]);
        let b = blocks(&[b'b'; 2 * BLOCK_BYTES]);
        c.insert(&a);
        c.insert(&b);
        // One block of `a` had to go: its tail, not its head.
        assert_eq!(c.lookup(&a), 2);
        assert!(!c.lru.as_ref().unwrap().contains(&a[2]));
        assert_eq!(c.used_tokens(), 4 * BLOCK_TOKENS);
    }

    #[test]
    fn a_prompt_longer_than_the_cache_keeps_its_head() {
        let mut c = PrefixCache::new(3 * BLOCK_TOKENS, BLOCK_TOKENS);
        let a = blocks(&[b'a'; 10 * BLOCK_BYTES]);
        assert_eq!(c.serve(&a), 0);
        assert_eq!(c.serve(&a), 3);
    }

    proptest! {
        #[test]
        fn never_exceeds_capacity(ps in prompts(), cap_blocks in 0usize..12) {
            let mut c = PrefixCache::new(cap_blocks * BLOCK_TOKENS, BLOCK_TOKENS);
            for p in &ps {
                c.serve(&blocks(p));
                prop_assert!(c.used_blocks() <= cap_blocks);
                prop_assert!(c.usage() <= 1.0);
            }
        }

        #[test]
        fn a_repeated_prompt_hits_fully_when_it_fits(ps in prompts(), cap_blocks in 1usize..12) {
            let mut c = PrefixCache::new(cap_blocks * BLOCK_TOKENS, BLOCK_TOKENS);
            for p in &ps {
                let b = blocks(p);
                c.serve(&b);
                prop_assert_eq!(c.serve(&b), b.len().min(cap_blocks));
            }
        }

        #[test]
        fn a_shared_prefix_hits_exactly_its_full_blocks(
            shared in proptest::collection::vec(b'a'..b'c', 0..100),
            a in proptest::collection::vec(b'a'..b'c', 0..60),
            b in proptest::collection::vec(b'a'..b'c', 0..60),
        ) {
            let (pa, pb) = ([&shared[..], &a[..]].concat(), [&shared[..], &b[..]].concat());
            let common = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
            let mut c = PrefixCache::new(1 << 20, BLOCK_TOKENS);
            c.serve(&blocks(&pa));
            let (bb, hit) = (blocks(&pb), c.lookup(&blocks(&pb)));
            prop_assert_eq!(hit, (common / BLOCK_BYTES).min(bb.len()));
            let prompt_tokens = pb.len().div_ceil(4) as u64;
            prop_assert!(c.cached_tokens(hit, prompt_tokens) <= prompt_tokens);
        }

        /// Every served prompt's cached blocks form a leading run.
        #[test]
        fn cached_blocks_stay_prefix_closed(ps in prompts(), cap_blocks in 1usize..12) {
            let mut c = PrefixCache::new(cap_blocks * BLOCK_TOKENS, BLOCK_TOKENS);
            let all: Vec<Vec<u64>> = ps.iter().map(|p| blocks(p)).collect();
            for (i, b) in all.iter().enumerate() {
                c.serve(b);
                for earlier in &all[..=i] {
                    let lru = c.lru.as_ref().unwrap();
                    let present = earlier.iter().filter(|h| lru.contains(*h)).count();
                    prop_assert_eq!(present, c.lookup(earlier));
                }
            }
        }
    }
}
