//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005): the heaviest keys of a stream, counted
//! in a fixed number of counters. A key already counted adds to its counter; a new one takes a
//! free counter, or replaces the smallest and starts from its count (an overestimate of at most
//! that count, kept as `error`). Any key with more than `1 / capacity` of the stream is
//! guaranteed a counter. Used by `/top` (per route, with decay) and by `floodgate replay` (the
//! identities denied most).

use std::collections::HashMap;

use crate::limiter::key::Prehashed;

/// One key's counts.
#[derive(Debug, Clone)]
pub struct Counted<K> {
    /// The key's hash, as the caller computed it.
    pub hash: u64,
    pub key: K,
    pub allowed: u64,
    pub denied: u64,
    /// How much of `allowed + denied` may belong to keys this counter replaced (it is counted
    /// as allowed).
    pub error: u64,
}

impl<K> Counted<K> {
    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.allowed + self.denied
    }
}

/// At most `capacity` counters.
#[derive(Debug, Clone)]
pub struct SpaceSaving<K> {
    capacity: usize,
    counters: Vec<Counted<K>>,
    by_hash: HashMap<u64, usize, Prehashed>,
}

impl<K> SpaceSaving<K> {
    /// A summary of at most `capacity` counters (at least one).
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            counters: Vec::with_capacity(capacity.max(1)),
            by_hash: HashMap::default(),
        }
    }

    /// Counts one request of the key whose hash is `hash` (`key` makes the key, only when it is
    /// new), allowed or not.
    pub fn count(&mut self, hash: u64, key: impl FnOnce() -> K, allowed: bool) {
        let slot = match self.by_hash.get(&hash) {
            Some(&i) => i,
            None => self.insert(hash, key()),
        };
        let counter = &mut self.counters[slot];
        if allowed {
            counter.allowed += 1;
        } else {
            counter.denied += 1;
        }
    }

    /// Divides every count by `2^shift`, and frees the counters that reach 0 (a decay).
    pub fn halve(&mut self, shift: u32) {
        for c in &mut self.counters {
            c.allowed >>= shift;
            c.denied >>= shift;
            c.error >>= shift;
        }
        self.counters.retain(|c| c.total() > 0);
        self.by_hash.clear();
        for (i, c) in self.counters.iter().enumerate() {
            self.by_hash.insert(c.hash, i);
        }
    }

    /// The counters, in no order.
    pub fn counters(&self) -> &[Counted<K>] {
        &self.counters
    }

    /// A counter for a new key: a free one, or the smallest, whose count it inherits as its
    /// error.
    fn insert(&mut self, hash: u64, key: K) -> usize {
        if self.counters.len() < self.capacity {
            self.counters.push(Counted {
                hash,
                key,
                allowed: 0,
                denied: 0,
                error: 0,
            });
            let i = self.counters.len() - 1;
            self.by_hash.insert(hash, i);
            return i;
        }
        // (A full summary has `capacity` counters, at least one: the fallback is never taken.)
        let (i, smallest) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.total())
            .map_or((0, 0), |(i, c)| (i, c.total()));
        let old = std::mem::replace(
            &mut self.counters[i],
            Counted {
                hash,
                key,
                allowed: smallest,
                denied: 0,
                error: smallest,
            },
        );
        self.by_hash.remove(&old.hash);
        self.by_hash.insert(hash, i);
        i
    }
}
