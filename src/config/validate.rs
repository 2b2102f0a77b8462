//! The checks every field goes through: each problem is collected with the path of its field
//! (`routes[2].limits[0].capacity`), so one run of `floodgate check` names them all.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;

use super::*;

/// Collects problems while checking fields one by one.
#[derive(Default)]
pub(super) struct Validator {
    pub(super) problems: Vec<FieldProblem>,
    /// `identity.jwt` is set: a `claim:` key has a verified token to read.
    pub(super) verifies_tokens: bool,
    /// `storage.global` is set: a `scope: global` limit has a global store.
    pub(super) has_global_store: bool,
}

impl Validator {
    pub(super) fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(FieldProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// The value of a closed choice, or `default` when it is absent; an invalid one is a
    /// problem at `path` (and `default` stands in, so validation goes on).
    pub(super) fn choice<T>(&mut self, path: &str, choice: Option<Choice<T>>, default: T) -> T {
        match choice {
            None => default,
            Some(Choice::Known(value)) => value,
            Some(Choice::Invalid(message)) => {
                self.problem(path, message);
                default
            }
        }
    }

    pub(super) fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        text.parse()
            .map_err(|_| {
                self.problem(
                    path,
                    format!("{text:?} is not an address like 127.0.0.1:8080"),
                )
            })
            .ok()
    }

    /// `http3:`; `tls` says whether the file has `tls:` (QUIC is always encrypted).
    pub(super) fn http3(&mut self, h: file::Http3File, tls: bool) -> Option<Http3Config> {
        if !tls {
            self.problem(
                "http3",
                "needs `tls:` (a certificate and key): QUIC is always encrypted",
            );
        }
        let listen = self.socket_addr("http3.listen", &h.listen);
        let max_streams = match h.max_streams {
            None => 100,
            Some(n @ 1..=10_000) => n as u32,
            Some(n) => {
                self.problem(
                    "http3.max_streams",
                    format!("{n} is not between 1 and 10000"),
                );
                100
            }
        };
        let idle_timeout = self.duration(
            "http3.idle_timeout",
            h.idle_timeout.as_deref(),
            Duration::from_secs(30),
        );
        // QUIC carries the idle timeout in milliseconds, at most 2^62.
        if idle_timeout > Duration::from_secs(24 * 3600) {
            self.problem("http3.idle_timeout", "must be at most 24h");
        }
        Some(Http3Config {
            listen: listen?,
            advertise: h.advertise.unwrap_or(true),
            max_streams,
            idle_timeout,
        })
        .filter(|_| tls)
    }

    pub(super) fn upstream_ca(&mut self, path: String) -> Option<UpstreamCa> {
        let path = PathBuf::from(path);
        match tls::root_store(&path) {
            Ok(roots) => Some(UpstreamCa {
                path,
                roots: Arc::new(roots),
            }),
            Err(message) => {
                self.problem("upstream_ca", message);
                None
            }
        }
    }

    pub(super) fn duration(
        &mut self,
        path: &str,
        text: Option<&str>,
        default: Duration,
    ) -> Duration {
        match text.map(parse_duration) {
            None => default,
            Some(Ok(d)) if !d.is_zero() => d,
            Some(Ok(_)) => {
                self.problem(path, "must be longer than 0");
                default
            }
            Some(Err(message)) => {
                self.problem(path, message);
                default
            }
        }
    }

    pub(super) fn header_name(
        &mut self,
        path: &str,
        text: Option<&str>,
        default: &'static str,
    ) -> Option<HeaderName> {
        let text = text.unwrap_or(default);
        HeaderName::try_from(text)
            .map_err(|_| self.problem(path, format!("{text:?} is not a valid header name")))
            .ok()
    }

    pub(super) fn identity(
        &mut self,
        i: file::IdentityFile,
        base_dir: Option<&std::path::Path>,
    ) -> Option<IdentityConfig> {
        let jwt = i.jwt.and_then(|j| self.jwt(j, base_dir));
        let api_key_header = self.header_name(
            "identity.api_key_header",
            i.api_key_header.as_deref(),
            "x-api-key",
        );
        let user_id_header = self.header_name(
            "identity.user_id_header",
            i.user_id_header.as_deref(),
            "x-user-id",
        );
        let trusted_proxies = self.networks("identity.trusted_proxies", &i.trusted_proxies);
        let ipv6_prefix = match i.ipv6_prefix {
            None => 64,
            Some(n @ 1..=128) => n as u8,
            Some(_) => {
                self.problem("identity.ipv6_prefix", "must be between 1 and 128");
                64
            }
        };
        let client_ip_header = match i.client_ip_header.as_deref() {
            None => None,
            Some(name) => Some(self.header_name("identity.client_ip_header", Some(name), "")?),
        };
        Some(IdentityConfig {
            client_ip_header,
            forwarded: i.forwarded.unwrap_or(false),
            client_cert: i.client_cert.unwrap_or(false),
            api_key_header: api_key_header?,
            user_id_header: user_id_header?,
            trusted_proxies,
            ipv6_prefix,
            strip_untrusted_user_id: i.strip_untrusted_user_id.unwrap_or(true),
            jwt,
        })
    }

    /// A list of networks at `path`: CIDRs, or bare addresses (that one host); each bad entry
    /// named by its index.
    pub(super) fn networks(&mut self, path: &str, list: &[String]) -> Vec<IpNet> {
        let mut out = Vec::with_capacity(list.len());
        for (n, text) in list.iter().enumerate() {
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
            match parsed {
                Ok(net) => out.push(net.trunc()),
                Err(_) => self.problem(
                    format!("{path}[{n}]"),
                    format!("{text:?} is not a CIDR like 10.0.0.0/8 or an IP address"),
                ),
            }
        }
        out
    }

    /// `identity.jwt`: every setting checked, the JWKS file read and every key in it usable.
    fn jwt(
        &mut self,
        j: file::JwtFile,
        base_dir: Option<&std::path::Path>,
    ) -> Option<std::sync::Arc<crate::identity::jwt::JwtConfig>> {
        use crate::identity::jwt::{JwtConfig, JwtSettings, MIN_HMAC_SECRET};
        let before = self.problems.len();
        let header = self.header_name("identity.jwt.header", j.header.as_deref(), "authorization");
        let read = |file: &str| {
            let path = match base_dir {
                Some(dir) => dir.join(file),
                None => std::path::PathBuf::from(file),
            };
            crate::files::read(&path)
        };
        // The shared secret of the HMAC algorithms: the file's bytes, less a final newline.
        let hmac_secret = j.hmac_secret_file.as_deref().and_then(|file| {
            let checked = read(file).and_then(|mut secret| {
                while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    secret.pop();
                }
                if secret.len() < MIN_HMAC_SECRET {
                    return Err(format!(
                        "holds {} bytes: an HMAC secret needs at least {MIN_HMAC_SECRET}",
                        secret.len()
                    ));
                }
                Ok(secret)
            });
            checked
                .map_err(|why| self.problem("identity.jwt.hmac_secret_file", why))
                .ok()
        });
        let allowed = self.jwt_algorithms(&j, before);
        let (url, jwks) = self.jwt_keys(&j, base_dir);
        let leeway = self.duration(
            "identity.jwt.leeway",
            j.leeway.as_deref(),
            std::time::Duration::from_secs(30),
        );
        let when_missing = self.choice(
            "identity.jwt.when_missing",
            j.when_missing,
            Default::default(),
        );
        if self.problems.len() > before {
            return None;
        }
        let settings = JwtSettings {
            header: header?,
            allowed,
            issuer: j.issuer,
            audiences: j.audiences,
            leeway_secs: leeway.as_secs(),
            subject_claim: j.subject_claim.unwrap_or_else(|| "sub".into()),
            tier_claim: j.tier_claim,
            when_missing,
            hmac_secret,
        };
        if let Some(url) = url {
            // Fetched when floodgate runs (`JwtConfig::keep_fresh`), not by `floodgate check`.
            return Some(std::sync::Arc::new(JwtConfig::from_url(settings, url)));
        }
        let Some(jwks) = jwks else {
            // No JWKS: the HMAC secret is the one key.
            return Some(std::sync::Arc::new(JwtConfig::with_secret_only(settings)));
        };
        match JwtConfig::new(settings, &jwks) {
            Ok(config) => Some(std::sync::Arc::new(config)),
            Err(why) => {
                self.problem("identity.jwt.jwks_file", why);
                None
            }
        }
    }

    /// `identity.jwt.algorithms` (the defaults when absent): never `none`, HMAC only with a
    /// secret, at least one; `before` is how many problems there were before the section.
    fn jwt_algorithms(&mut self, j: &file::JwtFile, before: usize) -> Vec<jsonwebtoken::Algorithm> {
        use crate::identity::jwt::{ALGORITHMS, DEFAULT_ALGORITHMS, HMAC_ALGORITHMS};
        let allowed = match &j.algorithms {
            None => DEFAULT_ALGORITHMS.to_vec(),
            Some(names) => names
                .iter()
                .enumerate()
                .filter_map(|(n, name)| {
                    let hmac = HMAC_ALGORITHMS.iter().filter(|_| j.hmac_secret_file.is_some());
                    let found = ALGORITHMS.iter().chain(hmac).find(|(known, _)| known == name);
                    if found.is_none() {
                        let why = if name.eq_ignore_ascii_case("none") {
                            "`none` (an unsigned token) is never accepted".to_string()
                        } else if HMAC_ALGORITHMS.iter().any(|(hs, _)| hs == name) {
                            format!(
                                "{name:?} needs a shared secret, which a JWKS does not hold: set identity.jwt.hmac_secret_file"
                            )
                        } else {
                            format!(
                                "{name:?} is not one of {}",
                                ALGORITHMS.map(|(n, _)| n).join(", ")
                            )
                        };
                        self.problem(format!("identity.jwt.algorithms[{n}]"), why);
                    }
                    found.map(|(_, alg)| *alg)
                })
                .collect(),
        };
        if allowed.is_empty() && j.algorithms.is_some() && self.problems.len() == before {
            self.problem("identity.jwt.algorithms", "allows no algorithm");
        }
        if j.hmac_secret_file.is_some()
            && !allowed
                .iter()
                .any(|alg| HMAC_ALGORITHMS.iter().any(|(_, hs)| hs == alg))
        {
            self.problem(
                "identity.jwt.algorithms",
                "allows no HMAC algorithm (HS256, HS384, HS512), so hmac_secret_file would verify nothing",
            );
        }
        allowed
    }

    /// Where the keys come from: `jwks_url` (fetched when floodgate runs), or `jwks_file`'s
    /// text (read now); neither is needed with `hmac_secret_file`.
    fn jwt_keys(
        &mut self,
        j: &file::JwtFile,
        base_dir: Option<&std::path::Path>,
    ) -> (Option<http::Uri>, Option<String>) {
        let url = match (&j.jwks_file, &j.jwks_url) {
            (Some(_), Some(_)) => {
                self.problem(
                    "identity.jwt.jwks_url",
                    "give jwks_file or jwks_url, not both",
                );
                None
            }
            (None, None) if j.hmac_secret_file.is_some() => None,
            (None, None) => {
                self.problem(
                    "identity.jwt.jwks_file",
                    "is required, or jwks_url or hmac_secret_file (the keys tokens are verified with)",
                );
                None
            }
            (None, Some(url)) => match url.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("https" | "http"))
                        && uri.host().is_some() =>
                {
                    Some(uri)
                }
                _ => {
                    self.problem(
                        "identity.jwt.jwks_url",
                        format!("{url:?} is not an https:// (or http://) URL"),
                    );
                    None
                }
            },
            (Some(_), None) => None,
        };
        let jwks = match &j.jwks_file {
            None => None,
            Some(file) => {
                let path = match base_dir {
                    Some(dir) => dir.join(file),
                    None => std::path::PathBuf::from(file),
                };
                match crate::files::read_text(&path) {
                    Ok(text) => Some(text),
                    Err(e) => {
                        self.problem("identity.jwt.jwks_file", e);
                        None
                    }
                }
            }
        };
        (url, jwks)
    }

    pub(super) fn timeouts(&mut self, t: file::TimeoutsFile) -> Timeouts {
        let d = Timeouts::default();
        Timeouts {
            header_read: self.duration(
                "timeouts.header_read",
                t.header_read.as_deref(),
                d.header_read,
            ),
            upstream_connect: self.duration(
                "timeouts.upstream_connect",
                t.upstream_connect.as_deref(),
                d.upstream_connect,
            ),
            upstream_response: self.duration(
                "timeouts.upstream_response",
                t.upstream_response.as_deref(),
                d.upstream_response,
            ),
            drain: self.duration("timeouts.drain", t.drain.as_deref(), d.drain),
            client_body: self.duration(
                "timeouts.client_body",
                t.client_body.as_deref(),
                d.client_body,
            ),
            upstream_body: self.duration(
                "timeouts.upstream_body",
                t.upstream_body.as_deref(),
                d.upstream_body,
            ),
            idle: self.duration("timeouts.idle", t.idle.as_deref(), d.idle),
        }
    }

    /// A byte size: `1048576`, `512k`, `1m`, `1g` (powers of 1024), `0` for none.
    /// A per-connection token bucket of `rate` per second with a burst of `burst_seconds` of it
    /// (at least 1): `http2_max_streams_per_second`, `http2_max_resets_per_second`.
    pub(super) fn per_connection_rate(
        &mut self,
        path: &str,
        rate: f64,
        burst_seconds: f64,
    ) -> Option<crate::limiter::Limit> {
        let burst = (rate * burst_seconds).clamp(1.0, f64::from(u32::MAX)) as u32;
        crate::limiter::Algorithm::token_bucket(burst, rate)
            .map(crate::limiter::Limit::of)
            .map_err(|e| self.problem(path, e.to_string()))
            .ok()
    }

    pub(super) fn size(&mut self, path: &str, text: Option<&str>, default: u64) -> u64 {
        let Some(text) = text else {
            return default;
        };
        let trimmed = text.trim();
        let (digits, unit) = match trimmed.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            Some((i, _)) => trimmed.split_at(i),
            None => (trimmed, ""),
        };
        let multiplier = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => Some(1u64),
            "k" | "kb" | "kib" => Some(1 << 10),
            "m" | "mb" | "mib" => Some(1 << 20),
            "g" | "gb" | "gib" => Some(1 << 30),
            _ => None,
        };
        match (digits.parse::<u64>().ok(), multiplier) {
            (Some(n), Some(m)) if n.checked_mul(m).is_some() => n * m,
            _ => {
                self.problem(
                    path,
                    format!("{text:?} is not a size like 1m, 512k or 1048576"),
                );
                default
            }
        }
    }
}
