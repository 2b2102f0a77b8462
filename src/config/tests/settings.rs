//! The config's settings outside the routes' limits: addresses, storage and its URLs, consumers,
//! HTTP/2 rates, body sizes, leases, adaptive concurrency, settled costs; and the checks that
//! run over a whole file.

use super::*;

#[test]
fn bad_addresses_are_named() {
    rejects(
        "listen: localhost\nroutes: []\n",
        "listen",
        "is not an address",
    );
    rejects(
        &with_top("admin_listen: \"127.0.0.1\""),
        "admin_listen",
        "is not an address",
    );
}

#[test]
fn bad_storage_settings_are_named() {
    rejects(
        &with_top("storage:\n  backend: etcd"),
        "storage.backend",
        "expected one of `memory`, `redis`, `redis_cluster`, `redis_sentinel`, `postgres`",
    );
    rejects(
        &with_top("storage:\n  on_error: maybe"),
        "storage.on_error",
        "expected one of `allow`, `deny`, `local`",
    );
    rejects(
        &with_top("storage:\n  max_keys: 0"),
        "storage.max_keys",
        "must be > 0",
    );
    rejects(
        &with_top("storage:\n  backend: redis_cluster"),
        "storage.urls",
        "required",
    );
    // These two read FLOODGATE_REDIS_URL, which the test environment does not set.
    if std::env::var_os("FLOODGATE_REDIS_URL").is_none() {
        rejects(
            &with_top("storage:\n  backend: redis"),
            "storage.url",
            "required when backend is redis",
        );
        rejects(
            &with_top("storage:\n  backend: redis\n  url: http://127.0.0.1:6379"),
            "storage.url",
            "must start with redis://",
        );
    }
}

#[test]
fn postgres_needs_a_postgres_url_and_never_prints_its_password() {
    rejects(
        &with_top("storage:\n  backend: postgres"),
        "storage.url",
        "required when backend is postgres (or set FLOODGATE_DATABASE_URL)",
    );
    let found = problems(&with_top(
        "storage:\n  backend: postgres\n  url: redis://fg:hunter2@127.0.0.1:5432/fg",
    ))
    .join("\n");
    assert!(
        found.contains(
            "storage.url: \"redis://fg:***@127.0.0.1:5432/fg\" must start with postgres://"
        ),
        "{found}"
    );
    assert!(!found.contains("hunter2"), "{found}");
    rejects(
        &with_top("storage:\n  backend: postgres\n  url: postgres://fg@db/fg?sslmode=verify"),
        "storage.url",
        "sslmode=verify: expected disable, allow, prefer, require, verify-ca or verify-full",
    );
    // The certificate files a URL names are read when the config is loaded.
    rejects(
        &with_top(
            "storage:\n  backend: postgres\n  url: postgres://fg@db/fg?sslmode=verify-full&sslrootcert=/nowhere/ca.pem",
        ),
        "storage.url",
        "sslrootcert: cannot read /nowhere/ca.pem",
    );
    for mode in ["require", "verify-ca", "verify-full"] {
        assert!(
            Config::from_yaml(&with_top(&format!(
                "storage:\n  backend: postgres\n  url: postgres://fg@db/fg?sslmode={mode}"
            )))
            .is_ok(),
            "{mode}"
        );
    }
    let config = Config::from_yaml(&with_top(
        "storage:\n  backend: postgres\n  url: postgresql://fg@db:5432/fg",
    ))
    .expect("valid");
    assert_eq!(
        config.storage.backend,
        Backend::Postgres {
            url: "postgresql://fg@db:5432/fg".into()
        }
    );
}

#[test]
fn each_url_override_applies_to_its_own_backend() {
    let overrides = Overrides {
        redis_url: Some("redis://from-env:6379".into()),
        database_url: Some("postgres://from-env/fg".into()),
        ..Overrides::default()
    };
    let postgres = Config::from_yaml_with(
        &with_top("storage:\n  backend: postgres\n  url: postgres://from-file/fg"),
        &overrides,
    )
    .expect("valid");
    assert_eq!(
        postgres.storage.backend,
        Backend::Postgres {
            url: "postgres://from-env/fg".into()
        }
    );
    let redis = Config::from_yaml_with(
        &with_top("storage:\n  backend: redis\n  url: redis://from-file:6379"),
        &overrides,
    )
    .expect("valid");
    assert_eq!(
        redis.storage.backend,
        Backend::Redis {
            url: "redis://from-env:6379".into()
        }
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = "listen: nowhere
storage:
  on_error: maybe
routes:
  - name: a
    path_prefix: a
    upstream: http://127.0.0.1:9000
    limits:
      - {algorithm: token_bucket, capacity: 0, refill_rate: 0}
  - name: b
    path_prefix: /b
    upstream: ftp://x
";
    let found = problems(yaml);
    for expected in [
        "listen: ",
        "storage.on_error: ",
        "routes[0].path_prefix: ",
        "routes[0].limits[0].capacity: must be > 0",
        "routes[0].limits[0].refill_rate: must be > 0",
        "routes[1].upstream: ",
    ] {
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "{expected} not in {found:?}"
        );
    }
    // And they print one per line, each led by its path.
    let err = Config::from_yaml(yaml).expect_err("invalid");
    assert_eq!(err.to_string().lines().count(), found.len());
}

#[test]
fn invalid_yaml_is_reported_not_panicked_on() {
    let found = problems("listen: [unclosed\n");
    assert!(found[0].starts_with("invalid YAML"), "{found:?}");
    let found = problems("");
    assert!(!found.is_empty());
}

#[test]
fn durations_parse_in_the_documented_units() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
    assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
    assert!(parse_duration("1").is_err(), "a bare number has no unit");
    assert!(parse_duration("soon").is_err());
}

#[test]
fn limits_are_stored_in_the_units_the_algorithms_use() {
    for (yaml, kind, units, span) in [
        (
            "{algorithm: fixed_window, limit: 7, window: 500ms}",
            AlgorithmKind::FixedWindow,
            7,
            500_000,
        ),
        (
            "{algorithm: sliding_window_log, limit: 2, window: 1m}",
            AlgorithmKind::SlidingWindowLog,
            2,
            60_000_000,
        ),
        (
            "{algorithm: sliding_window_counter, limit: 2, window: 1h}",
            AlgorithmKind::SlidingWindowCounter,
            2,
            3_600_000_000,
        ),
        (
            "{algorithm: token_bucket, capacity: 20, refill_rate: 0.5}",
            AlgorithmKind::TokenBucket,
            20,
            2_000_000,
        ),
        (
            "{algorithm: leaky_bucket, capacity: 5, leak_rate: 10}",
            AlgorithmKind::LeakyBucket,
            5,
            100_000,
        ),
    ] {
        let config = valid(&with_limit(yaml));
        let limit = config.routes[0].enforced.limits[0].limit;
        assert_eq!(
            *limit.algorithm(),
            Algorithm::from_parts(kind, units, span).unwrap(),
            "{yaml}"
        );
        assert_eq!(limit.cost(), 1, "cost defaults to 1");
    }
}

#[test]
fn per_and_tiers_are_read_and_default_to_identity_and_everyone() {
    let config = valid(&with_limit(
        "{algorithm: fixed_window, limit: 7, window: 1s, per: route, tiers: [anonymous]}",
    ));
    let limit = &config.routes[0].enforced.limits[0];
    assert_eq!(limit.per, Per::Route);
    assert!(limit.applies_to("anonymous") && !limit.applies_to("pro"));
    let config = valid(&with_limit(
        "{algorithm: fixed_window, limit: 7, window: 1s}",
    ));
    let limit = &config.routes[0].enforced.limits[0];
    assert_eq!(limit.per, Per::Identity);
    assert!(limit.applies_to("anything"));
    rejects(
        &with_limit("{algorithm: fixed_window, limit: 7, window: 1s, per: planet}"),
        &format!("{L}.per"),
        "is not a scope: identity, ip, route, endpoint, header:NAME, query:NAME, segment:N, claim:NAME or json:FIELD",
    );
}

#[test]
fn redis_cluster_rejects_routes_that_mix_per_scopes() {
    let yaml = "listen: 127.0.0.1:8080
storage:
  backend: redis_cluster
  urls: [redis://127.0.0.1:7000]
routes:
  - name: r
    path_prefix: /
    upstream: http://127.0.0.1:9000
    limits:
      - {algorithm: fixed_window, limit: 7, window: 1s}
      - {algorithm: fixed_window, limit: 70, window: 1s, per: route}
";
    rejects(yaml, "routes[0].limits", "mix per: scopes");
}

#[test]
fn unset_sections_take_their_defaults() {
    let config = valid("listen: 127.0.0.1:8080\n");
    assert_eq!(config.admin_listen, None);
    assert!(config.tls.is_none());
    assert!(config.upstream_ca.is_none());
    assert!(config.routes.is_empty());
    assert_eq!(config.storage.backend, Backend::Memory);
    assert_eq!(config.storage.on_error, OnError::Allow);
    assert_eq!(config.storage.timeout, Duration::from_millis(50));
    assert_eq!(config.storage.key_prefix, "fg:");
    assert_eq!(config.identity.api_key_header, "x-api-key");
    assert_eq!(config.identity.user_id_header, "x-user-id");
    assert!(config.identity.trusted_proxies.is_empty());
    assert_eq!(config.timeouts, Timeouts::default());
}

#[test]
fn the_budget_id_changes_with_the_limit_and_only_with_it() {
    let two = |second: &str| {
        valid(&format!(
            "{}      - {second}\n",
            with_limit("{algorithm: token_bucket, capacity: 3, refill_rate: 1}")
        ))
    };
    let a = two("{algorithm: fixed_window, limit: 5, window: 1s}");
    let same = two("{algorithm: fixed_window, limit: 5, window: 1s}");
    let other = two("{algorithm: fixed_window, limit: 6, window: 1s}");
    let ids = |c: &Config| -> Vec<String> {
        c.routes[0]
            .enforced
            .limits
            .iter()
            .map(|l| l.budget_id().to_string())
            .collect()
    };
    assert_eq!(ids(&a), ids(&same));
    assert_eq!(
        ids(&a)[0],
        ids(&other)[0],
        "the unchanged limit keeps its state"
    );
    assert_ne!(ids(&a)[1], ids(&other)[1], "the changed one starts afresh");
    assert!(ids(&a)[0].starts_with("r#0#"));
}

#[test]
fn the_example_configs_are_valid() {
    for file in [
        "config/floodgate.yaml",
        "config/ride-hailing.yaml",
        "config/llm-tokens.yaml",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let config = Config::load(&path, &Overrides::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!config.routes.is_empty());
    }
}

#[test]
fn an_unreadable_file_is_a_problem_not_a_panic() {
    let err = Config::load(
        Path::new("/nonexistent/floodgate.yaml"),
        &Overrides::default(),
    )
    .expect_err("missing file");
    assert!(err.to_string().contains("cannot read"), "{err}");
}

#[test]
fn consumer_problems_are_named_by_path() {
    let yaml = "listen: 127.0.0.1:8080
consumers:
  unknown_key: shrug
  entries:
    - name: a
      tier: pro
      keys_sha256: [not-hex]
    - name: a
      keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08,
                    9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08]
routes:
  - name: r
    path_prefix: /
    upstream: http://127.0.0.1:9000
    limits:
      - {algorithm: fixed_window, limit: 7, window: 1s, tiers: [pro, gold]}
";
    let found = problems(yaml);
    for expected in [
        "consumers.unknown_key: unknown variant `shrug`, expected `reject` or `anonymous`",
        "consumers.entries[0].keys_sha256[0]: must be 64 hex digits",
        "consumers.entries[1].name: duplicate consumer name \"a\"",
        "consumers.entries[1].keys_sha256[1]: consumer \"a\" has this key already",
        "routes[0].limits[0].tiers[1]: no request can have tier \"gold\"",
    ] {
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "{expected} not in {found:?}"
        );
    }
    assert!(
        !found.iter().any(|p| p.contains("tiers[0]")),
        "pro is a consumer's tier: {found:?}"
    );
}

#[test]
fn consumers_are_read_from_a_file_beside_the_config() {
    let dir = std::env::temp_dir().join(format!("fg-consumers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("consumers.yaml"),
        "- name: acme\n  tier: pro\n  keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]\n- name: bad\n  keys_sha256: [xyz]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("floodgate.yaml"),
        "listen: 127.0.0.1:8080\nconsumers:\n  file: consumers.yaml\n",
    )
    .unwrap();
    let err = Config::load(&dir.join("floodgate.yaml"), &Overrides::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "consumers.file[1].keys_sha256[0]: must be 64 hex digits: the SHA-256 of the key (floodgate hash-key KEY)"
    );
    std::fs::write(
        dir.join("consumers.yaml"),
        "- name: acme\n  tier: pro\n  keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]\n",
    )
    .unwrap();
    let config = Config::load(&dir.join("floodgate.yaml"), &Overrides::default()).unwrap();
    let consumers = config.consumers.expect("a consumers section");
    assert_eq!(
        consumers.find(b"test").map(|c| c.tier.as_str()),
        Some("pro")
    );
    assert_eq!(consumers.unknown_key, crate::identity::UnknownKey::Reject);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrency_takes_a_limit_and_a_lease() {
    let config = valid(&with_limit(
        "{algorithm: concurrency, limit: 64, per: route}",
    ));
    let limit = config.routes[0].enforced.limits[0].limit;
    assert_eq!(
        *limit.algorithm(),
        Algorithm::concurrency(64, Duration::from_secs(60)).unwrap(),
        "the lease defaults to 60s"
    );
    rejects(
        &with_limit("{algorithm: concurrency, limit: 4, window: 1s}"),
        &format!("{L}.window"),
        "is not a parameter of concurrency",
    );
    rejects(
        &with_limit("{algorithm: concurrency, limit: 4, lease: 0s}"),
        &format!("{L}.lease"),
        "must be longer than 0",
    );
    rejects(
        &with_limit("{algorithm: fixed_window, limit: 4, window: 1s, lease: 1s}"),
        &format!("{L}.lease"),
        "is not a parameter of fixed_window",
    );
    rejects(
        &with_limit("{algorithm: concurrency}"),
        &format!("{L}.limit"),
        "required",
    );
}

#[test]
fn sentinel_settings_are_named() {
    let config = valid(&with_top(
        "storage:\n  backend: redis_sentinel\n  sentinels: [redis://127.0.0.1:26379]\n  master_name: mymaster",
    ));
    assert_eq!(
        config.storage.backend,
        Backend::RedisSentinel {
            sentinels: vec!["redis://127.0.0.1:26379".into()],
            master_name: "mymaster".into()
        }
    );
    rejects(
        &with_top("storage:\n  backend: redis_sentinel\n  master_name: m"),
        "storage.sentinels",
        "required",
    );
    rejects(
        &with_top("storage:\n  backend: redis_sentinel\n  sentinels: [redis://x:1]"),
        "storage.master_name",
        "required",
    );
    rejects(
        &with_top("storage:\n  backend: redis_sentinel\n  sentinels: [x:1]\n  master_name: m"),
        "storage.sentinels[0]",
        "must start with redis://",
    );
}

#[test]
fn the_http2_stream_rate_is_configurable_and_checked() {
    assert!(
        valid(&with_top("")).http2_streams.is_none(),
        "no cap on streams that complete by default"
    );
    let config = valid(&with_top("http2_max_streams_per_second: 20000"));
    assert_eq!(
        config.http2_streams.map(|l| l.algorithm().units()),
        Some(10_000),
        "a burst of half a second"
    );
    rejects(
        &with_top("http2_max_streams_per_second: 0"),
        "http2_max_streams_per_second",
        "must be > 0",
    );
}

#[test]
fn the_http2_reset_rate_has_a_default_and_is_checked() {
    let config = valid(&with_top(""));
    assert_eq!(
        config.http2_resets.algorithm().units(),
        200,
        "100/s, 2 s of burst"
    );
    let config = valid(&with_top("http2_max_resets_per_second: 10"));
    assert_eq!(config.http2_resets.algorithm().units(), 20);
    rejects(
        &with_top("http2_max_resets_per_second: -1"),
        "http2_max_resets_per_second",
        "must be > 0",
    );
}

#[test]
fn max_body_size_is_a_number_of_bytes_or_a_size_with_a_unit() {
    let size = |yaml: &str| valid(&with_top(yaml)).max_body_size.map(|n| n.get());
    assert_eq!(size("max_body_size: 0"), None, "0: no limit");
    assert_eq!(size("max_body_size: \"0\""), None);
    assert_eq!(size("max_body_size: 2048"), Some(2048));
    assert_eq!(size("max_body_size: 2k"), Some(2048));
    assert_eq!(size(""), Some(1 << 20));
    rejects(&with_top("max_body_size: -1"), "max_body_size", "size");
    rejects(&with_top("max_body_size: [1]"), "max_body_size", "size");
}

#[test]
fn redirects_are_rewritten_unless_a_route_says_not_to() {
    assert!(valid(&with_top("")).routes[0].rewrite_redirects);
    let config = valid(&with_route_field("rewrite_redirects", "false"));
    assert!(!config.routes[0].rewrite_redirects);
}

#[test]
fn leases_are_on_by_default_and_can_be_turned_off_or_shortened() {
    let redis = "storage:\n  backend: redis\n  url: redis://127.0.0.1:6379\n";
    let config = valid(&with_top(redis));
    assert_eq!(
        config.storage.lease_ttl,
        Some(std::time::Duration::from_millis(250))
    );
    assert!(config.storage.batch);
    let config = valid(&with_top(&format!(
        "{redis}  leases: disabled\n  batch: false\n"
    )));
    assert_eq!(config.storage.lease_ttl, None);
    assert!(!config.storage.batch);
    let config = valid(&with_top(&format!("{redis}  lease_ttl: 100ms\n")));
    assert_eq!(
        config.storage.lease_ttl,
        Some(std::time::Duration::from_millis(100))
    );
    rejects(
        &with_top(&format!("{redis}  leases: sometimes\n")),
        "storage.leases",
        "",
    );
    rejects(
        &with_top(&format!("{redis}  lease_ttl: 0s\n")),
        "storage.lease_ttl",
        "longer than 0",
    );
}

#[test]
fn adaptive_concurrency_and_priority_are_checked_by_field() {
    let config = valid(&with_route_field(
        "adaptive_concurrency",
        "{min_limit: 2, max_limit: 50, queue_timeout: 20ms}",
    ));
    let bounds = config.routes[0].adaptive.expect("adaptive");
    assert_eq!(
        (bounds.min_limit, bounds.max_limit, bounds.queue_timeout),
        (2, 50, std::time::Duration::from_millis(20))
    );
    let defaults = valid(&with_route_field("adaptive_concurrency", "{}"));
    let b = defaults.routes[0].adaptive.unwrap();
    assert_eq!(
        (b.min_limit, b.max_limit, b.queue_timeout),
        (4, 1000, std::time::Duration::from_millis(50))
    );
    assert_eq!(
        valid(&with_route_field("priority", "high")).routes[0].priority,
        crate::adaptive::Priority::High
    );
    rejects(
        &with_route_field("adaptive_concurrency", "{min_limit: 0}"),
        "routes[0].adaptive_concurrency.min_limit",
        "between 1 and",
    );
    rejects(
        &with_route_field("adaptive_concurrency", "{min_limit: 10, max_limit: 5}"),
        "routes[0].adaptive_concurrency.max_limit",
        "below min_limit",
    );
    rejects(
        &with_route_field("adaptive_concurrency", "{queue_timeout: soon}"),
        "routes[0].adaptive_concurrency.queue_timeout",
        "",
    );
    rejects(
        &with_route_field("adaptive_concurrency", "{max: 5}"),
        "routes[0].adaptive_concurrency.max",
        "unknown field",
    );
    rejects(
        &with_route_field("priority", "urgent"),
        "routes[0].priority",
        "urgent",
    );
}

#[test]
fn routes_to_one_upstream_must_agree_on_its_learned_limit() {
    let yaml = "listen: 127.0.0.1:8080
routes:
  - name: a
    path_prefix: /a
    upstream: http://127.0.0.1:9000
    adaptive_concurrency: {max_limit: 100}
  - name: b
    path_prefix: /b
    upstream: http://127.0.0.1:9000
    adaptive_concurrency: {max_limit: 200}
";
    rejects(yaml, "routes[1].adaptive_concurrency", "same upstream");
    let agreeing = yaml.replace("max_limit: 200", "max_limit: 100");
    valid(&agreeing);
}

#[test]
fn a_settled_cost_names_its_own_fields() {
    // Block style, as configs are written (`cost` flow maps of `reserve` and `actual`).
    let settled = |cost: &str| {
        let cost = &cost[1..cost.len() - 1];
        let (reserve, actual) = cost.split_once(", actual: ").unwrap();
        let reserve = reserve.trim_start_matches("reserve: ");
        format!(
            "listen: 127.0.0.1:8080\nroutes:\n  - name: r\n    path_prefix: /\n    upstream: http://127.0.0.1:9000\n    \
             limits:\n      - algorithm: token_bucket\n        capacity: 1000\n        refill_rate: 1\n        \
             cost:\n          reserve: {reserve}\n          actual: {actual}\n"
        )
    };
    // A reserve's max above the capacity is named as such, with or without a default.
    let path = format!("{L}.cost.reserve.max");
    rejects(
        &settled("{reserve: {json: max_tokens, max: 5000}, actual: {json: usage.total_tokens}}"),
        &path,
        "between 1 and 1000",
    );
    assert_eq!(
        problems(&settled(
            "{reserve: {json: max_tokens, max: 5000}, actual: {json: usage.total_tokens}}"
        )),
        [format!(
            "{path}: must be between 1 and 1000 (the limit: a larger reserve could never be held)"
        )]
    );
    rejects(
        &settled("{reserve: {json: size, default: 10, max: 5000}, actual: {header: X-Cost}}"),
        &path,
        "between 1 and 1000",
    );
    // actual.max: at most the limit (a budget's debt is at most one limit), at least 1.
    for max in ["0", "1001", "-3"] {
        rejects(
            &settled(&format!(
                "{{reserve: 10, actual: {{header: X-Cost, max: {max}}}}}"
            )),
            &format!("{L}.cost.actual.max"),
            "between 1 and 1000",
        );
    }
    rejects(
        &settled("{reserve: 10, actual: {header: X-Cost, default: 5}}"),
        &format!("{L}.cost.actual.default"),
        "reserve's setting",
    );
    let config = valid(&settled(
        "{reserve: 10, actual: {header: X-Cost, max: 500}}",
    ));
    let limit = &config.routes[0].enforced.limits[0];
    assert_eq!(limit.settled.as_ref().unwrap().actual_max, 500);
    let config = valid(&settled("{reserve: 10, actual: {header: X-Cost}}"));
    let limit = &config.routes[0].enforced.limits[0];
    assert_eq!(
        limit.settled.as_ref().unwrap().actual_max,
        1000,
        "the capacity by default"
    );
}

/// A config with a region store on Redis, `global` as `storage.global`'s body (none when
/// empty), and one route whose limit is `limit`.
fn with_global(global: &str, limit: &str) -> String {
    let global = match global.is_empty() {
        true => String::new(),
        false => format!("  global: {global}\n"),
    };
    format!(
        "listen: 127.0.0.1:8080
storage:
  backend: redis
  url: redis://127.0.0.1:6379
{global}routes:
  - name: r
    path_prefix: /
    upstream: http://127.0.0.1:9000
    limits:
      - {limit}
"
    )
}

#[test]
fn storage_global_and_scope_global_are_checked_by_name() {
    let bucket = "{algorithm: token_bucket, capacity: 100, refill_rate: 1, scope: global}";
    let global = "{url: \"redis://10.0.0.9:6379\", region: eu-west}";
    // Defaults: a 2 s slice, 500 ms a call.
    let config = valid(&with_global(global, bucket));
    let g = config.storage.global.as_ref().expect("storage.global");
    assert_eq!(
        (g.region.as_str(), g.lease_ttl, g.timeout),
        (
            "eu-west",
            std::time::Duration::from_secs(2),
            std::time::Duration::from_millis(500)
        )
    );
    assert!(config.routes[0].enforced.limits[0].limit.is_global());
    // A region limit stays one.
    let config = valid(&with_global(
        global,
        "{algorithm: token_bucket, capacity: 100, refill_rate: 1}",
    ));
    assert!(!config.routes[0].enforced.limits[0].limit.is_global());

    rejects(
        &with_global("", bucket),
        "routes[0].limits[0].scope",
        "global needs storage.global",
    );
    for windowed in [
        "{algorithm: fixed_window, limit: 5, window: 1m, scope: global}",
        "{algorithm: quota, limit: 5, period: month, timezone: Europe/Paris, scope: global}",
    ] {
        let config = valid(&with_global(global, windowed));
        assert!(
            config.routes[0].enforced.limits[0].limit.is_global(),
            "{windowed}"
        );
    }
    rejects(
        &with_global(
            global,
            "{algorithm: sliding_window_log, limit: 5, window: 1m, scope: global}",
        ),
        "routes[0].limits[0].scope",
        "global is for token_bucket, fixed_window and quota limits, not sliding_window_log",
    );
    rejects(
        &with_global(
            global,
            "{algorithm: token_bucket, capacity: 100, refill_rate: 1, scope: world}",
        ),
        "routes[0].limits[0].scope",
        "expected `region` or `global`",
    );
    rejects(
        &with_global(
            global,
            "{algorithm: token_bucket, capacity: 100, refill_rate: 1, scope: global, shadow: true}",
        ),
        "routes[0].limits[0].shadow",
        "cannot be in shadow mode",
    );
    rejects(
        &with_global("{region: eu}", bucket),
        "storage.global.url",
        "required",
    );
    rejects(
        &with_global("{url: \"http://x:1\", region: eu}", bucket),
        "storage.global.url",
        "must start with redis://",
    );
    rejects(
        &with_global("{url: \"redis://x:1\"}", bucket),
        "storage.global.region",
        "required",
    );
    rejects(
        &with_global("{url: \"redis://x:1\", region: \"eu west\"}", bucket),
        "storage.global.region",
        "letters, digits",
    );
    rejects(
        &with_global(
            "{url: \"redis://x:1\", region: eu, lease_ttl: 10ms}",
            bucket,
        ),
        "storage.global.lease_ttl",
        "at least 100ms",
    );
    rejects(
        &with_global("{url: \"redis://x:1\", region: eu, ttl: 1s}", bucket),
        "storage.global.ttl",
        "unknown field",
    );
    rejects(
        &with_top("storage:\n  global: {url: \"redis://x:1\", region: eu}"),
        "storage.global",
        "one Redis server or PostgreSQL",
    );
}
