//! `POST /reset` on the admin listener: an identity's budgets on a route are full again: its
//! limits keyed by the identity (`per: identity`, and `per: ip` when the identity is an
//! address), enforced, shadow and an override's. Authorized and read as every write endpoint
//! is (`write.rs`); logged at info, the identity hashed.
//!
//! The store forgets the budgets' state; this instance forgets what it kept of them (cached
//! denials, leases), and a reset entry in the store's shared list has the other instances do the
//! same within a second (`control.rs`). Budgets of `per: route` and composite keys are left
//! alone: they are not the identity's alone.

use serde_json::{Value, json};

use super::query::{AdminError, bad};
use super::write::{Body, kind_label};
use crate::control::{Entry, Reset};
use crate::limiter::{KeyKind, wall_clock_us};
use crate::proxy::Proxy;

/// `POST /reset`.
pub async fn post(proxy: &Proxy, body: &[u8]) -> Result<Value, AdminError> {
    let body = Body::parse(body, &["route"])?;
    let route_name = body.route(proxy)?;
    let (kind, value) = body.identity(proxy)?;
    let snapshot = proxy.snapshot();
    let Some(route) = snapshot
        .routes
        .routes()
        .iter()
        .find(|r| *r.name == *route_name)
    else {
        return Err(bad(400, "bad_request", "route: no such route"));
    };
    let control = proxy.control();
    let over = control.find(&route.name, kind, &value).over;
    let limits = route
        .enforced
        .limits
        .iter()
        .chain(&route.shadow.limits)
        .chain(over.iter().flat_map(|o| &o.budget.limits));
    let ip = (kind == KeyKind::Ip).then_some(value.as_slice());
    let asks: Vec<_> = limits
        .filter_map(|l| l.ask(Some((kind, &value)), ip))
        .filter(|a| a.key.kind == kind)
        .collect();
    proxy.core().limiter().reset(&asks).await.map_err(|e| {
        bad(
            503,
            "store_unavailable",
            format!("the store could not reset the budgets: {e}"),
        )
    })?;
    let reset = Reset {
        id: control.new_id("rst"),
        budgets: asks.iter().map(|a| a.key.budget.to_string()).collect(),
        kind,
        value: value.clone(),
        until_us: wall_clock_us()
            + u64::try_from(crate::control::EVENT_LIVES.as_micros()).unwrap_or(u64::MAX),
    };
    tracing::info!(id = %reset.id, route = %route.name, identity = %kind_label(kind, &value), budgets = asks.len(), "budgets reset");
    let id = reset.id.clone();
    // The store's budgets are full again already; the entry tells the other instances to forget
    // what they kept of them. A reset is safe to repeat, so a failure here asks for that.
    crate::control::share(
        proxy.core().limiter(),
        &[(&id, Some(&Entry::Reset(reset)))],
        &[(&id, None)],
    )
    .await
    .map_err(|e| {
        bad(
            503,
            "store_unavailable",
            format!("the budgets were reset in the store, but the other instances could not be told (repeat the reset): {e}"),
        )
    })?;
    Ok(json!({ "id": id, "route": &*route.name, "budgets": asks.len() }))
}
