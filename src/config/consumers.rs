//! `consumers:`: the API keys floodgate knows, by SHA-256, and the tiers limits may name.

use std::path::{Path, PathBuf};

use super::file::{self, ConsumerFile};
use super::{RouteConfig, Validator, is_name};
use crate::identity::{ANONYMOUS_TIER, Consumer, Consumers, DEFAULT_TIER, UnknownKey};

impl Validator {
    /// `consumers:`: inline entries and those of `file`, each key's digest parsed and unique.
    pub(super) fn consumers(
        &mut self,
        c: file::ConsumersFile,
        base_dir: Option<&Path>,
    ) -> Consumers {
        let unknown_key = self.choice("consumers.unknown_key", c.unknown_key, UnknownKey::Reject);
        let mut consumers = Consumers::new(unknown_key);
        let mut names = std::collections::HashSet::new();
        let mut add = |v: &mut Validator, path: String, entry: ConsumerFile| {
            if !is_name(&entry.name) {
                v.problem(
                    format!("{path}.name"),
                    format!("{:?} must be letters, digits, '_', '.' or '-'", entry.name),
                );
            } else if !names.insert(entry.name.clone()) {
                v.problem(
                    format!("{path}.name"),
                    format!("duplicate consumer name {:?}", entry.name),
                );
            }
            let tier = entry.tier.unwrap_or_else(|| DEFAULT_TIER.to_string());
            if !is_name(&tier) || tier == ANONYMOUS_TIER {
                v.problem(
                    format!("{path}.tier"),
                    format!(
                        "{tier:?} must be letters, digits, '_', '.' or '-', and not {ANONYMOUS_TIER:?} (the tier of requests without a consumer)"
                    ),
                );
            }
            let index = consumers.add(Consumer {
                name: entry.name,
                tier,
            });
            for (k, hex) in entry.keys_sha256.iter().enumerate() {
                let key_path = format!("{path}.keys_sha256[{k}]");
                match parse_sha256(hex) {
                    None => v.problem(
                        key_path,
                        "must be 64 hex digits: the SHA-256 of the key (floodgate hash-key KEY)",
                    ),
                    Some(digest) => {
                        if let Err(owner) = consumers.add_key(digest, index) {
                            v.problem(key_path, format!("consumer {owner:?} has this key already"));
                        }
                    }
                }
            }
        };
        for (i, entry) in c.entries.into_iter().enumerate() {
            add(self, format!("consumers.entries[{i}]"), entry);
        }
        if let Some(file) = c.file {
            let path = match base_dir {
                Some(dir) => dir.join(&file),
                None => PathBuf::from(&file),
            };
            let entries = crate::files::read_text(&path).and_then(|text| {
                let value: serde_json::Value = serde_saphyr::from_str(&text)
                    .map_err(|e| format!("invalid YAML in {}: {e}", path.display()))?;
                serde_path_to_error::deserialize::<_, Vec<ConsumerFile>>(value).map_err(|e| {
                    let at = e.path().to_string();
                    format!("[{at}]: {}", e.into_inner())
                })
            });
            match entries {
                Ok(entries) => {
                    for (i, entry) in entries.into_iter().enumerate() {
                        add(self, format!("consumers.file[{i}]"), entry);
                    }
                }
                Err(message) => self.problem("consumers.file", message),
            }
        }
        consumers
    }

    /// Every tier a limit names must be one a request can have.
    /// Every tier a limit names must be one a request can have; with `identity.jwt.tier_claim`,
    /// a token can name any tier, so any is.
    pub(super) fn known_tiers(
        &mut self,
        routes: &[RouteConfig],
        consumers: Option<&Consumers>,
        tiers_from_tokens: bool,
    ) {
        if tiers_from_tokens {
            return;
        }
        let mut known: std::collections::HashSet<&str> = [ANONYMOUS_TIER].into();
        if let Some(consumers) = consumers {
            known.extend(consumers.iter().map(|c| c.tier.as_str()));
        }
        for (i, route) in routes.iter().enumerate() {
            let limits = route.enforced.limits.iter().chain(&route.shadow.limits);
            for limit in limits {
                let position = limit.position();
                for (t, tier) in limit.tiers.iter().flatten().enumerate() {
                    if !known.contains(tier.as_str()) {
                        self.problem(
                            format!("routes[{i}].limits[{position}].tiers[{t}]"),
                            format!(
                                "no request can have tier {tier:?}: it is neither {ANONYMOUS_TIER:?} nor the tier of any consumer"
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// 64 hex digits as 32 bytes.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}
