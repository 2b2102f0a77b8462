//! `POST /cache/purge` on the admin listener: a cached route's entries go, all of them
//! (`{"route": NAME}`), every query variant of one client path (`{"route", "path"}`), or every
//! path under a prefix (`{"route", "prefix"}`). Authorized as every write endpoint is; a body of
//! any other shape is a 400 naming the field, and removes nothing.
//!
//! With `cache.shared`, the store's entries go first; then this instance's; and on a shared
//! store, the purge is written to the control list (`control.rs`), whose follower on every other
//! instance removes theirs within a second (`Proxy::spread_purge`).

use serde_json::{Value, json};

use super::query::{AdminError, bad};
use crate::control::{Purge, PurgeScope as Scope};
use crate::proxy::Proxy;

/// The body read: the route and the scope.
fn parse(body: &[u8]) -> Result<(String, Scope), AdminError> {
    let map = super::write::object(body)?;
    if let Some(unknown) = map
        .keys()
        .find(|k| !["route", "path", "prefix"].contains(&k.as_str()))
    {
        return Err(bad(
            400,
            "bad_request",
            format!("{unknown}: not a field of a purge (it takes route, and path or prefix)"),
        ));
    }
    let text = |name: &str| match map.get(name) {
        None => Ok(None),
        Some(Value::String(s)) if s.starts_with('/') || name == "route" => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(bad(
            400,
            "bad_request",
            format!("{name}: must start with /"),
        )),
        Some(_) => Err(bad(400, "bad_request", format!("{name}: must be a string"))),
    };
    let route = text("route")?.ok_or_else(|| bad(400, "bad_request", "route: is required"))?;
    let scope = match (text("path")?, text("prefix")?) {
        (None, None) => Scope::Route,
        (Some(path), None) => Scope::Path(path),
        (None, Some(prefix)) => Scope::Prefix(prefix),
        (Some(_), Some(_)) => {
            return Err(bad(
                400,
                "bad_request",
                "prefix: give path or prefix, not both",
            ));
        }
    };
    Ok((route, scope))
}

/// `POST /cache/purge`.
pub async fn post(proxy: &Proxy, body: &[u8]) -> Result<Value, AdminError> {
    let (route, scope) = parse(body)?;
    let snapshot = proxy.snapshot();
    let Some(config) = snapshot.routes.routes().iter().find(|r| *r.name == *route) else {
        return Err(bad(
            400,
            "bad_request",
            format!("route: no route named {route:?}"),
        ));
    };
    if config.cache.is_none() {
        return Err(bad(
            400,
            "bad_request",
            format!("route: {route:?} has no cache"),
        ));
    }
    let purge = Purge {
        id: proxy.control().new_id("prg"),
        route,
        scope,
        until_us: crate::control::event_ends_us(),
    };
    let (purged, told) = proxy.spread_purge(&purge).await;
    tracing::info!(id = %purge.id, route = %purge.route, scope = ?purge.scope, purged, "cache purged");
    match told {
        // Told, or one instance's store: nobody else to tell.
        Ok(_) => Ok(json!({ "purged": purged })),
        Err(e) => Err(bad(
            503,
            "store_unavailable",
            format!(
                "the entries were purged here, but the other instances could not be told (repeat the purge): {e}"
            ),
        )),
    }
}

/// Removes what `purge` names from this instance's cache: how many entries went.
pub fn apply(proxy: &Proxy, purge: &Purge) -> usize {
    proxy.apply_purge(purge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purge_body_is_one_of_three_shapes_or_a_400_naming_the_field() {
        assert_eq!(
            parse(br#"{"route":"a"}"#).unwrap(),
            ("a".into(), Scope::Route)
        );
        assert_eq!(
            parse(br#"{"route":"a","path":"/x"}"#).unwrap(),
            ("a".into(), Scope::Path("/x".into()))
        );
        assert_eq!(
            parse(br#"{"route":"a","prefix":"/x/"}"#).unwrap(),
            ("a".into(), Scope::Prefix("/x/".into()))
        );
        for (body, field) in [
            (&br#"{"path":"/x"}"#[..], "route"),
            (br#"{"route":"a","paths":"/x"}"#, "paths"),
            (br#"{"route":"a","path":"x"}"#, "path"),
            (br#"{"route":"a","path":"/x","prefix":"/"}"#, "prefix"),
            (br#"{"route":7}"#, "route"),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(
                e.detail.starts_with(field),
                "{}: {}",
                String::from_utf8_lossy(body),
                e.detail
            );
        }
        assert_eq!(parse(b"[]").unwrap_err().status, 400);
    }
}
