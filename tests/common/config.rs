//! One typed way for tests to write floodgate's config: a [`Config`] of [`Route`]s with typed
//! [`Limit`]s, rendered as YAML. Tests say what they configure; the indentation is written here
//! once.

/// One limit of a route, as a YAML flow mapping.
#[derive(Debug, Clone)]
pub struct Limit(Vec<(String, String)>);

impl Limit {
    fn of(algorithm: &str, params: &[(&str, String)]) -> Limit {
        let mut fields = vec![("algorithm".to_string(), algorithm.to_string())];
        fields.extend(params.iter().map(|(k, v)| (k.to_string(), v.clone())));
        Limit(fields)
    }

    pub fn token_bucket(capacity: u64, refill_rate: f64) -> Limit {
        Limit::of(
            "token_bucket",
            &[
                ("capacity", capacity.to_string()),
                ("refill_rate", refill_rate.to_string()),
            ],
        )
    }

    pub fn leaky_bucket(capacity: u64, leak_rate: f64) -> Limit {
        Limit::of(
            "leaky_bucket",
            &[
                ("capacity", capacity.to_string()),
                ("leak_rate", leak_rate.to_string()),
            ],
        )
    }

    /// `algorithm: quota`: `limit` per calendar `period` in `timezone`.
    pub fn quota(limit: u64, period: &str, timezone: &str) -> Limit {
        Limit::of(
            "quota",
            &[
                ("limit", limit.to_string()),
                ("period", period.to_string()),
                ("timezone", timezone.to_string()),
            ],
        )
    }

    pub fn fixed_window(limit: u64, window: &str) -> Limit {
        Limit::of(
            "fixed_window",
            &[("limit", limit.to_string()), ("window", window.to_string())],
        )
    }

    pub fn sliding_window_log(limit: u64, window: &str) -> Limit {
        Limit::of(
            "sliding_window_log",
            &[("limit", limit.to_string()), ("window", window.to_string())],
        )
    }

    pub fn sliding_window_counter(limit: u64, window: &str) -> Limit {
        Limit::of(
            "sliding_window_counter",
            &[("limit", limit.to_string()), ("window", window.to_string())],
        )
    }

    pub fn concurrency(limit: u64) -> Limit {
        Limit::of("concurrency", &[("limit", limit.to_string())])
    }

    /// Any other key (`per`, `shadow`, `tiers`, `cost`, `lease`), its value as YAML.
    pub fn with(mut self, key: &str, value: &str) -> Limit {
        self.0.push((key.to_string(), value.to_string()));
        self
    }

    /// `per: ip` or `per: route`.
    pub fn per(self, per: &str) -> Limit {
        self.with("per", per)
    }

    /// `tiers: [...]`: the limit applies only to consumers of these tiers.
    pub fn tiers(self, tiers: &[&str]) -> Limit {
        self.with("tiers", &format!("[{}]", tiers.join(", ")))
    }

    pub fn shadow(self) -> Limit {
        self.with("shadow", "true")
    }

    fn yaml(&self) -> String {
        let fields: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        format!("{{{}}}", fields.join(", "))
    }
}

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    fields: Vec<(String, String)>,
    limits: Vec<Limit>,
}

impl Route {
    /// A route named `name` for paths under `path_prefix`, forwarding to `upstream`.
    pub fn new(name: &str, path_prefix: &str, upstream: &str) -> Route {
        Route {
            fields: vec![
                ("name".into(), name.into()),
                ("path_prefix".into(), path_prefix.into()),
                ("upstream".into(), upstream.into()),
            ],
            limits: Vec::new(),
        }
    }

    /// The route's upstream URL.
    pub fn upstream(&self) -> &str {
        &self.fields[2].1
    }

    pub fn limit(mut self, limit: Limit) -> Route {
        self.limits.push(limit);
        self
    }

    pub fn limits(mut self, limits: impl IntoIterator<Item = Limit>) -> Route {
        self.limits.extend(limits);
        self
    }

    /// Any other key of the route (`methods`, `priority`, `adaptive_concurrency`…), as YAML.
    pub fn with(mut self, key: &str, value: &str) -> Route {
        self.fields.push((key.to_string(), value.to_string()));
        self
    }

    fn yaml(&self, out: &mut String) {
        for (i, (k, v)) in self.fields.iter().enumerate() {
            out.push_str(if i == 0 { "  - " } else { "    " });
            out.push_str(&format!("{k}: {v}\n"));
        }
        if !self.limits.is_empty() {
            out.push_str("    limits:\n");
            for limit in &self.limits {
                out.push_str(&format!("      - {}\n", limit.yaml()));
            }
        }
    }
}

/// A whole config: `admin_listen: 127.0.0.1:0` (tests read metrics), then what the test sets.
#[derive(Debug, Clone)]
pub struct Config {
    top: Vec<(String, String)>,
    sections: Vec<(String, Vec<(String, String)>)>,
    routes: Vec<Route>,
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

impl Config {
    pub fn new() -> Config {
        Config {
            top: vec![("admin_listen".into(), "127.0.0.1:0".into())],
            sections: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// A top-level key, its value as YAML (a block value starts with a newline).
    pub fn with(mut self, key: &str, value: &str) -> Config {
        self.top.push((key.to_string(), value.to_string()));
        self
    }

    /// `key: value` inside the top-level mapping `section` (`storage`, `identity`, `timeouts`…).
    pub fn set(mut self, section: &str, key: &str, value: &str) -> Config {
        let entry = (key.to_string(), value.to_string());
        match self.sections.iter_mut().find(|(name, _)| name == section) {
            Some((_, keys)) => keys.push(entry),
            None => self.sections.push((section.to_string(), vec![entry])),
        }
        self
    }

    /// A `storage:` key.
    pub fn storage(self, key: &str, value: &str) -> Config {
        self.set("storage", key, value)
    }

    /// A `timeouts:` key.
    pub fn timeout(self, key: &str, value: &str) -> Config {
        self.set("timeouts", key, value)
    }

    /// `storage:` for one Redis server at `url`, with `on_error`.
    pub fn redis(self, url: &str, on_error: &str) -> Config {
        self.storage("backend", "redis")
            .storage("url", url)
            .storage("on_error", on_error)
    }

    /// `identity: {trusted_proxies: …}`, a YAML list of addresses or networks.
    pub fn trusted_proxies(self, list: &str) -> Config {
        self.set("identity", "trusted_proxies", list)
    }

    /// The test consumers ([`consumers`]), unknown keys handled as `unknown_key` says.
    pub fn consumers(mut self, unknown_key: &str) -> Config {
        let block = consumers(unknown_key);
        let value = block.strip_prefix("consumers:").expect("a consumers block");
        self.top
            .push(("consumers".into(), value.trim_end().to_string()));
        self
    }

    pub fn route(mut self, route: Route) -> Config {
        self.routes.push(route);
        self
    }

    pub fn yaml(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.top {
            out.push_str(&format!("{k}: {v}\n"));
        }
        for (section, keys) in &self.sections {
            out.push_str(&format!("{section}:\n"));
            for (k, v) in keys {
                out.push_str(&format!("  {k}: {v}\n"));
            }
        }
        out.push_str("routes:\n");
        for route in &self.routes {
            route.yaml(&mut out);
        }
        out
    }
}

/// The test consumers (a `consumers:` block), with `unknown_key` as given: acme (tier pro) has
/// the keys `test` and `test2`, hobbyist (tier default) has `bar`.
fn consumers(unknown_key: &str) -> String {
    format!(
        "consumers:
  unknown_key: {unknown_key}
  entries:
    - name: acme
      tier: pro
      keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08,
                    60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752]
    - name: hobbyist
      keys_sha256: [fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9]
"
    )
}
