//! floodgate on a real PostgreSQL (a fresh `initdb` cluster per test, on a free port): exact
//! shared budgets through two instances, all-or-nothing routes across `per:` scopes, concurrency
//! leases, `/budgets`, the schema installed and reinstalled by itself, expired budgets swept, and
//! the guard (`on_error`, timeout, breaker, `/readyz`) when PostgreSQL stops under load; batched
//! decisions (`storage.batch`) exact and free of deadlocks across instances.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, PostgresServer, Upstream, client, get, hammer, keyed_statuses, metric};
use http::StatusCode;

/// One route, `/` → `upstream`, limited by `limits`, on `postgres` with `on_error`. The 1 s
/// decision budget (where a test does not set its own) is for a debug build sharing two cores
/// with PostgreSQL and the test itself.
fn config(
    postgres: &PostgresServer,
    upstream: &Upstream,
    on_error: &str,
    limits: &[Limit],
) -> String {
    on_postgres(&postgres.url(), on_error, "1s")
        .route(api("/", upstream, limits))
        .yaml()
}

/// `storage:` on PostgreSQL at `url`, with `on_error` and the decision budget `timeout`.
fn on_postgres(url: &str, on_error: &str, timeout: &str) -> Config {
    Config::new()
        .storage("backend", "postgres")
        .storage("url", url)
        .storage("on_error", on_error)
        .storage("timeout", timeout)
}

/// A route named `api` for `prefix` → `upstream`, limited by `limits`.
fn api(prefix: &str, upstream: &Upstream, limits: &[Limit]) -> Route {
    Route::new("api", prefix, &upstream.url()).limits(limits.iter().cloned())
}

/// Waits until `fg` answers `/readyz` 200: the schema is installed and PostgreSQL answers.
async fn until_ready(fg: &Floodgate) {
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&client, &fg.admin_url("/readyz"), &[]).await.status != StatusCode::OK {
        assert!(Instant::now() < deadline, "never ready: {}", fg.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_grant_test_passes_through_two_instances_on_one_database() {
    let postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    let yaml = config(
        &postgres,
        &upstream,
        "deny",
        &[Limit::token_bucket(10, 10.0)],
    );
    let a = Floodgate::start(&yaml);
    let b = Floodgate::start(&yaml);
    until_ready(&a).await;
    until_ready(&b).await;
    let before = upstream.count();
    let totals = hammer(
        &[a.url("/ride"), b.url("/ride")],
        "rider-1",
        64,
        Duration::from_secs(3),
    )
    .await;
    let received = (upstream.count() - before) as u32;
    eprintln!("postgres over-grant: the upstream received {received}; responses {totals:?}");
    // on_error: deny, so a failed decision would show as a 503.
    assert!(totals.keys().all(|s| *s == 200 || *s == 429), "{totals:?}");
    // 10 at once plus 10 a second for 3 s is 40, one more at the window's edge at most; fewer
    // than 36 would mean lost refills (or decisions lost to errors).
    assert!((36..=41).contains(&received), "received {received}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_installed_before_floodgate_listens() {
    let postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    // Another session holds the installer's advisory lock for half a second, as an instance
    // installing at the same moment would: floodgate's install waits behind it.
    let mut holder =
        postgres.psql_in_background("SELECT pg_advisory_lock(7380396413569950068), pg_sleep(0.5)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while postgres.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") != "1" {
        assert!(Instant::now() < deadline, "the lock was never taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    let fg = Floodgate::start(&config(
        &postgres,
        &upstream,
        "deny",
        &[Limit::token_bucket(10, 10.0)],
    ));
    // No waiting for /readyz: floodgate listened only once the schema was in place (it waits up
    // to 2 s at start, four times the lock's hold).
    assert_eq!(
        postgres.try_psql("SELECT version FROM floodgate_schema"),
        Some("5".to_string()),
        "floodgate listened before its schema was installed"
    );
    assert_eq!(keyed_statuses(&fg.url("/x"), "A", 1).await, vec![200]);
    assert!(
        holder.wait().is_ok_and(|s| s.success()),
        "the lock holder failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_mixing_scopes_is_decided_all_or_nothing() {
    let postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(
        &postgres,
        &upstream,
        "deny",
        &[
            Limit::token_bucket(3, 0.01),
            Limit::fixed_window(5, "1h").per("route"),
            Limit::sliding_window_log(100, "1h").per("ip"),
            Limit::sliding_window_counter(100, "1h"),
            Limit::leaky_bucket(100, 1000.0),
            Limit::concurrency(10),
        ],
    ));
    until_ready(&fg).await;
    // A spends its 3; its 4th is denied by its own bucket and spends nothing from the route.
    assert_eq!(
        keyed_statuses(&fg.url("/x"), "A", 4).await,
        vec![200, 200, 200, 429]
    );
    // So B still finds 2 of the route's 5, and is then denied by the route's window.
    assert_eq!(
        keyed_statuses(&fg.url("/x"), "B", 3).await,
        vec![200, 200, 429]
    );
    assert_eq!(upstream.count(), 5);
    // The figures, spending nothing: A's bucket is empty, the route's window is spent.
    let client = client();
    let v = get(
        &client,
        &fg.admin_url("/budgets?route=api&api_key=A&ip=127.0.0.1"),
        &[],
    )
    .await
    .json();
    let remaining: Vec<u64> = v["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .map(|l| l["remaining"].as_u64().expect("remaining"))
        .collect();
    // The IP's log has 5 entries (the two denials added none); A's leaky bucket has drained; the
    // concurrency limit has all 10 free (every request has finished and given its lease back).
    assert_eq!(remaining, vec![0, 0, 95, 97, 100, 10]);
    // One row per budget (2 identities x 4 limits, the route's, the IP's), each named by a hash
    // of the client value, never the raw key.
    assert_eq!(
        postgres.psql(
            "SELECT count(*) FROM floodgate_budgets WHERE key ~ '^fg:.*:\\{[0-9a-f]{32}\\}:[a-z_]+$'"
        ),
        "10"
    );
    assert_eq!(
        postgres.psql("SELECT count(*) FROM floodgate_budgets"),
        "10"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_leases_are_held_while_in_flight_and_given_back() {
    let postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(
        &postgres,
        &upstream,
        "deny",
        &[Limit::concurrency(1)],
    ));
    until_ready(&fg).await;
    let url = fg.url("/slow");
    let slow =
        tokio::spawn(async move { get(&client(), &url, &[("x-api-key", "K")]).await.status });
    // While the slow request holds the one slot, another is turned away.
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.in_flight_now() == 0 {
        assert!(Instant::now() < deadline, "the slow request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(keyed_statuses(&fg.url("/x"), "K", 1).await, vec![429]);
    assert_eq!(slow.await.expect("slow request"), StatusCode::OK);
    // Released in the background when its body ended: the slot is free again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = keyed_statuses(&fg.url("/x"), "K", 1).await;
        if got == vec![200] {
            break;
        }
        assert!(Instant::now() < deadline, "the lease was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_versioned_and_reinstalled_when_it_disappears() {
    let postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    let yaml = config(
        &postgres,
        &upstream,
        "deny",
        &[Limit::token_bucket(2, 0.01)],
    );
    // Two instances starting together install it once, without tripping over each other.
    let a = Floodgate::start(&yaml);
    let b = Floodgate::start(&yaml);
    until_ready(&a).await;
    until_ready(&b).await;
    assert_eq!(postgres.psql("SELECT version FROM floodgate_schema"), "5");
    assert_eq!(keyed_statuses(&a.url("/x"), "K", 1).await, vec![200]);
    // The database loses everything floodgate made (restored from an old dump, say).
    postgres.psql(
        "DO $$ DECLARE f text; BEGIN
           FOR f IN SELECT oid::regprocedure::text FROM pg_proc WHERE proname LIKE 'floodgate_%' LOOP
             EXECUTE 'DROP FUNCTION ' || f;
           END LOOP;
         END $$;
         DROP TABLE floodgate_budgets; DROP TABLE floodgate_schema;",
    );
    // The next decision finds its function missing, installs the schema again and is decided
    // (on_error: deny would answer 503 otherwise): a fresh budget of 2.
    assert_eq!(
        keyed_statuses(&a.url("/x"), "K", 3).await,
        vec![200, 200, 429]
    );
    assert_eq!(postgres.psql("SELECT version FROM floodgate_schema"), "5");
    // The other instance shares the reinstalled budget.
    assert_eq!(keyed_statuses(&b.url("/x"), "K", 1).await, vec![429]);
    // A database of version 1 (before the control list, the shared cache and waiting rooms)
    // is brought to version 5 by the next instance that starts, its budgets kept.
    drop((a, b));
    postgres.psql(
        "DROP TABLE floodgate_control; DROP TABLE floodgate_claims; DROP TABLE floodgate_cache;
         DROP TABLE floodgate_room_state; DROP TABLE floodgate_room_members;
         DROP TABLE floodgate_blobs;
         DROP SEQUENCE floodgate_control_version;
         DELETE FROM floodgate_schema; INSERT INTO floodgate_schema (version) VALUES (1);",
    );
    let c = Floodgate::start(&yaml);
    until_ready(&c).await;
    assert_eq!(
        postgres.psql("SELECT max(version) FROM floodgate_schema"),
        "5"
    );
    assert_eq!(postgres.psql("SELECT count(*) FROM floodgate_control"), "0");
    assert_eq!(postgres.psql("SELECT count(*) FROM floodgate_blobs"), "0");
    assert_eq!(postgres.psql("SELECT count(*) FROM floodgate_cache"), "0");
    assert_eq!(keyed_statuses(&c.url("/x"), "K", 1).await, vec![429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_budgets_are_swept_and_live_ones_kept() {
    let postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(
        &on_postgres(&postgres.url(), "deny", "1s")
            .route(api("/short", &upstream, &[Limit::fixed_window(5, "1s")]))
            .route(Route::new("long", "/long", &upstream.url()).limit(Limit::fixed_window(5, "1h")))
            .yaml(),
    );
    until_ready(&fg).await;
    for key in 0..50 {
        let key = format!("k{key}");
        assert_eq!(keyed_statuses(&fg.url("/short"), &key, 1).await, vec![200]);
    }
    assert_eq!(keyed_statuses(&fg.url("/long"), "kept", 1).await, vec![200]);
    // Nothing is swept within the grace.
    assert_eq!(
        postgres.psql("SELECT count(*) FROM floodgate_budgets"),
        "51"
    );
    // The 1 s windows end within 1 s and are kept 5 s more (the sweeper's grace); the sweeper
    // passes about once a second (a pass pause of 1 s, batches of 1000): 25 s is far more than
    // the ~7 s it needs, for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(25);
    while postgres.psql("SELECT count(*) FROM floodgate_budgets") != "1" {
        assert!(Instant::now() < deadline, "expired budgets were not swept");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        postgres.psql("SELECT count(*) FROM floodgate_budgets WHERE key LIKE 'fg:long#%'"),
        "1",
        "the hour-long window is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_load_follows_on_error_and_limiting_resumes() {
    let mut postgres = PostgresServer::start();
    let upstream = Upstream::start().await;
    let limits = [Limit::token_bucket(3, 0.01)];
    // The load goes to a route of its own whose budget never runs out, so every request of it
    // reaches PostgreSQL (a denied one would be answered from the deny cache).
    let load =
        Route::new("load", "/load", &upstream.url()).limit(Limit::token_bucket(1_000_000, 1000.0));
    let open = Floodgate::start(
        &on_postgres(&postgres.url(), "allow", "200ms")
            .route(load)
            .route(api("/", &upstream, &limits))
            .yaml(),
    );
    let closed = Floodgate::start(
        &on_postgres(&postgres.url(), "deny", "200ms")
            .route(api("/", &upstream, &limits))
            .yaml(),
    );
    until_ready(&open).await;
    until_ready(&closed).await;
    // Load from 16 clients through the fail-open instance, while PostgreSQL stops in the middle.
    let load = {
        let url = open.url("/load");
        tokio::spawn(async move { hammer(&[url], "loaded", 16, Duration::from_secs(3)).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped_at = Instant::now();
    postgres.stop_now();
    let client = client();
    // Sequential requests while it is down: each answered within the decision budget or sooner
    // (the breaker opens after 3 failures and then spares them the wait).
    let mut slowest = Duration::ZERO;
    let mut seen: HashMap<u16, u32> = HashMap::new();
    for i in 0..20 {
        let started = Instant::now();
        let r = get(
            &client,
            &open.url("/x"),
            &[("x-api-key", &format!("down-{i}"))],
        )
        .await;
        slowest = slowest.max(started.elapsed());
        *seen.entry(r.status.as_u16()).or_default() += 1;
    }
    let under_load = load.await.expect("load");
    eprintln!(
        "postgres stopped: fail-open statuses {seen:?}, slowest {slowest:?}; load {under_load:?}"
    );
    assert_eq!(seen, HashMap::from([(200, 20)]), "on_error: allow forwards");
    assert_eq!(
        under_load.keys().collect::<Vec<_>>(),
        vec![&200],
        "{under_load:?}"
    );
    // 200 ms budget plus scheduling on a loaded two-core machine.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert_eq!(
        keyed_statuses(&closed.url("/x"), "down", 3).await,
        vec![503, 503, 503]
    );
    assert_eq!(
        get(&client, &open.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Back up: both instances reconnect by themselves, /readyz follows, and limiting is exact.
    postgres.restart();
    until_ready(&open).await;
    until_ready(&closed).await;
    eprintln!(
        "postgres back: ready again {:?} after the stop",
        stopped_at.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The breaker may still be cooling down (0.5 s): wait for the store to decide.
        let got = keyed_statuses(&closed.url("/x"), "after", 1).await;
        if got == vec![200] {
            break;
        }
        assert!(Instant::now() < deadline, "never decided again: {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        keyed_statuses(&closed.url("/x"), "after", 3).await,
        vec![200, 200, 429]
    );
    assert_eq!(keyed_statuses(&open.url("/x"), "after", 1).await, vec![429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_connects_over_verified_tls_and_nothing_else() {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
        .expect("a self-signed certificate");
    let cert_pem = certified.cert.pem();
    let postgres =
        PostgresServer::start_with_tls(&cert_pem, &certified.signing_key.serialize_pem());
    let trusted = common::TempFile::new(&cert_pem);
    let upstream = Upstream::start().await;
    let tls_yaml = on_postgres(&format!("{}?sslmode=require", postgres.url()), "deny", "1s")
        .route(api("/", &upstream, &[Limit::token_bucket(2, 0.01)]))
        .yaml();
    // Trusting the server's certificate (SSL_CERT_FILE replaces the system's roots): every
    // connection floodgate holds is TLS, and the store decides.
    let trusting = Floodgate::start_with_env(
        &tls_yaml,
        &[(
            "SSL_CERT_FILE",
            trusted.path().to_str().expect("utf-8 path"),
        )],
    );
    until_ready(&trusting).await;
    assert_eq!(
        keyed_statuses(&trusting.url("/x"), "K", 3).await,
        vec![200, 200, 429]
    );
    let connections = postgres.psql(
        "SELECT count(*) FILTER (WHERE ssl), count(*) FROM pg_stat_ssl
           JOIN pg_stat_activity USING (pid) WHERE application_name = 'floodgate'",
    );
    let (over_tls, all) = connections.split_once('|').expect("two counts");
    assert!(
        over_tls == all && all != "0",
        "every floodgate connection is TLS: {over_tls} of {all}"
    );
    // Not trusting it (an empty root file): no connection is made, nothing is decided.
    let empty = common::TempFile::new("");
    let distrusting = Floodgate::start_with_env(
        &tls_yaml,
        &[("SSL_CERT_FILE", empty.path().to_str().expect("utf-8 path"))],
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = client();
    assert_eq!(
        get(&client, &distrusting.admin_url("/readyz"), &[])
            .await
            .status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        keyed_statuses(&distrusting.url("/x"), "L", 1).await,
        vec![503]
    );
}

/// A test CA, for server and client certificates.
fn test_ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().expect("CA key"))
        .expect("a CA certificate")
}

/// A certificate and key (PEM) issued by `ca` to `common_name`, for `names`.
fn issue(
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    common_name: &str,
    names: &[&str],
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, ca).expect("a certificate");
    (cert.pem(), key.serialize_pem())
}

/// `config` with `query` after the PostgreSQL URL.
fn with_query(postgres: &PostgresServer, upstream: &Upstream, query: &str) -> String {
    on_postgres(&format!("{}?{query}", postgres.url()), "deny", "1s")
        .route(api("/", upstream, &[Limit::token_bucket(2, 0.01)]))
        .yaml()
}

/// A floodgate whose store never connects: not ready, and `on_error: deny` answers 503.
async fn assert_never_connects(fg: &Floodgate, why: &str) {
    // Twice the start-up wait: long enough for a connection that could succeed to have done so.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = client();
    assert_eq!(
        get(&client, &fg.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{why}"
    );
    assert_eq!(
        keyed_statuses(&fg.url("/x"), "N", 1).await,
        vec![503],
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslrootcert_is_trusted_and_verify_ca_checks_the_chain_but_not_the_name() {
    // The server's certificate names db.internal; floodgate reaches it as 127.0.0.1.
    let ca = test_ca("floodgate test CA");
    let (cert, key) = issue(&ca, "db.internal", &["db.internal"]);
    let postgres = PostgresServer::start_with_tls(&cert, &key);
    let root = common::TempFile::new(&ca.pem());
    let stranger = common::TempFile::new(&test_ca("another CA").pem());
    let upstream = Upstream::start().await;
    let root_of = |file: &common::TempFile| file.path().to_str().expect("utf-8").to_string();

    // verify-ca: the chain leads to the root the URL names (not the system's), whatever the name.
    let ca_only = Floodgate::start(&with_query(
        &postgres,
        &upstream,
        &format!("sslmode=verify-ca&sslrootcert={}", root_of(&root)),
    ));
    until_ready(&ca_only).await;
    assert_eq!(
        keyed_statuses(&ca_only.url("/x"), "K", 3).await,
        vec![200, 200, 429]
    );

    // verify-full checks the name too: 127.0.0.1 is not db.internal.
    let full = Floodgate::start(&with_query(
        &postgres,
        &upstream,
        &format!("sslmode=verify-full&sslrootcert={}", root_of(&root)),
    ));
    // verify-ca still checks the chain: a root that did not issue the certificate is refused.
    let wrong_root = Floodgate::start(&with_query(
        &postgres,
        &upstream,
        &format!("sslmode=verify-ca&sslrootcert={}", root_of(&stranger)),
    ));
    assert_never_connects(&full, "verify-full with a certificate for another name").await;
    assert_never_connects(&wrong_root, "verify-ca with a root that did not issue it").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_sslcert_and_sslkey_passes_cert_authentication() {
    let ca = test_ca("floodgate test CA");
    let (server_cert, server_key) = issue(&ca, "postgres", &["127.0.0.1"]);
    // The server takes only TLS connections that present a certificate from `ca` naming the
    // user (`hostssl ... cert`).
    let postgres =
        PostgresServer::start_with_tls_options(&server_cert, &server_key, Some(&ca.pem()));
    let (client_cert, client_key) = issue(&ca, "floodgate", &[]);
    let (root, cert, key) = (
        common::TempFile::new(&ca.pem()),
        common::TempFile::new(&client_cert),
        common::TempFile::new(&client_key),
    );
    let path = |file: &common::TempFile| file.path().to_str().expect("utf-8").to_string();
    let upstream = Upstream::start().await;
    let verified = format!("sslmode=verify-full&sslrootcert={}", path(&root));

    let with_cert = Floodgate::start(&with_query(
        &postgres,
        &upstream,
        &format!("{verified}&sslcert={}&sslkey={}", path(&cert), path(&key)),
    ));
    until_ready(&with_cert).await;
    assert_eq!(
        keyed_statuses(&with_cert.url("/x"), "K", 3).await,
        vec![200, 200, 429]
    );
    let authenticated = postgres.psql(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
          WHERE application_name = 'floodgate' AND client_dn = '/CN=floodgate'",
    );
    assert_ne!(
        authenticated, "0",
        "floodgate's connections carry its certificate"
    );

    let without = Floodgate::start(&with_query(&postgres, &upstream, &verified));
    assert_never_connects(&without, "no client certificate").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_decisions_from_two_stores_are_exact_and_never_deadlock() {
    use floodgate::limiter::Store;
    use floodgate::limiter::postgres::PostgresStore;
    use floodgate::limiter::{Algorithm, Ask, BudgetKey, KeyKind, Limit};
    use prometheus_client::metrics::counter::Counter;
    use std::sync::Arc;

    let postgres = PostgresServer::start();
    let calls = Counter::<u64>::default();
    let store = || {
        let store = PostgresStore::connect(&postgres.url(), "fgb:", Duration::from_secs(5))
            .expect("store")
            .batched();
        assert!(store.count_calls(calls.clone()));
        Arc::new(store)
    };
    let (a, b) = (store(), store());
    a.prepare().await.expect("schema");
    b.prepare().await.expect("schema");
    // 600 decisions at once through two stores (two floodgate instances), each over two limits:
    // its client's bucket of 1,000 (seven clients) and one shared bucket of 150, all-or-nothing.
    // Every decision locks two rows; batches lock all of theirs at once, in key order, whichever
    // order the decisions came in: a deadlock would be an error here.
    let tasks: Vec<_> = (0..600u64)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let own = Limit::of(Algorithm::token_bucket(1000, 1.0 / 3600.0).unwrap());
                let shared = Limit::of(Algorithm::token_bucket(150, 1.0 / 3600.0).unwrap());
                let client = format!("c{}", i % 7);
                let asks = [
                    Ask {
                        limit: &own,
                        key: BudgetKey {
                            budget: "own",
                            kind: KeyKind::ApiKey,
                            value: client.as_bytes(),
                        },
                    },
                    Ask {
                        limit: &shared,
                        key: BudgetKey {
                            budget: "shared",
                            kind: KeyKind::Route,
                            value: b"",
                        },
                    },
                ];
                // Half the decisions name the shared budget first.
                let asks = if i % 4 < 2 {
                    asks.to_vec()
                } else {
                    vec![asks[1], asks[0]]
                };
                store.decide(&asks, i).await
            })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        let verdict = task.await.expect("task").expect("decided, no deadlock");
        allowed += usize::from(verdict.verdict.allowed());
    }
    assert_eq!(allowed, 150, "exactly the shared budget");
    // Beyond the pool's connections (8 per store here) decisions wait and leave together.
    let calls = calls.get();
    eprintln!("{calls} calls for 600 decisions");
    assert!(calls < 600, "{calls} calls for 600 decisions");
    // An idle store adds no wait: a lone decision is answered at once.
    let limit = Limit::of(Algorithm::token_bucket(1, 1.0).unwrap());
    let alone = [Ask {
        limit: &limit,
        key: BudgetKey {
            budget: "alone",
            kind: KeyKind::ApiKey,
            value: b"x",
        },
    }];
    assert!(
        a.decide(&alone, 1)
            .await
            .expect("decided")
            .verdict
            .allowed()
    );
}

/// A database whose default isolation is `serializable` (as a distributed SQL database's is):
/// concurrent decisions on one key fail with serialization failures (SQLSTATE 40001) that the
/// database asks the application to retry. floodgate retries them within `storage.timeout`:
/// 32 clients on one key through two instances admit exactly a budget that never refills, and
/// no decision fails (`on_error: deny` would show one as a 503). Before, each conflict was a
/// store error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialization_failures_are_retried_and_the_budget_stays_exact() {
    let postgres = PostgresServer::start();
    postgres.psql("ALTER DATABASE postgres SET default_transaction_isolation TO 'serializable'");
    assert_eq!(
        postgres.psql("SHOW default_transaction_isolation"),
        "serializable"
    );
    let upstream = Upstream::start().await;
    // 200 a day, the window far from its turn for the test's few seconds.
    let yaml = on_postgres(&postgres.url(), "deny", "2s")
        .route(api("/", &upstream, &[Limit::fixed_window(200, "1d")]))
        .yaml();
    let a = Floodgate::start(&yaml);
    let b = Floodgate::start(&yaml);
    until_ready(&a).await;
    until_ready(&b).await;
    // Until every client is refused 5 times running: the 200 are spent however slowly.
    let totals =
        common::hammer_until_refused(&[a.url("/ride"), b.url("/ride")], "rider-serial", 32, 5)
            .await;
    eprintln!("serializable: responses {totals:?}");
    assert!(totals.keys().all(|s| *s == 200 || *s == 429), "{totals:?}");
    assert_eq!(totals.get(&200), Some(&200), "{totals:?}");
    assert_eq!(upstream.count(), 200);
    for fg in [&a, &b] {
        let failed = "floodgate_requests_total{route=\"api\",decision=\"store_error\"}";
        assert_eq!(metric(fg, failed).await, 0);
    }
}
