//! The Docker image's baked-in config (`config/floodgate.standalone.yaml`), run by the real binary
//! as `docker run -e FLOODGATE_UPSTREAM=...` runs it, and what a container's user is told when it
//! cannot read its config. (The image itself is built and run by `../shared/container-check/`,
//! outside CI: see docs/deployment.md.)

mod common;

use std::process::Command;

use common::{Floodgate, TempFile, Upstream, client, get};

const STANDALONE: &str = include_str!("../config/floodgate.standalone.yaml");

#[tokio::test]
async fn the_images_baked_config_needs_only_an_upstream_and_serves_real_responses() {
    let upstream = Upstream::start().await;
    let url = upstream.url();
    let fg = Floodgate::start_file(
        STANDALONE,
        &[
            ("FLOODGATE_UPSTREAM", url.as_str()),
            // Port 0 here; the image listens on 0.0.0.0:8080 and :9090.
            ("FLOODGATE_LISTEN", "127.0.0.1:0"),
            ("FLOODGATE_ADMIN_LISTEN", "127.0.0.1:0"),
            ("FLOODGATE_BURST", "3"),
        ],
    );
    let http = client();
    for _ in 0..3 {
        let reply = get(&http, &fg.url("/anything"), &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, common::UPSTREAM_BODY);
    }
    let denied = get(&http, &fg.url("/anything"), &[]).await;
    assert_eq!(
        denied.status, 429,
        "FLOODGATE_BURST=3 is the bucket's capacity"
    );
    assert_eq!(denied.header("x-ratelimit-limit"), "3");
    assert_eq!(get(&http, &fg.admin_url("/readyz"), &[]).await.status, 200);
    assert_eq!(upstream.count(), 3);
}

fn check(config: &std::path::Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
    command
        .args(["check", "--config"])
        .arg(config)
        .env_remove("FLOODGATE_UPSTREAM");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run floodgate check")
}

#[test]
fn the_baked_config_without_an_upstream_names_the_missing_variable() {
    let file = TempFile::new(STANDALONE);
    let output = check(file.path(), &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("${FLOODGATE_UPSTREAM} is not set"),
        "{stderr}"
    );
    let output = check(file.path(), &[("FLOODGATE_UPSTREAM", "http://api:9000")]);
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn a_config_its_user_cannot_read_says_which_user_must_read_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let file = TempFile::new("listen: 127.0.0.1:0\n");
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o000)).expect("chmod");
    // root reads any file: as root (CI), check as `nobody`, as the image's user would be.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let output = if root {
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(env!("CARGO_BIN_EXE_floodgate"))
            .args(["check", "--config"])
            .arg(file.path())
            .output()
            .expect("runuser")
    } else {
        check(file.path(), &[])
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{output:?}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(
        stderr.contains("floodgate runs as uid ") && stderr.contains("must be able to read it"),
        "{stderr}"
    );
}
