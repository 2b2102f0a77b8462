//! Exact leases (`storage.leases: auto`, src/limiter/lease.rs) end to end: real redis-server, real
//! floodgate processes, real clients. A budget spent fast is mostly spent without a round trip;
//! two instances together never admit more than a budget, for every leasable algorithm (token
//! bucket, fixed window, sliding window counter and log: the last two take the fixed window's
//! parameters); and at a steady offered rate above a refilling budget they still get nearly all of
//! it.

mod common;

use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, RedisServer, Upstream, hammer, metric};

/// `storage` with leases on (`auto`, the default, said out loud), a decision budget of 1 s (a
/// debug build of two proxies, the store and the clients share 2 cores here) and store errors
/// as 503s (`deny`), never a silent allow.
fn leased(storage: Config) -> Config {
    leased_within(storage, "1s")
}

/// [`leased`] with a decision budget of `timeout`.
fn leased_within(storage: Config, timeout: &str) -> Config {
    storage
        .storage("timeout", timeout)
        .storage("on_error", "deny")
        .storage("leases", "auto")
}

/// Leases on the Redis server `redis`.
fn on_redis(redis: &RedisServer) -> Config {
    leased(
        Config::new()
            .storage("backend", "redis")
            .storage("url", &redis.url()),
    )
}

/// Leases on the PostgreSQL server `postgres`.
fn on_postgres(postgres: &common::PostgresServer) -> Config {
    leased(
        Config::new()
            .storage("backend", "postgres")
            .storage("url", &postgres.url()),
    )
}

/// A window's limit and length, for the three window algorithms.
type Window = (u64, &'static str);

/// `storage` with four routes: `/tb` limited by `bucket`, and `/fw`, `/swc` and `/swl` by a
/// fixed window, a sliding window counter and a sliding window log of `window`.
fn config(storage: Config, upstream: &Upstream, bucket: Limit, (limit, window): Window) -> String {
    let route = |name: &str, limit: Limit| {
        Route::new(name, &format!("/{name}"), &upstream.url()).limit(limit)
    };
    storage
        .route(route("tb", bucket))
        .route(route("fw", Limit::fixed_window(limit, window)))
        .route(route("swc", Limit::sliding_window_counter(limit, window)))
        .route(route("swl", Limit::sliding_window_log(limit, window)))
        .yaml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_fast_is_mostly_spent_without_a_round_trip() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(
        on_redis(&redis),
        &upstream,
        Limit::token_bucket(1_000_000, 1_000_000.0),
        (1_000_000, "1h"),
    ));
    // A window of a million an hour. (A token bucket that is nearly full gains little: its
    // lease must drain as fast as the store's side could refill past the capacity, see lease.rs.)
    let totals = hammer(&[fg.url("/fw")], "hot", 16, Duration::from_secs(2)).await;
    let allowed = u64::from(totals.get(&200).copied().unwrap_or(0));
    assert_eq!(totals.len(), 1, "all allowed: {totals:?}");
    let calls = metric(&fg, "floodgate_store_calls_total{backend=\"redis\"}").await;
    let spent = metric(&fg, "floodgate_lease_units_total{outcome=\"spent\"}").await;
    let granted = metric(&fg, "floodgate_lease_units_total{outcome=\"granted\"}").await;
    eprintln!("{allowed} allowed, {calls} store calls, {granted} units leased, {spent} spent");
    // The first lease_ttl (250 ms) goes to the store request by request (no demand yet); after
    // that, leases sized to the last 250 ms serve most requests here, with no store call at all.
    // (Batching alone also brings calls below requests, so the lease count is what shows.)
    assert!(
        spent * 2 > allowed,
        "{spent} of {allowed} requests served from leases"
    );
    assert!(spent <= granted);
    // Little is leased in vain: one lease per budget is asked for at a time.
    assert!(
        granted < 2 * allowed,
        "{granted} units leased for {allowed} requests"
    );
}

/// How long [`two_instances`] loads a budget.
#[derive(Clone, Copy)]
enum Load {
    /// For a while (a refilling budget, whose rate is what is measured).
    For(Duration),
    /// Until every client is refused 5 times running (a budget that does not refill: spent
    /// out however slowly a loaded machine gets there).
    UntilRefused,
}

/// Hammers `path` on both instances with one key (see [`Load`]); returns what was admitted
/// (the upstream's count for the path).
async fn two_instances(
    a: &Floodgate,
    b: &Floodgate,
    upstream: &Upstream,
    path: &str,
    load: Load,
) -> usize {
    let urls = [a.url(path), b.url(path)];
    let totals = match load {
        Load::For(run_for) => hammer(&urls, "shared", 32, run_for).await,
        Load::UntilRefused => common::hammer_until_refused(&urls, "shared", 32, 5).await,
    };
    assert!(
        totals.keys().all(|s| *s == 200 || *s == 429),
        "only 200 and 429: {totals:?}"
    );
    let admitted = upstream.seen().iter().filter(|s| s.path == path).count();
    assert_eq!(totals.get(&200).copied().unwrap_or(0) as usize, admitted);
    admitted
}

/// Requests one at a time on `a` and `b` in turn until each is refused 5 times running: what
/// the instances owe the store (late answers' grants, ended leases) goes back with them, and is
/// spent by them if anything is left. Returns how many requests were answered other than 200
/// or 429 (a decision that outlived its 1 s timeout on a loaded machine: a 503).
async fn settle_once(a: &Floodgate, b: &Floodgate, path: &str) -> u32 {
    let client = common::client();
    let mut refused = [0, 0];
    let mut failed = 0;
    for i in 0..200 {
        if refused.iter().all(|&n| n >= 5) {
            break;
        }
        let which = i % 2;
        let status = client
            .post([a, b][which].url(path))
            .header("x-api-key", "shared")
            .send()
            .await
            .expect("send")
            .status();
        if status != 200 && status != 429 {
            eprintln!("{path}: settling, answered {status}");
            failed += 1;
        }
        refused[which] = if status == 429 { refused[which] + 1 } else { 0 };
    }
    failed
}

/// [`settle_once`], again after a pause as long as any request failed: the answer to a
/// decision abandoned at its timeout may come after the refusals that ended the settling, and
/// what it granted is owed back with the next call (2 s: twice the decision budget, past which
/// a PostgreSQL or Redis call on loopback has answered however loaded this machine is; the
/// loop ends, as the test does, if a store never answers).
async fn settle(a: &Floodgate, b: &Floodgate, path: &str) {
    for _ in 0..5 {
        if settle_once(a, b, path).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Leased units not spent here and not given back so far: held, or lapsed (granted − spent −
/// returned), the instances together.
async fn outstanding(instances: &[&Floodgate]) -> u64 {
    let mut sum = 0;
    for fg in instances {
        let units = |outcome: &str| format!("floodgate_lease_units_total{{outcome=\"{outcome}\"}}");
        sum += metric(fg, &units("granted")).await;
        sum -= metric(fg, &units("spent")).await;
        sum -= metric(fg, &units("returned")).await;
    }
    sum
}

/// Budgets of 1,500 that do not refill within the test (a token per 1,000 s; an hour's window):
/// large enough that both instances lease for a while before they run out.
fn bucket_1500() -> Limit {
    Limit::token_bucket(1500, 0.001)
}
const WINDOW_1500: Window = (1500, "1h");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_leases_never_admit_more_than_a_budget() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = config(on_redis(&redis), &upstream, bucket_1500(), WINDOW_1500);
    never_more_than_1500(&yaml, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_leases_on_postgres_never_admit_more_than_a_budget() {
    let postgres = common::PostgresServer::start();
    let upstream = Upstream::start().await;
    let yaml = config(
        on_postgres(&postgres),
        &upstream,
        bucket_1500(),
        WINDOW_1500,
    );
    never_more_than_1500(&yaml, &upstream).await;
}

/// Two instances of `yaml` (budgets of 1,500 on `/tb`, `/fw`, `/swc` and `/swl`), 32 clients
/// on each route in turn until it is spent: never more than 1,500 admitted, and every unit
/// accounted for.
async fn never_more_than_1500(yaml: &str, upstream: &Upstream) {
    let (a, b) = (Floodgate::start(yaml), Floodgate::start(yaml));
    for path in ["/tb", "/fw", "/swc", "/swl"] {
        let granted = async || {
            metric(&a, "floodgate_lease_units_total{outcome=\"granted\"}").await
                + metric(&b, "floodgate_lease_units_total{outcome=\"granted\"}").await
        };
        let granted_before = granted().await;
        let outstanding_before = outstanding(&[&a, &b]).await;
        two_instances(&a, &b, upstream, path, Load::UntilRefused).await;
        // What answers came too late (a loaded machine, a 1 s timeout) owe back rides on the
        // budget's next calls: a few requests more, until both instances are refused.
        settle(&a, &b, path).await;
        let admitted = upstream.seen().iter().filter(|s| s.path == path).count() as u64;
        let leased = granted().await - granted_before;
        let unspent = outstanding(&[&a, &b]).await - outstanding_before;
        let errors = metric(&a, "floodgate_store_errors_total").await
            + metric(&b, "floodgate_store_errors_total").await;
        eprintln!(
            "{path}: {admitted} admitted, {leased} units leased, {unspent} held or lapsed \
             ({errors} store errors so far)"
        );
        assert!(leased > 0, "{path} was leased (else this tests nothing)");
        // Never more than the budget.
        assert!(admitted <= 1500, "{path} over-granted: {admitted}");
        // Every unit the store debited was admitted, or is held unspent in a lease (or lapsed:
        // a lease that ended unspent gives its units back with the next request to the store;
        // on a budget that is spent out, none may come). A give-back the store ignored would
        // show here as units missing.
        assert_eq!(admitted + unspent, 1500, "{path}: units unaccounted for");
    }
}

const WINDOW_100K: Window = (100_000, "1h");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_unspent_gives_its_units_back() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = config(on_redis(&redis), &upstream, bucket_1500(), WINDOW_100K);
    given_back(&Floodgate::start(&yaml), &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_unspent_gives_its_units_back_on_postgres() {
    let postgres = common::PostgresServer::start();
    let upstream = Upstream::start().await;
    let yaml = config(
        on_postgres(&postgres),
        &upstream,
        bucket_1500(),
        WINDOW_100K,
    );
    given_back(&Floodgate::start(&yaml), &upstream).await;
}

/// Windows of 100,000 an hour on `fg`: far more than 8 clients spend in half a second here, so
/// leases end unspent, and the next request gives their units back.
async fn given_back(fg: &Floodgate, upstream: &Upstream) {
    let client = common::client();
    let returned = async || metric(fg, "floodgate_lease_units_total{outcome=\"returned\"}").await;
    for (route, path) in [("fw", "/fw"), ("swc", "/swc"), ("swl", "/swl")] {
        let returned_before = returned().await;
        // The lease counters are the instance's, every route's: a lease an earlier route was
        // left holding (its last request may take one) stays counted, as no request of that
        // route comes again to give it back. This route's are what moved from here.
        let held_before = outstanding(&[fg]).await;
        hammer(&[fg.url(path)], "back", 8, Duration::from_millis(500)).await;
        // A lease must be held now for one to end unspent (on a loaded machine the last one may
        // have been spent out): a little more load until one is.
        for _ in 0..20 {
            if outstanding(&[fg]).await > held_before {
                break;
            }
            hammer(&[fg.url(path)], "back", 8, Duration::from_millis(200)).await;
        }
        // The lease ends (lease_ttl, 250 ms); the next request to the store gives back what it
        // left (the request itself may take a new lease: `outstanding` counts it).
        tokio::time::sleep(Duration::from_millis(400)).await;
        let r = common::get(&client, &fg.url(path), &[("x-api-key", "back")]).await;
        assert_eq!(r.status, 200);
        let given_back = returned().await - returned_before;
        let budgets = common::get(
            &client,
            &fg.admin_url(&format!("/budgets?route={route}&api_key=back")),
            &[],
        )
        .await
        .json();
        let spent_in_store = 100_000 - budgets["limits"][0]["remaining"].as_u64().unwrap();
        let admitted = upstream.seen().iter().filter(|s| s.path == path).count() as u64;
        let held = outstanding(&[fg]).await - held_before;
        eprintln!(
            "{path}: {admitted} admitted, {given_back} given back, {held} held; the store counts {spent_in_store}"
        );
        assert!(given_back > 0, "{path}: nothing was given back");
        // What the store counts is what was admitted plus what is held (none lapsed): the
        // units given back are the store's again. (Counted before this route's own lease
        // counters were: two full runs failed by exactly the lease the route before was left
        // holding, 8 units against /swc's store, 5 against /swl's.)
        assert_eq!(spent_in_store, admitted + held, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_above_a_refilling_budget_get_nearly_all_of_it() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // A token bucket of 50 refilling 100 a second, and a sliding window log of 100 a second.
    let yaml = config(
        on_redis(&redis),
        &upstream,
        Limit::token_bucket(50, 100.0),
        (100, "1s"),
    );
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    // 32 clients per route without pause, far above 100/s, for 10 s, both routes at once.
    let load = Duration::from_secs(10);
    let started = Instant::now();
    let (tb, swl) = tokio::join!(
        two_instances(&a, &b, &upstream, "/tb", Load::For(load)),
        two_instances(&a, &b, &upstream, "/swl", Load::For(load))
    );
    let elapsed = started.elapsed().as_secs_f64();
    // The budgets over the run: the bucket's 50 at once plus 100 a second; the log's 100 in
    // every second. Requests are sent for 10 s; the run ends when the last one returns, a
    // little later (0.7 s in a debug build here, with or without leases). The ceilings count
    // the budget up to the end (more would be an over-grant); the 95% floors count the 10 s of
    // load only. A lease costs the log most: its entries count from the grant to a window
    // after the lease's end; but near exhaustion (a budget this contended) leases shrink to
    // nothing (at most half of what remains).
    let seconds = load.as_secs_f64();
    for (path, admitted, ceiling, floor) in [
        ("/tb", tb, 50.0 + 100.0 * elapsed, 50.0 + 100.0 * seconds),
        ("/swl", swl, 100.0 * elapsed.ceil(), 100.0 * seconds),
    ] {
        eprintln!("{path}: {admitted} admitted in {elapsed:.2} s, ceiling {ceiling:.0}");
        assert!(
            admitted as f64 <= ceiling + 1.0,
            "{path} over-granted: {admitted} of {ceiling:.0}"
        );
        assert!(
            admitted as f64 >= 0.95 * floor,
            "{path} under-granted: {admitted} of {floor:.0}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_holding_a_lease_costs_at_most_that_lease() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // A window of 6,000 an hour, spent by two instances: `a` takes leases, stops, and is killed
    // holding what it had not spent; `b` then spends the rest.
    let yaml = config(
        on_redis(&redis),
        &upstream,
        Limit::token_bucket(1_000_000, 1_000_000.0),
        (6000, "1h"),
    );
    let (mut a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    let by_a = hammer(&[a.url("/fw")], "shared", 16, Duration::from_secs(1)).await;
    let admitted_a = u64::from(by_a.get(&200).copied().unwrap_or(0));
    let held = outstanding(&[&a]).await;
    a.signal("KILL");
    assert!(
        a.wait_exit(Duration::from_secs(5)).is_some(),
        "a was killed"
    );
    // b spends the rest, until each of its clients is refused 5 times running: however loaded
    // the machine (a full run at a load average of 14 saw b admit 4,099 in 8 s at 512 a second,
    // short of the rest), the budget is spent out before anything is counted.
    let by_b = common::hammer_until_refused(&[b.url("/fw")], "shared", 16, 5).await;
    let admitted_b = u64::from(by_b.get(&200).copied().unwrap_or(0));
    eprintln!("a admitted {admitted_a} and held {held} unspent; b admitted {admitted_b}");
    let left_b = outstanding(&[&b]).await;
    assert!(
        held > 0,
        "a was killed holding a lease (else this tests nothing)"
    );
    assert!(by_b.contains_key(&429), "b spent the rest: {by_b:?}");
    // What a held unspent is lost (until the window ends), and nothing else but what b itself
    // still holds (or let lapse) at the end.
    eprintln!("b holds or let lapse {left_b}");
    assert_eq!(admitted_a + admitted_b + held + left_b, 6000);
}

/// Seed 002's routes on `storage`: `/tb`, `/fw`, `/swl` and `/swc`, each a budget of 40 that
/// does not refill, behind two instances; the upstream, the routes' names and the instances.
async fn seed_002_setup(storage: Config) -> (Upstream, [&'static str; 4], Floodgate, Floodgate) {
    let limits = [
        ("tb", Limit::token_bucket(40, 0.0001)),
        ("fw", Limit::fixed_window(40, "1h")),
        ("swl", Limit::sliding_window_log(40, "1h")),
        ("swc", Limit::sliding_window_counter(40, "1h")),
    ];
    let upstream = Upstream::start().await;
    let names = limits.each_ref().map(|(name, _)| *name);
    let yaml = limits
        .into_iter()
        .fold(storage, |config, (name, limit)| {
            config.route(Route::new(name, &format!("/{name}"), &upstream.url()).limit(limit))
        })
        .yaml();
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    (upstream, names, a, b)
}

/// Seed 002's over-grant test on `storage` (leases on): for each algorithm with a budget of 40
/// that does not refill, 64 clients through two instances; returns what each admitted.
async fn seed_002(storage: Config) -> Vec<(&'static str, usize)> {
    let (upstream, names, a, b) = seed_002_setup(storage).await;
    let mut admitted = Vec::new();
    for name in names {
        let path = format!("/{name}");
        let n = two_instances(&a, &b, &upstream, &path, Load::UntilRefused).await;
        admitted.push((name, n));
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_002s_over_grant_test_admits_exactly_40_with_leases_on_redis_cluster_and_sentinel() {
    let redis = RedisServer::start();
    let cluster = common::RedisCluster::start(3);
    let clustered = Config::new()
        .storage("backend", "redis_cluster")
        .storage("urls", &format!("[{}]", cluster.urls().join(", ")));
    let sentinels = common::RedisSentinelSet::start();
    let followed = Config::new()
        .storage("backend", "redis_sentinel")
        .storage(
            "sentinels",
            &format!("[{}]", sentinels.sentinel_urls().join(", ")),
        )
        .storage("master_name", "mymaster");
    for (backend, storage) in [
        ("redis", on_redis(&redis)),
        ("redis_cluster", leased(clustered)),
        ("redis_sentinel", leased(followed)),
    ] {
        let admitted = seed_002(storage).await;
        eprintln!("{backend}: {admitted:?}");
        for (algorithm, n) in admitted {
            assert_eq!(n, 40, "{backend}, {algorithm}: {n} admitted of 40");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_002s_over_grant_test_admits_exactly_40_with_leases_on_postgres() {
    let postgres = common::PostgresServer::start();
    let admitted = seed_002(on_postgres(&postgres)).await;
    eprintln!("postgres: {admitted:?}");
    for (algorithm, n) in admitted {
        assert_eq!(n, 40, "postgres, {algorithm}: {n} admitted of 40");
    }
}

/// `n` busy loops (`yes` into /dev/null) on the machine's cores until dropped: a store that
/// answers late, as it does when other work takes the CPU.
struct BusyLoops(Vec<std::process::Child>);

impl BusyLoops {
    fn start(n: usize) -> BusyLoops {
        BusyLoops(
            (0..n)
                .map(|_| {
                    std::process::Command::new("yes")
                        .stdout(std::process::Stdio::null())
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Seed 002's over-grant test with a store made slow: `storage` (leased, with a 10 ms decision
/// timeout and `on_error: deny`: a request whose decision is late is refused, 503), each algorithm's
/// budget of 40 spent by 64 clients through two instances while two busy loops share the two
/// cores. Many decisions are abandoned at the timeout after the store made them; what the store
/// granted them comes back with the budget's next call. Afterwards, with the machine quiet,
/// [`settle`] sends the last give-backs. Returns what each algorithm admitted and how many 503s the
/// contended phase saw.
async fn seed_002_busy(storage: Config) -> Vec<(&'static str, usize, u32)> {
    let (upstream, names, a, b) = seed_002_setup(storage).await;
    let client = common::client();
    let mut out = Vec::new();
    for name in names {
        let path = format!("/{name}");
        let post = |fg: &Floodgate| {
            client
                .post(fg.url(&path))
                .header("x-api-key", "shared")
                .send()
        };
        // One request first, on a quiet machine: a bucket full but for a late answer's
        // request's worth may not take it back (lease.rs, `Owed::own_at`); under contention it
        // never is full.
        assert_eq!(post(&a).await.expect("send").status(), 200);
        let totals = {
            let _busy = BusyLoops::start(2);
            hammer(
                &[a.url(&path), b.url(&path)],
                "shared",
                64,
                Duration::from_millis(1500),
            )
            .await
        };
        assert!(
            totals.keys().all(|s| [200, 429, 503].contains(s)),
            "only 200, 429 and 503: {totals:?}"
        );
        settle(&a, &b, &path).await;
        let admitted = upstream.seen().iter().filter(|s| s.path == path).count();
        out.push((name, admitted, totals.get(&503).copied().unwrap_or(0)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_002_with_busy_cores_admits_exactly_40_as_late_answers_are_given_back() {
    let redis = RedisServer::start();
    let postgres = common::PostgresServer::start();
    for (backend, storage) in [
        (
            "redis",
            Config::new()
                .storage("backend", "redis")
                .storage("url", &redis.url()),
        ),
        (
            "postgres",
            Config::new()
                .storage("backend", "postgres")
                .storage("url", &postgres.url()),
        ),
    ] {
        let admitted = seed_002_busy(leased_within(storage, "10ms")).await;
        eprintln!("{backend} (algorithm, admitted, 503s): {admitted:?}");
        for (algorithm, n, _) in admitted {
            assert_eq!(n, 40, "{backend}, {algorithm}: {n} admitted of 40");
        }
    }
}
