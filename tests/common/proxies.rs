//! Real nginx, Caddy and HAProxy (Debian's `nginx-light`, `caddy` and `haproxy`, installed by
//! `scripts/test.sh`), started as child processes on a free port from a config the test
//! writes. Killed on drop.

use super::*;

/// A free port on 127.0.0.1 (bound, then let go: the child binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A running nginx or Caddy.
pub struct FrontProxy {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl FrontProxy {
    /// nginx with `http_block` (the `http { … }` contents; `{PORT}` and `{DIR}` are replaced
    /// with its port and a directory of its own).
    pub fn nginx(http_block: &str) -> FrontProxy {
        let dir = TempDir::new("nginx");
        let port = free_port();
        let d = dir.path().display().to_string();
        let http = http_block
            .replace("{PORT}", &port.to_string())
            .replace("{DIR}", &d);
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n{http}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).expect("write nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx (Debian's nginx-light: scripts/test.sh installs it)");
        FrontProxy::ready(child, port, dir, "error.log")
    }

    /// Caddy with `site` (a Caddyfile site block's contents; `{PORT}` is replaced with its
    /// port), its admin API off and its data in a directory of its own.
    pub fn caddy(site: &str) -> FrontProxy {
        let dir = TempDir::new("caddy");
        let port = free_port();
        let file = format!(
            "{{\n  admin off\n  auto_https off\n}}\n\
             http://127.0.0.1:{port} {{\n{}\n}}\n",
            site.replace("{PORT}", &port.to_string())
        );
        let path = dir.path().join("Caddyfile");
        std::fs::write(&path, file).expect("write the Caddyfile");
        let log = std::fs::File::create(dir.path().join("caddy.log")).expect("log file");
        let child = Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&path)
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start caddy (Debian's caddy: scripts/test.sh installs it)");
        FrontProxy::ready(child, port, dir, "caddy.log")
    }

    /// HAProxy (Debian's `haproxy`) with `config` after a `global`/`defaults` preamble (`{PORT}`
    /// and `{DIR}` replaced with its port, its first `bind`, and a directory of its own).
    pub fn haproxy(config: &str) -> FrontProxy {
        let dir = TempDir::new("haproxy");
        let port = free_port();
        let d = dir.path().display().to_string();
        let file = format!(
            "global\n  maxconn 256\n\ndefaults\n  timeout connect 2s\n  timeout client 20s\n  \
             timeout server 20s\n\n{}\n",
            config
                .replace("{PORT}", &port.to_string())
                .replace("{DIR}", &d)
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, file).expect("write haproxy.cfg");
        let log = std::fs::File::create(dir.path().join("haproxy.log")).expect("log file");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start haproxy (Debian's haproxy: scripts/test.sh installs it)");
        FrontProxy::ready(child, port, dir, "haproxy.log")
    }

    /// Waits until the port accepts (20 s: both start in well under a second here).
    fn ready(mut child: Child, port: u16, dir: TempDir, log: &str) -> FrontProxy {
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the proxy exited ({status}): {}",
                    std::fs::read_to_string(dir.path().join(log)).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "the proxy did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        FrontProxy { child, port, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for FrontProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
