//! LoRA adapters as the router names them: an id from the adapter's name
//! (the same across reloads, so what a replica holds survives one), and a
//! stage's table of the adapters clients may ask for.

use std::collections::HashMap;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

/// An adapter: a hash of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub u64);

impl AdapterId {
    pub fn of(name: &str) -> AdapterId {
        AdapterId(xxh3_64(name.as_bytes()))
    }

    /// A prompt's block hash under this adapter: an engine caches an
    /// adapter's KV blocks apart from the base model's and from other
    /// adapters' (vLLM keys them by adapter too), so the prefix index must.
    pub fn block(self, block: u64) -> u64 {
        xxh3_64(&(block ^ self.0).to_le_bytes())
    }
}

/// A stage's adapters, by the names clients send and by id.
#[derive(Debug, Default)]
pub struct StageAdapters {
    by_name: HashMap<String, AdapterId>,
    names: HashMap<AdapterId, Arc<str>>,
}

impl StageAdapters {
    pub fn new(names: &[String]) -> StageAdapters {
        StageAdapters {
            by_name: names
                .iter()
                .map(|n| (n.clone(), AdapterId::of(n)))
                .collect(),
            names: names
                .iter()
                .map(|n| (AdapterId::of(n), Arc::from(n.as_str())))
                .collect(),
        }
    }

    /// The adapter a client's `model` names, when it names one.
    pub fn id(&self, model: &str) -> Option<AdapterId> {
        self.by_name.get(model).copied()
    }

    pub fn name(&self, id: AdapterId) -> Option<&Arc<str>> {
        self.names.get(&id)
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_moves_every_block_and_two_adapters_differ() {
        let (a, b) = (AdapterId::of("a"), AdapterId::of("b"));
        assert_ne!(a.block(7), 7);
        assert_ne!(a.block(7), b.block(7));
        assert_eq!(a.block(7), AdapterId::of("a").block(7));
        let t = StageAdapters::new(&["a".into(), "b".into()]);
        assert_eq!(t.id("a"), Some(a));
        assert_eq!(t.id("base"), None);
        assert_eq!(t.name(b).map(|n| &**n), Some("b"));
    }
}
