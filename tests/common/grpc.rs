//! The real gRPC peer (`tests/grpc/peer.py`: grpcio, the official Python implementation): a
//! server started as a child process on a free port, and a client run once per batch of calls.
//! Both run in the venv `scripts/test.sh` makes (`tests/.venv`, from `tests/requirements.txt`);
//! `FLOODGATE_TEST_PYTHON` names another interpreter.

use super::*;

/// The Python interpreter that has grpcio.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("FLOODGATE_TEST_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/.venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: scripts/test.sh makes it (python3 -m venv tests/.venv && \
         tests/.venv/bin/pip install -r tests/requirements.txt)",
        venv.display()
    );
    venv
}

fn peer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc/peer.py")
}

/// A grpcio server serving `floodgate.test.Echo` and the health service; killed on drop.
pub struct GrpcServer {
    child: Child,
    port: u16,
}

impl GrpcServer {
    /// Starts it over h2c.
    pub fn start() -> GrpcServer {
        GrpcServer::start_with(&[])
    }

    /// Starts it over h2c on `addr` (`127.0.0.2:PORT`: one of a pool's replicas).
    pub fn start_on(addr: &str) -> GrpcServer {
        GrpcServer::start_with(&["--listen".as_ref(), addr.as_ref()])
    }

    /// Starts it over TLS with this certificate and key (PEM files).
    pub fn start_tls(cert: &Path, key: &Path) -> GrpcServer {
        GrpcServer::start_with(&["--tls".as_ref(), cert.as_os_str(), key.as_os_str()])
    }

    fn start_with(args: &[&std::ffi::OsStr]) -> GrpcServer {
        let mut child = Command::new(python())
            .arg(peer_script())
            .arg("serve")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the grpcio server");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
        });
        // grpcio's import and start take about a second on this machine; 30 s is for a loaded one.
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the grpcio server did not report its port");
        let port = line
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from the grpcio server: {line}"));
        GrpcServer { child, port }
    }

    /// `host:port` of the server.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the grpcio client against `target` (`host:port`) for each scenario (see peer.py) with
/// `options` (`--tls-ca FILE`, `--key K`, `--authority NAME`), and returns what each call saw.
pub fn grpc_calls(target: &str, scenarios: &[&str], options: &[&str]) -> Vec<serde_json::Value> {
    let output = grpc_client(target, scenarios, options)
        .wait_with_output()
        .expect("run the grpcio client");
    read_calls(output)
}

/// The grpcio client started in the background (see [`grpc_calls`]); read it with
/// [`read_calls`].
pub fn grpc_client(target: &str, scenarios: &[&str], options: &[&str]) -> Child {
    Command::new(python())
        .arg(peer_script())
        .arg("call")
        .arg(target)
        .args(scenarios)
        .args(options)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the grpcio client")
}

/// What a finished grpcio client printed: one JSON object per call.
pub fn read_calls(output: Output) -> Vec<serde_json::Value> {
    assert!(
        output.status.success(),
        "the grpcio client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}
