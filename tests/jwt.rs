//! Verified bearer tokens (`identity.jwt`) end to end: tokens signed by PyJWT with
//! `cryptography`'s keys (RS256, ES256, EdDSA; `tests/jwt/tokens.py`, in the venv
//! `scripts/test.sh` makes), a JWKS file floodgate reads, and the real binary in front of an
//! upstream that counts what reaches it.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, Upstream, client, get, metric, python};
use http::StatusCode;

/// A folder of its own under the system's temporary one, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("floodgate-jwt-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        TempDir(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Keys, JWKS files and named tokens, made fresh by PyJWT in a temporary folder.
struct Tokens {
    dir: TempDir,
    tokens: HashMap<String, String>,
}

impl Tokens {
    fn make() -> Tokens {
        let dir = TempDir::new();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jwt/tokens.py");
        let out = std::process::Command::new(python())
            .arg(&script)
            .arg(dir.path())
            .output()
            .expect("run tokens.py");
        assert!(
            out.status.success(),
            "tokens.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tokens = serde_json::from_slice(&out.stdout).expect("tokens.py prints JSON");
        Tokens { dir, tokens }
    }

    fn get(&self, name: &str) -> &str {
        &self.tokens[name]
    }

    fn jwks(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// `identity.jwt` reading `jwks_file`, issuer and audience as tokens.py signs them, the tier from
/// `plan`; one route `/` allowing 2 requests an hour per identity (tiers `default` and
/// `anonymous`), 3 for the tier `pro`.
fn config(upstream: &Upstream, jwks_file: &str) -> Config {
    Config::new()
        .set(
            "identity",
            "jwt",
            &format!(
                "{{jwks_file: {jwks_file}, issuer: \"https://issuer.test/\", audiences: [rides-api], \
                 algorithms: [RS256, ES256, EdDSA], tier_claim: plan}}"
            ),
        )
        .route(
            Route::new("api", "/", &upstream.url())
                .limit(Limit::fixed_window(2, "1h").tiers(&["default", "anonymous"]))
                .limit(Limit::fixed_window(3, "1h").tiers(&["pro"])),
        )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// The statuses of `n` requests with `token`.
async fn statuses(fg: &Floodgate, token: &str, n: usize) -> Vec<u16> {
    let client = client();
    let mut out = Vec::new();
    for _ in 0..n {
        let auth = bearer(token);
        let reply = get(&client, &fg.url("/"), &[("authorization", auth.as_str())]).await;
        out.push(reply.status.as_u16());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_with_valid_tokens_have_their_own_budgets_and_bad_tokens_never_reach_the_upstream() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream, &tokens.jwks("jwks.json")).yaml());

    // Two users, two budgets of 2; alice's second token is the same subject, the same budget.
    assert_eq!(statuses(&fg, tokens.get("alice"), 2).await, [200, 200]);
    assert_eq!(statuses(&fg, tokens.get("alice_again"), 1).await, [429]);
    assert_eq!(statuses(&fg, tokens.get("bob"), 3).await, [200, 200, 429]);
    // carol's token says `plan: pro`: the pro tier's limit applies to her.
    assert_eq!(
        statuses(&fg, tokens.get("carol_pro"), 4).await,
        [200, 200, 200, 429]
    );
    // fay's says `plan: free`, a tier no limit names: the client's word, not the operator's,
    // so she is limited as `default` (before: unlimited).
    assert_eq!(
        statuses(&fg, tokens.get("fay_free"), 3).await,
        [200, 200, 429]
    );
    assert_eq!(upstream.seen().len(), 9);

    // Each refused for one reason; none reaches the upstream, each is told why in the
    // standard way (RFC 6750).
    let client = client();
    for name in [
        "forged",
        "expired",
        "not_yet",
        "wrong_audience",
        "wrong_issuer",
        "alg_none",
        "garbage",
        "dave_rotated",
        "crit_unknown",
        "crit_b64",
        "iat_future",
        "iss_list",
        "aud_object",
        "exp_string",
    ] {
        let auth = bearer(tokens.get(name));
        let reply = get(&client, &fg.url("/"), &[("authorization", auth.as_str())]).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{name}");
        assert_eq!(
            reply.headers["www-authenticate"], "Bearer error=\"invalid_token\"",
            "{name}"
        );
        assert_eq!(
            reply.headers["content-type"], "application/problem+json",
            "{name}"
        );
        assert!(
            reply.body.contains("\"invalid_token\""),
            "{name}: {}",
            reply.body
        );
    }
    assert_eq!(upstream.seen().len(), 9, "no refused token was forwarded");

    // No token: the address is the identity (falls through, the default).
    let reply = get(&client, &fg.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);

    // The keys in the store and the log never hold a token.
    let log = fg.stderr();
    for token in tokens.tokens.values() {
        assert!(!log.contains(token.as_str()), "a token is in the log");
    }
    assert_eq!(
        metric(
            &fg,
            "floodgate_requests_total{route=\"api\",decision=\"invalid_key\"}"
        )
        .await,
        14
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_rotated_on_sighup_verifies_the_new_key_and_no_longer_the_old() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let jwks = tokens.jwks("jwks.json");
    let fg = Floodgate::start(&config(&upstream, &jwks).yaml());
    assert_eq!(statuses(&fg, tokens.get("alice"), 1).await, [200]);
    assert_eq!(statuses(&fg, tokens.get("dave_rotated"), 1).await, [401]);

    // The issuer rotates its keys: the file is rewritten, floodgate told with SIGHUP.
    let rotated = std::fs::read(tokens.jwks("jwks-rotated.json")).expect("read");
    std::fs::write(&jwks, rotated).expect("rotate the JWKS");
    let reloads = r#"floodgate_config_reloads_total{result="success"}"#;
    let before = metric(&fg, reloads).await;
    fg.signal("HUP");
    // The reload runs on its own task: a few ms; 10 s for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&fg, reloads).await == before {
        assert!(Instant::now() < deadline, "no reload: {}", fg.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(statuses(&fg, tokens.get("dave_rotated"), 1).await, [200]);
    assert_eq!(statuses(&fg, tokens.get("alice"), 1).await, [401]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_missing_reject_refuses_a_request_without_a_token() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let yaml = Config::new()
        .set(
            "identity",
            "jwt",
            &format!(
                "{{jwks_file: {}, audiences: [rides-api], when_missing: reject}}",
                tokens.jwks("jwks.json")
            ),
        )
        .route(Route::new("open", "/", &upstream.url()))
        .yaml();
    let fg = Floodgate::start(&yaml);
    let reply = get(&client(), &fg.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    // Even on a route without limits, a token is checked.
    assert_eq!(statuses(&fg, tokens.get("forged"), 1).await, [401]);
    assert_eq!(statuses(&fg, tokens.get("bob"), 1).await, [200]);
    assert_eq!(upstream.seen().len(), 1);
}

#[test]
fn check_names_every_bad_jwt_setting() {
    let tokens = Tokens::make();
    let broken = tokens.dir.path().join("broken.json");
    std::fs::write(&broken, "{\"keys\": [{\"kty\": \"RSA\"}]}").expect("write");
    let cases = [
        (
            format!(
                "{{jwks_file: {}, algorithms: [RS256, none]}}",
                tokens.jwks("jwks.json")
            ),
            "identity.jwt.algorithms[1]",
        ),
        (
            format!(
                "{{jwks_file: {}, algorithms: [HS256]}}",
                tokens.jwks("jwks.json")
            ),
            "identity.jwt.algorithms[0]",
        ),
        (
            format!("{{jwks_file: {}}}", broken.display()),
            "identity.jwt.jwks_file",
        ),
        (
            "{jwks_file: /no/such/jwks.json}".to_string(),
            "identity.jwt.jwks_file",
        ),
        ("{audiences: [x]}".to_string(), "identity.jwt.jwks_file"),
        (
            format!(
                "{{hmac_secret_file: {}, algorithms: [HS256]}}",
                tokens.jwks("short.secret")
            ),
            "identity.jwt.hmac_secret_file",
        ),
        (
            format!("{{hmac_secret_file: {}}}", tokens.jwks("hmac.secret")),
            "identity.jwt.algorithms",
        ),
        (
            "{jwks_url: \"ftp://issuer.test/jwks\"}".to_string(),
            "identity.jwt.jwks_url",
        ),
        (
            format!(
                "{{jwks_file: {}, jwks_url: \"https://issuer.test/jwks\"}}",
                tokens.jwks("jwks.json")
            ),
            "identity.jwt.jwks_url",
        ),
        (
            format!("{{jwks_file: {}, leeway: soon}}", tokens.jwks("jwks.json")),
            "identity.jwt.leeway",
        ),
    ];
    for (jwt, field) in cases {
        let yaml = Config::new()
            .with("listen", "127.0.0.1:0")
            .set("identity", "jwt", &jwt)
            .route(Route::new("api", "/", "http://127.0.0.1:9"))
            .yaml();
        common::check_names(&yaml, &[field]);
    }
}

/// `per: "claim:org"`: one budget per organisation, whoever of it asks; a token without the
/// claim spends its subject's own budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_keys_a_budget_shared_by_every_subject_that_carries_it() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let yaml = Config::new()
        .set(
            "identity",
            "jwt",
            &format!(
                "{{jwks_file: {}, issuer: \"https://issuer.test/\", audiences: [rides-api]}}",
                tokens.jwks("jwks.json")
            ),
        )
        .route(
            Route::new("api", "/", &upstream.url())
                .limit(Limit::fixed_window(2, "1h").per(r#""claim:org""#)),
        )
        .yaml();
    let fg = Floodgate::start(&yaml);
    assert_eq!(statuses(&fg, tokens.get("erin_acme"), 1).await, [200]);
    assert_eq!(statuses(&fg, tokens.get("frank_acme"), 2).await, [200, 429]);
    assert_eq!(statuses(&fg, tokens.get("erin_acme"), 1).await, [429]);
    assert_eq!(statuses(&fg, tokens.get("gina_beta"), 1).await, [200]);
    // No `org` claim: alice's own budget of 2, not one shared by all who lack the claim.
    assert_eq!(statuses(&fg, tokens.get("alice"), 3).await, [200, 200, 429]);
    assert_eq!(statuses(&fg, tokens.get("bob"), 1).await, [200]);
    assert_eq!(upstream.seen().len(), 6);

    // /budgets by a token's subject, and by the claim a composite key reads.
    let remaining = |query: &str| {
        let url = fg.admin_url(&format!("/budgets?route=api&{query}"));
        async move { get(&client(), &url, &[]).await.json()["limits"][0]["remaining"].clone() }
    };
    assert_eq!(remaining("jwt_subject=erin&claim:org=acme").await, 0);
    assert_eq!(remaining("jwt_subject=erin&claim:org=beta").await, 1);
    assert_eq!(remaining("jwt_subject=alice").await, 0);
    assert_eq!(remaining("jwt_subject=bob").await, 1);
}

/// An issuer's JWKS endpoint: a real HTTP server on port 0 serving whichever document it was
/// last given (503 when none), counting the fetches.
struct JwksServer {
    url: String,
    document: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// While set, a request is accepted and never answered.
    hang: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Connections open now, and the most there ever were.
    open: std::sync::Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
}

impl JwksServer {
    async fn start(document: String) -> JwksServer {
        use http_body_util::Full;
        use hyper::service::service_fn;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        use std::sync::atomic::Ordering::SeqCst;
        let served = std::sync::Arc::new(std::sync::Mutex::new(Some(document)));
        let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hang = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open: std::sync::Arc<(
            std::sync::atomic::AtomicUsize,
            std::sync::atomic::AtomicUsize,
        )> = std::sync::Arc::new(Default::default());
        let (doc, count, hanging, opened) =
            (served.clone(), fetches.clone(), hang.clone(), open.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (doc, count, hanging) = (doc.clone(), count.clone(), hanging.clone());
                let opened = opened.clone();
                let now = opened.0.fetch_add(1, SeqCst) + 1;
                opened.1.fetch_max(now, SeqCst);
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        count.fetch_add(1, SeqCst);
                        let body = doc.lock().unwrap().clone();
                        let hang = hanging.load(SeqCst);
                        async move {
                            if hang {
                                std::future::pending::<()>().await;
                            }
                            let response = match body {
                                Some(body) => {
                                    http::Response::new(Full::new(bytes::Bytes::from(body)))
                                }
                                None => http::Response::builder()
                                    .status(503)
                                    .body(Full::new(bytes::Bytes::new()))
                                    .unwrap(),
                            };
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                    opened.0.fetch_sub(1, SeqCst);
                });
            }
        });
        JwksServer {
            url,
            document: served,
            fetches,
            hang,
            open,
        }
    }

    fn hang(&self, hang: bool) {
        self.hang.store(hang, std::sync::atomic::Ordering::SeqCst);
    }

    fn most_open(&self) -> usize {
        self.open.1.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn serve(&self, document: Option<String>) {
        *self.document.lock().unwrap() = document;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `identity.jwt` with the keys `issuer` serves (`jwks_url`), one route `/` to `upstream`.
fn from_issuer(issuer: &JwksServer, upstream: &Upstream) -> String {
    Config::new()
        .set(
            "identity",
            "jwt",
            &format!(
                "{{jwks_url: \"{}\", issuer: \"https://issuer.test/\", audiences: [rides-api]}}",
                issuer.url
            ),
        )
        .route(Route::new("api", "/", &upstream.url()))
        .yaml()
}

/// `jwks_url`: the set is fetched at start; a key rotated in at the issuer is found at its first
/// token (one fetch, shared by a burst); tokens naming keys nobody has cost the issuer at most
/// one fetch per 5 s; when the issuer fails, the keys fetched are kept.
///
/// Timing: the sleeps are 5.2 s against floodgate's 5 s least gap (measured from a fetch's
/// start, before the sleep begins), so each later fetch is allowed whatever the load; the
/// "no fetch" checks run right after a fetch, and would only see another if the machine stalled
/// 5 s between two local requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_is_fetched_cached_and_fetched_again_for_a_new_key() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let read = |name: &str| std::fs::read_to_string(tokens.jwks(name)).expect("read");
    let issuer = JwksServer::start(read("jwks.json")).await;
    let yaml = from_issuer(&issuer, &upstream);
    let fg = Floodgate::start(&yaml);
    assert_eq!(statuses(&fg, tokens.get("alice"), 3).await, [200, 200, 200]);
    assert_eq!(statuses(&fg, tokens.get("bob"), 1).await, [200]);
    assert_eq!(issuer.fetches(), 1, "fetched once at start, then cached");

    // The issuer rotates to a new key. More than 5 s after the first fetch (the least gap
    // between two), dave's token names it: fetched again, once, for a burst of eight.
    issuer.serve(Some(read("jwks-rotated.json")));
    tokio::time::sleep(Duration::from_millis(5200)).await;
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let fg_url = fg.url("/");
            let auth = bearer(tokens.get("dave_rotated"));
            tokio::spawn(async move {
                get(&client(), &fg_url, &[("authorization", auth.as_str())])
                    .await
                    .status
                    .as_u16()
            })
        })
        .collect();
    for request in burst {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(issuer.fetches(), 2, "one fetch for the burst");
    // The old key is gone from the set; tokens naming keys the set never had (alice's rsa-1
    // now) are refused without another fetch inside the gap.
    assert_eq!(statuses(&fg, tokens.get("alice"), 5).await, [401; 5]);
    assert_eq!(issuer.fetches(), 2, "no fetch within 5 s of the last");

    // The issuer fails: the keys fetched are kept.
    issuer.serve(None);
    tokio::time::sleep(Duration::from_millis(5200)).await;
    assert_eq!(statuses(&fg, tokens.get("alice"), 1).await, [401]);
    assert_eq!(
        issuer.fetches(),
        3,
        "alice's unknown key asked once more, and it failed"
    );
    assert_eq!(statuses(&fg, tokens.get("dave_rotated"), 1).await, [200]);
    assert_eq!(upstream.seen().len(), 4 + 8 + 1);
}

/// HS256 with a shared secret (`hmac_secret_file`) beside a JWKS: a token signed with the secret
/// is verified, one signed with another secret is refused, and without HS256 in `algorithms`
/// (the default) an HMAC token is refused whatever its signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs256_is_taken_only_with_its_configured_secret() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let jwt = |algorithms: &str| {
        Config::new()
            .set(
                "identity",
                "jwt",
                &format!(
                    "{{jwks_file: {}, hmac_secret_file: {}, algorithms: [{algorithms}], \
                     issuer: \"https://issuer.test/\", audiences: [rides-api]}}",
                    tokens.jwks("jwks.json"),
                    tokens.jwks("hmac.secret")
                ),
            )
            .route(Route::new("api", "/", &upstream.url()))
            .yaml()
    };
    let fg = Floodgate::start(&jwt("RS256, HS256"));
    assert_eq!(statuses(&fg, tokens.get("hank_hmac"), 1).await, [200]);
    assert_eq!(
        statuses(&fg, tokens.get("hank_other_secret"), 1).await,
        [401]
    );
    assert_eq!(statuses(&fg, tokens.get("alice"), 1).await, [200]);
    drop(fg);
    let fg = Floodgate::start(&jwt("RS256, HS384"));
    assert_eq!(statuses(&fg, tokens.get("hank_hmac"), 1).await, [401]);
    assert_eq!(upstream.seen().len(), 2);
}

/// One request's status and how long it took.
async fn timed(fg: &Floodgate, token: &str) -> (u16, Duration) {
    let started = std::time::Instant::now();
    let status = statuses(fg, token, 1).await[0];
    (status, started.elapsed())
}

/// A JWKS endpoint that accepts and never answers holds no request: tokens whose keys are held
/// are decided at once while its fetch hangs; a token whose key is unknown waits for the fetch
/// in flight 0.5 s at most, then gets its 401; the endpoint sees one connection at a time.
///
/// Timing: the bounds asserted are 2 s for a wait of 0.5 s (a loaded two-core machine adds a
/// few hundred ms at most), against the 5 s fetch timeout a request used to wait for (9.6 s
/// seen); the 5.2 s sleep passes floodgate's 5 s least gap between fetches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_endpoint_that_hangs_holds_no_request() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    let read = |name: &str| std::fs::read_to_string(tokens.jwks(name)).expect("read");
    let issuer = JwksServer::start(read("jwks.json")).await;
    issuer.hang(true);
    let yaml = from_issuer(&issuer, &upstream);
    // Started while the issuer hangs: no key yet; a token waits 0.5 s at most for the fetch.
    let fg = Floodgate::start(&yaml);
    let (status, took) = timed(&fg, tokens.get("alice")).await;
    assert_eq!(status, 401);
    assert!(took < Duration::from_secs(2), "held {took:?}");

    // The issuer answers again; once the hanging fetch has timed out (5 s) a token brings a
    // new fetch, and alice's key is found.
    issuer.hang(false);
    tokio::time::sleep(Duration::from_millis(5200)).await;
    assert_eq!(statuses(&fg, tokens.get("alice"), 1).await, [200]);

    // It hangs again. dave's key is unknown: his token starts a fetch that hangs, and waits
    // for it 0.5 s at most; alice's, whose key is held, are decided at once meanwhile.
    issuer.hang(true);
    tokio::time::sleep(Duration::from_millis(5200)).await;
    let (status, took) = timed(&fg, tokens.get("dave_rotated")).await;
    assert_eq!(status, 401);
    assert!(took < Duration::from_secs(2), "dave held {took:?}");
    for _ in 0..3 {
        let (status, took) = timed(&fg, tokens.get("bob")).await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(1), "a known key held {took:?}");
    }
    // A burst naming unknown keys while the fetch hangs: each 401 within the bound, and no
    // second connection to the issuer.
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let (fg_url, auth) = (fg.url("/"), bearer(tokens.get("dave_rotated")));
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let status = get(&client(), &fg_url, &[("authorization", auth.as_str())])
                    .await
                    .status
                    .as_u16();
                (status, started.elapsed())
            })
        })
        .collect();
    for request in burst {
        let (status, took) = request.await.unwrap();
        assert_eq!(status, 401);
        assert!(took < Duration::from_secs(2), "held {took:?}");
    }
    assert_eq!(
        issuer.most_open(),
        1,
        "one connection to the issuer at a time"
    );
}

/// `floodgate replay` of the proxy's own access log reaches the live proxy's decision for every
/// request of verified tokens whose tier comes from a claim: the log records the tier, and the
/// tier rule is the policy's (`Policy::resolve`), which replay shares. Before, replay limited
/// every token's subject as `anonymous` (a `pro` token's third request, allowed live, was denied
/// in replay; the exempt route's `pro` requests counted against a limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_agrees_with_the_live_proxy_on_tiers_from_token_claims() {
    let tokens = Tokens::make();
    let upstream = Upstream::start().await;
    // `/open` first (the first match wins), exempting `pro`; then `/` as `config` has it.
    let jwt = format!(
        "{{jwks_file: {}, issuer: \"https://issuer.test/\", audiences: [rides-api], \
         algorithms: [RS256, ES256, EdDSA], tier_claim: plan}}",
        tokens.jwks("jwks.json")
    );
    let yaml = Config::new()
        .with("log_format", "json")
        .set("identity", "jwt", &jwt)
        .route(
            Route::new("open", "/open", &upstream.url())
                .with("exempt", "{tiers: [pro]}")
                .limit(Limit::fixed_window(1, "1h")),
        )
        .route(
            Route::new("api", "/", &upstream.url())
                .limit(Limit::fixed_window(2, "1h").tiers(&["default", "anonymous"]))
                .limit(Limit::fixed_window(3, "1h").tiers(&["pro"])),
        )
        .yaml();
    let fg = Floodgate::start_with_env(&yaml, &[("RUST_LOG", "warn,floodgate::access=info")]);
    let client = client();
    let mut live = HashMap::new();
    for (path, token, n) in [
        ("/x", "alice", 4),
        ("/x", "carol_pro", 5),
        ("/x", "fay_free", 4),
        ("/open/y", "carol_pro", 3),
        ("/open/y", "alice", 2),
    ] {
        for _ in 0..n {
            let auth = bearer(tokens.get(token));
            let status = get(&client, &fg.url(path), &[("authorization", auth.as_str())])
                .await
                .status;
            *live.entry((path, token, status.as_u16())).or_insert(0) += 1;
        }
    }
    // The live decisions, as the tiers say: anonymous 2, pro 3, an unknown tier as default 2;
    // pro exempt on /open, alice 1 there.
    assert_eq!(live[&("/x", "alice", 200)], 2);
    assert_eq!(live[&("/x", "carol_pro", 200)], 3);
    assert_eq!(live[&("/x", "fay_free", 200)], 2);
    assert_eq!(live[&("/open/y", "carol_pro", 200)], 3);
    assert_eq!(live[&("/open/y", "alice", 200)], 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(log_has_tiers(&fg.stderr()), "the log records the tiers");
    let report = common::replay_own_log(&fg);
    for route in report["routes"].as_array().expect("routes") {
        let compared = &route["agreement"]["compared"];
        assert_eq!(&route["agreement"]["agreed"], compared, "{report}");
    }
    assert_eq!(report["routes"][0]["requests"], 5);
    assert_eq!(report["routes"][1]["requests"], 13);
}

fn log_has_tiers(log: &str) -> bool {
    [
        "\"tier\":\"pro\"",
        "\"tier\":\"default\"",
        "\"tier\":\"anonymous\"",
    ]
    .iter()
    .all(|t| log.contains(t))
}
