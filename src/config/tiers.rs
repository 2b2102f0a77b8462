//! The tiers a config names: a tier a token claims (`identity.jwt.tier_claim`) is the client's
//! word, not the operator's, so one that no limit and no exemption names is limited as
//! `default` (a `plan: free` nobody configured must not escape the `default` tier's limits).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::RouteConfig;
use crate::identity::DEFAULT_TIER;

/// The most unknown tier values remembered (each logged once); past it they are counted only.
const REMEMBERED: usize = 1000;

/// The tiers named by some limit's `tiers:` or some exemption, and the unknown ones seen.
#[derive(Debug, Default)]
pub struct KnownTiers {
    named: HashSet<String>,
    /// Unknown values already logged.
    logged: Mutex<HashSet<String>>,
    /// Requests whose claimed tier was unknown.
    unknown: AtomicU64,
}

impl KnownTiers {
    /// The tiers `routes` name, in their limits and exemptions (global ones included).
    pub fn of(routes: &[RouteConfig]) -> KnownTiers {
        let mut named = HashSet::new();
        for route in routes {
            let limits = route.enforced.limits.iter().chain(&route.shadow.limits);
            named.extend(limits.flat_map(|l| l.tiers.iter().flatten().cloned()));
            named.extend(route.exempt.tiers.iter().cloned());
        }
        KnownTiers {
            named,
            ..KnownTiers::default()
        }
    }

    /// The tier a request whose token claims `claimed` is limited as: `claimed` when the config
    /// names it, `default` otherwise (counted, and logged once per value).
    pub fn claimed<'a>(&self, claimed: &'a str) -> &'a str {
        if self.named.contains(claimed) {
            return claimed;
        }
        let n = self.unknown.fetch_add(1, Ordering::Relaxed) + 1;
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.len() < REMEMBERED && logged.insert(claimed.to_string()) {
            tracing::warn!(
                tier = %claimed.escape_debug(),
                unknown_so_far = n,
                "a token claims a tier no limit or exemption names: limited as \"default\""
            );
        }
        DEFAULT_TIER
    }

    /// How many requests claimed a tier the config does not name.
    pub fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_nobody_named_is_default() {
        let tiers = KnownTiers {
            named: ["pro".to_string(), "gold".to_string()].into(),
            ..KnownTiers::default()
        };
        assert_eq!(tiers.claimed("pro"), "pro");
        assert_eq!(tiers.claimed("free"), "default");
        assert_eq!(tiers.claimed("free"), "default");
        assert_eq!(tiers.unknown(), 2);
        assert_eq!(
            tiers.logged.lock().unwrap().len(),
            1,
            "logged once per value"
        );
    }
}
