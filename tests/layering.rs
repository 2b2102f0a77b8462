//! The dependency rule written in `src/lib.rs`, checked: each module's code names only the
//! modules it may build on (doc comments may link anywhere). A `use crate::config` inside the
//! limiter, say, fails here with the file and line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each top-level module and the modules its code may name (space-separated), as `src/lib.rs`
/// says.
const ALLOWED: &[(&str, &str)] = &[
    ("files", ""),
    ("logging", ""),
    ("tls", "files"),
    ("path", ""),
    ("deadline", ""),
    ("grpc", ""),
    ("limiter", "tls"),
    // Where a request goes: pools, discovery, balancing, health, retries.
    ("upstream", "metrics"),
    ("identity", "limiter tls"),
    ("metrics", "limiter"),
    ("adaptive", "limiter"),
    ("top", "limiter identity"),
    (
        "config",
        "files tls path limiter identity adaptive grpc upstream",
    ),
    ("route", "config path"),
    ("policy", "config identity limiter metrics"),
    ("access_log", "identity metrics"),
    ("telemetry", "config tls"),
    ("control", "config limiter"),
    ("alerts", "config control limiter metrics tls"),
    ("global", "limiter metrics"),
    // The one decider every front end calls (the proxy, replay, /budgets, the service).
    (
        "decider",
        "alerts config control global identity limiter metrics policy",
    ),
    // The pipeline's top: anything below it, never each other (replay runs without a proxy;
    // the proxy knows nothing of the admin listener or the server that calls it).
    (
        "proxy",
        "access_log adaptive alerts config control deadline decider global grpc identity limiter metrics path policy route telemetry tls top upstream",
    ),
    (
        "replay",
        "access_log config decider identity limiter metrics path policy route top",
    ),
    (
        "admin",
        "config control deadline decider identity limiter policy proxy top upstream",
    ),
    // The rate-limit service: descriptors decided by the proxy's decider and store.
    (
        "service",
        "config deadline decider files grpc identity limiter metrics policy proxy telemetry",
    ),
];

/// The module's files: `src/NAME.rs` and everything under `src/NAME/`.
fn files_of(module: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = vec![src.join(format!("{module}.rs"))];
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.retain(|p| p.exists());
    out
}

/// The top-level modules a line of code names through `crate::` (`crate::{…}` as "{", which no
/// module may use: it would hide the names from this check).
fn named(line: &str) -> BTreeSet<String> {
    line.match_indices("crate::")
        .map(|(at, m)| {
            let name: String = line[at + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() { "{".into() } else { name }
        })
        .collect()
}

#[test]
fn each_module_names_only_what_lib_rs_lets_it_build_on() {
    let mut broken = Vec::new();
    for (module, allowed) in ALLOWED {
        let files = files_of(module);
        assert!(!files.is_empty(), "no source for {module}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read source");
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for name in named(line) {
                    if name != *module && !allowed.split(' ').any(|a| a == name) {
                        broken.push(format!(
                            "{}:{}: {module} names crate::{name}",
                            file.display(),
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_check_sees_a_forbidden_name() {
    assert_eq!(
        named("use crate::config::tls; let x = crate::limiter::Limit::x(); use crate::{a, b};"),
        BTreeSet::from(["config".into(), "limiter".into(), "{".into()])
    );
}
