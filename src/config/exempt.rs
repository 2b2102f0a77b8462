//! `exempt:`, globally and per route: requests no limit applies to, by the client's network, the
//! consumer's tier or the consumer's name. An exempt request is forwarded without spending any
//! budget and counted as `decision="exempt"`: an internal health checker, a partner on a private
//! network, a staff tier.

use ipnet::IpNet;

use super::Validator;
use super::file::ExemptFile;
use crate::identity::{Consumers, Identity};

/// Who no limit applies to. A request is exempt when its client address is in one of the
/// networks, or its consumer has one of the tiers or names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exempt {
    pub networks: Vec<IpNet>,
    pub tiers: Vec<String>,
    pub consumers: Vec<String>,
}

impl Exempt {
    /// True when nothing is exempt.
    pub fn is_empty(&self) -> bool {
        self.networks.is_empty() && self.tiers.is_empty() && self.consumers.is_empty()
    }

    /// True when a request of `identity` and `tier` from `ip` is exempt: the client address
    /// (for IPv6, the prefix a budget is kept for) in a network, its tier (a consumer's, or a
    /// verified token's tier claim) listed, or its consumer's name.
    pub fn covers(&self, ip: std::net::IpAddr, identity: &Identity<'_>, tier: &str) -> bool {
        self.networks.iter().any(|net| net.contains(&ip))
            || self.tiers.iter().any(|t| t == tier)
            || matches!(identity, Identity::Consumer(c) if self.consumers.contains(&c.name))
    }

    /// Both lists together: a route's own exemptions beside the global ones.
    pub fn with(&self, more: &Exempt) -> Exempt {
        let mut out = self.clone();
        out.networks.extend(more.networks.iter().copied());
        out.tiers.extend(more.tiers.iter().cloned());
        out.consumers.extend(more.consumers.iter().cloned());
        out
    }
}

impl Validator {
    /// `exempt:` at `path` (`exempt`, `routes[2].exempt`): every network parsed (a bare address
    /// is that one host), every consumer named known when `consumers:` lists them.
    pub(super) fn exempt(
        &mut self,
        path: &str,
        file: Option<ExemptFile>,
        consumers: Option<&Consumers>,
        tiers_from_tokens: bool,
    ) -> Exempt {
        let Some(file) = file else {
            return Exempt::default();
        };
        let networks = self.networks(&format!("{path}.networks"), &file.networks);
        for (n, name) in file.consumers.iter().enumerate() {
            match consumers {
                None => self.problem(
                    format!("{path}.consumers[{n}]"),
                    "exempting a consumer needs a consumers: section",
                ),
                Some(known) if known.named(name).is_none() => self.problem(
                    format!("{path}.consumers[{n}]"),
                    format!("no consumer is named {name:?}"),
                ),
                Some(_) => {}
            }
        }
        if !file.tiers.is_empty() && consumers.is_none() && !tiers_from_tokens {
            self.problem(
                format!("{path}.tiers"),
                "exempting a tier needs a consumers: section or identity.jwt.tier_claim",
            );
        }
        Exempt {
            networks,
            tiers: file.tiers,
            consumers: file.consumers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_a_tier_or_a_consumer_is_exempt_whoever_named_the_tier() {
        let exempt = Exempt {
            networks: vec!["10.9.0.0/16".parse().unwrap()],
            tiers: vec!["staff".into()],
            consumers: vec!["health-checker".into()],
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let alice = Identity::Jwt(b"alice");
        assert!(exempt.covers(ip("10.9.3.4"), &alice, "anonymous"));
        assert!(!exempt.covers(ip("10.8.3.4"), &alice, "anonymous"));
        // A verified token's tier claim counts as a consumer's tier does.
        assert!(exempt.covers(ip("10.8.3.4"), &alice, "staff"));
        let checker = crate::identity::Consumer {
            name: "health-checker".into(),
            tier: "default".into(),
        };
        assert!(exempt.covers(ip("10.8.3.4"), &Identity::Consumer(&checker), "default"));
        assert!(!Exempt::default().covers(ip("10.9.3.4"), &alice, "staff"));
    }
}
