//! `PUT /bans`, `GET /bans`, `DELETE /bans/{id}` on the admin listener: an operator bans an
//! identity on a route (or every route, `"*"`) for a while (`control.rs`). Authorized and read
//! as every write endpoint is (`write.rs`); every change is logged at info, the identity hashed.

use serde_json::{Value, json};

use super::query::{AdminError, bad};
use super::write::{Body, kind_label, unshared};
use crate::control::{Ban, Entry};
use crate::limiter::wall_clock_us;
use crate::proxy::Proxy;

/// `PUT /bans`: the ban holds here at once, and is written to the store's shared list for the
/// other instances.
pub async fn put(proxy: &Proxy, body: &[u8]) -> Result<Value, AdminError> {
    let body = Body::parse(body, &["route", "duration", "reason"])?;
    let route = match body.text("route")? {
        Some("*") => None,
        _ => Some(body.route(proxy)?),
    };
    let duration = body
        .duration("duration")?
        .ok_or_else(|| bad(400, "bad_request", "duration: is required (like 10m)"))?;
    let reason = body.text("reason")?.unwrap_or("").to_string();
    let (kind, value) = body.identity(proxy)?;
    let control = proxy.control();
    let until_us =
        wall_clock_us().saturating_add(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX));
    let label = kind_label(kind, &value);
    let ban = Ban {
        id: control.new_id("ban"),
        route,
        kind,
        value,
        until_us,
        reason,
        by: "operator",
    };
    let id = ban.id.clone();
    let entry = Entry::Ban(ban.clone());
    crate::control::share(
        proxy.core().limiter(),
        &[(&id, Some(&entry))],
        &[(&id, None)],
    )
    .await
    .map_err(unshared)?;
    control.ban(ban.clone());
    tracing::info!(id = %ban.id, route = ban.route.as_deref().unwrap_or("*"), identity = %label, ?duration, reason = %ban.reason, "ban added");
    Ok(json!({ "id": id }))
}

/// `GET /bans`.
pub fn list(proxy: &Proxy) -> Value {
    let now = wall_clock_us();
    let bans: Vec<Value> = proxy
        .control()
        .bans(now)
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

/// `DELETE /bans/{id}` (and `/overrides/{id}`: an id names one entry of either).
pub async fn delete(proxy: &Proxy, id: &str, what: &str) -> Result<Value, AdminError> {
    let control = proxy.control();
    let Some(entry) = control
        .entry(id)
        .filter(|_| id.starts_with(&format!("{what}-")))
    else {
        return Err(bad(404, "not_found", format!("no {what} {id:?}")));
    };
    crate::control::share(proxy.core().limiter(), &[(id, None)], &[(id, Some(&entry))])
        .await
        .map_err(unshared)?;
    control.remove(id);
    tracing::info!(%id, "{what} removed");
    Ok(json!({ "id": id }))
}
