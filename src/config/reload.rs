//! What SIGHUP changes: the one list. Everything in a config is applied by a reload except the
//! settings in [`RESTART_ONLY`], which keep their running values until a restart; a reload that
//! changes one of them says so, naming each by its path ([`restart_only_changes`]).
//!
//! Applied by a reload (for requests and connections that start after it; those in flight
//! keep what they started with): `routes` (limits, upstreams and pools, `balance`, `outlier`,
//! `retries`, `upstream_protocol`…: an endpoint kept keeps its health and counters),
//! `identity`, `consumers` (and the file it names, re-read at every reload), `shadow`,
//! `rate_limit_headers`, `path_normalization`, `merge_slashes`, `underscores_in_headers`, `timeouts.*`, `max_body_size`,
//! `http2_max_resets_per_second`, `http2_max_streams_per_second`, `tls` (the certificate files
//! are re-read, for TCP and QUIC connections alike), `http3.advertise`, `http3.max_streams`,
//! `http3.idle_timeout`, `upstream_ca` (re-read; the upstream connection pools start anew; without it,
//! and with `timeouts.upstream_connect` unchanged, a reload keeps the upstream connections),
//! `storage.timeout`, `storage.on_error`, `storage.batch`, `storage.leases` and
//! `storage.lease_ttl` (a remote store's connections keep the reply timeout they were made with:
//! [`storage_timeout_ceiling`]), `cache.memory` and `cache.max_entry` (entries are kept; a
//! smaller `memory` evicts at once), `usage_path`, `admin.token_file` (re-read), `alerts` (the
//! crossings already alerted are kept), and the files
//! `service.config` names (re-read by the service). Limiter state carries over for every limit that did not change.
//!
//! `tests/reload.rs` changes each of them over SIGHUP and sees it take effect (`alerts` in
//! `tests/alerts.rs`), and each restart-only setting and finds its path in the warning;
//! docs/operations.md says the same.

use super::{Backend, Config};

/// Reads one setting's value from a config, for comparison.
pub type ValueOf = fn(&Config) -> String;

/// The settings only a restart can change, by their path in the config file, with how to read
/// each one's value for comparison. Why each one: the listening sockets are bound once (as
/// nginx keeps its own); `max_connections` sizes the accept loop's semaphore; `log_format` is
/// the global log subscriber's; the store's identity and layout (`storage.backend`, its
/// address, `key_prefix`, `max_keys`) are where and how the budgets already live.
pub const RESTART_ONLY: &[(&str, ValueOf)] = &[
    ("listen", |c| c.listen.to_string()),
    ("admin_listen", |c| format!("{:?}", c.admin_listen)),
    // The UDP socket too (and whether there is one); the rest of `http3:` follows reloads.
    ("http3.listen", |c| {
        format!("{:?}", c.http3.as_ref().map(|h| h.listen))
    }),
    ("http_listen", |c| format!("{:?}", c.http_listen)),
    // The ordering task is started once, with its directory, domains and challenge; the
    // certificates it has issued keep serving through reloads of the file certificates.
    ("tls.acme", |c| {
        format!("{:?}", c.tls.as_ref().and_then(|t| t.acme.as_ref()))
    }),
    ("max_connections", |c| c.max_connections.to_string()),
    ("log_format", |c| format!("{:?}", c.log_format)),
    ("storage.backend", |c| {
        backend_kind(&c.storage.backend).into()
    }),
    ("storage.url", |c| match &c.storage.backend {
        Backend::Redis { url } | Backend::Postgres { url } => url.clone(),
        _ => String::new(),
    }),
    ("storage.urls", |c| match &c.storage.backend {
        Backend::RedisCluster { urls } => urls.join(","),
        _ => String::new(),
    }),
    ("storage.sentinels", |c| match &c.storage.backend {
        Backend::RedisSentinel { sentinels, .. } => sentinels.join(","),
        _ => String::new(),
    }),
    ("storage.master_name", |c| match &c.storage.backend {
        Backend::RedisSentinel { master_name, .. } => master_name.clone(),
        _ => String::new(),
    }),
    ("storage.key_prefix", |c| c.storage.key_prefix.clone()),
    // The resolver is built once, with its servers and the discovery task's period; the pools'
    // names (routes' upstreams) follow reloads.
    ("resolver", |c| format!("{:?}", c.resolver)),
    ("storage.max_keys", |c| c.storage.max_keys.to_string()),
    // The global store's connections and keeper are made once; until a restart, an instance
    // started without it decides `scope: global` limits in its region's store alone.
    ("storage.global", |c| format!("{:?}", c.storage.global)),
    // The service's listener is bound once and serves what it started with; its rules
    // (`service.config`'s files) are re-read by every reload.
    ("service.listen", |c| {
        format!("{:?}", c.service.as_ref().map(|s| s.listen))
    }),
    ("service.tls", |c| {
        format!("{:?}", c.service.as_ref().and_then(|s| s.tls.as_ref()))
    }),
    ("service.config", |c| {
        format!("{:?}", c.service.as_ref().map(|s| &s.config))
    }),
    ("service.forward_auth", |c| {
        format!(
            "{:?}",
            c.service.as_ref().and_then(|s| s.forward_auth.as_ref())
        )
    }),
    // The exporter and its sampler are built once.
    ("telemetry", |c| format!("{:?}", c.telemetry)),
    // The engine's watcher is started once; the routes it finds follow the containers.
    ("providers.docker", |c| format!("{:?}", c.docker)),
];

fn backend_kind(backend: &Backend) -> &'static str {
    match backend {
        Backend::Memory => "memory",
        Backend::Redis { .. } => "redis",
        Backend::RedisCluster { .. } => "redis_cluster",
        Backend::RedisSentinel { .. } => "redis_sentinel",
        Backend::Postgres { .. } => "postgres",
    }
}

/// The longest a reloaded `storage.timeout` can make a decision wait on a remote store: the
/// store's connections were made with reply timeouts from the start value (at least 250 ms),
/// and keep them until a restart. `None` for the memory store, which never waits. Lowering the
/// timeout always takes effect.
pub fn storage_timeout_ceiling(running: &Config) -> Option<std::time::Duration> {
    match running.storage.backend {
        Backend::Memory => None,
        _ => Some(
            running
                .storage
                .timeout
                .max(std::time::Duration::from_millis(250)),
        ),
    }
}

/// The paths of the restart-only settings that differ between the running config and a
/// reloaded one.
pub fn restart_only_changes(running: &Config, reloaded: &Config) -> Vec<&'static str> {
    RESTART_ONLY
        .iter()
        .filter(|(_, value)| value(running) != value(reloaded))
        .map(|(path, _)| *path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        Config::from_yaml(yaml).expect("a valid config")
    }

    #[test]
    fn each_restart_only_setting_is_named_by_its_path() {
        let base = "listen: 127.0.0.1:8080\nroutes: []\n";
        let running = config(base);
        assert!(restart_only_changes(&running, &config(base)).is_empty());
        let changed =
            |extra: &str| restart_only_changes(&running, &config(&format!("{base}{extra}")));
        assert_eq!(changed("admin_listen: 127.0.0.1:9090\n"), ["admin_listen"]);
        assert_eq!(changed("max_connections: 5\n"), ["max_connections"]);
        let acme = |dir: &str| {
            format!(
                "tls: {{acme: {{directory: \"https://127.0.0.1:14000/dir\", domains: [a.test], challenge: tls-alpn-01, dir: {dir}}}}}\n"
            )
        };
        let with_acme = config(&format!("{base}{}", acme("/tmp/a")));
        assert_eq!(
            restart_only_changes(&with_acme, &config(&format!("{base}{}", acme("/tmp/b")))),
            ["tls.acme"]
        );
        assert_eq!(
            restart_only_changes(
                &with_acme,
                &config(&format!(
                    "{base}{}http_listen: 127.0.0.1:8081\n",
                    acme("/tmp/a")
                ))
            ),
            ["http_listen"]
        );
        assert_eq!(
            changed("telemetry: {otlp_endpoint: \"http://127.0.0.1:4318\"}\n"),
            ["telemetry"]
        );
        assert_eq!(
            changed("service: {listen: 127.0.0.1:8081, config: [rl/]}\n"),
            ["service.listen", "service.config"]
        );
        assert_eq!(
            changed("storage: {backend: redis, url: redis://127.0.0.1:1}\n"),
            ["storage.backend", "storage.url"]
        );
        assert_eq!(
            changed("storage: {key_prefix: \"x:\"}\n"),
            ["storage.key_prefix"]
        );
        // Reloadable settings are not in the warning.
        assert!(changed("timeouts: {upstream_response: 1s}\nmax_body_size: 5k\n").is_empty());
        assert!(changed("storage: {timeout: 10ms, on_error: deny, batch: false}\n").is_empty());
    }

    #[test]
    fn a_remote_stores_timeout_can_be_raised_up_to_its_connections_reply_timeout() {
        let redis = |timeout: &str| {
            config(&format!(
                "listen: 127.0.0.1:8080\nstorage: {{backend: redis, url: redis://127.0.0.1:1, timeout: {timeout}}}\nroutes: []\n"
            ))
        };
        let ms = std::time::Duration::from_millis;
        assert_eq!(storage_timeout_ceiling(&redis("50ms")), Some(ms(250)));
        assert_eq!(storage_timeout_ceiling(&redis("2s")), Some(ms(2000)));
        assert_eq!(
            storage_timeout_ceiling(&config("listen: 127.0.0.1:8080\nroutes: []\n")),
            None
        );
    }
}
