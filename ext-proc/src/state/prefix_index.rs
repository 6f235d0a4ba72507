//! Which replicas of a fleet hold which prompt blocks in their KV cache, as the
//! router predicts it.
//!
//! Readers (the decision path) see one lock-free map, block hash → bitmask of
//! replicas. Only the writer task changes it, through [`IndexWriter`], which
//! models each replica's cache as an LRU with a capacity in tokens, so the map
//! never holds more than the fleet's caches can. A prompt's blocks are touched
//! last-to-first, so the first block is the most recently used and eviction
//! takes a prompt's tail first, as engines do: cached prefixes stay prefixes.

use std::sync::Arc;

use lru::LruCache;
use nohash_hasher::BuildNoHashHasher;

use crate::topology::{MAX_SLOTS, ReplicaId};

/// Block hashes are already uniform xxh3 values: hashing them again is waste.
type Map = papaya::HashMap<u64, u64, BuildNoHashHasher<u64>>;

/// The readers' half.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    map: Map,
}

/// Matched prefix lengths of one request, in blocks: one count per replica
/// slot of a fleet, the slot being the replica's bit in the index's masks, so
/// a fleet holds at most [`Matches::SLOTS`] replicas (a static list is
/// refused beyond that; a source's extra members wait for a free slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matches([u16; Matches::SLOTS]);

impl Matches {
    /// Replica slots per fleet: the bits of a `u64` mask.
    pub const SLOTS: usize = MAX_SLOTS;
}

impl Default for Matches {
    fn default() -> Self {
        Matches([0; Matches::SLOTS])
    }
}

impl std::ops::Index<ReplicaId> for Matches {
    type Output = u16;
    fn index(&self, r: ReplicaId) -> &u16 {
        &self.0[r.index()]
    }
}

impl PrefixIndex {
    /// For each replica (by bit), how many leading blocks of `blocks` it holds.
    /// Returns the longest match.
    ///
    /// A replica that holds a block holds every block before it: block hashes
    /// are chained (a block's hash covers the whole prefix up to it), and the
    /// writer's LRU evicts a prompt's tail before its head. So a replica's
    /// match ends where its bit last appears, and bisection finds it in about
    /// log2(blocks) lookups per distinct match length instead of one lookup
    /// per block: a long conversation costs a dozen lookups, not hundreds.
    /// Blocks that are not a chain (never the filter's) can only be
    /// mispredicted, and never cost more than one lookup per block.
    pub fn matches(&self, blocks: &[u64], out: &mut Matches) -> u16 {
        out.0 = [0; Matches::SLOTS];
        let Some(last) = blocks.len().checked_sub(1) else {
            return 0;
        };
        let guard = self.map.guard();
        let holders = |i: usize| self.map.get(&blocks[i], &guard).copied().unwrap_or(0);
        let first = holders(0);
        if first == 0 {
            return 0;
        }
        let whole = if last == 0 {
            first
        } else {
            holders(last) & first
        };
        for bit in Bits(whole) {
            out.0[bit] = blocks.len() as u16;
        }
        settle(&holders, out, 0, last, first, whole);
        Bits(first).map(|bit| out.0[bit]).max().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Gives each replica that holds block `lo` (`lo_mask`) but not block `hi`
/// (`hi_mask`, a subset) its match length, in `lo + 1 ..= hi`.
fn settle(
    holders: &impl Fn(usize) -> u64,
    out: &mut Matches,
    lo: usize,
    hi: usize,
    lo_mask: u64,
    hi_mask: u64,
) {
    let ending = lo_mask & !hi_mask;
    if ending == 0 {
        return;
    }
    if hi == lo + 1 {
        for bit in Bits(ending) {
            out.0[bit] = hi as u16;
        }
        return;
    }
    let mid = lo + (hi - lo) / 2;
    // Clamped to the chain: whoever holds `hi` holds `mid`, and only holders
    // of `lo` can.
    let mid_mask = (holders(mid) & lo_mask) | hi_mask;
    settle(holders, out, lo, mid, lo_mask, mid_mask);
    settle(holders, out, mid, hi, mid_mask, hi_mask);
}

/// The set bits of a mask, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        (self.0 != 0).then(|| {
            let bit = self.0.trailing_zeros() as usize;
            self.0 &= self.0 - 1;
            bit
        })
    }
}

/// The writer's half: one LRU per replica slot, and the shared map kept
/// equal to their union. A replica that leaves costs only its own blocks
/// (`clear`); a joiner's slot starts empty; nobody else's bit moves.
#[derive(Debug)]
pub struct IndexWriter {
    index: Arc<PrefixIndex>,
    /// By slot; grown as slots are used.
    replicas: Vec<ReplicaBlocks>,
    capacity_tokens: u64,
}

#[derive(Debug)]
struct ReplicaBlocks {
    lru: LruCache<u64, ()>,
    capacity_tokens: u64,
}

impl IndexWriter {
    /// `capacity_tokens` per replica.
    pub fn new(capacity_tokens: u64) -> Self {
        IndexWriter {
            index: Arc::new(PrefixIndex {
                map: Map::with_hasher(BuildNoHashHasher::default()),
            }),
            replicas: Vec::new(),
            capacity_tokens,
        }
    }

    pub fn capacity_tokens(&self) -> u64 {
        self.capacity_tokens
    }

    pub fn index(&self) -> Arc<PrefixIndex> {
        self.index.clone()
    }

    /// A request with these blocks was sent to `replica`: after it, the
    /// replica's cache holds all of them.
    pub fn insert(&mut self, replica: ReplicaId, blocks: &[u64], block_tokens: u32) {
        let replica = replica.index();
        if replica >= Matches::SLOTS {
            return;
        }
        if self.replicas.len() <= replica {
            let capacity_tokens = self.capacity_tokens;
            self.replicas.resize_with(replica + 1, || ReplicaBlocks {
                lru: LruCache::unbounded(),
                capacity_tokens,
            });
        }
        let r = &mut self.replicas[replica];
        let block_tokens = u64::from(block_tokens.max(1));
        let capacity = (r.capacity_tokens / block_tokens) as usize;
        if capacity == 0 {
            return;
        }
        // A prompt longer than the cache keeps only its head.
        let blocks = &blocks[..blocks.len().min(capacity)];
        let bit = 1u64 << replica;
        let map = self.index.map.pin();
        for &b in blocks.iter().rev() {
            if r.lru.put(b, ()).is_none() {
                let old = map.get(&b).copied().unwrap_or(0);
                if old & bit == 0 {
                    map.insert(b, old | bit);
                }
            }
        }
        while r.lru.len() > capacity {
            if let Some((evicted, ())) = r.lru.pop_lru() {
                clear_bit(&map, evicted, bit);
            }
        }
    }

    /// Forgets everything `replica` holds (it failed, restarted or left).
    pub fn clear(&mut self, replica: ReplicaId) {
        let replica = replica.index();
        let Some(r) = self.replicas.get_mut(replica) else {
            return;
        };
        let bit = 1u64 << replica;
        let map = self.index.map.pin();
        while let Some((b, ())) = r.lru.pop_lru() {
            clear_bit(&map, b, bit);
        }
    }

    /// Blocks the replica is believed to hold.
    pub fn held(&self, replica: ReplicaId) -> usize {
        self.replicas
            .get(replica.index())
            .map_or(0, |r| r.lru.len())
    }
}

#[cfg(test)]
impl IndexWriter {
    /// Whether the shared map is exactly the union of the slots' LRUs, and
    /// every set bit is one of `live` (`Err` says what differs).
    pub fn check_union(&self, live: u64) -> Result<(), String> {
        let map = self.index.map.pin();
        let mut want: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        for (r, rb) in self.replicas.iter().enumerate() {
            for (b, ()) in rb.lru.iter() {
                *want.entry(*b).or_default() |= 1 << r;
            }
        }
        for (b, m) in map.iter() {
            if want.get(b) != Some(m) {
                return Err(format!(
                    "block {b}: map {m:b}, LRUs {:b}",
                    want.get(b).copied().unwrap_or(0)
                ));
            }
            if m & !live != 0 {
                return Err(format!(
                    "block {b}: bits {:b} of no live replica",
                    m & !live
                ));
            }
        }
        if map.len() != want.len() {
            return Err(format!(
                "map holds {} blocks, the LRUs {}",
                map.len(),
                want.len()
            ));
        }
        Ok(())
    }
}

fn clear_bit<G: papaya::Guard>(
    map: &papaya::HashMapRef<'_, u64, u64, BuildNoHashHasher<u64>, G>,
    block: u64,
    bit: u64,
) {
    if let Some(&old) = map.get(&block) {
        let new = old & !bit;
        if new == 0 {
            map.remove(&block);
        } else {
            map.insert(block, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matches(w: &IndexWriter, blocks: &[u64]) -> (u16, Matches) {
        let mut out = Matches::default();
        let best = w.index().matches(blocks, &mut out);
        (best, out)
    }

    #[test]
    fn longest_prefix_per_replica() {
        let mut w = IndexWriter::new(1000);
        w.insert(ReplicaId(0), &[1, 2, 3, 4], 10);
        w.insert(ReplicaId(1), &[1, 2, 9], 10);
        let (best, m) = matches(&w, &[1, 2, 3, 5]);
        assert_eq!(best, 3);
        assert_eq!(&m.0[..3], &[3, 2, 0]);
        let (best, m) = matches(&w, &[7, 1]);
        assert_eq!((best, &m.0[..3]), (0, &[0, 0, 0][..]));
    }

    #[test]
    fn capacity_evicts_tails_first_and_clear_forgets() {
        let mut w = IndexWriter::new(40); // 4 blocks of 10 tokens
        w.insert(ReplicaId(0), &[1, 2, 3], 10);
        w.insert(ReplicaId(0), &[7, 8], 10);
        // The older prompt lost its tail, kept its head.
        assert_eq!(matches(&w, &[1, 2, 3]).0, 2);
        assert_eq!(matches(&w, &[7, 8]).0, 2);
        assert_eq!(w.held(ReplicaId(0)), 4);
        w.clear(ReplicaId(0));
        assert!(w.index().is_empty());
    }

    /// The match by definition: walk the blocks in order, a replica's match
    /// ending at the first block it does not hold.
    fn walked(w: &IndexWriter, blocks: &[u64]) -> (u16, Matches) {
        let map = w.index.map.pin();
        let mut out = Matches::default();
        let mut alive = u64::MAX;
        for (i, b) in blocks.iter().enumerate() {
            let holders = map.get(b).copied().unwrap_or(0) & alive;
            for bit in Bits(alive & !holders) {
                out.0[bit] = i as u16;
            }
            alive = holders;
        }
        for bit in Bits(alive) {
            out.0[bit] = blocks.len() as u16;
        }
        (out.0.iter().copied().max().unwrap_or(0), out)
    }

    /// Chained block hashes, as the filter sends them: each covers the
    /// prompt up to its end, so prompts sharing a hash share all before it.
    fn chained(ids: &[u8]) -> Vec<u64> {
        let mut h = 0u64;
        ids.iter()
            .map(|&id| {
                h = xxhash_rust::xxh3::xxh3_64_with_seed(&[id], h);
                h
            })
            .collect()
    }

    proptest! {
        /// Bisection finds what a block-by-block walk finds, for chained
        /// prompts, through inserts, evictions and clears.
        #[test]
        fn bisection_matches_the_walk(
            ops in proptest::collection::vec((0usize..6, proptest::collection::vec(0u8..3, 0..40), any::<bool>()), 0..40),
            probes in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..48), 1..8)
        ) {
            let mut w = IndexWriter::new(300);
            for (r, ids, clear) in &ops {
                if *clear && ids.len() % 7 == 0 {
                    w.clear(ReplicaId(*r));
                } else {
                    w.insert(ReplicaId(*r), &chained(ids), 10);
                }
                for p in &probes {
                    let blocks = chained(p);
                    prop_assert_eq!(matches(&w, &blocks), walked(&w, &blocks), "{:?}", p);
                }
            }
        }

        /// The shared map is exactly the union of the replicas' LRUs, and
        /// never larger than their capacities.
        #[test]
        fn map_equals_union_of_replica_caches(
            ops in proptest::collection::vec((0usize..4, proptest::collection::vec(0u64..30, 0..12), any::<bool>()), 0..60)
        ) {
            let mut w = IndexWriter::new(80);
            for (r, blocks, clear) in &ops {
                if *clear && blocks.len() % 5 == 0 { w.clear(ReplicaId(*r)) } else { w.insert(ReplicaId(*r), blocks, 10) }
            }
            let idx = w.index();
            let map = idx.map.pin();
            let mut total = 0;
            for (r, rb) in w.replicas.iter().enumerate() {
                prop_assert!(rb.lru.len() <= 8);
                for (b, ()) in rb.lru.iter() {
                    prop_assert!(map.get(b).copied().unwrap_or(0) & (1 << r) != 0);
                    total += 1;
                }
            }
            let bits: u32 = map.iter().map(|(_, m)| m.count_ones()).sum();
            prop_assert_eq!(bits as usize, total);
        }
    }
}
