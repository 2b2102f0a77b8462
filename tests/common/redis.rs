//! A real redis-server for tests: started on a free port, killed on drop, restartable on the
//! same port (to test a Redis restart under traffic).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server child process on 127.0.0.1.
pub struct RedisServer {
    pub port: u16,
    /// The TLS port, if started with [`RedisServer::start_with_tls`].
    pub tls_port: Option<u16>,
    child: Option<Child>,
    dir: PathBuf,
    /// More `redis-server` arguments (the TLS ones).
    args: Vec<String>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl RedisServer {
    /// Starts redis-server (no persistence) and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(|_| (None, Vec::new()))
    }

    /// [`RedisServer::start`] with more `redis-server` arguments (`--rename-command FCALL ""`
    /// makes a Redis 7 look like a Redis 6 to floodgate).
    pub fn start_with_args(args: &[&str]) -> RedisServer {
        let args = args.iter().map(|a| a.to_string()).collect();
        RedisServer::start_with(|_| (None, args))
    }

    /// [`RedisServer::start`], also serving TLS on [`RedisServer::tls_url`] with this certificate
    /// chain and key (PEM); clients are not asked for certificates. The plain port stays open,
    /// for the test's own inspection.
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> RedisServer {
        RedisServer::start_with(|dir| {
            let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::write(&cert, cert_pem).expect("write the certificate");
            std::fs::write(&key, key_pem).expect("write the key");
            let tls_port = free_port();
            let args = vec![
                "--tls-port".to_string(),
                tls_port.to_string(),
                "--tls-cert-file".to_string(),
                cert.display().to_string(),
                "--tls-key-file".to_string(),
                key.display().to_string(),
                // redis-server wants a CA even when it asks clients for no certificate.
                "--tls-ca-cert-file".to_string(),
                cert.display().to_string(),
                "--tls-auth-clients".to_string(),
                "no".to_string(),
            ];
            (Some(tls_port), args)
        })
    }

    /// Makes the server's folder; `prepare` may write files into it and returns the TLS port
    /// and more arguments; then starts it.
    fn start_with(
        prepare: impl FnOnce(&std::path::Path) -> (Option<u16>, Vec<String>),
    ) -> RedisServer {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("floodgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (tls_port, args) = prepare(&dir);
        let mut server = RedisServer {
            port,
            tls_port,
            child: None,
            dir,
            args,
        };
        // The port was free when picked; if another process took it first, pick another.
        for _ in 0..3 {
            if server.try_spawn() {
                return server;
            }
            server.kill();
            server.port = free_port();
        }
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "redis-server on port {} did not start",
            self.port
        );
    }

    /// Starts redis-server on `self.port`; false if it did not come up (its port taken).
    fn try_spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        self.answers_ping()
    }

    fn wait_for_ping(&mut self) {
        assert!(
            self.answers_ping(),
            "redis-server on port {} did not start",
            self.port
        );
    }

    /// Waits until the server answers PING: false if it exits first (its port was taken) or
    /// stays silent for 10 s.
    fn answers_ping(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut c) = self.connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:TLS_PORT` (a server started with [`RedisServer::start_with_tls`]).
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("a server started with TLS");
        format!("rediss://127.0.0.1:{port}")
    }

    /// A plain synchronous connection, for inspecting keys and injecting faults.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        client.get_connection_with_timeout(Duration::from_secs(1))
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = self.connection().expect("connected to the test redis");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).expect("command succeeds")
    }

    /// How many decisions this server has run: its `FCALL`s and `EVALSHA`s (from `INFO
    /// commandstats`), less the failed ones (a first `FCALL` fails with "Function not found"
    /// and loads the library).
    pub fn decisions(&self) -> u64 {
        let stats: String = self.cmd(&["INFO", "commandstats"]);
        let field = |line: &str, name: &str| -> u64 {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name)?.parse().ok())
                .unwrap_or(0)
        };
        stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
            .map(|l| field(l, "calls=") - field(l, "failed_calls="))
            .sum()
    }

    /// Sends the server `signal` (`STOP`, `CONT`): a stopped server keeps its connections and
    /// answers nothing until it is continued.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let sent = std::process::Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status()
                .expect("run kill");
            assert!(sent.success(), "kill -{signal}");
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Ports held bound (by listeners nobody accepts on) until a cluster starts on them.
pub struct ReservedPorts(Vec<TcpListener>);

impl ReservedPorts {
    pub fn ports(&self) -> Vec<u16> {
        self.0
            .iter()
            .map(|l| l.local_addr().expect("bound").port())
            .collect()
    }
}

/// A real Redis Cluster on this machine: `masters` masters with one replica each, made with
/// `redis-cli --cluster create`, every node a child process killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `2 × masters` cluster-enabled redis-servers and joins them into a cluster with one
    /// replica per master; waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        // A port can still be taken in the instant between releasing it and redis-server
        // binding it (parallel tests open thousands of connections): start again elsewhere.
        for _ in 0..3 {
            if let Ok(cluster) = RedisCluster::try_start_on(RedisCluster::reserve(masters)) {
                return cluster;
            }
        }
        RedisCluster::start_on(RedisCluster::reserve(masters))
    }

    /// Free ports for a cluster of `masters` masters and their replicas, to start it later. They
    /// stay bound until [`RedisCluster::start_on`], so no other process of a parallel test run
    /// (a server on port 0, an outgoing connection's ephemeral port) takes one meanwhile.
    pub fn reserve(masters: usize) -> ReservedPorts {
        ReservedPorts(
            (0..masters * 2)
                .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
                .collect(),
        )
    }

    /// [`RedisCluster::start`] on these ports (one master per two ports).
    pub fn start_on(reserved: ReservedPorts) -> RedisCluster {
        RedisCluster::try_start_on(reserved).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_on(reserved: ReservedPorts) -> Result<RedisCluster, String> {
        let mut nodes = Vec::new();
        for held in reserved.0 {
            let port = held.local_addr().expect("bound").port();
            // The bus port is port + 10000 unless given: past 55535 that overflows.
            let bus = TcpListener::bind("127.0.0.1:0").expect("a free port");
            let bus_port = bus.local_addr().expect("bound").port();
            // Each port is let go only now, just before its server binds it.
            drop((held, bus));
            let mut server = {
                let dir = std::env::temp_dir()
                    .join(format!("floodgate-cluster-{}-{port}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("temp dir");
                let child = Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "2000",
                        // A test cluster's replicas may take over whatever their data's age
                        // (their first sync can be slow on a loaded machine; in production keep
                        // the default, which refuses a replica that lost its master long ago).
                        "--cluster-replica-validity-factor",
                        "0",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        "--cluster-port",
                        &bus_port.to_string(),
                    ])
                    .arg("--dir")
                    .arg(&dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server must be installed (scripts/test.sh installs it)");
                RedisServer {
                    port,
                    tls_port: None,
                    child: Some(child),
                    dir,
                    args: Vec::new(),
                }
            };
            if !server.answers_ping() {
                return Err(format!("cluster node on port {port} did not start"));
            }
            nodes.push(server);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed with redis-server");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Every node sees the cluster ok, and every replica has synced with its master.
        while !cluster.nodes.iter().all(|n| {
            let replication: String = n.cmd(&["INFO", "replication"]);
            n.cmd::<String>(&["CLUSTER", "INFO"])
                .contains("cluster_state:ok")
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
        }) {
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cluster)
    }

    /// The seed URLs, for `storage.urls`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes that are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes.iter().filter(|n| is_master(n)).collect()
    }
}

fn is_master(node: &RedisServer) -> bool {
    let mut c = match node.connection() {
        Ok(c) => c,
        Err(_) => return false,
    };
    let role: redis::Value = match redis::cmd("ROLE").query(&mut c) {
        Ok(v) => v,
        Err(_) => return false,
    };
    matches!(role, redis::Value::Array(items) if matches!(items.first(), Some(redis::Value::BulkString(b)) if b == b"master"))
}

/// A Redis master, one replica and three sentinels watching them as `mymaster` (quorum 2, a
/// master down after 1 s), every one a child process killed on drop.
pub struct RedisSentinelSet {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinelSet {
    pub fn start() -> RedisSentinelSet {
        let master = RedisServer::start();
        let replica = RedisServer::start();
        let _: String = replica.cmd(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cmd::<String>(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels = (0..3)
            .map(|_| {
                let port = free_port();
                let dir = std::env::temp_dir()
                    .join(format!("floodgate-sentinel-{}-{port}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("temp dir");
                // Sentinel rewrites its config file, so each gets its own, writable.
                let conf = dir.join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\n\
                         sentinel monitor mymaster 127.0.0.1 {} 2\n\
                         sentinel down-after-milliseconds mymaster 1000\n\
                         sentinel failover-timeout mymaster 5000\n\
                         sentinel parallel-syncs mymaster 1\n",
                        dir.display(),
                        master.port
                    ),
                )
                .expect("sentinel.conf");
                let child = Command::new("redis-server")
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server must be installed (scripts/test.sh installs it)");
                let mut sentinel = RedisServer {
                    port,
                    tls_port: None,
                    child: Some(child),
                    dir,
                    args: Vec::new(),
                };
                sentinel.wait_for_ping();
                sentinel
            })
            .collect();
        // Let the sentinels find each other and the replica before anyone relies on them.
        let set = RedisSentinelSet {
            master,
            replica,
            sentinels,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !set.sentinels.iter().all(|s| {
            let info: String = s.cmd(&["INFO", "sentinel"]);
            info.contains("slaves=1") && info.contains("sentinels=3")
        }) {
            assert!(
                Instant::now() < deadline,
                "the sentinels never saw each other"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        set
    }

    /// The sentinels' URLs, for `storage.sentinels`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }
}
