//! Pebble, Let's Encrypt's test CA (Debian's `pebble`, installed by `scripts/test.sh`), on
//! loopback, with `pebble-challtestsrv` as its DNS server (every name resolves to 127.0.0.1).
//! Pebble validates HTTP-01 at `http_port` and TLS-ALPN-01 at `tls_port` on 127.0.0.1: the
//! ports the test gives floodgate's `http_listen` and `listen`. Its own HTTPS listener serves a
//! certificate of a test CA ([`Pebble::https_ca`]: floodgate's `tls.acme.ca`). Killed on drop.

use super::*;

pub struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    config: PathBuf,
    dns_port: u16,
    pub listen: u16,
    pub management: u16,
    /// The CA of Pebble's own HTTPS certificate, on disk.
    pub https_ca: TestCa,
    _https: Leaf,
    _dir: TempDir,
}

impl Pebble {
    /// Pebble validating at `http_port` and `tls_port`, issuing certificates valid for
    /// `validity_seconds`.
    pub fn start(http_port: u16, tls_port: u16, validity_seconds: u64) -> Pebble {
        let dir = TempDir::new("pebble");
        let https_ca = TestCa::new("pebble HTTPS CA");
        let https = https_ca.server(&["localhost", "127.0.0.1"]);
        let (listen, management, dns_port) = (free_port(), free_port(), free_port());
        let config = dir.path().join("pebble.json");
        let json = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": https.cert_file.path(),
            "privateKey": https.key_file.path(),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "certificateValidityPeriod": validity_seconds,
        }});
        std::fs::write(&config, json.to_string()).expect("write pebble.json");
        let dns = Command::new("pebble-challtestsrv")
            .args(["-dns01", &format!("127.0.0.1:{dns_port}")])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &format!("127.0.0.1:{}", free_port())])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pebble-challtestsrv (Debian's pebble: scripts/test.sh installs it)");
        let mut pebble = Pebble {
            pebble: None,
            dns,
            config,
            dns_port,
            listen,
            management,
            https_ca,
            _https: https,
            _dir: dir,
        };
        pebble.resume();
        pebble
    }

    /// `https://127.0.0.1:PORT/dir`.
    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.listen)
    }

    /// Stops the CA (as an outage: its port refuses connections).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.pebble.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the CA again on the same ports (a new root: Pebble keeps nothing across runs).
    pub fn resume(&mut self) {
        let child = Command::new("pebble")
            .arg("-config")
            .arg(&self.config)
            .args(["-dnsserver", &format!("127.0.0.1:{}", self.dns_port)])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_VA_ALWAYS_VALID", "0")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pebble (Debian's pebble: scripts/test.sh installs it)");
        self.pebble = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.management)).is_err() {
            assert!(Instant::now() < deadline, "pebble did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The root Pebble issues under now (PEM), read from its management listener.
    pub async fn root(&self) -> String {
        let ca = reqwest::Certificate::from_pem(self.https_ca.cert_pem.as_bytes()).unwrap();
        let client = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([ca])
            .build()
            .unwrap();
        let url = format!("https://127.0.0.1:{}/roots/0", self.management);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => return r.text().await.unwrap(),
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                other => panic!("pebble's root: {other:?}"),
            }
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}
