//! A request body while this filter pauses it: Envoy buffers the bytes (the
//! filter never copies them as they arrive), they count against a per-worker
//! budget, and they are read once, at end of stream, in bounded pieces into a
//! buffer reserved up front, so running out of memory is an answer, not a trap.

use std::cell::Cell;
use std::rc::Rc;

/// Bytes asked of the host per read: the host allocates each piece inside the
/// VM, so no single host-side allocation grows with the body.
pub const PIECE_BYTES: usize = 64 << 10;

/// What extraction may allocate beyond the body it reads, as a multiple of the
/// body (the extraction tests hold it to this).
pub const EXTRACTION_OVERHEAD: usize = 3;

/// Request-body bytes that Envoy holds for this worker's paused requests. Each
/// Envoy worker runs its own single-threaded VM, so a plain counter is exact
/// for the worker and needs no lock.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    held: Cell<u64>,
}

impl Budget {
    pub fn new(limit: u64) -> Rc<Budget> {
        Rc::new(Budget {
            limit,
            held: Cell::new(0),
        })
    }

    /// Bytes held now by all of this worker's paused requests.
    pub fn held(&self) -> u64 {
        self.held.get()
    }
}

/// Taking more would pass the worker's budget.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget;

/// One request's share of the budget, given back when dropped: when its body
/// is passed on, and in any case when the request ends (answered, finished or
/// reset: the host drops the request's context).
#[derive(Debug)]
pub struct Hold {
    budget: Rc<Budget>,
    bytes: u64,
}

impl Hold {
    pub fn new(budget: Rc<Budget>) -> Hold {
        Hold { budget, bytes: 0 }
    }

    /// Grows this request's share to `total` bytes. On `Err` nothing changes.
    pub fn grow_to(&mut self, total: u64) -> Result<(), OverBudget> {
        let extra = total.saturating_sub(self.bytes);
        let held = self.budget.held.get();
        if held.saturating_add(extra) > self.budget.limit {
            return Err(OverBudget);
        }
        self.budget.held.set(held.saturating_add(extra));
        self.bytes = self.bytes.max(total);
        Ok(())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let b = &self.budget;
        b.held.set(b.held.get().saturating_sub(self.bytes));
    }
}

/// The VM could not reserve memory for a body.
#[derive(Debug, PartialEq, Eq)]
pub struct NoMemory;

/// Reads `len` body bytes through `read(offset, max_len)` in pieces of at most
/// [`PIECE_BYTES`], into one buffer reserved before the first read. Also makes
/// sure the VM can still give extraction its working memory, so the parse that
/// follows cannot run out either. A host that returns less than asked ends the
/// body there.
pub fn read_in_pieces(
    len: usize,
    read: impl FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, NoMemory> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).map_err(|_| NoMemory)?;
    // Reserved and given back at once: the allocator keeps the space, so the
    // parse's own allocations find it.
    let mut headroom: Vec<u8> = Vec::new();
    headroom
        .try_reserve_exact(len.saturating_mul(EXTRACTION_OVERHEAD))
        .map_err(|_| NoMemory)?;
    drop(headroom);
    fill(&mut buf, len, read);
    Ok(buf)
}

/// Reads `len` body bytes like [`read_in_pieces`], into a buffer with
/// `slack` bytes to spare, for an edit in place that may lengthen it.
pub fn read_for_edit(
    len: usize,
    slack: usize,
    read: impl FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, NoMemory> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(len.saturating_add(slack))
        .map_err(|_| NoMemory)?;
    fill(&mut buf, len, read);
    Ok(buf)
}

fn fill(buf: &mut Vec<u8>, len: usize, mut read: impl FnMut(usize, usize) -> Option<Vec<u8>>) {
    while buf.len() < len {
        let want = (len - buf.len()).min(PIECE_BYTES);
        let Some(piece) = read(buf.len(), want).filter(|p| !p.is_empty()) else {
            break;
        };
        // Never past the reservation, whatever the host returns.
        buf.extend_from_slice(piece.get(..want).unwrap_or(&piece));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_hold_is_given_back_when_dropped() {
        let budget = Budget::new(100);
        let mut a = Hold::new(budget.clone());
        let mut b = Hold::new(budget.clone());
        a.grow_to(60).unwrap();
        assert_eq!(b.grow_to(50), Err(OverBudget));
        assert_eq!(budget.held(), 60, "a refused growth takes nothing");
        b.grow_to(40).unwrap();
        assert_eq!(a.grow_to(61), Err(OverBudget));
        drop(a);
        assert_eq!(budget.held(), 40);
        b.grow_to(100).unwrap();
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn an_impossible_reservation_is_an_error() {
        let r = read_in_pieces(usize::MAX / 2, |_, _| Some(vec![0]));
        assert_eq!(r, Err(NoMemory));
    }

    proptest! {
        /// However requests grow, interleave and end, the budget is never
        /// passed and returns to zero.
        #[test]
        fn budget_accounting_returns_to_zero(
            steps in proptest::collection::vec((0usize..8, 0u64..400, any::<bool>()), 0..200),
        ) {
            let budget = Budget::new(1000);
            let mut holds: Vec<Option<Hold>> = (0..8).map(|_| None).collect();
            for (i, size, end) in steps {
                let slot = &mut holds[i];
                if end {
                    *slot = None;
                } else {
                    let h = slot.get_or_insert_with(|| Hold::new(budget.clone()));
                    let before = budget.held();
                    match h.grow_to(size) {
                        Ok(()) => prop_assert!(h.bytes >= size),
                        Err(OverBudget) => prop_assert_eq!(budget.held(), before),
                    }
                }
                let sum: u64 = holds.iter().flatten().map(|h| h.bytes).sum();
                prop_assert_eq!(budget.held(), sum);
                prop_assert!(budget.held() <= 1000);
            }
            holds.clear();
            prop_assert_eq!(budget.held(), 0);
        }

        /// Reading in pieces gives exactly the whole body, however the host
        /// splits what it returns.
        #[test]
        fn pieces_add_up_to_the_body(
            len in 0usize..(3 * PIECE_BYTES),
            seed in any::<u8>(),
            short in prop_oneof![1usize..64, 1usize..=PIECE_BYTES],
        ) {
            let body: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut calls = 0;
            let read = read_in_pieces(body.len(), |at, max| {
                calls += 1;
                assert!(max <= PIECE_BYTES);
                // A host may return less than asked; never more than exists.
                let n = max.min(short);
                Some(body[at..(at + n).min(body.len())].to_vec())
            })
            .unwrap();
            prop_assert_eq!(&read, &body);
            prop_assert!(read.capacity() == body.len(), "one reservation, never grown");
            prop_assert!(calls <= body.len().div_ceil(short.min(PIECE_BYTES)) + 1);
        }
    }
}
