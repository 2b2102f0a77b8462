//! End to end through the real binary, over TLS: floodgate terminating TLS on its listener (ALPN
//! h2 and HTTP/1.1, rate limits as over cleartext, the handshake timeout, `floodgate check` on bad
//! certificate files), and floodgate speaking HTTPS to upstreams (trusted through `upstream_ca`,
//! refused with 502 when the system's roots do not vouch for them). Certificates are self-signed
//! for `localhost` and 127.0.0.1, made fresh by each test with rcgen.

mod common;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{
    Floodgate, SelfSigned, TempFile, UPSTREAM_BODY, Upstream, assert_admitted, assert_problem,
    assert_rate_limited, client, floodgate_command, get, yaml_path,
};
use http::{StatusCode, Version};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// One route, `/` → `upstream_url`, without limits.
fn route(upstream_url: &str) -> Config {
    Config::new().route(Route::new("r", "/", upstream_url))
}

/// `https://localhost:PORT{path}` on floodgate's TLS listener.
fn https_url(fg: &Floodgate, path: &str) -> String {
    format!("https://localhost:{}{path}", fg.addr().port())
}

#[tokio::test]
async fn a_tls_client_negotiates_h2_and_reaches_a_plain_http1_upstream() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&cert.served(route(&upstream.url())).yaml());

    let reply = get(
        &cert.client(fg.addr(), false),
        &https_url(&fg, "/hello"),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.version, Version::HTTP_2, "ALPN should pick h2");
    assert_eq!(reply.body, UPSTREAM_BODY);

    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/hello");
    assert_eq!(seen[0].version, Version::HTTP_11);
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("https"));
}

#[tokio::test]
async fn an_http1_only_tls_client_is_served_over_http1() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&cert.served(route(&upstream.url())).yaml());

    let reply = get(&cert.client(fg.addr(), true), &https_url(&fg, "/one"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.version, Version::HTTP_11);
    assert_eq!(reply.body, UPSTREAM_BODY);
    assert_eq!(
        upstream.seen()[0].header("x-forwarded-proto"),
        Some("https")
    );
}

#[tokio::test]
async fn rate_limits_apply_over_tls() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    // A bucket of 2 that refills one token every 1000 s: the third request is denied.
    let limited = Route::new("r", "/", &upstream.url()).limit(Limit::token_bucket(2, 0.001));
    let fg = Floodgate::start(&cert.served(Config::new().route(limited)).yaml());
    let client = cert.client(fg.addr(), false);
    let url = https_url(&fg, "/limited");

    assert_admitted(&get(&client, &url, &[]).await, 2, 1);
    assert_admitted(&get(&client, &url, &[]).await, 2, 0);
    let denied = get(&client, &url, &[]).await;
    assert_eq!(denied.version, Version::HTTP_2);
    assert_rate_limited(&denied, 2);
    assert_eq!(
        upstream.count(),
        2,
        "a denied request never reaches the upstream"
    );
}

#[tokio::test]
async fn a_client_that_never_starts_the_handshake_is_disconnected() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(
        &cert
            .served(route(&upstream.url()))
            .timeout("header_read", "1s")
            .yaml(),
    );

    let started = Instant::now();
    let mut stream = TcpStream::connect(fg.addr()).await.expect("connect");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("floodgate closes a silent connection well within 10 s");
    // Closed (EOF) or reset, but never a byte: a TLS server does not speak first.
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // The handshake timeout is header_read (1 s); the lower bound shows the close is that
    // timeout and not an immediate refusal. Timers only fire late, never early.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

/// Runs `floodgate check` on `yaml` and returns its stderr; asserts it failed.
fn check_fails(yaml: &str) -> String {
    let config = TempFile::new(yaml);
    let output = floodgate_command(&[
        OsStr::new("check"),
        OsStr::new("--config"),
        config.path().as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "check passed:\n{stderr}");
    stderr
}

#[test]
fn check_names_a_missing_cert_file() {
    let cert = SelfSigned::new();
    let stderr = check_fails(&format!(
        "listen: 127.0.0.1:0\ntls:\n  cert: /nonexistent/cert.pem\n  key: {}\n",
        yaml_path(&cert.key_file)
    ));
    assert!(
        stderr.contains("tls.cert: cannot read /nonexistent/cert.pem"),
        "{stderr}"
    );
}

#[test]
fn check_names_a_key_file_without_a_key() {
    let cert = SelfSigned::new();
    // The certificate file given as the key: readable PEM, but no private key in it.
    let stderr = check_fails(&format!(
        "listen: 127.0.0.1:0\ntls:\n  cert: {0}\n  key: {0}\n",
        yaml_path(&cert.cert_file)
    ));
    assert!(stderr.contains("tls.key: no private key found"), "{stderr}");
}

#[test]
fn check_names_a_key_that_does_not_match_the_cert() {
    let (cert, other) = (SelfSigned::new(), SelfSigned::new());
    let stderr = check_fails(&format!(
        "listen: 127.0.0.1:0\ntls:\n  cert: {}\n  key: {}\n",
        yaml_path(&cert.cert_file),
        yaml_path(&other.key_file)
    ));
    assert!(stderr.contains("tls.key:"), "{stderr}");
    assert!(
        stderr.contains("does not match the certificate"),
        "{stderr}"
    );
}

#[test]
fn check_names_a_bad_upstream_ca() {
    let cert = SelfSigned::new();
    let stderr = check_fails("listen: 127.0.0.1:0\nupstream_ca: /nonexistent/ca.pem\n");
    assert!(
        stderr.contains("upstream_ca: cannot read /nonexistent/ca.pem"),
        "{stderr}"
    );
    // A key is not a CA bundle.
    let stderr = check_fails(&format!(
        "listen: 127.0.0.1:0\nupstream_ca: {}\n",
        yaml_path(&cert.key_file)
    ));
    assert!(
        stderr.contains("upstream_ca: no certificate found"),
        "{stderr}"
    );
}

#[test]
fn check_accepts_a_valid_tls_config_and_https_upstreams() {
    let cert = SelfSigned::new();
    let config = TempFile::new(
        &cert
            .served(route("https://localhost:8443"))
            .with("listen", "127.0.0.1:0")
            .with("upstream_ca", &yaml_path(&cert.cert_file))
            .yaml(),
    );
    let output = floodgate_command(&[
        OsStr::new("check"),
        OsStr::new("--config"),
        config.path().as_os_str(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn an_https_upstream_trusted_through_upstream_ca_gets_the_request() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start_tls(cert.server_config()).await;
    let upstream_url = format!("https://localhost:{}", upstream.addr().port());
    let fg = Floodgate::start(
        &route(&upstream_url)
            .with("upstream_ca", &yaml_path(&cert.cert_file))
            .yaml(),
    );

    let reply = get(&client(), &fg.url("/secure"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}\n{}", fg.stderr());
    assert_eq!(reply.body, UPSTREAM_BODY);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/secure");
    assert_eq!(
        seen[0].header("host"),
        Some(format!("localhost:{}", upstream.addr().port()).as_str())
    );
    // The client spoke cleartext to floodgate.
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("http"));
}

#[tokio::test]
async fn an_https_upstream_with_an_untrusted_certificate_is_a_502() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start_tls(cert.server_config()).await;
    let upstream_url = format!("https://localhost:{}", upstream.addr().port());
    // No upstream_ca: the system's roots, which do not vouch for a self-signed certificate.
    let fg = Floodgate::start(&route(&upstream_url).yaml());

    let reply = get(&client(), &fg.url("/secure"), &[]).await;
    let body = assert_problem(&reply, StatusCode::BAD_GATEWAY, "upstream_unreachable");
    assert!(
        body["detail"].as_str().is_some_and(|d| d.contains("TLS")),
        "{body}\n{}",
        fg.stderr()
    );
    assert_eq!(
        upstream.count(),
        0,
        "no request is sent over an unverified connection"
    );
}

#[tokio::test]
async fn auto_speaks_http1_to_an_https_upstream_whose_alpn_offers_no_h2() {
    // The upstream's TLS offers no ALPN (an HTTP/1.1 server): `auto` offers h2 and http/1.1,
    // gets neither chosen, and speaks HTTP/1.1, on the first connection and the pooled ones.
    let cert = SelfSigned::new();
    let upstream = Upstream::start_tls(cert.server_config()).await;
    let upstream_url = format!("https://localhost:{}", upstream.addr().port());
    let fg = Floodgate::start(
        &Config::new()
            .with("upstream_ca", &yaml_path(&cert.cert_file))
            .route(Route::new("all", "/", &upstream_url).with("upstream_protocol", "auto"))
            .yaml(),
    );
    for _ in 0..3 {
        let reply = get(&client(), &fg.url("/secure"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}\n{}", fg.stderr());
        assert_eq!(reply.body, UPSTREAM_BODY);
    }
    assert_eq!(upstream.count(), 3);
}
