//! A route's edge keys: `cors:`, `refusals:`, its own `timeouts:` and `max_body_size`.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};

use super::cors::{Cors, DEFAULT_EXPOSE};
use super::template::{NAMES as REFUSAL_NAMES, Template, Templates};
use crate::config::Validator;
use crate::config::file::{CorsFile, RefusalFile, TimeoutsFile, WebSocketFile};

/// A route's own timeouts: each `None` takes the top-level one. Only those that start after the
/// route is known; a connection's (`header_read`, `idle`, `drain`) and the shared upstream
/// connections' (`upstream_connect`) are the top level's alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteTimeouts {
    pub upstream_response: Option<Duration>,
    pub client_body: Option<Duration>,
    pub upstream_body: Option<Duration>,
}

/// A route's `websocket:` limits on its upgraded connections.
#[derive(Debug, Clone)]
pub struct WebSocketLimits {
    /// `messages:`: client messages per connection, a token bucket (capacity, refill a second).
    pub messages: Option<(u32, f64)>,
    /// `max_message`: the largest client message, in bytes.
    pub max_message: Option<u64>,
    /// `idle_timeout`: no frame either way for this long closes the connection.
    pub idle_timeout: Option<Duration>,
    /// `max_connections`: the route as an upgrade request sees it, its limits and a concurrency
    /// limit of this many connections per identity (held for the connection's life).
    pub upgrade: Option<Arc<super::RouteConfig>>,
    /// `max_connections`, as written.
    pub max_connections: Option<u32>,
}

/// How long a connection's slot under `max_connections` lasts unless renewed (every third of
/// it, while the connection is open): a crashed instance's connections are released within it.
pub const WEBSOCKET_LEASE: Duration = Duration::from_secs(30);

/// The methods a `cors:` without `methods:` allows when the route names none.
const CORS_METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

impl Validator {
    /// `cors:` at `path`; `route_methods` are the route's `methods:` (what `methods:` defaults to).
    pub(super) fn cors(
        &mut self,
        path: &str,
        c: CorsFile,
        route_methods: Option<&[Method]>,
    ) -> Option<Arc<Cors>> {
        let before = self.problems.len();
        let any = c.origins.iter().any(|o| o == "*");
        if c.origins.is_empty() {
            self.problem(
                format!("{path}.origins"),
                "list the origins allowed (https://app.example.com), or [\"*\"] for any",
            );
        } else if any && c.origins.len() > 1 {
            self.problem(
                format!("{path}.origins"),
                "\"*\" allows every origin: it cannot be listed with others",
            );
        }
        if !any {
            for (n, origin) in c.origins.iter().enumerate() {
                if let Err(e) = check_origin(origin) {
                    self.problem(format!("{path}.origins[{n}]"), e);
                }
            }
        }
        let credentials = c.credentials.unwrap_or(false);
        if any && credentials {
            self.problem(
                format!("{path}.credentials"),
                "credentials with origins [\"*\"] would let every site send a user's cookies: list the origins",
            );
        }
        let methods: Vec<Method> = match &c.methods {
            None => route_methods.map_or_else(|| CORS_METHODS.to_vec(), <[Method]>::to_vec),
            Some(methods) => self.methods(&format!("{path}.methods"), methods),
        };
        let mut names = |key: &str, list: Option<Vec<String>>, default: &[&str]| -> Vec<String> {
            let list = list.unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect());
            for (n, name) in list.iter().enumerate() {
                if name != "*" && HeaderName::try_from(name.as_str()).is_err() {
                    self.problem(
                        format!("{path}.{key}[{n}]"),
                        format!("{name:?} is not a header name"),
                    );
                }
            }
            list
        };
        let headers = names("headers", c.headers, &[]);
        let expose = names("expose", c.expose, &DEFAULT_EXPOSE);
        let max_age = self.duration(
            &format!("{path}.max_age"),
            c.max_age.as_deref(),
            Duration::from_secs(600),
        );
        if self.problems.len() > before {
            return None;
        }
        let origins = (!any).then_some(c.origins);
        let cors = Cors::new(
            origins,
            &methods,
            &headers,
            &expose,
            credentials,
            max_age.as_secs(),
        );
        if cors.is_none() {
            self.problem(
                path.to_string(),
                "its lists cannot be written as header values",
            );
        }
        cors.map(Arc::new)
    }

    /// `refusals:` at `path`, for the route named `route`.
    pub(super) fn refusals(
        &mut self,
        path: &str,
        route: &Arc<str>,
        refusals: std::collections::BTreeMap<String, RefusalFile>,
    ) -> Option<Arc<Templates>> {
        let mut by_name = Vec::new();
        for (name, r) in refusals {
            let Some(known) = REFUSAL_NAMES.iter().find(|n| **n == name) else {
                self.problem(
                    format!("{path}.{name}"),
                    format!(
                        "{name:?} is not a refusal name (they are {})",
                        REFUSAL_NAMES.join(", ")
                    ),
                );
                continue;
            };
            let content_type = r.content_type.as_deref().unwrap_or("application/json");
            match Template::parse(r.status, content_type, &r.body) {
                Ok(template) => by_name.push((*known, template)),
                Err(e) => {
                    let field = match () {
                        _ if e.starts_with("status") => "status",
                        _ if e.starts_with("content_type") => "content_type",
                        _ => "body",
                    };
                    self.problem(format!("{path}.{name}.{field}"), e);
                }
            }
        }
        (!by_name.is_empty()).then(|| {
            Arc::new(Templates {
                route: route.clone(),
                by_name,
            })
        })
    }

    /// A route's own `timeouts:` at `path`.
    pub(super) fn route_timeouts(&mut self, path: &str, t: TimeoutsFile) -> RouteTimeouts {
        for (key, set) in [
            ("header_read", t.header_read.is_some()),
            ("idle", t.idle.is_some()),
            ("drain", t.drain.is_some()),
        ] {
            if set {
                self.problem(
                    format!("{path}.{key}"),
                    "a connection's timeout, before any route is known: set it under the top-level timeouts",
                );
            }
        }
        if t.upstream_connect.is_some() {
            self.problem(
                format!("{path}.upstream_connect"),
                "upstream connections are pooled for every route to an upstream: set it under the top-level timeouts",
            );
        }
        let mut one = |key: &str, text: Option<String>| {
            let text = text?;
            Some(self.duration(&format!("{path}.{key}"), Some(&text), Duration::ZERO))
                .filter(|d| !d.is_zero())
        };
        RouteTimeouts {
            upstream_response: one("upstream_response", t.upstream_response),
            client_body: one("client_body", t.client_body),
            upstream_body: one("upstream_body", t.upstream_body),
        }
    }

    /// `websocket:` at `path` (the upgrade route, which needs the whole route, is made by the
    /// caller).
    pub(super) fn websocket(&mut self, path: &str, w: WebSocketFile) -> WebSocketLimits {
        let max_connections = w.max_connections.and_then(|n| match u32::try_from(n) {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                self.problem(
                    format!("{path}.max_connections"),
                    format!("{n} must be a whole number from 1"),
                );
                None
            }
        });
        let messages = w.messages.and_then(|m| {
            let capacity = u32::try_from(m.capacity).ok().filter(|c| *c >= 1);
            if capacity.is_none() {
                self.problem(
                    format!("{path}.messages.capacity"),
                    format!("{} must be a whole number from 1", m.capacity),
                );
            }
            if !(m.refill_rate.is_finite() && m.refill_rate > 0.0) {
                self.problem(
                    format!("{path}.messages.refill_rate"),
                    format!("{} must be more than 0 (messages a second)", m.refill_rate),
                );
                return None;
            }
            Some((capacity?, m.refill_rate))
        });
        let max_message = w.max_message.and_then(|size| {
            let before = self.problems.len();
            let n = self.size(&format!("{path}.max_message"), Some(&size.0), 0);
            (self.problems.len() == before && n > 0).then_some(n)
        });
        let idle_timeout = w.idle_timeout.map(|t| {
            self.duration(
                &format!("{path}.idle_timeout"),
                Some(&t),
                Duration::from_secs(300),
            )
        });
        WebSocketLimits {
            messages,
            max_message,
            idle_timeout,
            upgrade: None,
            max_connections,
        }
    }

    /// A route's own `max_body_size` at `path`: `Some(None)` for no limit (`0`).
    pub(super) fn route_body_size(
        &mut self,
        path: &str,
        size: Option<&str>,
    ) -> Option<Option<NonZeroU64>> {
        let size = size?;
        let before = self.problems.len();
        let n = self.size(path, Some(size), 0);
        (self.problems.len() == before).then(|| NonZeroU64::new(n))
    }
}

/// An origin as a browser sends it: `scheme://host[:port]`, nothing after.
fn check_origin(origin: &str) -> Result<(), String> {
    let uri: http::Uri = origin
        .parse()
        .map_err(|_| format!("{origin:?} is not an origin like https://app.example.com"))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(format!(
            "{origin:?} is not an origin like https://app.example.com"
        ));
    };
    if authority.as_str().contains('@') || scheme.is_empty() {
        return Err(format!("{origin:?} is not an origin (no user, a scheme)"));
    }
    let rest = &origin[scheme.len() + 3 + authority.as_str().len()..];
    if !rest.is_empty() {
        return Err(format!(
            "{origin:?} has {rest:?} after its host: an origin is scheme://host[:port] (a browser sends no path, no slash)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_origin;

    #[test]
    fn an_origin_is_scheme_host_and_port_only() {
        assert!(check_origin("https://app.example.com").is_ok());
        assert!(check_origin("http://localhost:5173").is_ok());
        assert!(check_origin("https://app.example.com/").is_err());
        assert!(check_origin("https://app.example.com/x").is_err());
        assert!(check_origin("app.example.com").is_err());
        assert!(check_origin("https://u@app.example.com").is_err());
    }
}
