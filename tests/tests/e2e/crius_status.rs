//! `crius status` as an operator runs it, against a real crius with a pod and containers in
//! each state: exit codes and printed lines. (The other subcommands, which need no running
//! crius, are tested in `runtime/tests/cli.rs`.)
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::Env;

/// Runs the crius binary under test with `args`.
fn crius(args: &[&str]) -> Output {
    Command::new(crius_tests::binary("crius").unwrap())
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value printed after `key:` in `crius status` output.
fn field<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{status}"))
        .trim()
}

fn status_of(socket: &Path) -> String {
    let out = crius(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[tokio::test]
async fn status_reports_version_uptime_config_and_counts_by_state() {
    let mut env = Env::with_image().await;
    let socket = env.crius.socket();
    let config = env.crius.config_path();

    let status = status_of(&socket);
    let pid = env.crius.pid().unwrap();
    let first = status.lines().next().unwrap();
    assert!(
        first.starts_with(&format!(
            "crius {} (CRI v1), pid {pid}, up ",
            env!("CARGO_PKG_VERSION")
        )),
        "{status}"
    );
    assert_eq!(field(&status, "socket"), socket.display().to_string());
    assert_eq!(field(&status, "config"), config.display().to_string());
    assert_eq!(field(&status, "conditions"), "RuntimeReady, NetworkReady");
    assert_eq!(field(&status, "pods"), "0");
    assert_eq!(field(&status, "containers"), "0");
    assert_eq!(field(&status, "pulls"), "none");
    assert_eq!(
        field(&status, "nri"),
        format!("{}, no plugin connected", env.crius.nri_socket().display())
    );
    assert!(
        field(&status, "handlers").starts_with("(default)"),
        "{status}"
    );

    // One pod; containers created, running and exited.
    let pod_config = env.pod_config("status", false);
    let pod = env.run_pod(pod_config.clone()).await;
    env.create(
        &pod,
        &pod_config,
        env.container_config("created", &["sleep", "600"]),
    )
    .await;
    env.create_start(
        &pod,
        &pod_config,
        env.container_config("running", &["sleep", "600"]),
    )
    .await;
    let done = env
        .create_start(&pod, &pod_config, env.container_config("done", &["true"]))
        .await;
    env.wait_exited(&done, Duration::from_secs(20)).await;
    let status = status_of(&socket);
    eprintln!("crius status:\n{status}");
    assert_eq!(field(&status, "pods"), "1 (1 ready)");
    assert_eq!(
        field(&status, "containers"),
        "3 (1 created, 1 running, 1 exited)"
    );

    // A drop-in shows among the files once crius has read it (at its next start), and the
    // socket comes from the configuration when --socket is not given.
    let drop_in = env.crius.dir().join("config.d/10-status.toml");
    std::fs::create_dir_all(drop_in.parent().unwrap()).unwrap();
    std::fs::write(&drop_in, "log_format = \"json\"\n").unwrap();
    env.crius.restart().await.unwrap();
    env.stop_pod(&pod).await;
    let out = crius(&[
        "--config",
        config.to_str().unwrap(),
        "--listen",
        &format!("unix://{}", socket.display()),
        "status",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status = text(&out.stdout);
    assert_eq!(
        field(&status, "config"),
        format!("{}, {}", config.display(), drop_in.display())
    );
    assert_eq!(field(&status, "pods"), "1 (1 not ready)");
    assert!(
        status
            .lines()
            .next()
            .unwrap()
            .contains(&format!("pid {}, up ", env.crius.pid().unwrap())),
        "{status}"
    );
    env.remove_pod(&pod).await;

    // Nothing listening: exit 1, and the message says where it looked.
    env.crius.stop().unwrap();
    let out = crius(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "crius: connect to {} (is crius running?)",
            socket.display()
        )),
        "{err}"
    );
}
