//! What the write endpoints (`/bans`, `/overrides`, `/reset`) share: the bearer token, the
//! request's JSON body, the identity it names, and how an identity is shown.
//!
//! Every one of them, reads included, needs `Authorization: Bearer <token>` with the token of
//! `admin.token_file` (compared in constant time): 403 when no token is configured, 401
//! without it or with another. A body that does not parse, names an unknown route or an invalid
//! field is a 400 problem+json naming the field, and changes nothing.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::query::{AdminError, bad};
use crate::identity::{Identity, ip_octets};
use crate::limiter::KeyKind;

pub use crate::control::label as kind_label;
use crate::policy::{Claim, ResolveError};
use crate::proxy::Proxy;

/// Checks the request's bearer token against `admin.token_file`'s.
pub fn authorize(proxy: &Proxy, authorization: Option<&[u8]>) -> Result<(), AdminError> {
    let snapshot = proxy.snapshot();
    let Some(token) = snapshot.admin_token.as_deref() else {
        return Err(bad(
            403,
            "forbidden",
            "the write endpoints are off: set admin.token_file",
        ));
    };
    let given = authorization
        .and_then(|v| v.strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if !constant_time_eq(given, token.as_bytes()) {
        return Err(bad(401, "unauthorized", "a valid bearer token is required"));
    }
    Ok(())
}

/// Equal, in a time that depends on the lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A change the shared store did not take: 503, nothing changed here (and the change undone
/// there, if it landed late: `control::share`).
pub fn unshared(e: crate::limiter::LimiterError) -> AdminError {
    bad(
        503,
        "store_unavailable",
        format!("the store did not take the change, so nothing was changed: {e}"),
    )
}

/// The fields that name an identity, which every write body may hold (exactly one of them).
const IDENTITY_FIELDS: [&str; 5] = ["api_key", "consumer", "user_id", "jwt_subject", "ip"];

/// A write's body as a JSON object, or a 400 saying it is not one.
pub fn object(bytes: &[u8]) -> Result<Map<String, Value>, AdminError> {
    serde_json::from_slice(bytes).map_err(|e| {
        bad(
            400,
            "bad_request",
            format!("the body is not a JSON object: {e}"),
        )
    })
}

/// A write's JSON body: an object, its fields read by name.
pub struct Body(Map<String, Value>);

impl Body {
    /// The body, if it is a JSON object whose every field is an identity field or one of
    /// `fields`: a field the endpoint does not know (a typo such as `expire_in`) is a 400 naming
    /// it, so that nothing is changed on a misreading.
    pub fn parse(bytes: &[u8], fields: &[&str]) -> Result<Body, AdminError> {
        let map = object(bytes)?;
        if let Some(unknown) = map
            .keys()
            .find(|k| !fields.contains(&k.as_str()) && !IDENTITY_FIELDS.contains(&k.as_str()))
        {
            let mut known: Vec<&str> = fields.to_vec();
            known.extend(IDENTITY_FIELDS);
            return Err(bad(
                400,
                "bad_request",
                format!(
                    "{unknown}: not a field of this request (it takes {})",
                    known.join(", ")
                ),
            ));
        }
        Ok(Body(map))
    }

    /// The string field `name`, if given.
    pub fn text(&self, name: &str) -> Result<Option<&str>, AdminError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(bad(400, "bad_request", format!("{name}: must be a string"))),
        }
    }

    /// The field `name`, as given.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// The duration field `name` (like `10m`), longer than 0, if given.
    pub fn duration(&self, name: &str) -> Result<Option<std::time::Duration>, AdminError> {
        let Some(text) = self.text(name)? else {
            return Ok(None);
        };
        crate::config::parse_duration(text)
            .ok()
            .filter(|d| !d.is_zero())
            .map(Some)
            .ok_or_else(|| {
                bad(
                    400,
                    "bad_request",
                    format!("{name}: {text:?} is not a duration like 10m"),
                )
            })
    }

    /// The route it names (`route`, required), which must exist.
    pub fn route(&self, proxy: &Proxy) -> Result<String, AdminError> {
        let name = self
            .text("route")?
            .ok_or_else(|| bad(400, "bad_request", "route: is required"))?;
        if !proxy
            .snapshot()
            .routes
            .routes()
            .iter()
            .any(|r| *r.name == *name)
        {
            return Err(bad(
                400,
                "bad_request",
                format!("route: no route named {name:?}"),
            ));
        }
        Ok(name.to_string())
    }

    /// The identity it names (`api_key`, `consumer`, `user_id`, `jwt_subject` or `ip`, exactly
    /// one), as the decider keys it: an API key becomes its consumer when there are consumers,
    /// an address its budget's prefix (`identity.ipv6_prefix`).
    pub fn identity(&self, proxy: &Proxy) -> Result<(KeyKind, Vec<u8>), AdminError> {
        let snapshot = proxy.snapshot();
        let mut named = Vec::new();
        for name in IDENTITY_FIELDS {
            if let Some(value) = self.text(name)? {
                named.push((name, value));
            }
        }
        let [(name, value)] = named[..] else {
            return Err(bad(
                400,
                "bad_request",
                "name exactly one of api_key, consumer, user_id, jwt_subject, ip",
            ));
        };
        let ip: IpAddr;
        let claim = match name {
            "api_key" => Claim::ApiKey(value.as_bytes()),
            "consumer" => Claim::Consumer(value),
            "user_id" => Claim::Keyless(Identity::UserId(value.as_bytes())),
            "jwt_subject" => Claim::Keyless(Identity::Jwt(value.as_bytes())),
            _ => {
                let parsed = value.parse::<IpAddr>().map_err(|_| {
                    bad(
                        400,
                        "bad_request",
                        format!("ip: {value:?} is not an IP address"),
                    )
                })?;
                ip = snapshot.identity.budget_addr(parsed.to_canonical());
                Claim::Keyless(Identity::Ip(ip))
            }
        };
        let whose = snapshot
            .policy()
            .resolve(
                claim,
                None,
                || Err(ResolveError::Unidentified),
                || IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            )
            .map_err(|e| bad(400, "bad_request", format!("{name}: {e}")))?;
        let mut buf = [0u8; 16];
        let bytes = match whose.identity {
            Identity::Ip(ip) => ip_octets(ip, &mut buf).to_vec(),
            other => other.key_bytes(&mut buf).to_vec(),
        };
        Ok((KeyKind::from(whose.identity.kind()), bytes))
    }
}
