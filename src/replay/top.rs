//! The identities denied most, per route, in fixed memory: the one Space-Saving table `/top`
//! uses ([`crate::top::space_saving`]), fed only denials and never decayed (a log is counted
//! whole).

use std::hash::{BuildHasher, RandomState};

use super::{TOP_REPORTED, TOP_TRACKED};
use crate::top::space_saving::SpaceSaving;

/// The denied identities of one route, by their report label.
#[derive(Debug, Clone)]
pub(super) struct TopK {
    hasher: RandomState,
    counts: SpaceSaving<String>,
}

impl Default for TopK {
    fn default() -> Self {
        TopK {
            hasher: RandomState::new(),
            counts: SpaceSaving::new(TOP_TRACKED),
        }
    }
}

impl TopK {
    /// Counts one denial of `item`.
    pub(super) fn add(&mut self, item: String) {
        let hash = self.hasher.hash_one(&item);
        self.counts.count(hash, || item, false);
    }

    /// The most denied, most first (a newcomer's count includes what it inherited: an
    /// overestimate by at most that much).
    pub(super) fn top(&self) -> Vec<(&str, u64)> {
        let mut all: Vec<_> = self
            .counts
            .counters()
            .iter()
            .map(|c| (c.key.as_str(), c.total()))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.truncate(TOP_REPORTED);
        all
    }
}
