//! ACME against Pebble (Let's Encrypt's test CA, Debian's `pebble`) on loopback: HTTP-01 on
//! `http_listen` and TLS-ALPN-01 on `listen`, the issued chain verified against Pebble's root; a
//! restart on `tls.acme.dir` ordering nothing new; two instances on one Redis making one order
//! and serving the same certificate, renewing it without a restart, and, with Pebble stopped
//! during a renewal, serving the old one until Pebble is back and the retried order succeeds.
//!
//! Pebble validates at fixed ports (its config's `httpPort` and `tlsPort`): each test takes free
//! ports and gives them to floodgate. Every wait is a deadline, not a sleep: an order on this
//! machine takes well under a second; renewals follow the certificates' own short lifetimes.

mod common;

use std::time::{Duration, Instant};

use common::{Floodgate, Pebble, RedisServer, TempDir, Upstream, free_port, yaml_path};

/// The floodgate config serving `domain` from ACME at `pebble` with `challenge`, listening on
/// `listen` (and `http_listen` for HTTP-01), keeping its state in `dir` (memory store) or the
/// store `storage` names.
fn config(
    pebble: &Pebble,
    domain: &str,
    challenge: &str,
    listen: u16,
    http_listen: Option<u16>,
    keep: &str,
    upstream: &Upstream,
) -> String {
    let http = http_listen.map_or(String::new(), |p| format!("http_listen: 127.0.0.1:{p}\n"));
    format!(
        "listen: 127.0.0.1:{listen}\n{http}admin_listen: 127.0.0.1:0\n\
         tls:\n  acme: {{directory: '{}', ca: {}, challenge: {challenge}, email: ops@example.test{keep}}}\n\
         routes:\n  - {{name: r, path_prefix: /, upstream: '{}', hosts: [{domain}]}}\n",
        pebble.directory(),
        yaml_path_of(&pebble.https_ca.cert_file),
        upstream.url(),
    )
}

fn yaml_path_of(file: &common::TempFile) -> String {
    yaml_path(file)
}

/// The certificate `fg` serves for `domain` (DER), verified against `root`; none while the
/// handshake fails to verify (the fallback is served before the first issuance).
async fn served(fg_port: u16, domain: &str, root: &str) -> Option<Vec<u8>> {
    let root = reqwest::Certificate::from_pem(root.as_bytes()).ok()?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([root])
        .tls_info(true)
        .resolve(domain, ([127, 0, 0, 1], fg_port).into())
        .pool_max_idle_per_host(0)
        .build()
        .ok()?;
    let response = client
        .get(format!("https://{domain}:{fg_port}/"))
        .send()
        .await
        .ok()?;
    assert_eq!(response.status().as_u16(), 200);
    let info = response.extensions().get::<reqwest::tls::TlsInfo>()?;
    info.peer_certificate().map(<[u8]>::to_vec)
}

/// Waits until `fg` serves `domain` a certificate chaining to Pebble's root that `accept`s.
async fn until_served(
    fg: &Floodgate,
    port: u16,
    domain: &str,
    pebble: &Pebble,
    within: Duration,
    accept: impl Fn(&[u8]) -> bool,
) -> Vec<u8> {
    let deadline = Instant::now() + within;
    loop {
        let root = pebble.root().await;
        if let Some(cert) = served(port, domain, &root).await
            && accept(&cert)
        {
            return cert;
        }
        assert!(
            Instant::now() < deadline,
            "no certificate for {domain} within {within:?}:\n{}",
            fg.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `floodgate_acme_orders_total{outcome}` on `fg`'s admin listener.
async fn orders(fg: &Floodgate, outcome: &str) -> u64 {
    let text = reqwest::get(fg.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = format!("floodgate_acme_orders_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn http_01_issues_a_certificate_and_a_restart_on_the_kept_dir_orders_nothing_new() {
    let (http_port, listen) = (free_port(), free_port());
    let pebble = Pebble::start(http_port, free_port(), 3600);
    let upstream = Upstream::start().await;
    let dir = TempDir::new("acme-dir");
    let keep = format!(", dir: {:?}", dir.path().display().to_string());
    let yaml = config(
        &pebble,
        "http01.test",
        "http-01",
        listen,
        Some(http_port),
        &keep,
        &upstream,
    );
    let fg = Floodgate::start_file(&yaml, &[]);
    let first = until_served(
        &fg,
        listen,
        "http01.test",
        &pebble,
        Duration::from_secs(30),
        |_| true,
    )
    .await;
    assert_eq!(orders(&fg, "issued").await, 1);
    let metrics = reqwest::get(fg.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let expiry = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("floodgate_tls_certificate_expiry_seconds{name=\"http01.test\"} ")
        })
        .expect("the expiry gauge");
    let seconds: i64 = expiry.trim().parse().unwrap();
    assert!((3000..=3600).contains(&seconds), "{seconds}");
    // http_listen: anything but a challenge goes to https on `listen`'s port.
    let plain = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = plain
        .get(format!("http://127.0.0.1:{http_port}/rides?x=1"))
        .header("host", "http01.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 308);
    assert_eq!(
        r.headers()["location"],
        format!("https://http01.test:{listen}/rides?x=1").as_str()
    );

    // A restart finds the certificate kept in the directory: the same one, no order.
    drop(fg);
    let fg = Floodgate::start_file(&yaml, &[]);
    let again = until_served(
        &fg,
        listen,
        "http01.test",
        &pebble,
        Duration::from_secs(10),
        |_| true,
    )
    .await;
    assert_eq!(again, first);
    assert_eq!(orders(&fg, "issued").await, 0);
}

#[tokio::test]
async fn two_instances_on_one_redis_order_once_renew_and_ride_out_a_ca_outage() {
    // Pebble validates TLS-ALPN-01 at instance A's port; B answers there only through A (the
    // store carries the challenge), whichever instance ordered.
    let (a_port, b_port) = (free_port(), free_port());
    // 30 s certificates: renewed when 10 s are left, every ~20 s.
    let mut pebble = Pebble::start(free_port(), a_port, 30);
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let keep = String::new();
    let env = [("FLOODGATE_REDIS_URL", redis.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let with_redis = |listen: u16| {
        config(
            &pebble,
            "shared.test",
            "tls-alpn-01",
            listen,
            None,
            &keep,
            &upstream,
        ) + "storage: {backend: redis, url: 'redis://unused'}\n"
    };
    let a = Floodgate::start_file(&with_redis(a_port), &env);
    let b = Floodgate::start_file(&with_redis(b_port), &env);
    let from_a = until_served(
        &a,
        a_port,
        "shared.test",
        &pebble,
        Duration::from_secs(30),
        |_| true,
    )
    .await;
    let from_b = until_served(
        &b,
        b_port,
        "shared.test",
        &pebble,
        Duration::from_secs(30),
        |c| c == from_a.as_slice(),
    )
    .await;
    assert_eq!(from_a, from_b);
    assert_eq!(
        orders(&a, "issued").await + orders(&b, "issued").await,
        1,
        "one order for both"
    );

    // Renewed without a restart: a new certificate, on both.
    let renewed = until_served(
        &a,
        a_port,
        "shared.test",
        &pebble,
        Duration::from_secs(40),
        |c| c != from_a.as_slice(),
    )
    .await;
    until_served(
        &b,
        b_port,
        "shared.test",
        &pebble,
        Duration::from_secs(30),
        |c| c == renewed.as_slice(),
    )
    .await;

    // The CA goes away before the next renewal: the current certificate keeps serving past its
    // renewal time, and the failed orders are counted.
    pebble.stop();
    let due = Instant::now() + Duration::from_secs(25);
    while Instant::now() < due {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let failed = orders(&a, "failed").await + orders(&b, "failed").await;
    assert!(failed >= 1, "the renewal was tried");
    // (Pebble's root is gone with it: the certificate is read without verification here.)
    let still = served_unverified(a_port, "shared.test").await;
    assert_eq!(still, renewed, "the current certificate keeps serving");

    // Back (with a new root and no memory of the account): the retried order succeeds.
    pebble.resume();
    until_served(
        &a,
        a_port,
        "shared.test",
        &pebble,
        Duration::from_secs(60),
        |c| c != renewed.as_slice(),
    )
    .await;
}

/// The certificate served for `domain`, whatever signed it.
async fn served_unverified(port: u16, domain: &str) -> Vec<u8> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .tls_danger_accept_invalid_certs(true)
        .tls_info(true)
        .resolve(domain, ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    let response = client
        .get(format!("https://{domain}:{port}/"))
        .send()
        .await
        .unwrap();
    let info = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .unwrap();
    info.peer_certificate().unwrap().to_vec()
}
