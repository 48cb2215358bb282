//! Container processes start with a clean signal state: nothing blocked, nothing ignored.
//! The shim blocks SIGTERM/SIGINT/SIGCHLD for its own signalfd and its libcontainer helper is
//! a Rust program (which ignores SIGPIPE); neither may leak into a container, or a plain
//! `StopContainer` would have to wait its whole timeout for SIGKILL.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::common::Env;

fn sig_line<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or_else(|| panic!("{key} missing from {status}"))
}

#[tokio::test]
async fn containers_and_execs_start_with_no_blocked_or_ignored_signal() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("signals", true);
    let pod = env.run_pod(pod_config.clone()).await;
    // The test image's StopSignal is SIGUSR1: `top` dies of it
    // at once only if it is not blocked.
    let config = env.container_config("top", &["top"]);
    let id = env.create_start(&pod, &pod_config, config).await;

    let status = std::fs::read_to_string(format!("/proc/{}/status", env.pid(&id).await)).unwrap();
    assert_eq!(
        sig_line(&status, "SigBlk:"),
        "0000000000000000",
        "init's blocked signals"
    );
    assert_eq!(
        sig_line(&status, "SigIgn:"),
        "0000000000000000",
        "init's ignored signals"
    );

    let out = env
        .exec(&id, &["cat", "/proc/self/status"], 10)
        .await
        .unwrap();
    let status = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        sig_line(&status, "SigBlk:"),
        "0000000000000000",
        "exec's blocked signals"
    );
    assert_eq!(
        sig_line(&status, "SigIgn:"),
        "0000000000000000",
        "exec's ignored signals"
    );

    let start = Instant::now();
    env.stop(&id, 30).await;
    let took = start.elapsed();
    let exited = env.status(&id).await;
    assert_eq!(
        exited.exit_code,
        128 + 10,
        "top ends by the image's StopSignal (SIGUSR1), not by SIGKILL"
    );
    assert!(
        took < Duration::from_secs(10),
        "StopContainer took {took:?}"
    );
    env.remove(&id).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
