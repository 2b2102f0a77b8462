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
    // Where a request goes and how: pools, discovery, balancing, health, retries, and the
    // connections (conn/: HTTP/1.1 pool, HTTP/2 multiplexer, the frames read off them).
    ("upstream", "metrics tls"),
    ("identity", "limiter tls"),
    ("metrics", "limiter"),
    ("adaptive", "limiter"),
    ("top", "limiter identity"),
    (
        "config",
        "files tls path limiter identity adaptive grpc upstream cache",
    ),
    ("route", "config path"),
    ("policy", "config identity limiter metrics"),
    ("access_log", "identity logging metrics"),
    ("telemetry", "config logging tls"),
    ("control", "config limiter"),
    ("alerts", "config control limiter metrics tls"),
    ("global", "limiter metrics"),
    // The response cache: what may be stored, the entries, one fetch per key. It knows nothing
    // of routes' limits or upstreams: the proxy tells it what a request is and what came back.
    // `cache.shared` keeps entries and fill claims in the store, through the store trait.
    ("cache", "limiter metrics"),
    // Waiting rooms: their rules, and their line in the store (or in memory).
    ("room", "config limiter metrics"),
    // floodgate's own answers (refusals, rate-limit headers), below every front end.
    ("answer", "config grpc limiter metrics policy upstream"),
    // The one decider every front end calls (the proxy, replay, /budgets, the service).
    (
        "decider",
        "alerts config control global identity limiter metrics policy",
    ),
    // The pipeline's top: anything below it, never each other (replay runs without a proxy;
    // the proxy knows nothing of the admin listener or the server that calls it).
    (
        "proxy",
        "access_log adaptive alerts answer cache config control deadline decider global grpc identity limiter metrics path policy room route telemetry tls top upstream",
    ),
    (
        "replay",
        "access_log config decider identity limiter metrics path policy route top",
    ),
    // Routes from containers' labels: the engine's events into routes, applied through a
    // trait the server's reloader implements.
    ("provider", "config metrics"),
    (
        "admin",
        "answer config control deadline decider identity limiter policy provider proxy top upstream",
    ),
    // The rate-limit service: descriptors decided by the decider whose owner it shares with
    // the proxy (the proxy gives it the snapshot of rules).
    (
        "service",
        "answer config deadline decider files grpc identity limiter metrics policy proxy telemetry",
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

/// Every `.rs` file under `root`, with its module path (`proxy/context.rs` is
/// `["proxy", "context"]`; `main.rs` and `lib.rs` are the crate's root, `[]`).
fn modules_under(root: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap().with_extension("");
            let mut module: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.as_slice(), [one] if one == "lib" || one == "main") {
                module.clear();
            }
            out.push((module, path));
        }
    }
    out
}

/// The modules a file's code names through `crate::a::b…` and `super::a…` paths (outside
/// comments and its `#[cfg(test)]` part), each the longest prefix that is a file of the crate.
fn file_names(
    text: &str,
    module: &[String],
    files: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line
            .match_indices("crate::")
            .chain(line.match_indices("super::"))
        {
            // Not the tail of a longer path (`a::super::`) or a word (`supercrate::`).
            if at > 0
                && (line.as_bytes()[at - 1].is_ascii_alphanumeric()
                    || line.as_bytes()[at - 1] == b':'
                    || line.as_bytes()[at - 1] == b'_')
            {
                continue;
            }
            let path: String = line[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut parts = path.split("::").filter(|p| !p.is_empty());
            let mut base: Vec<String> = match parts.next() {
                Some("crate") => Vec::new(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            let mut found = None;
            for part in parts {
                if part == "super" {
                    base.pop();
                    continue;
                }
                base.push(part.to_string());
                if files.contains(&base) {
                    found = Some(base.clone());
                }
            }
            if let Some(found) = found {
                out.insert(found);
            }
        }
    }
    out
}

/// Two files of which neither contains the other (siblings, cousins) never name each other:
/// such a pair is one thing split in two, or a dependency the wrong way round (round 6 found
/// identity/jwks.rs and jwt.rs, proxy/context.rs and response.rs, and the demo upstream's chat.rs
/// and service.rs doing this).
#[test]
fn no_two_files_name_each_other() {
    for root in ["src", "demo-upstream/src"] {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
        let modules = modules_under(&root);
        let files: BTreeSet<Vec<String>> = modules.iter().map(|(m, _)| m.clone()).collect();
        let mut names = std::collections::BTreeMap::new();
        for (module, path) in &modules {
            let text = std::fs::read_to_string(path).expect("read source");
            names.insert(module.clone(), file_names(&text, module, &files));
        }
        let mut circles = Vec::new();
        for (a, named) in &names {
            for b in named {
                let related = a.starts_with(b) || b.starts_with(a);
                if !related && a < b && names.get(b).is_some_and(|n| n.contains(a)) {
                    circles.push(format!("{} <-> {}", a.join("/"), b.join("/")));
                }
            }
        }
        assert!(
            circles.is_empty(),
            "{}: {}",
            root.display(),
            circles.join(", ")
        );
    }
}

#[test]
fn the_circle_check_resolves_super_and_crate_paths() {
    let files: BTreeSet<Vec<String>> = [
        vec!["proxy".to_string()],
        vec!["proxy".into(), "context".into()],
        vec!["proxy".into(), "response".into()],
        vec!["limiter".into()],
    ]
    .into();
    let module = vec!["proxy".to_string(), "context".to_string()];
    let named = file_names(
        "use super::response::Dialect;\nuse crate::limiter::Verdict;\n// super::nothing\n#[cfg(test)]\nuse super::proxy;",
        &module,
        &files,
    );
    assert_eq!(
        named,
        BTreeSet::from([
            vec!["proxy".to_string(), "response".to_string()],
            vec!["limiter".to_string()],
        ])
    );
}
