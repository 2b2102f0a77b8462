//! Limits on upgraded connections (`websocket:`), end to end: PyPI's `websockets` as client and
//! echo server (`tests/websocket/peer.py`), floodgate between them. The connection limit across
//! two instances on one Redis, a killed instance's connections released within the lease, the
//! message rate (close 1008) and size (close 1009), and the idle timeout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::config::{Config, Route};
use common::{Floodgate, PostgresServer, RedisServer, metric, python};

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/websocket/peer.py")
}

/// The `websockets` echo server; killed on drop.
struct Echo {
    child: Child,
    port: u16,
}

impl Echo {
    fn start() -> Echo {
        let mut child = Command::new(python())
            .arg(script())
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the echo server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the echo server said {line:?}"));
        Echo { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `websockets` client process, driven a line at a time.
struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn start() -> Client {
        let mut child = Command::new(python())
            .arg(script())
            .arg("client")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the WebSocket client");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Client {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one command and reads its answer (the client answers every command, within the
    /// seconds the command itself names, or its 10 s open and echo timeouts).
    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ws://` for floodgate's `path`.
fn ws(fg: &Floodgate, path: &str) -> String {
    format!("ws://{}{path}", fg.addr())
}

fn routed(echo: &Echo, websocket: &str) -> Config {
    Config::new().route(Route::new("chat", "/", &echo.url()).with("websocket", websocket))
}

#[test]
fn the_connection_limit_holds_across_two_instances_and_a_killed_ones_are_released() {
    let redis = RedisServer::start();
    let echo = Echo::start();
    let yaml = routed(&echo, "{max_connections: 2}")
        .redis(&redis.url(), "deny")
        .yaml();
    let mut one = Floodgate::start(&yaml);
    let two = Floodgate::start(&yaml);
    let mut client = Client::start();
    // Two sockets through the first instance, held open; the third, through the second
    // instance, is refused at its handshake: the budget is the identity's on every instance.
    assert_eq!(
        client.ask(&format!("open a {} rider", ws(&one, "/"))),
        "open a ok"
    );
    assert_eq!(
        client.ask(&format!("open b {} rider", ws(&one, "/"))),
        "open b ok"
    );
    assert_eq!(
        client.ask(&format!("open c {} rider", ws(&two, "/"))),
        "open c refused 429"
    );
    // Another identity has its own.
    assert_eq!(
        client.ask(&format!("open d {} other", ws(&two, "/"))),
        "open d ok"
    );
    // Sockets stay usable, and a closed one gives its slot back.
    assert_eq!(client.ask("send a 100"), "sent a");
    assert_eq!(client.ask("close a"), "closed a");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // The release is sent as the socket ends, a moment after the client's close.
        let answer = client.ask(&format!("open e {} rider", ws(&two, "/")));
        if answer == "open e ok" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot never came back: {answer}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Held past the first renewal (every 10 s: a third of the 30 s lease), the sockets still
    // count.
    std::thread::sleep(Duration::from_secs(11));
    assert_eq!(
        client.ask(&format!("open f {} rider", ws(&two, "/"))),
        "open f refused 429"
    );
    assert_eq!(client.ask("send b 10"), "sent b");
    // The first instance dies holding b: its slot is refused until its lease ends (at most
    // 30 s after its last renewal), then given to the next socket.
    one.signal("KILL");
    let _ = one.wait_exit(Duration::from_secs(5));
    let killed = Instant::now();
    loop {
        let answer = client.ask(&format!("open g {} rider", ws(&two, "/")));
        if answer == "open g ok" {
            break;
        }
        assert_eq!(answer, "open g refused 429");
        // The lease (30 s) plus a renewal period (10 s) plus slack for a loaded machine.
        assert!(killed.elapsed() < Duration::from_secs(45), "never released");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        killed.elapsed() > Duration::from_secs(5),
        "released at once: the kill was not a crash"
    );
    // e has lived past its first lease (opened over 30 s ago) and still holds its slot, renewed
    // by the instance that serves it: with g, the rider has two.
    assert_eq!(client.ask("send e 10"), "sent e");
    assert_eq!(
        client.ask(&format!("open h {} rider", ws(&two, "/"))),
        "open h refused 429"
    );
}

#[test]
fn on_postgresql_a_socket_keeps_its_slot_past_its_first_lease() {
    let postgres = PostgresServer::start();
    let echo = Echo::start();
    let yaml = routed(&echo, "{max_connections: 1}")
        .storage("backend", "postgres")
        .storage("url", &postgres.url())
        .storage("on_error", "deny")
        .storage("timeout", "1s")
        .yaml();
    let one = Floodgate::start(&yaml);
    let two = Floodgate::start(&yaml);
    let mut client = Client::start();
    assert_eq!(
        client.ask(&format!("open a {} rider", ws(&one, "/"))),
        "open a ok"
    );
    assert_eq!(
        client.ask(&format!("open b {} rider", ws(&two, "/"))),
        "open b refused 429"
    );
    // Past the 30 s lease it was granted with: renewed on the database's clock, it still holds.
    std::thread::sleep(Duration::from_secs(32));
    assert_eq!(client.ask("send a 10"), "sent a");
    assert_eq!(
        client.ask(&format!("open c {} rider", ws(&two, "/"))),
        "open c refused 429"
    );
    // Closed, its slot goes back at once.
    assert_eq!(client.ask("close a"), "closed a");
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.ask(&format!("open d {} rider", ws(&two, "/"))) != "open d ok" {
        assert!(Instant::now() < deadline, "the slot never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_past_the_rate_close_1008_and_a_large_one_closes_1009() {
    let echo = Echo::start();
    let yaml = routed(
        &echo,
        "{messages: {capacity: 5, refill_rate: 0.001}, max_message: 1KiB}",
    )
    .yaml();
    let fg = Floodgate::start(&yaml);
    let url = ws(&fg, "/");
    let closes = tokio::task::spawn_blocking(move || {
        let mut client = Client::start();
        assert_eq!(client.ask(&format!("open a {url}")), "open a ok");
        // Five messages pass (the bucket holds five); the sixth closes the connection.
        let burst = client.ask("burst a 10");
        let rate = client.ask("wait_close a 5");
        assert_eq!(client.ask(&format!("open b {url}")), "open b ok");
        // A message of exactly 1 KiB passes; one byte more closes with 1009.
        let fits = client.ask("send b 1024");
        let big = client.ask("send b 1025");
        let size = client.ask("wait_close b 5");
        (burst, rate, fits, big, size)
    })
    .await
    .unwrap();
    assert_eq!(closes.0, "burst a 5");
    assert_eq!(closes.1, "closed a 1008");
    assert_eq!(closes.2, "sent b");
    assert_eq!(closes.3, "failed b");
    assert_eq!(closes.4, "closed b 1009");
    let closed = |reason: &str| {
        format!(r#"floodgate_websocket_closed_total{{route="chat",reason="{reason}"}}"#)
    };
    assert_eq!(metric(&fg, &closed("rate")).await, 1);
    assert_eq!(metric(&fg, &closed("size")).await, 1);
    // Messages passed: five, and the one of 1 KiB (the refused two never were).
    assert_eq!(
        metric(&fg, r#"floodgate_websocket_messages_total{route="chat"}"#).await,
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_its_idle_timeout() {
    let echo = Echo::start();
    let fg = Floodgate::start(&routed(&echo, "{idle_timeout: 1s}").yaml());
    let url = ws(&fg, "/");
    let answers = tokio::task::spawn_blocking(move || {
        let mut client = Client::start();
        assert_eq!(client.ask(&format!("open a {url}")), "open a ok");
        // Talking keeps it open past its timeout...
        let mut sent = Vec::new();
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(400));
            sent.push(client.ask("send a 10"));
        }
        // ... silence closes it: within the timeout and a margin of 4 s for a loaded machine.
        (sent, client.ask("wait_close a 5"))
    })
    .await
    .unwrap();
    assert!(answers.0.iter().all(|a| a == "sent a"), "{:?}", answers.0);
    assert_eq!(answers.1, "closed a 1001");
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_websocket_closed_total{route="chat",reason="idle"}"#
        )
        .await,
        1
    );
    assert_eq!(
        metric(&fg, r#"floodgate_websocket_connections{route="chat"}"#).await,
        0
    );
}
