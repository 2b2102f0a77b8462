//! Certificates through the real binary: several chosen by SNI (exact beats wildcard, the first
//! for everything else, a reload swapping them for new connections), client certificates
//! (required, optional, from another CA, and as the identity whose budget a request spends), and
//! `floodgate check` on the mistakes. Every certificate is made fresh by a test CA (rcgen); the
//! clients are reqwest over rustls, which reports the certificate it was served.

mod common;

use std::ffi::OsStr;
use std::time::Duration;

use common::config::{Config, Limit, Route};
use common::{Floodgate, Leaf, TestCa, Upstream, floodgate_command, yaml_path};

/// A client of floodgate's TLS listener at `name` (sent as SNI), trusting `ca`, that reports the
/// certificate it was served; `verify: false` accepts any (a name no certificate serves).
fn client(fg: &Floodgate, name: &str, ca: &TestCa, verify: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca.cert_pem.as_bytes()).unwrap();
    reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([ca])
        .tls_danger_accept_invalid_certs(!verify)
        .tls_info(true)
        .resolve(name, fg.addr())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// The certificate floodgate served for a GET of `url`.
async fn served(client: &reqwest::Client, url: &str) -> Vec<u8> {
    let response = client.get(url).send().await.expect("a TLS response");
    assert_eq!(response.status().as_u16(), 200);
    let info = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .expect("TLS info");
    info.peer_certificate().expect("a certificate").to_vec()
}

fn certificates(leaves: &[&Leaf]) -> String {
    let list: Vec<String> = leaves
        .iter()
        .map(|l| {
            format!(
                "{{cert: {}, key: {}}}",
                yaml_path(&l.cert_file),
                yaml_path(&l.key_file)
            )
        })
        .collect();
    format!("{{certificates: [{}]}}", list.join(", "))
}

#[tokio::test]
async fn sni_chooses_among_three_certificates_and_a_reload_swaps_them_for_new_connections() {
    let ca = TestCa::new("floodgate test CA");
    let first = ca.server(&["default.test"]);
    let wildcard = ca.server(&["*.example.test"]);
    let exact = ca.server(&["api.example.test"]);
    let upstream = Upstream::start().await;
    let config = |tls: String| {
        Config::new()
            .with("tls", &tls)
            .route(Route::new("r", "/", &upstream.url()))
    };
    let fg = Floodgate::start(&config(certificates(&[&first, &wildcard, &exact])).yaml());
    let port = fg.addr().port();
    let at = |name: &str| format!("https://{name}:{port}/");

    for (name, leaf) in [
        ("api.example.test", &exact),
        ("API.Example.Test", &exact),
        ("www.example.test", &wildcard),
        ("default.test", &first),
    ] {
        let c = client(&fg, name, &ca, true);
        assert_eq!(
            served(&c, &at(name)).await,
            leaf.cert_der.to_vec(),
            "{name}"
        );
    }
    // A wildcard covers one label; a name nothing serves, and no SNI at all (an address), get
    // the first.
    for name in ["a.b.example.test", "other.test"] {
        let c = client(&fg, name, &ca, false);
        assert_eq!(
            served(&c, &at(name)).await,
            first.cert_der.to_vec(),
            "{name}"
        );
    }
    let c = client(&fg, "unused.test", &ca, false);
    assert_eq!(
        served(&c, &format!("https://127.0.0.1:{port}/")).await,
        first.cert_der.to_vec(),
        "no SNI"
    );

    // A new certificate for the exact name, on SIGHUP: new connections get it.
    let renewed = ca.server(&["api.example.test"]);
    let reloaded = config(certificates(&[&first, &wildcard, &renewed])).yaml();
    std::fs::write(fg.config_path(), format!("listen: 127.0.0.1:0\n{reloaded}")).unwrap();
    fg.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let c = client(&fg, "api.example.test", &ca, true);
        if served(&c, &at("api.example.test")).await == renewed.cert_der.to_vec() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reload never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The dashboard lists every name served and how long its certificate has left (rcgen's
    // certificates run to 4096: "ok"), in headless Chromium.
    let (dom, stderr) = common::chromium_dom(&fg.admin_url("/"), 3_000).await;
    for name in ["default.test", "*.example.test", "api.example.test"] {
        let pill = format!("class=\"pill ok\" data-certificate=\"{name}\">");
        assert!(dom.contains(&pill), "{name} not listed: {dom}\n{stderr}");
    }
}

/// floodgate on `tls` (server certificate for localhost, `client_auth` as given) with one route
/// of 2 requests per identity a minute, `identity.client_cert: true`.
fn mtls_config(server: &Leaf, clients: &TestCa, required: bool, upstream: &Upstream) -> String {
    let tls = format!(
        "{{cert: {}, key: {}, client_auth: {{ca: {}, required: {required}}}}}",
        yaml_path(&server.cert_file),
        yaml_path(&server.key_file),
        yaml_path(&clients.cert_file),
    );
    Config::new()
        .with("tls", &tls)
        .with("identity", "{client_cert: true}")
        .route(Route::new("r", "/", &upstream.url()).limit(Limit::fixed_window(2, "1m")))
        .yaml()
}

/// A client of `fg` at `localhost` trusting `server_ca`, presenting `identity` if any.
fn mtls_client(
    fg: &Floodgate,
    server_ca: &TestCa,
    identity: Option<reqwest::Identity>,
) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(server_ca.cert_pem.as_bytes()).unwrap();
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([ca])
        .resolve("localhost", fg.addr());
    if let Some(identity) = identity {
        builder = builder.identity(identity);
    }
    builder.build().unwrap()
}

/// The statuses of `n` GETs, or `None` where the request failed (no TLS session).
async fn statuses(c: &reqwest::Client, fg: &Floodgate, n: usize) -> Vec<Option<u16>> {
    let url = format!("https://localhost:{}/", fg.addr().port());
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(c.get(&url).send().await.ok().map(|r| r.status().as_u16()));
    }
    out
}

/// A floodgate asking for client certificates of `clients` (`required` or not), in front of
/// `upstream`; `strangers` is another CA, whose certificates it must refuse.
struct Mtls {
    server_ca: TestCa,
    clients: TestCa,
    strangers: TestCa,
    upstream: Upstream,
    fg: Floodgate,
    /// Its certificate's files, kept while it runs.
    _server: Leaf,
}

impl Mtls {
    async fn start(required: bool) -> Mtls {
        let (server_ca, clients, strangers) = (
            TestCa::new("server CA"),
            TestCa::new("client CA"),
            TestCa::new("another CA"),
        );
        let server = server_ca.server(&["localhost"]);
        let upstream = Upstream::start().await;
        let fg = Floodgate::start(&mtls_config(&server, &clients, required, &upstream));
        Mtls {
            server_ca,
            clients,
            strangers,
            upstream,
            fg,
            _server: server,
        }
    }
}

#[tokio::test]
async fn a_required_client_certificate_names_the_client_and_each_spends_its_own_budget() {
    let Mtls {
        server_ca,
        clients,
        strangers,
        upstream,
        fg,
        ..
    } = Mtls::start(true).await;

    let uri = rcgen::SanType::URI("spiffe://example.test/billing".try_into().unwrap());
    let billing = clients.client("billing", vec![uri]);
    let dns = rcgen::SanType::DnsName("reports.example.test".try_into().unwrap());
    let reports = clients.client("reports", vec![dns]);
    // No SAN of the kinds read: the subject's CN names it.
    let legacy = clients.client("legacy-batch", vec![]);
    for leaf in [&billing, &reports, &legacy] {
        let c = mtls_client(&fg, &server_ca, Some(leaf.identity(&clients)));
        // Each certificate its own budget of 2: exact, whatever the others spent.
        assert_eq!(
            statuses(&c, &fg, 3).await,
            [Some(200), Some(200), Some(429)],
            "{}",
            leaf.cert_pem.len()
        );
    }
    // Without a certificate, or with one of another CA: no TLS session at all.
    let none = mtls_client(&fg, &server_ca, None);
    assert_eq!(statuses(&none, &fg, 1).await, [None]);
    let stranger = strangers.client("billing", vec![]);
    let c = mtls_client(&fg, &server_ca, Some(stranger.identity(&strangers)));
    assert_eq!(statuses(&c, &fg, 1).await, [None]);
    assert_eq!(upstream.seen().len(), 6, "2 forwarded per certificate");
}

#[tokio::test]
async fn an_optional_client_certificate_lets_others_in_by_address_and_still_refuses_a_stranger() {
    let Mtls {
        server_ca,
        clients,
        strangers,
        upstream: _upstream,
        fg,
        ..
    } = Mtls::start(false).await;

    // No certificate: identified by address, one budget of 2.
    let none = mtls_client(&fg, &server_ca, None);
    assert_eq!(
        statuses(&none, &fg, 3).await,
        [Some(200), Some(200), Some(429)]
    );
    // A verified certificate from the same address is a client of its own.
    let mobile = clients.client("mobile", vec![]);
    let c = mtls_client(&fg, &server_ca, Some(mobile.identity(&clients)));
    assert_eq!(statuses(&c, &fg, 2).await, [Some(200), Some(200)]);
    // One that does not verify is refused, optional or not.
    let stranger = strangers.client("mobile", vec![]);
    let c = mtls_client(&fg, &server_ca, Some(stranger.identity(&strangers)));
    assert_eq!(statuses(&c, &fg, 1).await, [None]);
}

fn check_fails(yaml: &str) -> String {
    let file = common::TempFile::new(yaml);
    let output = floodgate_command(&[
        OsStr::new("check"),
        OsStr::new("--config"),
        file.path().as_os_str(),
    ]);
    assert!(!output.status.success(), "check accepted:\n{yaml}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn check_names_each_certificate_mistake() {
    let ca = TestCa::new("check CA");
    let a = ca.server(&["a.test"]);
    let b = ca.server(&["b.test"]);
    let route = "routes: [{name: r, path_prefix: /, upstream: 'http://127.0.0.1:1'}]\n";
    let cases = [
        (
            // The second entry's key is the first's.
            format!(
                "tls: {{certificates: [{{cert: {}, key: {}}}, {{cert: {}, key: {}}}]}}\n",
                yaml_path(&a.cert_file),
                yaml_path(&a.key_file),
                yaml_path(&b.cert_file),
                yaml_path(&a.key_file)
            ),
            "tls.certificates[1].key",
        ),
        ("tls: {}\n".to_owned(), "tls: give `cert` and `key`"),
        (
            format!("tls: {{cert: {}}}\n", yaml_path(&a.cert_file)),
            "tls.key",
        ),
        (
            format!(
                "tls: {{cert: {}, key: {}, client_auth: {{ca: /nonexistent.pem}}}}\n",
                yaml_path(&a.cert_file),
                yaml_path(&a.key_file)
            ),
            "tls.client_auth.ca",
        ),
        (
            format!(
                "tls: {{cert: {}, key: {}}}\nidentity: {{client_cert: true}}\n",
                yaml_path(&a.cert_file),
                yaml_path(&a.key_file)
            ),
            "identity.client_cert",
        ),
        (
            "tls: {acme: {directory: 'https://127.0.0.1:14000/dir'}}\n".to_owned(),
            "tls.acme.challenge",
        ),
        (
            "tls: {acme: {directory: 'http://127.0.0.1:14000/dir', challenge: tls-alpn-01}}\n"
                .to_owned(),
            "tls.acme.directory",
        ),
        (
            "tls: {acme: {directory: 'https://ca.test/dir', challenge: dns-01}}\n".to_owned(),
            "tls.acme.challenge",
        ),
        (
            "tls: {acme: {directory: 'https://ca.test/dir', challenge: tls-alpn-01, domains: ['*.example.test']}}\n".to_owned(),
            "tls.acme.domains[0]",
        ),
        ("http_listen: 127.0.0.1:0\n".to_owned(), "http_listen"),
    ];
    for (tls, field) in cases {
        let stderr = check_fails(&format!("listen: 127.0.0.1:0\n{tls}{route}"));
        assert!(stderr.contains(field), "{field} not named:\n{stderr}");
    }
}

#[tokio::test]
async fn an_upstream_requiring_a_client_certificate_is_reached_only_with_the_routes_own() {
    let (upstream_ca, clients) = (TestCa::new("upstream CA"), TestCa::new("client CA"));
    // nginx's certificate names `api.internal`, dialled at 127.0.0.1: the route's server_name
    // is what SNI sends and the handshake verifies.
    let nginx_cert = upstream_ca.server(&["api.internal"]);
    let floodgate_cert = clients.client("floodgate", vec![]);
    let nginx = common::FrontProxy::nginx(&format!(
        "server {{\n  listen 127.0.0.1:{{PORT}} ssl;\n  ssl_certificate {};\n  ssl_certificate_key {};\n  \
         ssl_client_certificate {};\n  ssl_verify_client on;\n  \
         location / {{ return 200 \"verified $ssl_client_s_dn\"; }}\n}}",
        nginx_cert.cert_file.path().display(),
        nginx_cert.key_file.path().display(),
        clients.cert_file.path().display(),
    ));
    let https = nginx.url("/").replace("http://", "https://");
    let upstream_tls = |cert: bool| {
        let mut tls = format!(
            "{{ca: {}, server_name: api.internal",
            yaml_path(&upstream_ca.cert_file)
        );
        if cert {
            tls += &format!(
                ", cert: {}, key: {}",
                yaml_path(&floodgate_cert.cert_file),
                yaml_path(&floodgate_cert.key_file)
            );
        }
        tls + "}"
    };
    let fg = Floodgate::start(
        &Config::new()
            .route(Route::new("mtls", "/mtls", &https).with("upstream_tls", &upstream_tls(true)))
            .route(Route::new("plain", "/plain", &https).with("upstream_tls", &upstream_tls(false)))
            // upstream_ca alone does not verify `api.internal` at 127.0.0.1, nor present a
            // certificate.
            .route(Route::new("global", "/", &https))
            .with("upstream_ca", &yaml_path(&upstream_ca.cert_file))
            .yaml(),
    );
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let reply = c.get(fg.url("/mtls")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    assert_eq!(reply.text().await.unwrap(), "verified CN=floodgate");
    // Verified, but without a certificate nginx answers 400 ("No required SSL certificate").
    let reply = c.get(fg.url("/plain")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 400);
    // The URL's own host (127.0.0.1) is not in nginx's certificate: 502.
    let reply = c.get(fg.url("/other")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http3_a_client_certificate_is_required_and_names_the_client_as_on_tcp() {
    let (server_ca, clients) = (TestCa::new("server CA"), TestCa::new("client CA"));
    let server = server_ca.server(&["localhost"]);
    let upstream = Upstream::start().await;
    let yaml = mtls_config(&server, &clients, true, &upstream);
    let fg = Floodgate::start(&format!("{yaml}http3: {{listen: 127.0.0.1:0}}\n"));
    let h3 = |leaf: Option<&Leaf>| {
        let identity = leaf.map(|l| l.chain_and_key(&clients));
        common::H3Client::connect_as(
            fg.http3_addr(),
            "localhost",
            server_ca.cert_der.clone(),
            identity,
        )
    };
    let (billing, reports) = (
        clients.client("billing", vec![]),
        clients.client("reports", vec![]),
    );
    for leaf in [&billing, &reports] {
        let client = h3(Some(leaf))
            .await
            .expect("an HTTP/3 session with a certificate");
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(client.get("/", &[]).await.expect("an answer"));
        }
        // Each certificate's own budget of 2, as over TCP: the QUIC handshake's certificate
        // names the client.
        assert_eq!(seen, [200, 200, 429], "{}", fg.stderr());
    }
    // Without a certificate the QUIC handshake (or its first request) fails.
    let refused = match h3(None).await {
        Ok(client) => client.get("/", &[]).await.err().map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    assert!(refused.is_some(), "served without a certificate");
    assert_eq!(upstream.seen().len(), 4, "2 forwarded per certificate");
}
