//! `GET /top` on the admin listener: who is being limited right now ([`crate::top`]).
//!
//! Query: `route=NAME` (every route when absent), `n` (default 10, at most the table's
//! capacity), `sort=denied` to put the most denied first (default: the most requests).
//! Answer: `{"route": NAME, "identities": [{"identity", "kind", "allowed", "denied", "error"}]}`,
//! or `{"routes": [...]}` of those without `route=`; API keys and user ids appear hashed.

use serde_json::{Value, json};

use super::query::{AdminError, Query, bad};
use crate::proxy::Proxy;
use crate::top::CAPACITY;

/// The answer to `GET /top?{query}`.
pub fn top(proxy: &Proxy, query: &str) -> Result<Value, AdminError> {
    let query = Query::parse(query);
    let param = |name: &str| query.get(name);
    let n = match param("n") {
        None => 10,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| bad(400, "bad_request", format!("n={text:?} is not a count")))?
            .min(CAPACITY),
    };
    let by_denied = match param("sort") {
        None | Some("requests") => false,
        Some("denied") => true,
        Some(other) => {
            return Err(bad(
                400,
                "bad_request",
                format!("sort={other:?}: requests or denied"),
            ));
        }
    };
    let snapshot = proxy.snapshot();
    let now = crate::proxy::uptime_us();
    let table = |i: usize| {
        json!({
            "route": &*snapshot.routes.routes()[i].name,
            "identities": snapshot.top_of(i).top(n, by_denied, now),
        })
    };
    match param("route") {
        Some(name) => {
            let i = snapshot
                .routes
                .routes()
                .iter()
                .position(|r| *r.name == *name)
                .ok_or_else(|| bad(404, "no_route", format!("no route named {name:?}")))?;
            Ok(table(i))
        }
        None => Ok(json!({
            "routes": (0..snapshot.routes.routes().len()).map(table).collect::<Vec<_>>(),
        })),
    }
}
