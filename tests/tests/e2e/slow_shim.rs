//! A create that crius stopped waiting for is settled: when the pod's shim does not answer in
//! `[runtime] shim_operation_timeout_secs`, CreateContainer fails with DeadlineExceeded (not
//! Internal), and once the shim gets to it the container it created is removed, so nothing is
//! left half-known and the name can be used again.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::common::Env;
use crius_api::v1::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tonic::Code;

/// Continues a stopped process when dropped, so a failing assertion leaves no shim stopped.
struct Stopped(i32);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGCONT);
    }
}

#[tokio::test]
async fn a_create_crius_gave_up_on_is_removed_once_the_shim_finishes_it() {
    let mut env = Env::with_config("[runtime]\nshim_operation_timeout_secs = 2\n").await;
    env.pull(&env.image.clone()).await;
    let config = env.pod_config("slow-shim", false);
    let pod = env.run_pod(config.clone()).await;
    let shim = env.shim_pid(&pod);

    // The shim stalls (as a shim relaying a flood on a loaded node did, for more than 10 s).
    kill(Pid::from_raw(shim), Signal::SIGSTOP).unwrap();
    let stopped = Stopped(shim);
    let began = Instant::now();
    let err = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(env.container_config("late", &["sleep", "1000"])),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("timed out"), "{}", err.message());
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "crius waited {:?}, not its 2 s",
        began.elapsed()
    );
    // kubelet sees no container of that create.
    assert!(env
        .list_containers(ContainerFilter {
            pod_sandbox_id: pod.clone(),
            ..Default::default()
        })
        .await
        .is_empty());

    // The shim goes on: it finishes the create nobody waits for, and crius removes it.
    drop(stopped);
    let bundles = env.crius.state().join("containers");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_dir, client) = shim_client(&env, &pod).await;
        let in_shim = client.list().await.unwrap();
        let left: Vec<_> = std::fs::read_dir(&bundles)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        if in_shim.len() == 1 && left.is_empty() {
            // Only the pause container is left in the shim, and no container's state dir.
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: shim has {in_shim:?}, state has {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The name is free again: kubelet's retry of the same create succeeds.
    let id = env
        .create_start(
            &pod,
            &config,
            env.container_config("late", &["sleep", "1000"]),
        )
        .await;
    assert!(!id.is_empty());
    assert!(env.crius.log().contains("undo of a failed create"));
}

/// The shim's control socket of `pod`, through the shim directory's descriptor (the path is
/// longer than a socket address holds). Keep the file open while the client is used.
async fn shim_client(env: &Env, pod: &str) -> (std::fs::File, crius_api::shim::Client) {
    let dir = std::fs::File::open(env.crius.state().join("shims").join(pod)).unwrap();
    let socket = format!(
        "/proc/self/fd/{}/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dir),
        crius_api::shim::CONTROL_SOCKET
    );
    let client = crius_api::shim::Client::connect(&socket).await.unwrap();
    (dir, client)
}
