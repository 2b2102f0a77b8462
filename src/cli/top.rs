//! `floodgate top --admin URL`: `/top` drawn live in a terminal, with plain ANSI (crossterm only
//! for the raw mode that reads single keys): `d` sorts by denials, `r` by requests, `q` quits.
//! Without a terminal (`--once`, or output to a pipe) it prints one snapshot and exits.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyModifiers};
use crossterm::terminal;

/// What to show, and where from.
pub struct Options {
    /// The admin listener, `http://HOST:PORT`.
    pub admin: String,
    /// One route, or every route.
    pub route: Option<String>,
    pub n: usize,
    pub interval: Duration,
    /// Print one snapshot and exit.
    pub once: bool,
}

/// `GET path` on the admin listener (plain HTTP/1.1, one request per connection).
fn get(admin: &str, path: &str) -> Result<serde_json::Value, String> {
    let host = admin
        .strip_prefix("http://")
        .ok_or_else(|| format!("--admin {admin:?}: expected http://HOST:PORT"))?
        .trim_end_matches('/');
    let addr = std::net::ToSocketAddrs::to_socket_addrs(host)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("--admin {admin:?}: cannot resolve {host}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("cannot reach {admin}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    stream.set_write_timeout(Some(Duration::from_secs(5))).ok();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{admin}: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("{admin}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{admin}: not an HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{admin}{path}: {}",
            head.lines().next().unwrap_or("?")
        ));
    }
    serde_json::from_str(body).map_err(|e| format!("{admin}{path}: {e}"))
}

/// The tables of `/top`'s answer (one route, or `routes`), as text lines.
pub fn render(answer: &serde_json::Value, by_denied: bool) -> Vec<String> {
    let tables: Vec<&serde_json::Value> = match answer.get("routes") {
        Some(routes) => routes
            .as_array()
            .map(|r| r.iter().collect())
            .unwrap_or_default(),
        None => vec![answer],
    };
    let mut lines = vec![format!(
        "floodgate top: the heaviest identities of the recent past, by {} (d: denials, r: requests, q: quit)",
        if by_denied { "denials" } else { "requests" }
    )];
    for table in tables {
        lines.push(String::new());
        lines.push(format!("route {}", table["route"].as_str().unwrap_or("?")));
        lines.push(format!(
            "  {:<32} {:<9} {:>10} {:>10} {:>8}",
            "identity", "kind", "allowed", "denied", "denied%"
        ));
        let rows = table["identities"].as_array().cloned().unwrap_or_default();
        if rows.is_empty() {
            lines.push("  (nobody yet)".to_string());
        }
        for row in rows {
            let (allowed, denied) = (
                row["allowed"].as_u64().unwrap_or(0),
                row["denied"].as_u64().unwrap_or(0),
            );
            let share = 100.0 * denied as f64 / (allowed + denied).max(1) as f64;
            lines.push(format!(
                "  {:<32} {:<9} {:>10} {:>10} {:>7.1}%",
                row["identity"].as_str().unwrap_or("?"),
                row["kind"].as_str().unwrap_or("?"),
                allowed,
                denied,
                share
            ));
        }
    }
    lines
}

fn query(options: &Options, by_denied: bool) -> String {
    let mut path = format!("/top?n={}", options.n);
    if let Some(route) = &options.route {
        path.push_str(&format!("&route={route}"));
    }
    if by_denied {
        path.push_str("&sort=denied");
    }
    path
}

/// Runs the view until `q` (or once); `Err` says why it cannot.
pub fn run(options: &Options) -> Result<(), String> {
    let interactive = !options.once && std::io::IsTerminal::is_terminal(&std::io::stdout());
    if !interactive {
        let answer = get(&options.admin, &query(options, false))?;
        for line in render(&answer, false) {
            println!("{line}");
        }
        return Ok(());
    }
    terminal::enable_raw_mode().map_err(|e| format!("no raw terminal: {e}"))?;
    let result = live(options);
    let _ = terminal::disable_raw_mode();
    // Leave the cursor below the table.
    println!();
    result
}

fn live(options: &Options) -> Result<(), String> {
    let mut by_denied = false;
    let mut out = std::io::stdout();
    loop {
        let lines = match get(&options.admin, &query(options, by_denied)) {
            Ok(answer) => render(&answer, by_denied),
            Err(e) => vec![format!("floodgate top: {e} (retrying; q quits)")],
        };
        // Clear, home, then the lines (raw mode needs \r\n).
        let mut frame = String::from("\x1b[2J\x1b[H");
        for line in lines {
            frame.push_str(&line);
            frame.push_str("\r\n");
        }
        out.write_all(frame.as_bytes()).map_err(|e| e.to_string())?;
        out.flush().ok();
        // Wait for the next refresh, or a key.
        if event::poll(options.interval).map_err(|e| e.to_string())?
            && let Event::Key(KeyEvent {
                code, modifiers, ..
            }) = event::read().map_err(|e| e.to_string())?
        {
            match code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                KeyCode::Char('d') => by_denied = true,
                KeyCode::Char('r') => by_denied = false,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_shows_each_identity_with_its_share_denied() {
        let answer = serde_json::json!({
            "route": "api",
            "identities": [
                {"identity": "api_key:0123456789ab…", "kind": "api_key", "allowed": 5, "denied": 15, "error": 0},
            ],
        });
        let lines = render(&answer, true);
        assert!(lines[0].contains("by denials"));
        assert_eq!(lines[2], "route api");
        assert!(
            lines[4].contains("api_key:0123456789ab…") && lines[4].ends_with("75.0%"),
            "{lines:?}"
        );
        let empty = render(
            &serde_json::json!({"routes": [{"route": "x", "identities": []}]}),
            false,
        );
        assert!(empty.iter().any(|l| l.contains("nobody yet")));
    }
}
