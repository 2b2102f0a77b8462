//! The route table: the first route, in file order, whose path prefix and methods match.

use http::Method;

use crate::config::RouteConfig;

/// Routes in file order.
#[derive(Debug, Clone)]
pub struct RouteTable {
    routes: Vec<RouteConfig>,
}

impl RouteTable {
    pub fn new(routes: Vec<RouteConfig>) -> Self {
        RouteTable { routes }
    }

    /// The position of the first route whose `path_prefix` matches `path` (a plain string
    /// prefix, as nginx's `location /prefix` and Kong's paths, or at a segment boundary with
    /// `path_match: segment`) and whose methods, if any, include `method` (case-sensitively, as
    /// HTTP says). `path` must already be normalised ([`crate::path`]).
    pub fn position(&self, method: &Method, path: &str) -> Option<usize> {
        self.routes.iter().position(|r| {
            r.path_match.matches(&r.path_prefix, path)
                && r.methods
                    .as_ref()
                    .is_none_or(|methods| methods.contains(method))
        })
    }

    /// All routes, in order.
    pub fn routes(&self) -> &[RouteConfig] {
        &self.routes
    }
}
