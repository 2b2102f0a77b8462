//! The bundled demo upstream (`floodgate-demo-upstream`, a workspace binary): a worker pool
//! with finite capacity and a knob that makes it sick at run time.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running demo upstream, killed when dropped.
pub struct DemoUpstream {
    child: Child,
    url: String,
}

/// The demo upstream's binary, next to floodgate's; built first if a run of this test crate
/// alone left it out.
pub fn binary() -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_floodgate"))
        .with_file_name("floodgate-demo-upstream");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "floodgate-demo-upstream"])
            .status()
            .expect("cargo build -p floodgate-demo-upstream");
        assert!(status.success(), "the demo upstream did not build");
    }
    path
}

impl DemoUpstream {
    /// `workers` × `service_time`, answering 503 after `queue_timeout` in its queue.
    pub fn start(workers: u32, service_time: &str, queue_timeout: &str) -> DemoUpstream {
        let mut child = Command::new(binary())
            .args(["--listen", "127.0.0.1:0", "--workers", &workers.to_string()])
            .args([
                "--service-time",
                service_time,
                "--queue-timeout",
                queue_timeout,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the demo upstream");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("its listening line");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        DemoUpstream { child, url }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its `/__stats`: served, rejected (its own 503s), workers, service time.
    pub async fn stats(&self) -> serde_json::Value {
        let body = super::client()
            .get(format!("{}/__stats", self.url))
            .send()
            .await
            .expect("stats")
            .text()
            .await
            .expect("stats body");
        serde_json::from_str(&body).expect("stats json")
    }

    /// Turns the knob: `service_time=150ms&workers=4`.
    pub async fn set_capacity(&self, query: &str) {
        let status = super::client()
            .post(format!("{}/__capacity?{query}", self.url))
            .send()
            .await
            .expect("capacity")
            .status();
        assert_eq!(status, 200, "the knob refused {query}");
    }
}

impl Drop for DemoUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
