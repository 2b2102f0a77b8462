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
    /// When some route has `hosts`: the routes a request may match, by its host.
    index: Option<HostIndex>,
}

/// The routes a request for a host may match, in file order: for each host some route names
/// exactly, the routes naming it and every route that a host does not rule out (one with a
/// `*.` pattern, or without `hosts`); for any other host, or none, those last ones alone. The
/// scan then checks each candidate whole, so the first match is the table's first match: a
/// request to the 20th host of 200 routes looks at its 10 routes, not all 200.
#[derive(Debug, Clone)]
struct HostIndex {
    exact: std::collections::HashMap<Box<str>, Box<[u32]>>,
    others: Box<[u32]>,
}

impl HostIndex {
    fn of(routes: &[RouteConfig]) -> HostIndex {
        use crate::config::HostPattern;
        // A route any host may match: no `hosts`, or a wildcard among them.
        let open = |r: &RouteConfig| {
            r.hosts.is_empty() || r.hosts.iter().any(|p| matches!(p, HostPattern::Suffix(_)))
        };
        let mut named: Vec<&str> = routes
            .iter()
            .flat_map(|r| &r.hosts)
            .filter_map(|p| match p {
                HostPattern::Exact(name) => Some(name.as_str()),
                HostPattern::Suffix(_) => None,
            })
            .collect();
        named.sort_unstable();
        named.dedup();
        let positions = |keep: &dyn Fn(&RouteConfig) -> bool| -> Box<[u32]> {
            (0..routes.len())
                .filter(|&i| keep(&routes[i]))
                .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                .collect()
        };
        let exact = named
            .into_iter()
            .map(|name| {
                let names_it = |r: &RouteConfig| {
                    r.hosts
                        .iter()
                        .any(|p| matches!(p, HostPattern::Exact(n) if n == name))
                };
                (name.into(), positions(&|r| names_it(r) || open(r)))
            })
            .collect();
        HostIndex {
            exact,
            others: positions(&open),
        }
    }

    /// The candidates for a request to `host`.
    fn candidates(&self, host: Option<&str>) -> &[u32] {
        host.and_then(|h| self.exact.get(h)).unwrap_or(&self.others)
    }
}

impl RouteTable {
    pub fn new(routes: Vec<RouteConfig>) -> Self {
        let by_host = routes.iter().any(|r| !r.hosts.is_empty());
        let index = by_host.then(|| HostIndex::of(&routes));
        RouteTable {
            routes,
            by_host,
            index,
        }
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
        match &self.index {
            None => self.routes.iter().position(|r| matches(r, request)),
            Some(index) => index
                .candidates(request.host)
                .iter()
                .map(|&i| i as usize)
                .find(|&i| matches(&self.routes[i], request)),
        }
    }

    /// All routes, in order.
    pub fn routes(&self) -> &[RouteConfig] {
        &self.routes
    }
}

/// Whether `route` matches `request`: its path prefix, methods, hosts and headers.
#[inline]
fn matches(route: &RouteConfig, request: &Request<'_>) -> bool {
    route.path_match.matches(&route.path_prefix, request.path)
        && route
            .methods
            .as_ref()
            .is_none_or(|methods| methods.contains(request.method))
        && (route.hosts.is_empty()
            || request
                .host
                .is_some_and(|host| route.hosts.iter().any(|p| p.matches(host))))
        && route.headers.iter().all(|h| h.matches(request.headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index never changes which route is first: on a table mixing exact names, wildcards,
    /// routes without hosts, methods and headers, in an order where each kind shadows another,
    /// every request finds what a scan of every route finds.
    #[test]
    fn the_host_index_finds_what_a_scan_of_every_route_finds() {
        let config = crate::config::Config::from_yaml(
            r#"listen: 127.0.0.1:0
routes:
  - {name: w-api, hosts: ["*.example.com"], path_prefix: /api/, upstream: "http://127.0.0.1:1"}
  - {name: a-all, hosts: [a.example.com], path_prefix: /, methods: [POST], upstream: "http://127.0.0.1:1"}
  - {name: none-x, path_prefix: /x/, upstream: "http://127.0.0.1:1"}
  - {name: a-b, hosts: [a.example.com, b.example.org], path_prefix: /, headers: {X-Tenant: "*"}, upstream: "http://127.0.0.1:1"}
  - {name: b, hosts: [b.example.org], path_prefix: /b/, upstream: "http://127.0.0.1:1"}
  - {name: w-org, hosts: ["*.example.org", c.example.net], path_prefix: /, upstream: "http://127.0.0.1:1"}
  - {name: a-rest, hosts: [a.example.com], path_prefix: /, upstream: "http://127.0.0.1:1"}
  - {name: catch-all, path_prefix: /, methods: [GET], upstream: "http://127.0.0.1:1"}
"#,
        )
        .expect("config");
        let table = RouteTable::new(config.routes);
        assert!(table.index.is_some());
        let mut tenant = HeaderMap::new();
        tenant.insert("x-tenant", "t1".parse().unwrap());
        let hosts = [
            None,
            Some("a.example.com"),
            Some("b.example.org"),
            Some("x.b.example.org"),
            Some("c.example.net"),
            Some("z.example.com"),
            Some("elsewhere.test"),
        ];
        let mut seen = std::collections::HashSet::new();
        for host in hosts {
            for path in ["/", "/api/v1", "/x/1", "/b/2", "/other"] {
                for method in [Method::GET, Method::POST] {
                    for headers in [&HeaderMap::new(), &tenant] {
                        let request = Request {
                            method: &method,
                            host,
                            headers,
                            path,
                        };
                        let scan = table.routes().iter().position(|r| matches(r, &request));
                        assert_eq!(table.find(&request), scan, "{host:?} {method} {path}");
                        seen.insert(scan);
                    }
                }
            }
        }
        // Every route was some request's first match (and some requests matched none).
        assert_eq!(seen.len(), table.routes().len() + 1);
    }
}
