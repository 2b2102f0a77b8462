//! `PUT /bans`, `GET /bans`, `DELETE /bans/{id}` on the admin listener: an operator bans an
//! identity on a route (or every route, `"*"`) for a while (`control.rs`). The write endpoints,
//! reads included, need `Authorization: Bearer <token>` with the token of `admin.token_file`
//! (compared in constant time): 403 when no token is configured, 401 without it or with another.
//! A body that does not parse, names an unknown route or an invalid duration is a 400 naming the
//! field, and changes nothing. Every change is logged at info, the identity hashed.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::query::{AdminError, bad};
use crate::identity::{Identity, ip_octets};
use crate::limiter::{KeyKind, wall_clock_us};
use crate::policy::{Claim, Refusal};
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

/// `PUT /bans`: the ban holds here at once, and is written to the store's shared list (Redis)
/// for the other instances.
pub async fn put(proxy: &Proxy, body: &[u8]) -> Result<Value, AdminError> {
    let body: serde_json::Map<String, Value> = serde_json::from_slice(body).map_err(|e| {
        bad(
            400,
            "bad_request",
            format!("the body is not a JSON object: {e}"),
        )
    })?;
    let text = |name: &str| -> Result<Option<&str>, AdminError> {
        match body.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(bad(400, "bad_request", format!("{name}: must be a string"))),
        }
    };
    let snapshot = proxy.snapshot();
    let route = text("route")?.ok_or_else(|| bad(400, "bad_request", "route: is required"))?;
    let route = match route {
        "*" => None,
        name if snapshot.routes.routes().iter().any(|r| *r.name == *name) => Some(name.to_string()),
        name => {
            return Err(bad(
                400,
                "bad_request",
                format!("route: no route named {name:?}"),
            ));
        }
    };
    let duration = text("duration")?
        .ok_or_else(|| bad(400, "bad_request", "duration: is required (like 10m)"))?;
    let duration = crate::config::parse_duration(duration)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            bad(
                400,
                "bad_request",
                format!("duration: {duration:?} is not a duration like 10m"),
            )
        })?;
    let reason = text("reason")?.unwrap_or("").to_string();
    let (kind, value) = identity(proxy, &text)?;
    let now = wall_clock_us();
    let until = now.saturating_add(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX));
    let label = kind_label(kind, &value);
    let ban = proxy.bans().add(
        route.clone(),
        kind,
        value,
        until,
        reason.clone(),
        "operator",
        now,
    );
    tracing::info!(id = %ban.id, route = route.as_deref().unwrap_or("*"), identity = %label, ?duration, %reason, "ban added");
    crate::control::share(proxy.limiter(), &ban.id, Some(&ban)).await;
    Ok(json!({ "id": ban.id }))
}

/// `GET /bans`.
pub fn list(proxy: &Proxy) -> Value {
    let now = wall_clock_us();
    let bans: Vec<Value> = proxy
        .bans()
        .list(now)
        .iter()
        .map(|b| {
            json!({
                "id": b.id,
                "route": b.route.as_deref().unwrap_or("*"),
                "identity": kind_label(b.kind, &b.value),
                "expires_in_s": (b.until_us - now) as f64 / 1e6,
                "reason": b.reason,
                "by": b.by,
            })
        })
        .collect();
    json!({ "bans": bans })
}

/// `DELETE /bans/{id}`.
pub async fn delete(proxy: &Proxy, id: &str) -> Result<Value, AdminError> {
    if proxy.bans().remove(id) {
        tracing::info!(%id, "ban lifted");
        crate::control::share(proxy.limiter(), id, None).await;
        Ok(json!({ "id": id }))
    } else {
        Err(bad(404, "no_ban", format!("no ban {id:?}")))
    }
}

/// How a ban's identity is shown: API keys and user ids hashed, as `/top` shows them.
pub fn kind_label(kind: KeyKind, value: &[u8]) -> String {
    use sha2::Digest;
    match kind {
        KeyKind::Consumer => format!("consumer:{}", String::from_utf8_lossy(value)),
        KeyKind::Ip => match value.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(value).unwrap_or_default()).to_string(),
            16 => IpAddr::from(<[u8; 16]>::try_from(value).unwrap_or_default()).to_string(),
            _ => "ip:?".into(),
        },
        other => {
            let digest = sha2::Sha256::digest(value);
            format!("{}:{}…", other.as_str(), crate::limiter::hex(&digest[..6]))
        }
    }
}

/// The identity a body names (`api_key`, `consumer`, `user_id`, `jwt_subject` or `ip`, exactly
/// one), as the decider keys it: an API key becomes its consumer when there are consumers.
fn identity<'b>(
    proxy: &Proxy,
    text: &impl Fn(&str) -> Result<Option<&'b str>, AdminError>,
) -> Result<(KeyKind, Vec<u8>), AdminError> {
    let snapshot = proxy.snapshot();
    let named: Vec<(&str, &str)> = ["api_key", "consumer", "user_id", "jwt_subject", "ip"]
        .into_iter()
        .filter_map(|name| Some((name, text(name).ok()??)))
        .collect();
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
            ip = snapshot.identity.budget_addr(
                value
                    .parse::<IpAddr>()
                    .map_err(|_| {
                        bad(
                            400,
                            "bad_request",
                            format!("ip: {value:?} is not an IP address"),
                        )
                    })?
                    .to_canonical(),
            );
            Claim::Keyless(Identity::Ip(ip))
        }
    };
    let whose = snapshot
        .policy()
        .resolve(
            claim,
            None,
            || Err(Refusal::Unidentified),
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
