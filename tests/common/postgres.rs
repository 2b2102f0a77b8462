//! A real PostgreSQL server for tests: a fresh cluster made by `initdb` in a temp dir, `postgres`
//! on a free port with its socket in that dir, stopped and removed on drop. PostgreSQL refuses to
//! run as root, so when the tests run as root both run as the `postgres` user (`runuser`), which
//! Debian's `postgresql` package creates (scripts/test.sh installs it).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `postgres` server on 127.0.0.1, superuser `floodgate`, no password (trust).
pub struct PostgresServer {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
    /// More `-c name=value` settings for `postgres`.
    settings: Vec<String>,
}

/// The folder with `initdb` and `postgres`: `FLOODGATE_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps them off the PATH), else the PATH.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLOODGATE_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_default()
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl PostgresServer {
    /// Makes a fresh cluster and starts it; waits until it accepts connections.
    pub fn start() -> PostgresServer {
        PostgresServer::start_with(|_| Vec::new())
    }

    /// [`PostgresServer::start`] with TLS on (plain connections are still accepted), serving
    /// this certificate chain and key (PEM).
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> PostgresServer {
        PostgresServer::start_with_tls_options(cert_pem, key_pem, None)
    }

    /// [`PostgresServer::start_with_tls`]; with `client_ca_pem`, a TLS connection must also
    /// present a client certificate issued by that CA for the user's name (`cert`
    /// authentication), while plain ones (psql here) are still trusted.
    pub fn start_with_tls_options(
        cert_pem: &str,
        key_pem: &str,
        client_ca_pem: Option<&str>,
    ) -> PostgresServer {
        let (cert_pem, key_pem) = (cert_pem.to_string(), key_pem.to_string());
        let client_ca_pem = client_ca_pem.map(str::to_string);
        PostgresServer::start_with(move |dir| {
            let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::write(&cert, &cert_pem).expect("write the certificate");
            std::fs::write(&key, &key_pem).expect("write the key");
            let mut files = vec![cert.clone(), key.clone()];
            let mut settings = vec![
                "ssl=on".to_string(),
                format!("ssl_cert_file={}", cert.display()),
                format!("ssl_key_file={}", key.display()),
            ];
            if let Some(ca_pem) = client_ca_pem {
                let (ca, hba) = (dir.join("client-ca.crt"), dir.join("hba.conf"));
                std::fs::write(&ca, ca_pem).expect("write the client CA");
                std::fs::write(
                    &hba,
                    "local all all trust\n\
                     hostnossl all all 127.0.0.1/32 trust\n\
                     hostssl all all 127.0.0.1/32 cert\n",
                )
                .expect("write pg_hba");
                settings.push(format!("ssl_ca_file={}", ca.display()));
                settings.push(format!("hba_file={}", hba.display()));
                files.extend([ca, hba]);
            }
            // PostgreSQL refuses a key that others may read.
            let status = Command::new("chmod").arg("600").arg(&key).status();
            assert!(status.is_ok_and(|s| s.success()), "chmod of the key failed");
            if running_as_root() {
                let status = Command::new("chown")
                    .arg("postgres:postgres")
                    .args(&files)
                    .status();
                assert!(
                    status.is_ok_and(|s| s.success()),
                    "chown of the TLS files failed"
                );
            }
            settings
        })
    }

    /// Makes a fresh cluster; `prepare` may write files into its folder and returns more
    /// settings for `postgres`; then starts it.
    fn start_with(prepare: impl FnOnce(&std::path::Path) -> Vec<String>) -> PostgresServer {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "floodgate-pg-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = PostgresServer {
            port: free_port(),
            dir,
            bin: bin_dir(),
            child: None,
            settings: Vec::new(),
        };
        if running_as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the temp dir to postgres failed");
        }
        let out = server
            .command("initdb")
            .arg("-D")
            .arg(server.dir.join("data"))
            .args([
                "-A",
                "trust",
                "-U",
                "floodgate",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .expect("initdb must be installed (scripts/test.sh installs postgresql)");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.settings = prepare(&server.dir);
        // The port was free when picked, but initdb takes a while and tests run in parallel: if
        // another process took it meanwhile, postgres exits at once; pick another.
        for _ in 0..5 {
            if server.spawn() {
                return server;
            }
            server.port = free_port();
        }
        panic!(
            "postgres did not start: {}",
            std::fs::read_to_string(server.dir.join("server.log")).unwrap_or_default()
        );
    }

    /// `program` from the PostgreSQL bin folder, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if running_as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// Starts `postgres` and waits until it answers; false if it exited first (its port taken).
    fn spawn(&mut self) -> bool {
        let log = std::fs::File::create(self.dir.join("server.log")).expect("log file");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                // A test database: nothing needs to survive a crash of the machine.
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("postgres must be installed (scripts/test.sh installs postgresql)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.try_psql("SELECT 1").is_some() {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "postgres on port {} did not start: {}",
            self.port,
            std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
        );
    }

    /// `postgres://floodgate@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://floodgate@127.0.0.1:{}/postgres", self.port)
    }

    /// psql running `sql` in the database `postgres` (unaligned, tuples only, stopping at the
    /// first error).
    fn psql_command(&self, sql: &str) -> Command {
        self.psql_command_in("postgres", sql)
    }

    /// psql running `sql` in the database `db`.
    fn psql_command_in(&self, db: &str, sql: &str) -> Command {
        let mut command = Command::new(self.bin.join("psql"));
        command
            // Plain: a server that wants client certificates over TLS still trusts psql.
            .env("PGSSLMODE", "disable")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "floodgate", "-d", db, "-AtX", "-v", "ON_ERROR_STOP=1"])
            .args(["-c", sql]);
        command
    }

    /// Starts psql on `sql` and returns at once (a session holding a lock, say).
    pub fn psql_in_background(&self, sql: &str) -> std::process::Child {
        self.psql_command(sql)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn psql")
    }

    /// What psql printed for `sql`, or `None` when it failed.
    pub fn try_psql(&self, sql: &str) -> Option<String> {
        self.try_psql_in("postgres", sql)
    }

    /// What psql printed for `sql` in the database `db`, or `None` when it failed.
    pub fn try_psql_in(&self, db: &str, sql: &str) -> Option<String> {
        let out = self.psql_command_in(db, sql).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Runs `sql` with psql and returns what it printed (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|| panic!("psql failed on {sql:?}"))
    }

    /// Stops the server at once, as a crash would (an immediate shutdown: every backend ends,
    /// nothing is flushed), and waits for it to exit.
    pub fn stop_now(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // The postmaster's pid is the first line of postmaster.pid (the child may be runuser).
        let pid = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string));
        if let Some(pid) = pid {
            let _ = Command::new("kill").args(["-QUIT", &pid]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the server again on the same port and data (after [`PostgresServer::stop_now`]).
    pub fn restart(&mut self) {
        self.stop_now();
        assert!(
            self.spawn(),
            "postgres did not start again on port {}",
            self.port
        );
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop_now();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
