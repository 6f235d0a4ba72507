//! A fleet's replica slots. A replica keeps its slot (its `ReplicaId`, and
//! its bit in the prefix index's masks) for as long as it is a member: a
//! joiner takes the lowest free slot, a leaver frees its own, and no other
//! replica moves. Ids stay meaningful across membership changes, so state
//! keyed by them (prefix bits, health, in-flight events) needs no remapping.

use std::ops::Index;

use super::ReplicaId;

/// Slots per fleet: the bits of the prefix index's `u64` masks.
pub const MAX_SLOTS: usize = 64;

/// Values by replica slot; a slot is occupied or free.
#[derive(Clone, Debug, PartialEq)]
pub struct Slots<T> {
    slots: Vec<Option<T>>,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slots<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Occupied slots.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, id: ReplicaId) -> Option<&T> {
        self.slots.get(id.index()).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, id: ReplicaId) -> Option<&mut T> {
        self.slots.get_mut(id.index()).and_then(Option::as_mut)
    }

    /// Occupied slots, lowest id first.
    pub fn iter(&self) -> impl Iterator<Item = (ReplicaId, &T)> + Clone {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((ReplicaId(i), v.as_ref()?)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ReplicaId, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, v)| Some((ReplicaId(i), v.as_mut()?)))
    }

    pub fn values(&self) -> impl Iterator<Item = &T> + Clone {
        self.slots.iter().flatten()
    }

    pub fn ids(&self) -> impl Iterator<Item = ReplicaId> + Clone + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// The lowest free slot, if the fleet has one left.
    pub fn free(&self) -> Option<ReplicaId> {
        let i = self
            .slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.slots.len());
        (i < MAX_SLOTS).then_some(ReplicaId(i))
    }

    /// Puts `v` in slot `id` (which must be below [`MAX_SLOTS`]); returns
    /// what was there.
    pub fn insert(&mut self, id: ReplicaId, v: T) -> Option<T> {
        assert!(id.index() < MAX_SLOTS, "slot {id} beyond {MAX_SLOTS}");
        if self.slots.len() <= id.index() {
            self.slots.resize_with(id.index() + 1, || None);
        }
        let old = self.slots[id.index()].replace(v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Frees slot `id`.
    pub fn remove(&mut self, id: ReplicaId) -> Option<T> {
        let old = self.slots.get_mut(id.index()).and_then(Option::take);
        if old.is_some() {
            self.len -= 1;
            while self.slots.last().is_some_and(Option::is_none) {
                self.slots.pop();
            }
        }
        old
    }

    /// The same slots, each value mapped.
    pub fn map<U>(&self, mut f: impl FnMut(ReplicaId, &T) -> U) -> Slots<U> {
        Slots {
            slots: self
                .slots
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_ref().map(|v| f(ReplicaId(i), v)))
                .collect(),
            len: self.len,
        }
    }
}

impl<T> FromIterator<T> for Slots<T> {
    /// Dense: the `i`th value in slot `i` (at most [`MAX_SLOTS`]).
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut s = Slots::new();
        for (i, v) in iter.into_iter().enumerate() {
            s.insert(ReplicaId(i), v);
        }
        s
    }
}

/// An id from the same topology generation is always occupied; any other is a bug.
impl<T> Index<ReplicaId> for Slots<T> {
    type Output = T;
    fn index(&self, id: ReplicaId) -> &T {
        self.get(id)
            .unwrap_or_else(|| panic!("replica slot {id} is free"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joiners_take_the_lowest_free_slot_and_nobody_moves() {
        let mut s: Slots<&str> = ["a", "b", "c"].into_iter().collect();
        assert_eq!(s.remove(ReplicaId(1)), Some("b"));
        assert_eq!((s.len(), s.free()), (2, Some(ReplicaId(1))));
        assert_eq!(s[ReplicaId(2)], "c");
        s.insert(ReplicaId(1), "d");
        assert_eq!(s.free(), Some(ReplicaId(3)));
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [
                (ReplicaId(0), &"a"),
                (ReplicaId(1), &"d"),
                (ReplicaId(2), &"c")
            ]
        );
        s.remove(ReplicaId(2));
        s.remove(ReplicaId(0));
        assert_eq!(s.values().collect::<Vec<_>>(), [&"d"]);
        assert_eq!(s.get(ReplicaId(2)), None);
        let m = s.map(|id, v| format!("{id}{v}"));
        assert_eq!(m[ReplicaId(1)], "1d");
    }

    #[test]
    fn at_most_max_slots() {
        let mut s: Slots<usize> = (0..MAX_SLOTS).collect();
        assert_eq!(s.free(), None);
        s.remove(ReplicaId(7));
        assert_eq!(s.free(), Some(ReplicaId(7)));
    }
}
