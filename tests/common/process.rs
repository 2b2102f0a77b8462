//! Temp files and the floodgate process under test.

use super::*;

// ---------------------------------------------------------------------------------------------
// Temp files
// ---------------------------------------------------------------------------------------------

/// A file in the system temp dir, removed on drop.
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Writes `contents` to a fresh file named after this process and a counter.
    pub fn new(contents: &str) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("floodgate-test-{}-{n}.yaml", std::process::id()));
        std::fs::write(&path, contents).expect("write temp config");
        TempFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// The floodgate process
// ---------------------------------------------------------------------------------------------

/// A running `floodgate --config FILE` child process, killed on drop.
pub struct Floodgate {
    child: Child,
    addr: SocketAddr,
    admin: Arc<Mutex<Option<SocketAddr>>>,
    service: Arc<Mutex<Option<SocketAddr>>>,
    http3: Arc<Mutex<Option<SocketAddr>>>,
    stderr: Arc<Mutex<String>>,
    _config: TempFile,
}

impl Floodgate {
    /// Starts floodgate with `yaml` (everything but `listen:`, which is set to 127.0.0.1:0) and
    /// waits for its `floodgate listening on http://IP:PORT` line (`https://` with `tls:`).
    pub fn start(yaml: &str) -> Floodgate {
        Floodgate::start_with_env(yaml, &[])
    }

    /// [`Floodgate::start`] with extra environment variables (`FLOODGATE_REDIS_URL`, say).
    pub fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Floodgate {
        Floodgate::start_file(&format!("listen: 127.0.0.1:0\n{yaml}"), env)
    }

    /// Starts floodgate with `yaml` as it is (its own `listen:`, which must report a port) and
    /// extra environment variables.
    pub fn start_file(yaml: &str, env: &[(&str, &str)]) -> Floodgate {
        let config = TempFile::new(yaml);
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command.env_remove("FLOODGATE_REDIS_URL");
        // Quiet unless the test asks for more (`RUST_LOG` in `env` wins).
        command.env("RUST_LOG", "warn");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .arg("--config")
            .arg(config.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn floodgate");

        // Keep stderr drained (so the child never blocks on a full pipe) and at hand for failures.
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut child_stderr = child.stderr.take().expect("stderr piped");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = child_stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });

        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        // floodgate prints its admin address (if any) before the proxy's.
        let admin = Arc::new(Mutex::new(None));
        let admin_sink = admin.clone();
        let service = Arc::new(Mutex::new(None));
        let service_sink = service.clone();
        let http3 = Arc::new(Mutex::new(None));
        let http3_sink = http3.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Some(addr) = line.strip_prefix("floodgate http3 listening on udp://") {
                    if let Ok(addr) = addr.trim().parse::<SocketAddr>() {
                        *http3_sink.lock().unwrap() = Some(addr);
                    }
                } else if let Some(addr) = line.strip_prefix("floodgate admin listening on http://")
                {
                    if let Ok(addr) = addr.trim().parse::<SocketAddr>() {
                        *admin_sink.lock().unwrap() = Some(addr);
                    }
                } else if let Some(addr) = line
                    .strip_prefix("floodgate service listening on http://")
                    .or_else(|| line.strip_prefix("floodgate service listening on https://"))
                {
                    if let Ok(addr) = addr.trim().parse::<SocketAddr>() {
                        *service_sink.lock().unwrap() = Some(addr);
                    }
                } else if let Some(addr) = line
                    .strip_prefix("floodgate listening on http://")
                    .or_else(|| line.strip_prefix("floodgate listening on https://"))
                {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>());
                }
            }
        });

        let mut floodgate = Floodgate {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin,
            service,
            http3,
            stderr,
            _config: config,
        };
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(addr)) => floodgate.addr = addr,
            other => panic!(
                "floodgate did not report its address ({other:?}); exit: {:?}; stderr:\n{}",
                floodgate.child.try_wait(),
                floodgate.stderr()
            ),
        }
        floodgate
    }

    /// The HTTP/3 listener's (UDP) address (the config must set `http3.listen`); printed
    /// before the proxy's.
    pub fn http3_addr(&self) -> SocketAddr {
        self.http3
            .lock()
            .unwrap()
            .expect("floodgate reported no HTTP/3 address")
    }

    /// The proxy listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT{path}` on the proxy listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The admin listener's address (the config must set `admin_listen: 127.0.0.1:0`).
    pub fn admin_url(&self, path: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(addr) = *self.admin.lock().unwrap() {
                return format!("http://{addr}{path}");
            }
            assert!(
                Instant::now() < deadline,
                "floodgate reported no admin address"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The rate-limit service's address (the config must set `service.listen`).
    pub fn service_addr(&self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(addr) = *self.service.lock().unwrap() {
                return addr;
            }
            assert!(
                Instant::now() < deadline,
                "floodgate reported no service address"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `http://IP:PORT{path}` on the rate-limit service's listener.
    pub fn service_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.service_addr())
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config file floodgate was started with (rewrite it, then [`Floodgate::signal`] HUP).
    pub fn config_path(&self) -> &Path {
        self._config.path()
    }

    /// Sends a signal (`HUP`, `TERM`, `INT`) to the process.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit on its own, for at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// What floodgate has logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Floodgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the floodgate binary to completion with `args`.
pub fn floodgate_command(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("FLOODGATE_REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run floodgate")
}

/// Runs `floodgate check` on `yaml` and asserts that it fails naming each of `fields`.
pub fn check_names(yaml: &str, fields: &[&str]) {
    let file = TempFile::new(yaml);
    let out = floodgate_command(&[
        "check".as_ref(),
        "--config".as_ref(),
        file.path().as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check accepted:\n{yaml}");
    for field in fields {
        assert!(stderr.contains(field), "{field} not named in:\n{stderr}");
    }
}

/// `floodgate replay --format json` of `fg`'s own access log (its stderr) with its own config.
pub fn replay_own_log(fg: &Floodgate) -> serde_json::Value {
    let log = TempFile::new(&fg.stderr());
    let out = floodgate_command(&[
        "replay".as_ref(),
        "--config".as_ref(),
        fg.config_path().as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        log.path().as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Chromium's binary, if Debian's package is installed.
pub fn chromium() -> std::path::PathBuf {
    for name in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            return std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!("chromium is missing: scripts/test.sh installs Debian's chromium");
}

/// The DOM headless Chromium (a profile of its own) dumps for `url` after `budget_ms` of
/// virtual time (the page's timers run within it), and Chromium's stderr.
pub async fn chromium_dom(url: &str, budget_ms: u64) -> (String, String) {
    let profile = TempDir::new("chromium");
    let (url, chromium) = (url.to_string(), chromium());
    let dir = profile.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .arg(format!("--user-data-dir={}", dir.display()))
            .arg(format!("--virtual-time-budget={budget_ms}"))
            .args(["--run-all-compositor-stages-before-draw", "--dump-dom"])
            .arg(url)
            .output()
            .expect("run chromium")
    })
    .await
    .expect("chromium's task");
    drop(profile);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
