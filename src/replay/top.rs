//! The identities denied most, per route, in fixed memory.

use std::collections::HashMap;

use super::{TOP_REPORTED, TOP_TRACKED};

/// The Space-Saving summary of the most frequent items, in fixed memory.
#[derive(Debug, Default, Clone)]
pub(super) struct TopK {
    counts: HashMap<String, u64>,
}

impl TopK {
    pub(super) fn add(&mut self, item: String) {
        if let Some(n) = self.counts.get_mut(&item) {
            *n += 1;
        } else if self.counts.len() < TOP_TRACKED {
            self.counts.insert(item, 1);
        } else if let Some((smallest, n)) = self
            .counts
            .iter()
            .min_by_key(|(_, n)| **n)
            .map(|(k, n)| (k.clone(), *n))
        {
            // The newcomer inherits the evicted count: an overestimate by at most that much.
            self.counts.remove(&smallest);
            self.counts.insert(item, n + 1);
        }
    }

    pub(super) fn top(&self) -> Vec<(&str, u64)> {
        let mut all: Vec<_> = self.counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.truncate(TOP_REPORTED);
        all
    }
}
