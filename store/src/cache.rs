//! The writer's bounded cache of hot entities and stream ids.
//!
//! Owns [`Cache`]: intents and runs the writer decided over recently, by stream id, with
//! their stream's length, and stream names → ids. It holds at most
//! [`engine::limits::ENTITY_CACHE_MAX`] entries of each kind, in two generations: a lookup
//! finds an entry in the young one or moves it there from the old one; when the young one is
//! full the old one is dropped and the young one becomes old. So the most recently used
//! half stays, every operation is O(1), and memory stays bounded whatever the log's size.
//!
//! # Coherence
//!
//! An entry is exactly its entity row as of the writer's last command. The writer keeps it
//! so: it rewrites the rows a command changed and then updates their entries; it drops the
//! entries of every stream another process appended to (catch-up, under the write lock,
//! before deciding anything); and it clears everything when a batch rolls back. Stream ids
//! never change once assigned, so the id map needs no invalidation.

use engine::event::StreamId;
use engine::ledger::{Intent, Run};
use std::collections::HashMap;
use std::hash::Hash;

/// An entity as cached.
#[derive(Clone, Debug)]
pub(crate) enum Entity {
    /// An intent's state.
    Intent(Box<Intent>),
    /// A run's state.
    Run(Box<Run>),
}

/// What the cache knows of one stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct Entry {
    /// Its length (last `stream_seq`), once read.
    pub(crate) len: Option<u64>,
    /// Its entity, once loaded.
    pub(crate) entity: Option<Entity>,
}

/// A map of at most `max` entries that keeps the most recently used ones.
struct Generations<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
    half: usize,
}

impl<K: Eq + Hash + Clone, V> Generations<K, V> {
    fn new(max: usize) -> Self {
        let half = (max / 2).max(1);
        Self { young: HashMap::with_capacity(half), old: HashMap::new(), half }
    }

    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        if !self.young.contains_key(key) {
            let value = self.old.remove(key)?;
            self.insert(key.clone(), value);
        }
        self.young.get_mut(key)
    }

    fn insert(&mut self, key: K, value: V) {
        if self.young.len() >= self.half && !self.young.contains_key(&key) {
            self.old = std::mem::take(&mut self.young);
            self.young.reserve(self.half);
        }
        self.young.insert(key, value);
    }

    fn remove(&mut self, key: &K) {
        self.young.remove(key);
        self.old.remove(key);
    }

    fn clear(&mut self) {
        self.young.clear();
        self.old.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }
}

/// See the [module docs](self).
pub(crate) struct Cache {
    ids: Generations<StreamId, i64>,
    entries: Generations<i64, Entry>,
}

impl Cache {
    /// An empty cache holding at most `max` entities and `max` stream ids.
    pub(crate) fn new(max: usize) -> Self {
        Self { ids: Generations::new(max), entries: Generations::new(max) }
    }

    /// The id of a stream, if cached.
    pub(crate) fn id(&mut self, name: &StreamId) -> Option<i64> {
        self.ids.get_mut(name).copied()
    }

    /// Remembers a stream's id.
    pub(crate) fn set_id(&mut self, name: &StreamId, id: i64) {
        self.ids.insert(name.clone(), id);
    }

    /// What is cached of stream `id`.
    pub(crate) fn entry(&mut self, id: i64) -> Option<&mut Entry> {
        self.entries.get_mut(&id)
    }

    /// What is cached of stream `id`, created empty if nothing was.
    pub(crate) fn entry_or_default(&mut self, id: i64) -> &mut Entry {
        if self.entries.get_mut(&id).is_none() {
            self.entries.insert(id, Entry::default());
        }
        self.entries.get_mut(&id).expect("the entry was just inserted")
    }

    /// Forgets what is cached of stream `id` (another process changed it).
    pub(crate) fn forget(&mut self, id: i64) {
        self.entries.remove(&id);
    }

    /// Forgets everything (a batch rolled back: the ids it assigned are gone with it).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.ids.clear();
    }

    /// Entries held, for tests of the bound.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        (self.ids.len(), self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_never_holds_more_than_its_bound_and_keeps_what_is_used() {
        let mut cache = Cache::new(100);
        for id in 0..10_000 {
            cache.set_id(&StreamId::from_stored(format!("run:{id}")), id);
            cache.entry_or_default(id).len = Some(1);
            // Stream 7 is used all the time: it must stay.
            cache.entry_or_default(7).len = Some(7);
            let (ids, entries) = cache.held();
            assert!(ids <= 100 && entries <= 100, "{ids} ids, {entries} entries");
        }
        assert_eq!(cache.entry(7).and_then(|e| e.len), Some(7));
        assert!(cache.entry(0).is_none(), "an old, unused entry was dropped");
        cache.forget(7);
        assert!(cache.entry(7).is_none());
    }
}
