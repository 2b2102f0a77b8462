//! `GET /budgets` on the admin listener: one client's budgets on one route, now, per limit,
//! computed by the same algorithms on the store's state without spending anything (memory: a
//! copy of the state; Redis: the limiter script with its commits skipped).
//!
//! Query: `route=NAME` and one of `api_key=K` (resolved to its consumer when `consumers:` is
//! configured), `consumer=NAME`, `jwt_subject=SUB` (with `tier=T` for a token's tier claim),
//! `user_id=U`, `ip=ADDR` (`ip` also names the budget of `per: ip` limits); for composite keys,
//! the values their parts read, named as the parts are (`header:X-Tenant=acme`: see
//! [`RequestValues`]). Per limit: `algorithm`, `per`, `limit`, `remaining` (units left now; `null` for a
//! `per: ip` limit when no `ip` is given), `reset_after_s` (when the budget would be full again if
//! the next request were admitted: the `X-RateLimit-Reset` that request would get), `shadow`.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::query::{AdminError, Query, bad};
use crate::config::{Per, RequestView};
use crate::decider::Peek;
use crate::identity::{ANONYMOUS_TIER, Identity, IdentityError, ip_octets};
use crate::limiter::KeyKind;
use crate::policy::{Claim, ResolveError};
use crate::proxy::Proxy;

/// The answer to `GET /budgets?{query}`.
pub async fn budgets(proxy: &Proxy, query: &str) -> Result<Value, AdminError> {
    let query = Query::parse(query);
    let param = |name: &str| query.get(name);
    let snapshot = proxy.snapshot();
    let route_name = param("route").ok_or_else(|| bad(400, "bad_request", "route= is required"))?;
    let route = snapshot
        .routes
        .routes()
        .iter()
        .find(|r| *r.name == *route_name)
        .ok_or_else(|| bad(404, "no_route", format!("no route named {route_name:?}")))?;
    let ip: Option<IpAddr> = match param("ip") {
        Some(text) => Some(
            // The address a budget is kept for (an IPv6 client's /64, by default).
            snapshot.identity.budget_addr(
                text.parse::<IpAddr>()
                    .map_err(|_| bad(400, "bad_request", format!("{text:?} is not an IP address")))?
                    .to_canonical(),
            ),
        ),
        None => None,
    };
    // Whose allowance: the proxy's rules (crate::policy), on what the query names.
    let claim = if let Some(name) = param("consumer") {
        Some(Claim::Consumer(name))
    } else if let Some(key) = param("api_key") {
        Some(Claim::ApiKey(key.as_bytes()))
    } else if let Some(subject) = param("jwt_subject") {
        Some(Claim::Keyless(Identity::Jwt(subject.as_bytes())))
    } else if let Some(user) = param("user_id") {
        Some(Claim::Keyless(Identity::UserId(user.as_bytes())))
    } else {
        ip.map(|ip| Claim::Keyless(Identity::Ip(ip)))
    };
    let resolved = claim.map(|claim| {
        snapshot.policy().resolve(
            claim,
            // A token's tier comes from its claim, which the query cannot show: it may say it.
            param("tier"),
            || ip.map(Identity::Ip).ok_or(ResolveError::Unidentified),
            || ip.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        )
    });
    let whose = match resolved {
        None | Some(Err(ResolveError::Unidentified)) => None,
        Some(Ok(whose)) => Some(whose),
        Some(Err(ResolveError::UnknownConsumer(name))) => {
            return Err(bad(
                404,
                "unknown_consumer",
                format!("no consumer named {name:?}"),
            ));
        }
        Some(Err(ResolveError::Identity(IdentityError::UnknownKey))) => {
            return Err(bad(404, "invalid_api_key", "no consumer has this key"));
        }
        Some(Err(e)) => return Err(bad(400, "bad_request", e.to_string())),
    };
    let needs_identity = route
        .enforced
        .limits
        .iter()
        .chain(&route.shadow.limits)
        .any(|l| l.per == Per::Identity);
    let identity = whose.map(|w| w.identity);
    if identity.is_none() && needs_identity {
        return Err(bad(
            400,
            "missing_identity",
            "give one of api_key=, consumer=, jwt_subject=, user_id=, ip=",
        ));
    }
    let tier = whose.map_or(ANONYMOUS_TIER, |w| w.tier);
    let values = RequestValues::of(&query);
    let mut id_buf = [0u8; 16];
    let identity = identity
        .as_ref()
        .map(|i| (KeyKind::from(i.kind()), i.key_bytes(&mut id_buf)));
    let mut ip_buf = [0u8; 16];
    let ip_bytes = ip.map(|ip| ip_octets(ip, &mut ip_buf));
    let view = values.view();
    let who = Peek {
        tier,
        identity,
        ip: ip_bytes,
        view: &view,
    };
    let decider = proxy.core().decider(snapshot.policy(), snapshot.on_error);
    let limits: Vec<Value> = decider
        .peek_route(route, &who, true)
        .await
        .map_err(|e| bad(503, "rate_limiter_unavailable", e.to_string()))?
        .into_iter()
        .map(|peeked| {
            let mut value = json!({
                "algorithm": peeked.algorithm,
                "per": peeked.per,
                "limit": peeked.limit,
                "remaining": peeked.figures.map(|(remaining, _)| remaining),
                "reset_after_s": peeked.figures.map(|(_, reset_us)| reset_us as f64 / 1e6),
                "shadow": peeked.shadow,
            });
            if peeked.global {
                value["scope"] = json!("global");
                if let Some((region, held)) = peeked.slice {
                    value["slice"] = json!({"region": region, "held": held});
                }
            }
            value
        })
        .collect();
    Ok(json!({
        "route": &*route.name,
        "identity": whose.map(|w| w.identity.kind().as_str()),
        "tier": tier,
        "limits": limits,
    }))
}

/// What a query says of the request a composite key (`per:` with `header:`, `query:`,
/// `segment:`, `claim:`, `json:` parts) would read: parameters named as the parts are
/// (`header:X-Tenant=acme`, `query:team=red`, `segment:1=acme`, `claim:org=acme`,
/// `json:model=gpt-4o`). A part the query does not give is missing, as in a request without it.
struct RequestValues {
    headers: http::HeaderMap,
    query: String,
    rest: String,
    claims: serde_json::Map<String, Value>,
    json: serde_json::Map<String, Value>,
}

impl RequestValues {
    fn of(query: &Query) -> RequestValues {
        let mut values = RequestValues {
            headers: http::HeaderMap::new(),
            query: String::new(),
            rest: String::new(),
            claims: serde_json::Map::new(),
            json: serde_json::Map::new(),
        };
        let mut segments: Vec<(usize, &str)> = Vec::new();
        let mut params = form_urlencoded::Serializer::new(String::new());
        for (name, value) in query.pairs() {
            match name.split_once(':') {
                Some(("header", header)) => {
                    if let (Ok(name), Ok(value)) = (
                        http::HeaderName::from_bytes(header.as_bytes()),
                        http::HeaderValue::from_str(value),
                    ) {
                        values.headers.append(name, value);
                    }
                }
                Some(("query", param)) => {
                    params.append_pair(param, value);
                }
                Some(("segment", n)) => {
                    if let Ok(n) = n.parse::<usize>() {
                        segments.push((n, value));
                    }
                }
                Some(("claim", claim)) => {
                    values
                        .claims
                        .insert(claim.into(), Value::String(value.into()));
                }
                Some(("json", field)) => {
                    values
                        .json
                        .insert(field.into(), Value::String(value.into()));
                }
                _ => {}
            }
        }
        values.query = params.finish();
        // The segments as a path after the prefix: the Nth given at place N, "-" for the gaps
        // (a part naming a gap reads "-": give every segment a limit names).
        let last = segments.iter().map(|(n, _)| *n).max().unwrap_or(0);
        values.rest = (1..=last)
            .map(|n| {
                segments
                    .iter()
                    .find(|(at, _)| *at == n)
                    .map_or("-", |(_, v)| v)
            })
            .collect::<Vec<_>>()
            .join("/");
        values
    }

    fn view(&self) -> RequestView<'_> {
        RequestView {
            headers: &self.headers,
            query: Some(self.query.as_str()).filter(|q| !q.is_empty()),
            rest: &self.rest,
            claims: Some(&self.claims),
            json: Some(&self.json),
        }
    }
}
