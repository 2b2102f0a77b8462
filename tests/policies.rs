//! Policies that hold against a client who tries to walk around them, end to end through the real
//! binary: known consumers (rotating keys buys nothing), tiers, `per: ip` and `per: route`
//! limits, and the all-or-nothing rule across budgets of different scopes; on the memory store and
//! on Redis (two instances sharing one budget).

mod common;

use common::RedisServer;
use common::config::{Config, Limit, Route};
use common::policy::{on_redis, one_route, random_key, spawn_get, statuses, with_key};
use common::{Floodgate, Upstream, client, floodgate_command, get, metric};
use http::StatusCode;

/// The SHA-256 of the key `test`, as in the contract's example.
const TEST_KEY_SHA256: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// The consumers, unknown keys rejected (`common::config::consumers`).
fn consumers_rejecting() -> Config {
    Config::new().consumers("reject")
}
// The keys above: acme has `test` and `test2`; hobbyist (tier default) has `bar`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_unknown_keys_are_rejected_with_401_and_never_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        consumers_rejecting(),
        &[Limit::token_bucket(100, 1.0)],
    ));
    let client = client();
    for n in 0..20 {
        let reply = get(&client, &fg.url("/"), &with_key(&random_key(n))).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.json()["error"], "invalid_api_key");
        assert_eq!(reply.header("content-type"), "application/problem+json");
    }
    assert_eq!(upstream.count(), 0, "no unknown key was forwarded");
    assert_eq!(
        get(&client, &fg.url("/"), &with_key("test")).await.status,
        StatusCode::OK,
        "a known key passes"
    );
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="api",decision="invalid_key"}"#
        )
        .await,
        20
    );
}

#[tokio::test]
async fn two_keys_of_one_consumer_share_one_budget() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        consumers_rejecting(),
        &[Limit::token_bucket(3, 0.01)],
    ));
    let got = statuses(
        &fg,
        &[
            with_key("test"),
            with_key("test2"),
            with_key("test"),
            with_key("test2"),
            with_key("bar"),
        ],
    )
    .await;
    assert_eq!(
        got,
        vec![200, 200, 200, 429, 200],
        "acme's two keys spend one bucket of 3; hobbyist has its own"
    );
}

#[tokio::test]
async fn unknown_keys_under_anonymous_share_the_clients_ip_budget() {
    let upstream = Upstream::start().await;
    let consumers = Config::new().consumers("anonymous");
    let fg = Floodgate::start(&one_route(
        &upstream,
        consumers,
        &[Limit::token_bucket(3, 0.01)],
    ));
    let keys: Vec<String> = (0..6).map(random_key).collect();
    let requests: Vec<_> = keys.iter().map(|k| with_key(k)).collect();
    let got = statuses(&fg, &requests).await;
    assert_eq!(got, vec![200, 200, 200, 429, 429, 429]);
    assert_eq!(upstream.count(), 3);
}

#[tokio::test]
async fn a_tier_limit_applies_only_to_that_tier() {
    let upstream = Upstream::start().await;
    let consumers = Config::new().consumers("anonymous");
    let fg = Floodgate::start(&one_route(
        &upstream,
        consumers,
        &[
            Limit::token_bucket(2, 0.01).tiers(&["default", "anonymous"]),
            Limit::token_bucket(4, 0.01).tiers(&["pro"]),
        ],
    ));
    let pro = statuses(&fg, &vec![with_key("test"); 5]).await;
    assert_eq!(pro, vec![200, 200, 200, 200, 429], "pro: 4");
    let free = statuses(&fg, &vec![with_key("bar"); 3]).await;
    assert_eq!(free, vec![200, 200, 429], "default tier: 2");
    let anonymous = statuses(&fg, &vec![vec![]; 3]).await;
    assert_eq!(anonymous, vec![200, 200, 429], "no key: anonymous, 2");
}

#[tokio::test]
async fn a_per_ip_ceiling_holds_while_the_client_rotates_keys() {
    let upstream = Upstream::start().await;
    // No consumers: every key is its own identity, with a generous budget each.
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new(),
        &[
            Limit::token_bucket(100, 1.0),
            Limit::token_bucket(4, 0.01).per("ip"),
        ],
    ));
    let keys: Vec<String> = (0..10).map(random_key).collect();
    let requests: Vec<_> = keys.iter().map(|k| with_key(k)).collect();
    let got = statuses(&fg, &requests).await;
    assert_eq!(got.iter().filter(|&&s| s == 200).count(), 4);
    assert_eq!(upstream.count(), 4);
}

#[tokio::test]
async fn a_per_route_cap_holds_across_many_identities() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new(),
        &[Limit::fixed_window(5, "1h").per("route")],
    ));
    let keys: Vec<String> = (0..12).map(random_key).collect();
    let requests: Vec<_> = keys.iter().map(|k| with_key(k)).collect();
    let got = statuses(&fg, &requests).await;
    assert_eq!(got.iter().filter(|&&s| s == 200).count(), 5);
    assert_eq!(upstream.count(), 5);
}

#[tokio::test]
async fn a_denial_by_one_limit_spends_nothing_from_a_limit_of_another_scope() {
    let upstream = Upstream::start().await;
    // Each key may send 2; the whole route 3 (windows of an hour: no refill during the test).
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new(),
        &[
            Limit::fixed_window(2, "1h"),
            Limit::fixed_window(3, "1h").per("route"),
        ],
    ));
    let got = statuses(
        &fg,
        &[
            with_key("a"),
            with_key("a"),
            with_key("a"), // denied by a's own limit: must not spend the route's third
            with_key("b"), // so this one gets it
            with_key("c"), // and the route is now spent
        ],
    )
    .await;
    assert_eq!(got, vec![200, 200, 429, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_route_cap_holds_across_two_instances_sharing_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = one_route(
        &upstream,
        on_redis(&redis),
        &[
            Limit::token_bucket(50, 1.0),
            Limit::fixed_window(10, "1h").per("route"),
        ],
    );
    let a = Floodgate::start(&yaml);
    let b = Floodgate::start(&yaml);
    let client = client();
    let mut admitted = 0;
    for n in 0..40 {
        let fg = if n % 2 == 0 { &a } else { &b };
        let reply = get(&client, &fg.url("/"), &with_key(&random_key(n))).await;
        assert!(
            reply.status == StatusCode::OK || reply.status == StatusCode::TOO_MANY_REQUESTS,
            "{}",
            reply.status
        );
        admitted += usize::from(reply.status == StatusCode::OK);
    }
    assert_eq!(admitted, 10, "one budget for both instances");
    assert_eq!(upstream.count(), 10);
}

#[tokio::test]
async fn rotating_keys_behind_a_spent_ip_budget_cost_redis_nothing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        on_redis(&redis),
        &[
            Limit::token_bucket(100, 1.0),
            Limit::token_bucket(3, 0.01).per("ip"),
        ],
    ));
    let keys: Vec<String> = (0..60).map(random_key).collect();
    let requests: Vec<_> = keys.iter().map(|k| with_key(k)).collect();
    let got = statuses(&fg, &requests).await;
    assert_eq!(got[..3], [200, 200, 200]);
    assert!(got[3..].iter().all(|&s| s == 429), "{got:?}");
    // Three admissions and the one denial that spent the IP's budget reached Redis; the 56 new
    // keys after it were turned away by the remembered IP budget, locally.
    assert_eq!(redis.decisions(), 4);
    assert_eq!(upstream.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_and_tiers_hold_on_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        on_redis(&redis).consumers("reject"),
        &[
            Limit::token_bucket(3, 0.01).tiers(&["pro"]),
            Limit::token_bucket(1, 0.01).tiers(&["default"]),
            Limit::token_bucket(4, 0.01).per("ip"),
        ],
    ));
    let got = statuses(
        &fg,
        &[
            with_key("test"),
            with_key("test2"),
            with_key(&random_key(1)),
            with_key("test"),
            with_key("test2"),
            with_key("bar"),
        ],
    )
    .await;
    // acme (pro, 3): 200 200 _ 200 429; the unknown key: 401; hobbyist: the IP ceiling of 4 is
    // spent by acme's three and hobbyist's first... which is its own only allowed request.
    assert_eq!(got, vec![200, 200, 401, 200, 429, 200]);
    // Redis holds consumer budgets by the consumer's hashed name, never a raw key.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(keys.iter().any(|k| k.contains(":consumer:")), "{keys:?}");
    assert!(!keys.iter().any(|k| k.contains("test")), "{keys:?}");
}

#[test]
fn hash_key_prints_the_sha256_for_keys_sha256() {
    let out = floodgate_command(&["hash-key".as_ref(), "test".as_ref()]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), TEST_KEY_SHA256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_leases_of_a_killed_instance_end_on_their_own() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = one_route(
        &upstream,
        on_redis(&redis),
        &[Limit::concurrency(1).with("lease", "1s").per("route")],
    );
    let doomed = Floodgate::start(&yaml);
    let survivor = Floodgate::start(&yaml);
    let held = spawn_get(&doomed, "/slow", 0);
    // Let the slow request take the one slot, then kill -9 its instance: no release is sent.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    doomed.signal("KILL");
    let _ = held.await;
    let killed_at = std::time::Instant::now();
    let status = get(&client(), &survivor.url("/"), &[]).await.status;
    // Asked within ~0.3 s of the kill, 0.7 s before the 1 s lease (taken at ~0 s) ends.
    assert!(killed_at.elapsed() < std::time::Duration::from_millis(500));
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the dead instance's lease still counts"
    );
    // After the lease's end (1 s after it was taken, plus 0.5 s of slack), the slot is free.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert_eq!(
        get(&client(), &survivor.url("/"), &[]).await.status,
        StatusCode::OK
    );
    // And a request that finishes gives its lease back at once.
    assert_eq!(
        get(&client(), &survivor.url("/"), &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_on_redis_follow_spending_and_never_spend() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        on_redis(&redis).consumers("reject"),
        &[
            Limit::token_bucket(3, 0.01).tiers(&["pro"]),
            Limit::fixed_window(50, "1h").per("route"),
            Limit::concurrency(4).per("route"),
        ],
    ));
    let client = client();
    let url = fg.admin_url("/budgets?route=api&consumer=acme");
    let remaining = |v: serde_json::Value| -> Vec<u64> {
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["remaining"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        remaining(get(&client, &url, &[]).await.json()),
        vec![3, 50, 4]
    );
    // A request with either of acme's keys spends acme's bucket.
    get(&client, &fg.url("/"), &with_key("test2")).await;
    for _ in 0..200 {
        get(&client, &url, &[]).await;
    }
    assert_eq!(
        remaining(get(&client, &url, &[]).await.json()),
        vec![2, 49, 4]
    );
    let by_key = fg.admin_url("/budgets?route=api&api_key=test");
    assert_eq!(
        remaining(get(&client, &by_key, &[]).await.json()),
        vec![2, 49, 4]
    );
    let unknown = get(
        &client,
        &fg.admin_url("/budgets?route=api&api_key=nope"),
        &[],
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_is_repaired_and_opens_no_breaker() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        on_redis(&redis),
        &[Limit::token_bucket(100, 1.0)],
    ));
    let client = client();
    assert_eq!(
        get(&client, &fg.url("/"), &with_key("victim")).await.status,
        StatusCode::OK
    );
    // Something else writes a list where the victim's bucket lives.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*:api_key:*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let _: i64 = redis.cmd(&["DEL", &keys[0]]);
    let _: i64 = redis.cmd(&["RPUSH", &keys[0], "junk"]);
    // The victim is served (its bucket starts afresh) and so is everyone else: with
    // on_error: deny, errors would be 503s, and three in a row would open the breaker for all.
    for n in 0..10 {
        let victim = get(&client, &fg.url("/"), &with_key("victim")).await;
        let other = get(&client, &fg.url("/"), &with_key(&random_key(n))).await;
        assert_eq!(
            (victim.status, other.status),
            (StatusCode::OK, StatusCode::OK)
        );
    }
    let kind: String = redis.cmd(&["TYPE", &keys[0]]);
    assert_eq!(kind, "string", "the key was replaced by a bucket");
    assert_eq!(
        metric(&fg, r#"floodgate_store_breaker_opened_total"#).await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_run_as_a_redis_function_and_survive_function_flush() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        on_redis(&redis),
        &[Limit::token_bucket(3, 0.01)],
    ));
    let client = client();
    let statuses = |n: usize| {
        let client = client.clone();
        let url = fg.url("/");
        async move {
            let mut got = Vec::new();
            for _ in 0..n {
                got.push(get(&client, &url, &with_key("fn")).await.status.as_u16());
            }
            got
        }
    };
    assert_eq!(statuses(2).await, vec![200, 200]);
    let libraries: Vec<redis::Value> = redis.cmd(&["FUNCTION", "LIST"]);
    assert_eq!(libraries.len(), 1, "one floodgate library loaded");
    // Someone flushes the functions (or a failover lands on a server without them): the next
    // decision loads the library again, and the budget carries on where it was.
    let _: String = redis.cmd(&["FUNCTION", "FLUSH"]);
    assert_eq!(statuses(2).await, vec![200, 429]);
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_fcall:calls="), "{stats}");
    assert!(
        !stats.contains("cmdstat_evalsha:calls="),
        "no EVALSHA: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_networks_tiers_and_consumers_are_forwarded_without_spending() {
    let upstream = Upstream::start().await;
    let once_an_hour = || Limit::fixed_window(1, "1h");
    // Globally: clients in 10.9.0.0/16 (the address a trusted proxy names) and the tier `pro`
    // (acme); on /private also the consumer hobbyist.
    let yaml = Config::new()
        .consumers("anonymous")
        .trusted_proxies("[127.0.0.1]")
        .with("exempt", "{networks: [10.9.0.0/16], tiers: [pro]}")
        .route(Route::new("public", "/public", &upstream.url()).limit(once_an_hour()))
        .route(
            Route::new("private", "/private", &upstream.url())
                .with("exempt", "{consumers: [hobbyist]}")
                .limit(once_an_hour()),
        )
        .yaml();
    let fg = Floodgate::start(&yaml);
    let client = client();
    let mut seen = Vec::new();
    for (path, headers, n) in [
        ("/public", vec![("x-api-key", "test")], 3),
        ("/public", vec![("x-api-key", "bar")], 2),
        ("/private", vec![("x-api-key", "bar")], 3),
        ("/public", vec![("x-forwarded-for", "10.9.1.2")], 3),
        ("/public", vec![("x-forwarded-for", "10.8.0.1")], 2),
    ] {
        let mut statuses = Vec::new();
        for _ in 0..n {
            let reply = get(&client, &fg.url(path), &headers).await;
            if reply.status == StatusCode::OK {
                // An exempt response carries no rate-limit figures: nothing was spent.
                assert_eq!(
                    reply.headers.get("x-ratelimit-remaining").is_none(),
                    n == 3,
                    "{path} {headers:?}"
                );
            }
            statuses.push(reply.status.as_u16());
        }
        seen.push(statuses);
    }
    assert_eq!(
        seen,
        [
            vec![200, 200, 200], // acme: tier pro
            vec![200, 429],      // hobbyist on /public: limited
            vec![200, 200, 200], // hobbyist on /private: exempt there
            vec![200, 200, 200], // 10.9.1.2: in the network
            vec![200, 429],      // 10.8.0.1: not
        ]
    );
    let exempt =
        |route: &str| format!("floodgate_requests_total{{route=\"{route}\",decision=\"exempt\"}}");
    assert_eq!(metric(&fg, &exempt("public")).await, 6);
    assert_eq!(metric(&fg, &exempt("private")).await, 3);
    assert_eq!(upstream.seen().len(), 11, "13 requests, two refused");
}

#[test]
fn check_names_every_bad_exemption() {
    let yaml = Config::new()
        .with("listen", "127.0.0.1:0")
        .with(
            "exempt",
            "{networks: [10.0.0.0/8, 10.0.0.0/33], tiers: [pro]}",
        )
        .route(
            Route::new("api", "/", "http://127.0.0.1:9")
                .with("exempt", "{consumers: [nobody], networks: [nope]}")
                .limit(Limit::fixed_window(1, "1h")),
        )
        .yaml();
    common::check_names(
        &yaml,
        &[
            "exempt.networks[1]",
            "exempt.tiers",
            "routes[0].exempt.consumers[0]",
            "routes[0].exempt.networks[0]",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_keys_from_the_request_give_each_combination_its_own_budget() {
    let upstream = Upstream::start().await;
    let once = |per: &str| Limit::fixed_window(1, "1h").per(per);
    let yaml = Config::new()
        .route(
            Route::new("tenants", "/tenants", &upstream.url())
                .limit(once(r#"[identity, "header:X-Tenant"]"#)),
        )
        .route(Route::new("teams", "/teams", &upstream.url()).limit(once(r#""query:team""#)))
        .route(Route::new("orgs", "/orgs/", &upstream.url()).limit(once(r#""segment:1""#)))
        .yaml();
    let fg = Floodgate::start(&yaml);
    let client = client();
    let status = |path: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let client = client.clone();
        let url = fg.url(path);
        async move { get(&client, &url, &headers).await.status.as_u16() }
    };
    let k =
        |key: &'static str, tenant: &'static str| vec![("x-api-key", key), ("x-tenant", tenant)];
    // One key, two tenants: two budgets; the same pair again: refused.
    assert_eq!(status("/tenants", k("a", "t1")).await, 200);
    assert_eq!(status("/tenants", k("a", "t2")).await, 200);
    assert_eq!(status("/tenants", k("a", "t1")).await, 429);
    // Another key, same tenant: its own budget.
    assert_eq!(status("/tenants", k("b", "t1")).await, 200);
    // Without the header, the identity's own budget (not one shared by all who lack it).
    assert_eq!(status("/tenants", vec![("x-api-key", "c")]).await, 200);
    assert_eq!(status("/tenants", vec![("x-api-key", "d")]).await, 200);
    assert_eq!(status("/tenants", vec![("x-api-key", "c")]).await, 429);
    // `query:team` alone: one budget per team, whoever asks.
    assert_eq!(
        status("/teams?team=red", vec![("x-api-key", "a")]).await,
        200
    );
    assert_eq!(
        status("/teams?x=1&team=red", vec![("x-api-key", "b")]).await,
        429
    );
    assert_eq!(
        status("/teams?team=blue", vec![("x-api-key", "b")]).await,
        200
    );
    // `segment:1`: the first path segment after the prefix.
    assert_eq!(status("/orgs/acme/users", vec![]).await, 200);
    assert_eq!(status("/orgs/acme/projects", vec![]).await, 429);
    assert_eq!(status("/orgs/beta/users", vec![]).await, 200);
    assert_eq!(upstream.seen().len(), 9);

    // /budgets names a composite budget by the values its parts read.
    let remaining = |query: &'static str| {
        let client = client.clone();
        let url = fg.admin_url(&format!("/budgets?{query}"));
        async move { get(&client, &url, &[]).await.json()["limits"][0]["remaining"].clone() }
    };
    assert_eq!(
        remaining("route=tenants&api_key=a&header:X-Tenant=t1").await,
        0
    );
    assert_eq!(
        remaining("route=tenants&api_key=a&header:X-Tenant=t3").await,
        1
    );
    assert_eq!(remaining("route=teams&api_key=z&query:team=red").await, 0);
    assert_eq!(remaining("route=teams&api_key=z&query:team=green").await, 1);
    assert_eq!(remaining("route=orgs&ip=127.0.0.1&segment:1=acme").await, 0);
    assert_eq!(
        remaining("route=orgs&ip=127.0.0.1&segment:1=gamma").await,
        1
    );
    // Without the values: the identity's own budget (c spent it, without a tenant).
    assert_eq!(remaining("route=tenants&api_key=c").await, 0);
    assert_eq!(remaining("route=tenants&api_key=e").await, 1);
}

#[test]
fn check_names_every_bad_per_key() {
    let yaml = Config::new()
        .with("listen", "127.0.0.1:0")
        .route(
            Route::new("api", "/", "http://127.0.0.1:9")
                .limit(Limit::fixed_window(1, "1h").per(r#"[identity, "segment:0"]"#))
                .limit(Limit::fixed_window(1, "1h").per(r#""claim:tenant""#))
                .limit(Limit::fixed_window(1, "1h").per(r#""header:bad header""#))
                .limit(Limit::fixed_window(1, "1h").per("everyone")),
        )
        .yaml();
    common::check_names(
        &yaml,
        &[
            "routes[0].limits[0].per[1]",
            "routes[0].limits[1].per",
            "routes[0].limits[2].per",
            "routes[0].limits[3].per",
        ],
    );
}
