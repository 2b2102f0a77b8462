//! `PUT /overrides`, `GET /overrides`, `DELETE /overrides/{id}` on the admin listener: an
//! identity's limits on a route are others (written as `routes[].limits` are) until the override
//! is deleted or ends (`control.rs`). Its budgets are its own: they start full. Authorized and
//! read as every write endpoint is (`write.rs`); every change is logged at info, the identity
//! hashed.

use std::sync::Arc;

use serde_json::{Value, json};

use super::query::{AdminError, bad};
use super::write::{Body, kind_label, unshared};
use crate::control::{Entry, Override, OverrideFor};
use crate::limiter::wall_clock_us;
use crate::proxy::Proxy;

/// `PUT /overrides`: in force here at once, and written to the store's shared list for the
/// other instances. An identity's earlier override of the same route is replaced.
pub async fn put(proxy: &Proxy, body: &[u8]) -> Result<Value, AdminError> {
    let body = Body::parse(body, &["route", "limits", "expires_in"])?;
    let route = body.route(proxy)?;
    let snapshot = proxy.snapshot();
    if snapshot
        .routes
        .routes()
        .iter()
        .find(|r| *r.name == *route)
        .is_some_and(|r| !r.is_limited())
    {
        return Err(bad(
            400,
            "bad_request",
            format!("route: {route:?} has no limits to override"),
        ));
    }
    let (kind, value) = body.identity(proxy)?;
    let expires_in = body.duration("expires_in")?;
    let limits = body
        .get("limits")
        .cloned()
        .ok_or_else(|| bad(400, "bad_request", "limits: is required"))?;
    let control = proxy.control();
    let id = control.new_id("ovr");
    let until_us = match expires_in {
        Some(d) => wall_clock_us().saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        None => u64::MAX,
    };
    let whom = OverrideFor { route, kind, value };
    let over = Override::build(
        id.clone(),
        whom,
        until_us,
        limits,
        snapshot.verifies_tokens(),
    )
    .map_err(|e| {
        let first = e.problems.first().map(ToString::to_string);
        bad(400, "bad_request", first.unwrap_or_default())
    })?;
    let over = Arc::new(over);
    let entry = Entry::Override(over.clone());
    // The identity's earlier override of the route goes from the shared list in the same write.
    let earlier = control
        .override_for(&over.route, over.kind, &over.value)
        .map(Entry::Override);
    let mut changes = vec![(id.as_str(), Some(&entry))];
    let mut undo = vec![(id.as_str(), None)];
    if let Some(earlier) = &earlier {
        changes.push((earlier.id(), None));
        undo.push((earlier.id(), Some(earlier)));
    }
    crate::control::share(proxy.core().limiter(), &changes, &undo)
        .await
        .map_err(unshared)?;
    tracing::info!(%id, route = %over.route, identity = %kind_label(over.kind, &over.value), limits = %over.limits, ?expires_in, "override set");
    control.set_override(over);
    Ok(json!({ "id": id }))
}

/// `GET /overrides`.
pub fn list(proxy: &Proxy) -> Value {
    let now = wall_clock_us();
    let overrides: Vec<Value> = proxy
        .control()
        .overrides(now)
        .iter()
        .map(|o| {
            json!({
                "id": o.id,
                "route": o.route,
                "identity": kind_label(o.kind, &o.value),
                "limits": o.limits,
                "expires_in_s": (o.until_us != u64::MAX).then(|| (o.until_us - now) as f64 / 1e6),
            })
        })
        .collect();
    json!({ "overrides": overrides })
}
