//! Unit tests for the config: every error names its field by path, durations parse, defaults
//! hold, and the example config is valid.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::limiter::{Algorithm, AlgorithmKind};
use http::Method;

/// A valid config whose one route has the limit `limit` (YAML after `- `, on one line in flow
/// style, e.g. `{algorithm: token_bucket, capacity: 3, refill_rate: 1}`).
fn with_limit(limit: &str) -> String {
    format!(
        "listen: 127.0.0.1:8080
routes:
  - name: r
    path_prefix: /
    upstream: http://127.0.0.1:9000
    limits:
      - {limit}
"
    )
}

/// A valid config with `extra` inserted at the top level.
fn with_top(extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:8080
{extra}
routes:
  - name: r
    path_prefix: /
    upstream: http://127.0.0.1:9000
"
    )
}

/// A valid config whose one route has `field: value` set or replaced.
fn with_route_field(field: &str, value: &str) -> String {
    let mut route = vec![
        ("name", "r".to_string()),
        ("path_prefix", "/".to_string()),
        ("upstream", "http://127.0.0.1:9000".to_string()),
    ];
    match route.iter_mut().find(|(f, _)| *f == field) {
        Some(slot) => slot.1 = value.to_string(),
        None => route.push((field, value.to_string())),
    }
    let mut yaml = "listen: 127.0.0.1:8080\nroutes:\n".to_string();
    for (n, (f, v)) in route.iter().enumerate() {
        yaml.push_str(if n == 0 { "  - " } else { "    " });
        yaml.push_str(&format!("{f}: {v}\n"));
    }
    yaml
}

/// The problems of a config that must not validate, as `path: message` lines.
fn problems(yaml: &str) -> Vec<String> {
    match Config::from_yaml(yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.problems.iter().map(ToString::to_string).collect(),
    }
}

/// Asserts that `yaml` is rejected with a problem at exactly `path` whose message contains
/// `message`.
#[track_caller]
fn rejects(yaml: &str, path: &str, message: &str) {
    let err = Config::from_yaml(yaml).expect_err(yaml);
    assert!(
        err.problems
            .iter()
            .any(|p| p.path == path && p.message.contains(message)),
        "expected `{path}: …{message}…` in {:?}\nfor\n{yaml}",
        err.problems
    );
}

fn valid(yaml: &str) -> Config {
    Config::from_yaml(yaml).unwrap_or_else(|e| panic!("rejected ({e}):\n{yaml}"))
}

const L: &str = "routes[0].limits[0]";

#[test]
fn token_bucket_parameters_are_checked_by_name() {
    let tb = "algorithm: token_bucket";
    rejects(
        &with_limit(&format!("{{{tb}, refill_rate: 1}}")),
        &format!("{L}.capacity"),
        "required",
    );
    rejects(
        &with_limit(&format!("{{{tb}, capacity: 0, refill_rate: 1}}")),
        &format!("{L}.capacity"),
        "must be > 0",
    );
    rejects(
        &with_limit(&format!("{{{tb}, capacity: -3, refill_rate: 1}}")),
        &format!("{L}.capacity"),
        "must be > 0",
    );
    rejects(
        &with_limit(&format!("{{{tb}, capacity: 3}}")),
        &format!("{L}.refill_rate"),
        "required for token_bucket",
    );
    for bad in ["0", "-1", "0.0", "-0.5"] {
        rejects(
            &with_limit(&format!("{{{tb}, capacity: 3, refill_rate: {bad}}}")),
            &format!("{L}.refill_rate"),
            "must be > 0",
        );
    }
    rejects(
        &with_limit(&format!("{{{tb}, capacity: 3, refill_rate: 2000000}}")),
        &format!("{L}.refill_rate"),
        "at most 1000000",
    );
    // The YAML parser itself refuses non-finite floats (with a line and column, not a path).
    problems(&with_limit(&format!(
        "{{{tb}, capacity: 3, refill_rate: .inf}}"
    )));
}

#[test]
fn leaky_bucket_parameters_are_checked_by_name() {
    let lb = "algorithm: leaky_bucket";
    rejects(
        &with_limit(&format!("{{{lb}, leak_rate: 1}}")),
        &format!("{L}.capacity"),
        "required",
    );
    rejects(
        &with_limit(&format!("{{{lb}, capacity: 3}}")),
        &format!("{L}.leak_rate"),
        "required for leaky_bucket",
    );
    rejects(
        &with_limit(&format!("{{{lb}, capacity: 3, leak_rate: 0}}")),
        &format!("{L}.leak_rate"),
        "must be > 0",
    );
    // A token bucket's rate is not a leaky bucket's.
    rejects(
        &with_limit(&format!("{{{lb}, capacity: 3, refill_rate: 1}}")),
        &format!("{L}.refill_rate"),
        "is not a parameter of leaky_bucket",
    );
}

#[test]
fn bucket_algorithms_reject_window_parameters() {
    for (algorithm, rate) in [
        ("token_bucket", "refill_rate"),
        ("leaky_bucket", "leak_rate"),
    ] {
        let base = format!("algorithm: {algorithm}, capacity: 3, {rate}: 1");
        rejects(
            &with_limit(&format!("{{{base}, limit: 5}}")),
            &format!("{L}.limit"),
            &format!("is not a parameter of {algorithm}"),
        );
        rejects(
            &with_limit(&format!("{{{base}, window: 1s}}")),
            &format!("{L}.window"),
            &format!("is not a parameter of {algorithm}"),
        );
    }
    rejects(
        &with_limit("{algorithm: token_bucket, capacity: 3, refill_rate: 1, leak_rate: 1}"),
        &format!("{L}.leak_rate"),
        "is not a parameter of token_bucket",
    );
}

#[test]
fn window_algorithm_parameters_are_checked_by_name() {
    for algorithm in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
    ] {
        let a = format!("algorithm: {algorithm}");
        rejects(
            &with_limit(&format!("{{{a}, window: 1s}}")),
            &format!("{L}.limit"),
            "required",
        );
        rejects(
            &with_limit(&format!("{{{a}, limit: 0, window: 1s}}")),
            &format!("{L}.limit"),
            "must be > 0",
        );
        rejects(
            &with_limit(&format!("{{{a}, limit: 5}}")),
            &format!("{L}.window"),
            &format!("required for {algorithm}"),
        );
        rejects(
            &with_limit(&format!("{{{a}, limit: 5, window: soon}}")),
            &format!("{L}.window"),
            "is not a duration",
        );
        for too_short in ["0s", "500us"] {
            rejects(
                &with_limit(&format!("{{{a}, limit: 5, window: {too_short}}}")),
                &format!("{L}.window"),
                "at least 1ms",
            );
        }
        for foreign in ["capacity: 3", "refill_rate: 1", "leak_rate: 1"] {
            let name = foreign.split(':').next().expect("name");
            rejects(
                &with_limit(&format!("{{{a}, limit: 5, window: 1s, {foreign}}}")),
                &format!("{L}.{name}"),
                &format!("is not a parameter of {algorithm}"),
            );
        }
    }
}

#[test]
fn an_unknown_algorithm_is_named() {
    rejects(
        &with_limit("{algorithm: gcra, capacity: 3}"),
        &format!("{L}.algorithm"),
        "unknown variant `gcra`, expected one of",
    );
}

#[test]
fn a_cost_above_what_the_limit_can_ever_hold_is_rejected() {
    rejects(
        &with_limit("{algorithm: token_bucket, capacity: 3, refill_rate: 1, cost: 4}"),
        &format!("{L}.cost"),
        "must be between 1 and 3",
    );
    rejects(
        &with_limit("{algorithm: fixed_window, limit: 10, window: 1m, cost: 11}"),
        &format!("{L}.cost"),
        "must be between 1 and 10",
    );
    rejects(
        &with_limit("{algorithm: fixed_window, limit: 10, window: 1m, cost: 0}"),
        &format!("{L}.cost"),
        "must be between 1 and 10",
    );
    let config = valid(&with_limit(
        "{algorithm: token_bucket, capacity: 3, refill_rate: 1, cost: 3}",
    ));
    assert_eq!(config.routes[0].enforced.limits[0].limit.cost(), 3);
}

#[test]
fn a_budget_too_long_for_the_stores_arithmetic_is_rejected() {
    rejects(
        &with_limit("{algorithm: sliding_window_log, limit: 10000000, window: 1h}"),
        L,
        "the budget spans too long",
    );
    valid(&with_limit(
        "{algorithm: sliding_window_log, limit: 1000000, window: 1h}",
    ));
    // A fixed window counts in one window: its span is never multiplied by its limit
    // (envoyproxy/ratelimit's 100,000 a month, say).
    valid(&with_limit(
        "{algorithm: fixed_window, limit: 10000000, window: 720h}",
    ));
}

#[test]
fn a_type_error_names_its_field() {
    rejects(
        &with_limit("{algorithm: token_bucket, capacity: ten, refill_rate: 1}"),
        &format!("{L}.capacity"),
        "invalid type",
    );
    rejects(
        &with_limit("{algorithm: token_bucket, capacity: 3, refill_rate: fast}"),
        &format!("{L}.refill_rate"),
        "invalid type",
    );
    rejects(
        &with_top("identity:\n  trusted_proxies: 10.0.0.0/8"),
        "identity.trusted_proxies",
        "invalid type",
    );
}

#[test]
fn bad_upstream_urls_are_named() {
    for (url, message) in [
        ("not a url", "is not a URL"),
        ("127.0.0.1:9000", "must be an absolute URL"),
        ("/just/a/path", "must be an absolute URL"),
        ("ftp://127.0.0.1:9000", "is not supported"),
        ("http://127.0.0.1:9000/api", "without a path"),
        ("http://127.0.0.1:9000/?q=1", "without a path"),
    ] {
        rejects(
            &with_route_field("upstream", &format!("{url:?}")),
            "routes[0].upstream",
            message,
        );
    }
    let config = valid(&with_route_field(
        "upstream",
        "http://backend.internal:8081/",
    ));
    assert_eq!(config.routes[0].upstream.authority, "backend.internal:8081");
    let config = valid(&with_route_field("upstream", "https://api.example.com"));
    assert_eq!(config.routes[0].upstream.scheme, http::uri::Scheme::HTTPS);
    assert_eq!(config.routes[0].upstream.authority, "api.example.com");
}

#[test]
fn bad_methods_are_named_by_index() {
    rejects(
        &with_route_field("methods", "[GET, \"PO ST\"]"),
        "routes[0].methods[1]",
        "is not an HTTP method",
    );
    rejects(
        &with_route_field("methods", "[\"\"]"),
        "routes[0].methods[0]",
        "is not an HTTP method",
    );
    let config = valid(&with_route_field("methods", "[get, Post]"));
    assert_eq!(
        config.routes[0].methods,
        Some(vec![Method::GET, Method::POST])
    );
}

#[test]
fn bad_route_names_and_prefixes_are_named() {
    for bad in ["\"\"", "\" \"", "\"a b\"", "\"r/1\"", "\"rïdes\""] {
        rejects(
            &with_route_field("name", bad),
            "routes[0].name",
            "must be letters, digits, '_', '.' or '-'",
        );
    }
    valid(&with_route_field("name", "rides_v2.api-x"));
    rejects(
        &with_route_field("path_prefix", "api"),
        "routes[0].path_prefix",
        "must start with /",
    );
}

#[test]
fn duplicate_route_names_are_rejected() {
    let yaml = "listen: 127.0.0.1:8080
routes:
  - name: same
    path_prefix: /a
    upstream: http://127.0.0.1:9000
  - name: other
    path_prefix: /b
    upstream: http://127.0.0.1:9000
  - name: same
    path_prefix: /c
    upstream: http://127.0.0.1:9000
";
    rejects(yaml, "routes[2].name", "duplicate route name \"same\"");
}

#[test]
fn bad_trusted_proxies_are_named_by_index() {
    let yaml = with_top("identity:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.0/33, nope, \"::1\"]");
    rejects(&yaml, "identity.trusted_proxies[1]", "is not a CIDR");
    rejects(&yaml, "identity.trusted_proxies[2]", "is not a CIDR");
    assert_eq!(problems(&yaml).len(), 2, "{:?}", problems(&yaml));

    // A bare address is that one host; host bits in a CIDR are dropped.
    let config = valid(&with_top(
        "identity:\n  trusted_proxies: [10.1.2.3, 192.168.7.9/16, \"fd00::/8\"]",
    ));
    let nets: Vec<String> = config
        .identity
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(nets, ["10.1.2.3/32", "192.168.0.0/16", "fd00::/8"]);
}

#[test]
fn bad_identity_header_names_are_named() {
    rejects(
        &with_top("identity:\n  api_key_header: \"X API Key\""),
        "identity.api_key_header",
        "is not a valid header name",
    );
    rejects(
        &with_top("identity:\n  user_id_header: \"\""),
        "identity.user_id_header",
        "is not a valid header name",
    );
}

#[test]
fn unknown_keys_are_named_at_every_depth() {
    for (yaml, path) in [
        (with_top("extra: 1"), "extra"),
        (with_top("storage:\n  backendd: memory"), "storage.backendd"),
        (
            with_top("identity:\n  trusted_proxy: [10.0.0.0/8]"),
            "identity.trusted_proxy",
        ),
        (
            with_top("timeouts:\n  upstream_timeout: 1s"),
            "timeouts.upstream_timeout",
        ),
        (
            with_top("tls:\n  cert: c.pem\n  key: k.pem\n  ca: ca.pem"),
            "tls.ca",
        ),
        (with_route_field("upstreamz", "[]"), "routes[0].upstreamz"),
        (
            with_limit("{algorithm: token_bucket, capacity: 3, refill_rate: 1, burst: 5}"),
            "routes[0].limits[0].burst",
        ),
    ] {
        let name = path.rsplit('.').next().expect("name");
        rejects(&yaml, path, &format!("unknown field `{name}`"));
    }
}

#[test]
fn missing_required_keys_are_named() {
    let missing_listen = "routes: []\n";
    let shown = problems(missing_listen).join("\n");
    assert!(shown.contains("missing field `listen`"), "{shown}");
    rejects(
        "listen: 127.0.0.1:8080\nroutes:\n  - name: r\n    path_prefix: /\n",
        "routes[0].upstream",
        "is required (or upstreams: a pool of origins)",
    );
}

#[test]
fn bad_durations_are_named() {
    rejects(
        &with_top("storage:\n  timeout: fast"),
        "storage.timeout",
        "is not a duration like 500ms, 1s, 1m or 1h",
    );
    rejects(
        &with_top("timeouts:\n  upstream_response: 0s"),
        "timeouts.upstream_response",
        "must be longer than 0",
    );
    for field in [
        "header_read",
        "upstream_connect",
        "upstream_response",
        "drain",
    ] {
        rejects(
            &with_top(&format!("timeouts:\n  {field}: 10 parsecs")),
            &format!("timeouts.{field}"),
            "is not a duration",
        );
    }
}

mod settings;

#[test]
fn a_routes_pool_is_checked_field_by_field() {
    for (field, value, path, message) in [
        (
            "upstreams",
            "[http://127.0.0.1:1, http://127.0.0.1:1]",
            "routes[0].upstreams[1]",
            "twice",
        ),
        (
            "upstreams",
            "[{url: http://127.0.0.1:1, weight: 0}]",
            "routes[0].upstreams[0].weight",
            "from 1 to 100",
        ),
        (
            "upstreams",
            "[]",
            "routes[0].upstreams",
            "at least one origin",
        ),
        ("balance", "random", "routes[0].balance", "least_request"),
        (
            "hash_on",
            "header:X-A",
            "routes[0].hash_on",
            "balance: hash",
        ),
        (
            "outlier",
            "{max_ejected: 150%}",
            "routes[0].outlier.max_ejected",
            "share",
        ),
        (
            "outlier",
            "{ejection: soon}",
            "routes[0].outlier.ejection",
            "",
        ),
        (
            "retries",
            "{attempts: 9}",
            "routes[0].retries.attempts",
            "from 1",
        ),
        (
            "retries",
            "{on: [teapot]}",
            "routes[0].retries.on[0]",
            "connect_failure",
        ),
        (
            "retries",
            "{budget: lots}",
            "routes[0].retries.budget",
            "share",
        ),
        (
            "health_check",
            "{path: healthz}",
            "routes[0].health_check.path",
            "starting with /",
        ),
        (
            "health_check",
            "{path: /h, healthy_after: 0}",
            "routes[0].health_check.healthy_after",
            "at least 1",
        ),
    ] {
        let origin = match field {
            "upstreams" => String::new(),
            _ => "    upstream: http://127.0.0.1:9000\n".to_string(),
        };
        let yaml = format!(
            "listen: 127.0.0.1:8080\nroutes:\n  - name: r\n    path_prefix: /\n{origin}    {field}: {value}\n"
        );
        rejects(&yaml, path, message);
    }
    // Both upstream and upstreams.
    rejects(
        "listen: 127.0.0.1:8080\nroutes:\n  - name: r\n    path_prefix: /\n    upstream: http://127.0.0.1:1\n    upstreams: [http://127.0.0.1:2]\n",
        "routes[0].upstreams",
        "not both",
    );
    rejects(
        &with_top("resolver: {servers: [nameserver]}"),
        "resolver.servers[0]",
        "address",
    );
}

#[test]
fn per_endpoint_stands_alone_and_takes_no_penalty() {
    let limits = |limit: &str| with_route_field("limits", &format!("[{limit}]"));
    let config = valid(&limits(
        "{algorithm: fixed_window, limit: 5, window: 1s, per: endpoint}",
    ));
    assert_eq!(config.routes[0].enforced.limits[0].per, Per::Endpoint);
    rejects(
        &limits("{algorithm: fixed_window, limit: 5, window: 1s, per: [endpoint, ip]}"),
        "routes[0].limits[0].per[0]",
        "stands alone",
    );
    rejects(
        &limits(
            "{algorithm: fixed_window, limit: 5, window: 1s, per: endpoint, penalty: {denials: 3, within: 1m, ban: 1m}}",
        ),
        "routes[0].limits[0].penalty",
        "no penalty",
    );
}

#[test]
fn hosts_and_headers_are_read_and_a_bad_one_is_named() {
    let config = valid(&with_route_field(
        "hosts",
        "[Billing.Example.com, \"*.example.com\"]\n    headers: {X-Canary: \"1\", X-Beta: \"*\"}",
    ));
    let route = &config.routes[0];
    assert_eq!(
        route.hosts,
        vec![
            HostPattern::Exact("billing.example.com".into()),
            HostPattern::Suffix(".example.com".into())
        ]
    );
    assert_eq!(route.headers.len(), 2);
    assert!(
        route
            .headers
            .iter()
            .any(|h| h.name == "x-beta" && h.value.is_none())
    );
    rejects(
        &with_route_field("hosts", "[\"ex ample.com\"]"),
        "routes[0].hosts[0]",
        "is not a host name",
    );
    rejects(
        &with_route_field("rewrite_prefix", "v2/"),
        "routes[0].rewrite_prefix",
        "must start with /",
    );
    rejects(
        &with_route_field("request_headers", "{set: {Transfer-Encoding: x}}"),
        "routes[0].request_headers.set.Transfer-Encoding",
        "managed by floodgate",
    );
    rejects(
        &with_route_field("response_headers", "{set: {X-Key: \"{api_key}\"}}"),
        "routes[0].response_headers.set.X-Key",
        "not a variable",
    );
    rejects(
        &with_route_field("request_headers", "{remove: [Connection]}"),
        "routes[0].request_headers.remove[0]",
        "managed by floodgate",
    );
    let limit = |extra: &str| {
        with_route_field(
            "limits",
            &format!("[{{algorithm: fixed_window, limit: 5, window: 1m, {extra}}}]"),
        )
    };
    rejects(
        &limit("refund_on: [404], spend_on: [401]"),
        "routes[0].limits[0].spend_on",
        "use one",
    );
    rejects(
        &limit("refund_on: [\"6xx\"]"),
        "routes[0].limits[0].refund_on[0]",
        "a status",
    );
    rejects(
        &with_route_field(
            "limits",
            "[{algorithm: sliding_window_log, limit: 5, window: 1m, refund_on: [404]}]",
        ),
        "routes[0].limits[0].refund_on",
        "cannot give units back",
    );
    let refunding = valid(&limit("refund_on: [404, \"5xx\"]"));
    assert!(refunding.routes[0].enforced.limits[0].settled.is_some());
    let rewritten = valid(&with_route_field("rewrite_prefix", "/v2/"));
    assert_eq!(rewritten.routes[0].rewrite_prefix.as_deref(), Some("/v2/"));
    rejects(
        &with_route_field("headers", "{\"bad name\": x}"),
        "routes[0].headers.bad name",
        "is not a header name",
    );
}
