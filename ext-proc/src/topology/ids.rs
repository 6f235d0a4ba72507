//! Typed indices: a stage, a fleet and a replica (within its fleet) of one
//! topology generation, and a place in a decision's candidate list. Each
//! indexes only the lists it belongs to, so a fleet index cannot be used for
//! a replica by mistake.

use std::ops::{Index, IndexMut};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(pub usize);

        impl $name {
            pub fn index(self) -> usize {
                self.0
            }

            /// Every id of a list of `len` entries.
            pub fn all(len: usize) -> impl Iterator<Item = $name> + Clone {
                (0..len).map($name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl<T> Index<$name> for [T] {
            type Output = T;
            fn index(&self, i: $name) -> &T {
                &self[i.0]
            }
        }

        impl<T> IndexMut<$name> for [T] {
            fn index_mut(&mut self, i: $name) -> &mut T {
                &mut self[i.0]
            }
        }

        impl<T> Index<$name> for Vec<T> {
            type Output = T;
            fn index(&self, i: $name) -> &T {
                &self[i.0]
            }
        }

        impl<T> IndexMut<$name> for Vec<T> {
            fn index_mut(&mut self, i: $name) -> &mut T {
                &mut self[i.0]
            }
        }
    };
}

id!(
    /// A stage: an index into `Topology::stages`.
    StageId
);
id!(
    /// A fleet: an index into `Topology::fleets` (and the snapshot's per-fleet lists).
    FleetId
);
id!(
    /// A replica within its fleet: an index into `Fleet::replicas`.
    ReplicaId
);
id!(
    /// A place in one decision's list of candidate fleets.
    Candidate
);

/// A list with at least one entry: its first is always there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NonEmpty<T>(Vec<T>);

impl<T> NonEmpty<T> {
    pub fn new(v: Vec<T>) -> Option<NonEmpty<T>> {
        (!v.is_empty()).then_some(NonEmpty(v))
    }

    pub fn head(&self) -> &T {
        &self.0[0]
    }
}

impl<'a, T> IntoIterator for &'a NonEmpty<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T> std::ops::Deref for NonEmpty<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

/// `get` by a typed id (slices take `usize` only).
pub trait ById<I> {
    type Item;
    fn by_id(&self, i: I) -> Option<&Self::Item>;
    fn by_id_mut(&mut self, i: I) -> Option<&mut Self::Item>;
}

macro_rules! by_id {
    ($($name:ident),*) => {$(
        impl<T> ById<$name> for [T] {
            type Item = T;
            fn by_id(&self, i: $name) -> Option<&T> {
                self.get(i.0)
            }
            fn by_id_mut(&mut self, i: $name) -> Option<&mut T> {
                self.get_mut(i.0)
            }
        }
    )*};
}

by_id!(StageId, FleetId, ReplicaId, Candidate);
