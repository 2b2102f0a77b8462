//! Routes from the containers (`providers.docker`), driven by a fake Engine API on a Unix
//! socket written here (`common/engine.rs`, in Docker's dialect and Podman's), with real
//! upstreams standing in for the containers: start, health, kill, die, a lost event and the
//! resync that finds it, invalid labels, colliding route names, the engine going away, and the
//! only container recreated while requests wait.
//!
//! Timing: every wait polls for the state it needs, bounded by `SETTLE` (10 s: a change takes one
//! event and one config apply, milliseconds; the bound only keeps a broken build from hanging).

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::time::{Duration, Instant};

use common::{Floodgate, Upstream, metric};
use engine::{Container, Dialect, Engine};

const SETTLE: Duration = Duration::from_secs(10);

fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(common::client).clone()
}

/// The labels of a container of the `rides` service.
const RIDES: &[(&str, &str)] = &[
    ("floodgate.enable", "true"),
    ("floodgate.route.path_prefix", "/rides/"),
];

fn rides(id: &str, upstream: &Upstream) -> Container {
    Container::new(id, "rides", "127.0.0.1", upstream.addr().port(), RIDES)
}

/// floodgate watching `engine`, with a file route of its own.
fn start(engine: &Engine, file_upstream: &Upstream, extra: &str) -> Floodgate {
    Floodgate::start(&format!(
        "admin_listen: 127.0.0.1:0\n\
         providers:\n  docker:\n    endpoint: {}\n{extra}\
         routes:\n  - {{name: file, path_prefix: /file/, upstream: \"{}\"}}\n",
        engine.endpoint(),
        file_upstream.url()
    ))
}

async fn discovered(fg: &Floodgate) -> serde_json::Value {
    let body = client()
        .get(fg.admin_url("/discovered"))
        .send()
        .await
        .expect("GET /discovered")
        .text()
        .await
        .expect("a body");
    serde_json::from_str(&body).expect("JSON")
}

/// Waits until `GET /discovered` satisfies `ready`; returns it.
async fn until(
    fg: &Floodgate,
    what: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let seen = discovered(fg).await;
        if ready(&seen) {
            return seen;
        }
        assert!(
            started.elapsed() < SETTLE,
            "{what}: never seen; last /discovered: {seen:#}\nstderr:\n{}",
            fg.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The states `GET /discovered` gives the containers, by name.
fn states(seen: &serde_json::Value) -> Vec<(String, String)> {
    let mut states: Vec<(String, String)> = seen["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    states.sort();
    states
}

fn has_states(want: &[(&str, &str)]) -> impl Fn(&serde_json::Value) -> bool {
    let mut want: Vec<(String, String)> = want
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect();
    want.sort();
    move |seen| seen["connected"] == true && states(seen) == want
}

async fn get(fg: &Floodgate, path: &str) -> u16 {
    client()
        .get(fg.url(path))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Sends `n` requests to `/rides/x`, each answered 200.
async fn all_served(fg: &Floodgate, n: usize) {
    for _ in 0..n {
        assert_eq!(get(fg, "/rides/x").await, 200, "stderr:\n{}", fg.stderr());
    }
}

#[tokio::test]
async fn containers_join_at_start_and_health_drain_at_kill_and_leave_at_die() {
    let dir = tempfile_dir("follow");
    let engine = Engine::start(&dir, Dialect::Docker).await;
    let (a, b, c, file) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    engine.put(rides("a", &a));
    engine.put(rides("b", &b));
    let fg = start(&engine, &file, "    resync: 10m\n");
    until(
        &fg,
        "two serving",
        has_states(&[("shop-rides-a", "serving"), ("shop-rides-b", "serving")]),
    )
    .await;
    all_served(&fg, 20).await;
    assert!(
        a.count() > 0 && b.count() > 0,
        "balanced: {} and {}",
        a.count(),
        b.count()
    );
    assert_eq!(
        get(&fg, "/file/x").await,
        200,
        "the file's route serves beside them"
    );

    // A container with a health check joins once healthy, not at its start.
    let mut third = rides("c", &c);
    third.health = Some("starting".into());
    engine.put(third);
    engine.event("start", "c");
    until(&fg, "c starting", |s| {
        states(s).contains(&("shop-rides-c".into(), "starting".into()))
    })
    .await;
    all_served(&fg, 10).await;
    assert_eq!(c.count(), 0, "no request to a container still starting");
    engine.update("c", |c| c.health = Some("healthy".into()));
    engine.event("health_status", "c");
    until(&fg, "c serving", |s| {
        states(s).contains(&("shop-rides-c".into(), "serving".into()))
    })
    .await;
    all_served(&fg, 30).await;
    assert!(c.count() > 0, "c serves once healthy");

    // `kill` drains: no new request reaches the container from the event on.
    engine.event("kill", "a");
    until(&fg, "a draining", |s| {
        states(s).contains(&("shop-rides-a".into(), "draining".into()))
    })
    .await;
    let before = a.count();
    all_served(&fg, 30).await;
    assert_eq!(a.count(), before, "a draining container got a request");
    engine.update("a", |c| c.running = false);
    engine.event("die", "a");
    until(
        &fg,
        "a gone",
        has_states(&[("shop-rides-b", "serving"), ("shop-rides-c", "serving")]),
    )
    .await;

    let seen = discovered(&fg).await;
    let b_entry = seen["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "shop-rides-b")
        .unwrap();
    assert_eq!(b_entry["route"], "shop-rides");
    assert_eq!(b_entry["service"], "rides");
    assert_eq!(
        b_entry["endpoint"],
        format!("127.0.0.1:{}", b.addr().port())
    );
    assert_eq!(b_entry["error"], serde_json::Value::Null);
    assert_eq!(metric(&fg, "floodgate_discovery_connected").await, 1);
    assert_eq!(
        metric(&fg, "floodgate_discovery_events_total{action=\"kill\"}").await,
        1
    );
    assert_eq!(
        metric(&fg, "floodgate_discovery_events_total{action=\"die\"}").await,
        1
    );
    // Only the contract's GETs reached the engine.
    for request in engine.requests() {
        let path = request
            .strip_prefix("GET ")
            .unwrap_or_else(|| panic!("not a GET: {request}"));
        let allowed = ["/_ping", "/version", "/containers/json", "/events"].contains(&path)
            || (path.starts_with("/containers/") && path.ends_with("/json"));
        assert!(allowed, "{request}");
    }
}

#[tokio::test]
async fn podmans_dialect_and_a_lost_event_found_by_the_resync() {
    let dir = tempfile_dir("podman");
    let engine = Engine::start(&dir, Dialect::Podman).await;
    let (a, b, file) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    engine.put(rides("a", &a));
    engine.put(rides("b", &b));
    let fg = start(&engine, &file, "    resync: 1s\n");
    until(
        &fg,
        "two serving",
        has_states(&[("shop-rides-a", "serving"), ("shop-rides-b", "serving")]),
    )
    .await;
    // Podman's `died`.
    engine.update("a", |c| c.running = false);
    engine.event("die", "a");
    until(
        &fg,
        "a gone at died",
        has_states(&[("shop-rides-b", "serving")]),
    )
    .await;
    assert_eq!(
        metric(&fg, "floodgate_discovery_events_total{action=\"die\"}").await,
        1
    );
    // A container that comes and one that goes with no event: the next listing (1 s) finds both.
    engine.put(rides("c", &a));
    engine.remove("b");
    until(
        &fg,
        "the resync",
        has_states(&[("shop-rides-c", "serving")]),
    )
    .await;
    all_served(&fg, 10).await;
    assert_eq!(
        b.count(),
        0,
        "b, gone without an event, got no request after the resync"
    );
}

#[tokio::test]
async fn invalid_labels_and_colliding_names_are_reported_and_the_others_serve() {
    let dir = tempfile_dir("invalid");
    let engine = Engine::start(&dir, Dialect::Docker).await;
    let (a, file) = (Upstream::start().await, Upstream::start().await);
    engine.put(rides("a", &a));
    let port = a.addr().port();
    engine.put(Container::new(
        "bad",
        "billing",
        "127.0.0.1",
        port,
        &[
            ("floodgate.enable", "true"),
            ("floodgate.route.path_prefix", "/billing/"),
            (
                "floodgate.route.limits",
                "[{algorithm: token_bucket, capacity: 0, refill_rate: 1}]",
            ),
        ],
    ));
    engine.put(Container::new(
        "rival",
        "other",
        "127.0.0.1",
        port,
        &[
            ("floodgate.enable", "true"),
            ("floodgate.route.name", "shop-rides"),
            ("floodgate.route.path_prefix", "/other/"),
        ],
    ));
    let mut noport = Container::new(
        "noport",
        "maps",
        "127.0.0.1",
        port,
        &[
            ("floodgate.enable", "true"),
            ("floodgate.route.path_prefix", "/maps/"),
        ],
    );
    noport.ports = vec![80, 9000];
    engine.put(noport);
    let fg = start(&engine, &file, "");
    let seen = until(&fg, "all four listed", |s| {
        s["containers"].as_array().is_some_and(|c| c.len() == 4)
    })
    .await;
    let entry = |name: &str| {
        seen["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap()
    };
    let bad = entry("shop-billing-bad");
    assert_eq!(bad["state"], "invalid");
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("floodgate.route.limits[0].capacity"),
        "{bad}"
    );
    let rival = entry("shop-other-rival");
    assert_eq!(rival["state"], "invalid");
    assert!(
        rival["error"].as_str().unwrap().contains("shop-rides-a"),
        "{rival}"
    );
    let kept = entry("shop-rides-a");
    assert_eq!(kept["state"], "serving");
    assert!(
        kept["error"].as_str().unwrap().contains("shop-other-rival"),
        "{kept}"
    );
    let noport = entry("shop-maps-noport");
    assert!(
        noport["error"]
            .as_str()
            .unwrap()
            .contains("floodgate.route.port"),
        "{noport}"
    );
    all_served(&fg, 5).await;
    assert_eq!(
        get(&fg, "/billing/x").await,
        404,
        "the invalid container is not routed"
    );
    assert_eq!(
        get(&fg, "/other/x").await,
        404,
        "the rival's labels are not used"
    );
    assert!(metric(&fg, "floodgate_discovery_errors_total").await >= 3);
    let stderr = fg.stderr();
    assert!(
        stderr.contains("container shop-billing-bad: floodgate.route.limits[0].capacity: "),
        "{stderr}"
    );
    // The dashboard's table of discovered containers, in headless Chromium.
    let (dom, stderr) = common::chromium_dom(&fg.admin_url("/"), 3_000).await;
    assert!(
        dom.contains("data-container=\"shop-rides-a\">serving<"),
        "{dom}\n{stderr}"
    );
    assert!(
        dom.contains("data-container=\"shop-billing-bad\">invalid<"),
        "{dom}"
    );
    assert!(dom.contains("floodgate.route.limits[0].capacity"), "{dom}");
    assert!(dom.contains("engine connected"), "{dom}");
}

#[tokio::test]
async fn the_engine_going_away_keeps_the_routes_serving_and_floodgate_reconnects() {
    let dir = tempfile_dir("away");
    let mut engine = Engine::start(&dir, Dialect::Docker).await;
    let (a, b, file) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    engine.put(rides("a", &a));
    let fg = start(&engine, &file, "");
    until(&fg, "a serving", has_states(&[("shop-rides-a", "serving")])).await;
    engine.stop();
    until(&fg, "disconnected", |s| s["connected"] == false).await;
    all_served(&fg, 10).await;
    assert_eq!(metric(&fg, "floodgate_discovery_connected").await, 0);
    // Back, with a container started while it was away (no event floodgate could see).
    engine.put(rides("b", &b));
    engine.restart();
    until(
        &fg,
        "reconnected and listed",
        has_states(&[("shop-rides-a", "serving"), ("shop-rides-b", "serving")]),
    )
    .await;
    all_served(&fg, 20).await;
    assert!(b.count() > 0);
}

#[tokio::test]
async fn recreating_the_only_container_holds_requests_until_the_new_one_serves() {
    let dir = tempfile_dir("recreate");
    let engine = Engine::start(&dir, Dialect::Docker).await;
    let (old, new, file) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    engine.put(rides("old", &old));
    let fg = start(&engine, &file, "    recreate_grace: 5s\n");
    until(
        &fg,
        "old serving",
        has_states(&[("shop-rides-old", "serving")]),
    )
    .await;
    all_served(&fg, 3).await;
    // compose recreates: kill, die, destroy the old; create and start the new.
    engine.event("kill", "old");
    engine.update("old", |c| c.running = false);
    engine.event("die", "old");
    engine.remove("old");
    engine.event("destroy", "old");
    until(&fg, "old gone", |s| {
        s["containers"].as_array().is_some_and(|c| c.is_empty())
    })
    .await;
    let waiting: Vec<_> = (0..20)
        .map(|_| {
            let url = fg.url("/rides/x");
            tokio::spawn(async move { client().get(url).send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    // The requests are held (not answered 404 or 503) while the new container starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "a request was answered with no container"
    );
    engine.put(rides("new", &new));
    engine.event("start", "new");
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap(), 200);
    }
    assert_eq!(new.count(), 20);
    assert_eq!(
        metric(
            &fg,
            "floodgate_discovery_held_requests_total{outcome=\"served\"}"
        )
        .await,
        20
    );

    // With no container back within the grace: 503 while held, then the route is gone.
    engine.event("kill", "new");
    engine.update("new", |c| c.running = false);
    engine.event("die", "new");
    engine.remove("new");
    until(&fg, "new gone", |s| {
        s["containers"].as_array().is_some_and(|c| c.is_empty())
    })
    .await;
    let started = Instant::now();
    assert_eq!(get(&fg, "/rides/x").await, 503);
    let held = started.elapsed();
    // The grace counts from the loss of the last endpoint: the request waited most of 5 s.
    assert!(held >= Duration::from_secs(3), "held {held:?}");
    assert_eq!(
        metric(
            &fg,
            "floodgate_discovery_held_requests_total{outcome=\"expired\"}"
        )
        .await,
        1
    );
    let gone = Instant::now();
    while get(&fg, "/rides/x").await != 404 {
        assert!(
            gone.elapsed() < SETTLE,
            "the route never left after its grace"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh folder for the engine's socket (a Unix socket path must stay short).
fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fg-engine-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_redeploy_refills_nobody_and_a_sighup_keeps_the_discovered_routes() {
    let dir = tempfile_dir("budget");
    let engine = Engine::start(&dir, Dialect::Docker).await;
    let (old, new, file) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    // Three requests, then one every 1,000 s.
    let limited = |id: &str, upstream: &Upstream| {
        Container::new(
            id,
            "rides",
            "127.0.0.1",
            upstream.addr().port(),
            &[
                ("floodgate.enable", "true"),
                ("floodgate.route.path_prefix", "/rides/"),
                (
                    "floodgate.route.limits",
                    "[{algorithm: token_bucket, capacity: 3, refill_rate: 0.001}]",
                ),
            ],
        )
    };
    engine.put(limited("old", &old));
    let fg = start(&engine, &file, "");
    until(
        &fg,
        "old serving",
        has_states(&[("shop-rides-old", "serving")]),
    )
    .await;
    let keyed = |key: &'static str| {
        let url = fg.url("/rides/x");
        async move {
            client()
                .get(url)
                .header("x-api-key", key)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    for _ in 0..3 {
        assert_eq!(keyed("rider").await, 200);
    }
    assert_eq!(keyed("rider").await, 429);
    // The container replaced by another with the same labels: the same route, the same budget.
    engine.put(limited("new", &new));
    engine.event("start", "new");
    engine.event("kill", "old");
    engine.update("old", |c| c.running = false);
    engine.event("die", "old");
    until(
        &fg,
        "new serving",
        has_states(&[("shop-rides-new", "serving")]),
    )
    .await;
    assert_eq!(
        keyed("rider").await,
        429,
        "the redeploy refilled the budget"
    );
    assert_eq!(keyed("another").await, 200);
    // SIGHUP re-reads the file; the discovered route stays, with its budget.
    let reloads = metric(&fg, "floodgate_config_reloads_total{result=\"success\"}").await;
    fg.signal("HUP");
    let started = Instant::now();
    while metric(&fg, "floodgate_config_reloads_total{result=\"success\"}").await == reloads {
        assert!(started.elapsed() < SETTLE, "no reload");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(keyed("rider").await, 429);
    assert_eq!(get(&fg, "/file/x").await, 200);
    assert_eq!(
        new.count(),
        1,
        "only `another`'s request reached the new container"
    );
}

#[tokio::test]
async fn labels_the_file_refused_are_checked_again_after_a_sighup_fixes_the_file() {
    let dir = tempfile_dir("sighup");
    let engine = Engine::start(&dir, Dialect::Docker).await;
    let (a, file) = (Upstream::start().await, Upstream::start().await);
    // A limit for tier `pro`: no consumer has it until the file gets one.
    engine.put(Container::new(
        "a",
        "rides",
        "127.0.0.1",
        a.addr().port(),
        &[
            ("floodgate.enable", "true"),
            ("floodgate.route.path_prefix", "/rides/"),
            (
                "floodgate.route.limits",
                "[{algorithm: token_bucket, capacity: 5, refill_rate: 1, tiers: [pro]}]",
            ),
        ],
    ));
    let fg = start(&engine, &file, "    resync: 1s\n");
    let seen = until(&fg, "a invalid", has_states(&[("shop-rides-a", "invalid")])).await;
    let error = seen["containers"][0]["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("floodgate.route.limits[0].tiers[0]"),
        "{error}"
    );
    let config = std::fs::read_to_string(fg.config_path()).unwrap();
    std::fs::write(
        fg.config_path(),
        format!(
            "{config}consumers:\n  unknown_key: reject\n  entries:\n    - name: acme\n      tier: pro\n      keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]\n"
        ),
    )
    .unwrap();
    fg.signal("HUP");
    // The next listing (within 1 s) checks the labels again, against the new file.
    until(&fg, "a serving", has_states(&[("shop-rides-a", "serving")])).await;
    let status = client()
        .get(fg.url("/rides/x"))
        .header("x-api-key", "test")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200, "{}", fg.stderr());
}
