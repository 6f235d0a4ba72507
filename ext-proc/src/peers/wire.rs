//! The bytes of one batch on the peer link. Compact and bounded: a batch
//! read from Redis is decoded under the same limits the filter puts on a
//! request (at most `MAX_BLOCKS` blocks, names of at most 255 bytes), and a
//! malformed batch is dropped whole.
//!
//! Prefix batch: `1u8`, count `u16`, then per change: kind `u8` (0 routed,
//! 1 cleared), fleet and replica as `u8` length + bytes, and for a routed
//! change `block_tokens: u32`, `n: u16`, `n × u64` (little-endian).
//! Forward batch: `1u8`, count `u16`, then per entry `u32` length + bytes.
//! Load report: `1u8`, fleets `u16`, then per fleet its name and a count
//! `u16` of replicas, each an address and `inflight: u16`, `prefilling: u16`,
//! `pending_prefill: u32` (saturated; larger figures mean the same to a
//! decision).

use crate::state::peer::{PeerChange, PeerUpdate};
use crate::state::peer_load::{FleetLoad, LoadReport};
use crate::topology::load::LoadFigures;

const VERSION: u8 = 1;
/// The filter's ceiling on hashed blocks per prompt.
pub const MAX_BLOCKS: usize = 4096;
/// Largest forwarded item (a trimmed access log entry is a few hundred bytes).
pub const MAX_ITEM_BYTES: usize = 16 * 1024;
/// Most replica figures one load report may carry.
pub const MAX_LOAD_FIGURES: usize = 4096;

/// Bytes `u` takes in a batch.
pub fn update_len(u: &PeerUpdate) -> usize {
    let names = 3 + u.fleet.len().min(255) + u.replica.len().min(255);
    match &u.change {
        PeerChange::Routed { blocks, .. } => names + 6 + 8 * blocks.len().min(MAX_BLOCKS),
        PeerChange::Cleared => names,
    }
}

fn name(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

/// One batch of prefix changes (at most `u16::MAX`).
pub fn encode_updates(updates: &[PeerUpdate]) -> Vec<u8> {
    let n = updates.len().min(usize::from(u16::MAX));
    let mut out = Vec::with_capacity(3 + updates[..n].iter().map(update_len).sum::<usize>());
    out.push(VERSION);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for u in &updates[..n] {
        match &u.change {
            PeerChange::Routed {
                blocks,
                block_tokens,
            } => {
                out.push(0);
                name(&mut out, &u.fleet);
                name(&mut out, &u.replica);
                let blocks = &blocks[..blocks.len().min(MAX_BLOCKS)];
                out.extend_from_slice(&block_tokens.to_le_bytes());
                out.extend_from_slice(&(blocks.len() as u16).to_le_bytes());
                for b in blocks {
                    out.extend_from_slice(&b.to_le_bytes());
                }
            }
            PeerChange::Cleared => {
                out.push(1);
                name(&mut out, &u.fleet);
                name(&mut out, &u.replica);
            }
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn name(&mut self) -> Option<String> {
        let n = usize::from(self.u8()?);
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

/// A batch of prefix changes; `None` when it is malformed.
pub fn decode_updates(bytes: &[u8]) -> Option<Vec<PeerUpdate>> {
    let mut r = Reader(bytes);
    if r.u8()? != VERSION {
        return None;
    }
    let n = usize::from(r.u16()?);
    let mut out = Vec::with_capacity(n.min(bytes.len() / 3));
    for _ in 0..n {
        let kind = r.u8()?;
        let fleet = r.name()?;
        let replica = r.name()?;
        let change = match kind {
            0 => {
                let block_tokens = r.u32()?;
                let count = usize::from(r.u16()?);
                if count > MAX_BLOCKS || r.0.len() < count * 8 {
                    return None;
                }
                let blocks = (0..count).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
                PeerChange::Routed {
                    blocks,
                    block_tokens,
                }
            }
            1 => PeerChange::Cleared,
            _ => return None,
        };
        out.push(PeerUpdate {
            fleet,
            replica,
            change,
        });
    }
    r.0.is_empty().then_some(out)
}

/// One batch of opaque items (forwarded entries), each at most `MAX_ITEM_BYTES`.
pub fn encode_items(items: &[Vec<u8>]) -> Vec<u8> {
    let n = items.len().min(usize::from(u16::MAX));
    let mut out = Vec::with_capacity(3 + items[..n].iter().map(|i| 4 + i.len()).sum::<usize>());
    out.push(VERSION);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for i in &items[..n] {
        out.extend_from_slice(&(i.len() as u32).to_le_bytes());
        out.extend_from_slice(i);
    }
    out
}

pub fn decode_items(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut r = Reader(bytes);
    if r.u8()? != VERSION {
        return None;
    }
    let n = usize::from(r.u16()?);
    let mut out = Vec::with_capacity(n.min(bytes.len() / 4));
    for _ in 0..n {
        let len = r.u32()? as usize;
        if len > MAX_ITEM_BYTES {
            return None;
        }
        out.push(r.take(len)?.to_vec());
    }
    r.0.is_empty().then_some(out)
}

fn sat16(n: u32) -> u16 {
    n.min(u32::from(u16::MAX)) as u16
}

/// A load report in at most `max` bytes: the fleets and replicas in the
/// report's order, as many as fit (and at most `MAX_LOAD_FIGURES`). Also
/// returns the figures left out.
pub fn encode_load(report: &LoadReport, max: usize) -> (Vec<u8>, usize) {
    let mut out = vec![VERSION, 0, 0];
    let (mut fleets, mut figures) = (0u16, 0usize);
    'fleets: for f in &report.fleets {
        if fleets == u16::MAX {
            break;
        }
        let head = out.len();
        name(&mut out, &f.fleet);
        let count_at = out.len();
        out.extend_from_slice(&[0, 0]);
        let mut n = 0u16;
        for (addr, l) in &f.replicas {
            let len = 1 + addr.len().min(255) + 8;
            if out.len() + len > max || figures >= MAX_LOAD_FIGURES || n == u16::MAX {
                if n == 0 {
                    out.truncate(head);
                } else {
                    out[count_at..count_at + 2].copy_from_slice(&n.to_le_bytes());
                    fleets += 1;
                }
                break 'fleets;
            }
            name(&mut out, addr);
            out.extend_from_slice(&sat16(l.inflight).to_le_bytes());
            out.extend_from_slice(&sat16(l.prefilling).to_le_bytes());
            let tokens = l.pending_prefill.min(u64::from(u32::MAX)) as u32;
            out.extend_from_slice(&tokens.to_le_bytes());
            n += 1;
            figures += 1;
        }
        out[count_at..count_at + 2].copy_from_slice(&n.to_le_bytes());
        fleets += 1;
    }
    out[1..3].copy_from_slice(&fleets.to_le_bytes());
    (out, report.len() - figures)
}

/// A load report; `None` when it is malformed.
pub fn decode_load(bytes: &[u8]) -> Option<LoadReport> {
    let mut r = Reader(bytes);
    if r.u8()? != VERSION {
        return None;
    }
    let n = usize::from(r.u16()?);
    let mut fleets = Vec::with_capacity(n.min(bytes.len() / 3));
    let mut figures = 0;
    for _ in 0..n {
        let fleet = r.name()?;
        let count = usize::from(r.u16()?);
        figures += count;
        if figures > MAX_LOAD_FIGURES || r.0.len() < count * 9 {
            return None;
        }
        let mut replicas = Vec::with_capacity(count);
        for _ in 0..count {
            let addr = r.name()?;
            let l = LoadFigures {
                inflight: u32::from(r.u16()?),
                prefilling: u32::from(r.u16()?),
                pending_prefill: u64::from(r.u32()?),
            };
            replicas.push((addr, l));
        }
        fleets.push(FleetLoad { fleet, replicas });
    }
    r.0.is_empty().then_some(LoadReport { fleets })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn load(fleets: &[(&str, usize)]) -> LoadReport {
        LoadReport {
            fleets: fleets
                .iter()
                .map(|&(f, n)| FleetLoad {
                    fleet: f.into(),
                    replicas: (0..n)
                        .map(|i| {
                            (
                                format!("10.0.0.{i}:8000"),
                                LoadFigures {
                                    inflight: i as u32 + 1,
                                    prefilling: 1,
                                    pending_prefill: 1000 * i as u64,
                                },
                            )
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn load_reports_round_trip_and_are_cut_to_the_byte_bound() {
        let r = load(&[("base", 3), ("burst", 2)]);
        let (bytes, left) = encode_load(&r, 1 << 16);
        assert_eq!((decode_load(&bytes), left), (Some(r.clone()), 0));
        // Only the first fleet and one replica of the second fit.
        let (cut, left) = encode_load(&r, 3 + 7 + 3 * 22 + 8 + 22);
        assert_eq!(left, 1);
        let back = decode_load(&cut).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back.fleets[1].replicas.len(), 1);
        for n in 0..cut.len() {
            assert_eq!(decode_load(&cut[..n]), None, "cut at {n}");
        }
        // Figures beyond the wire's widths saturate.
        let mut big = load(&[("f", 1)]);
        big.fleets[0].replicas[0].1 = LoadFigures {
            inflight: 1 << 20,
            prefilling: 7,
            pending_prefill: u64::MAX,
        };
        let l = decode_load(&encode_load(&big, 1024).0).unwrap().fleets[0].replicas[0].1;
        assert_eq!(
            (l.inflight, l.prefilling, l.pending_prefill),
            (65535, 7, u64::from(u32::MAX))
        );
        assert_eq!(
            encode_load(&LoadReport::default(), 1024).0,
            vec![VERSION, 0, 0]
        );
    }

    #[test]
    fn load_reports_beyond_the_figure_bound_are_refused() {
        let mut huge = vec![VERSION, 1, 0, 1, b'f'];
        huge.extend_from_slice(&((MAX_LOAD_FIGURES + 1) as u16).to_le_bytes());
        huge.extend(std::iter::repeat_n(0u8, (MAX_LOAD_FIGURES + 1) * 9));
        assert_eq!(decode_load(&huge), None);
    }

    fn routed(blocks: Vec<u64>) -> PeerUpdate {
        PeerUpdate {
            fleet: "base".into(),
            replica: "10.0.0.1:8000".into(),
            change: PeerChange::Routed {
                blocks,
                block_tokens: 256,
            },
        }
    }

    #[test]
    fn a_batch_round_trips_and_its_length_is_known() {
        let us = vec![
            routed(vec![1, 2, u64::MAX]),
            PeerUpdate {
                fleet: "burst".into(),
                replica: "10.0.1.1:8000".into(),
                change: PeerChange::Cleared,
            },
        ];
        let bytes = encode_updates(&us);
        assert_eq!(bytes.len(), 3 + us.iter().map(update_len).sum::<usize>());
        assert_eq!(decode_updates(&bytes), Some(us));
    }

    #[test]
    fn malformed_batches_decode_to_nothing() {
        let bytes = encode_updates(&[routed(vec![7; 10])]);
        for cut in 0..bytes.len() {
            assert_eq!(decode_updates(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(decode_updates(&extra), None);
        let mut bad = bytes;
        bad[0] = 9;
        assert_eq!(decode_updates(&bad), None);
        // A count of blocks beyond the filter's ceiling is refused before
        // anything is allocated for it.
        let mut huge = vec![VERSION, 1, 0, 0, 1, b'f', 1, b'r', 0, 1, 0, 0];
        huge.extend_from_slice(&(u16::MAX).to_le_bytes());
        assert_eq!(decode_updates(&huge), None);
    }

    proptest! {
        #[test]
        fn items_round_trip(items in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..20)) {
            prop_assert_eq!(decode_items(&encode_items(&items)), Some(items));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_updates(&bytes);
            let _ = decode_items(&bytes);
            let _ = decode_load(&bytes);
        }
    }
}
