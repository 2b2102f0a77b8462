//! The command line with the real binary: `floodgate check` names the offending field of a bad
//! config and accepts a good one, and `floodgate --config BAD` refuses to start.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Output;

use common::{TempFile, floodgate_command};

const GOOD: &str = "listen: 127.0.0.1:0
routes:
  - name: rides
    path_prefix: /api/rides
    methods: [POST]
    upstream: http://127.0.0.1:9000
    limits:
      - algorithm: token_bucket
        capacity: 20
        refill_rate: 10
      - algorithm: fixed_window
        limit: 1000
        window: 1h
";

fn check(path: &Path) -> Output {
    floodgate_command(&[
        OsStr::new("check"),
        OsStr::new("--config"),
        path.as_os_str(),
    ])
}

/// Runs `floodgate check` on `yaml` and returns its stderr, after checking it failed.
fn check_fails(yaml: &str) -> (String, TempFile) {
    let file = TempFile::new(yaml);
    let output = check(file.path());
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "check accepted:\n{yaml}");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    (stderr, file)
}

#[test]
fn check_names_the_field_of_a_zero_refill_rate() {
    let (stderr, file) = check_fails(&GOOD.replace("refill_rate: 10", "refill_rate: 0"));
    let expected = format!(
        "{}: routes[0].limits[0].refill_rate: must be > 0",
        file.path().display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn check_names_an_unknown_key() {
    let (stderr, _file) =
        check_fails(&GOOD.replace("capacity: 20", "capacity: 20\n        burst: 5"));
    assert!(stderr.contains("routes[0].limits[0]"), "{stderr}");
    assert!(stderr.contains("burst"), "{stderr}");
}

#[test]
fn check_names_the_window_of_a_bad_duration() {
    let (stderr, _file) = check_fails(&GOOD.replace("window: 1h", "window: 1 fortnight"));
    assert!(stderr.contains("routes[0].limits[1].window: "), "{stderr}");
}

#[test]
fn check_reports_every_problem_not_just_the_first() {
    let yaml = GOOD
        .replace("refill_rate: 10", "refill_rate: -1")
        .replace("limit: 1000", "limit: 0");
    let (stderr, _file) = check_fails(&yaml);
    assert!(
        stderr.contains("routes[0].limits[0].refill_rate: must be > 0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("routes[0].limits[1].limit: must be > 0"),
        "{stderr}"
    );
}

#[test]
fn check_accepts_a_good_config() {
    let file = TempFile::new(GOOD);
    let output = check(file.path());
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn check_accepts_the_example_configs() {
    for name in [
        "floodgate.yaml",
        "ride-hailing.yaml",
        "floodgate.docker.yaml",
    ] {
        let example = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("config")
            .join(name);
        let output = check(&example);
        assert!(output.status.success(), "{name}: {output:?}");
    }
}

#[test]
fn starting_with_a_bad_config_fails_naming_the_field() {
    let file = TempFile::new(&GOOD.replace("refill_rate: 10", "refill_rate: 0"));
    let output = floodgate_command(&[OsStr::new("--config"), file.path().as_os_str()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{output:?}");
    assert!(
        stderr.contains("routes[0].limits[0].refill_rate: must be > 0"),
        "{stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "it must not claim to listen: {output:?}"
    );
}
