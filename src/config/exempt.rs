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

    /// True when a request of `identity` from `ip` is exempt: the client address (for IPv6, the
    /// prefix a budget is kept for) in a network, or its consumer's tier or name listed.
    pub fn covers(&self, ip: std::net::IpAddr, identity: &Identity<'_>) -> bool {
        if self.networks.iter().any(|net| net.contains(&ip)) {
            return true;
        }
        match identity {
            Identity::Consumer(consumer) => {
                self.tiers.contains(&consumer.tier) || self.consumers.contains(&consumer.name)
            }
            _ => false,
        }
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
        if !file.tiers.is_empty() && consumers.is_none() {
            self.problem(
                format!("{path}.tiers"),
                "exempting a tier needs a consumers: section (tiers are consumers')",
            );
        }
        Exempt {
            networks,
            tiers: file.tiers,
            consumers: file.consumers,
        }
    }
}
