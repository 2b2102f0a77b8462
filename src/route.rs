//! The route table: the first route, in file order, whose path prefix, methods, hosts and
//! headers match.

use http::{HeaderMap, Method};

use crate::config::RouteConfig;

/// What a route matches a request by.
pub struct Request<'a> {
    pub method: &'a Method,
    /// Lowercase, without port ([`crate::config::request_host`]); `None`: the request names
    /// no host (a route with `hosts` does not match it).
    pub host: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// Normalised ([`crate::path`]).
    pub path: &'a str,
}

/// Routes in file order.
#[derive(Debug, Clone)]
pub struct RouteTable {
    routes: Vec<RouteConfig>,
    /// Whether any route has `hosts` (else a request's host need not be read).
    by_host: bool,
}

impl RouteTable {
    pub fn new(routes: Vec<RouteConfig>) -> Self {
        let by_host = routes.iter().any(|r| !r.hosts.is_empty());
        RouteTable { routes, by_host }
    }

    /// True when some route matches by host: the request's host must be read to route it.
    pub fn by_host(&self) -> bool {
        self.by_host
    }

    /// The position of the first route whose `path_prefix` matches `path` (a plain string
    /// prefix, as nginx's `location /prefix` and Kong's paths, or at a segment boundary with
    /// `path_match: segment`) and whose methods, if any, include `method` (case-sensitively, as
    /// HTTP says). `path` must already be normalised ([`crate::path`]). Routes with `hosts` or
    /// `headers` are passed over ([`RouteTable::find`] matches them).
    pub fn position(&self, method: &Method, path: &str) -> Option<usize> {
        self.find(&Request {
            method,
            host: None,
            headers: &HeaderMap::new(),
            path,
        })
    }

    /// The position of the first route that `request` matches: its path and methods as
    /// [`RouteTable::position`] says, its `hosts` (one matches the request's host; a route
    /// without any matches every host), its `headers` (every one is there).
    pub fn find(&self, request: &Request<'_>) -> Option<usize> {
        self.routes.iter().position(|r| {
            r.path_match.matches(&r.path_prefix, request.path)
                && r.methods
                    .as_ref()
                    .is_none_or(|methods| methods.contains(request.method))
                && (r.hosts.is_empty()
                    || request
                        .host
                        .is_some_and(|host| r.hosts.iter().any(|p| p.matches(host))))
                && r.headers.iter().all(|h| h.matches(request.headers))
        })
    }

    /// All routes, in order.
    pub fn routes(&self) -> &[RouteConfig] {
        &self.routes
    }
}
