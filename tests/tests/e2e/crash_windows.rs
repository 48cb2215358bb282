//! A crius killed in the middle of a lifecycle step comes back telling the truth: the shim's
//! view wins over a record written before the step finished.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::Env;
use crius_api::shim::Client as ShimClient;
use crius_api::v1::*;

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// The shim's control socket of `pod`, reached through the shim directory's descriptor (the
/// full path is longer than a socket address holds), as crius does. Keep the returned file
/// open while the client is used.
async fn shim_of(env: &Env, pod: &str) -> (std::fs::File, ShimClient) {
    let dir = std::fs::File::open(env.crius.state().join("shims").join(pod)).unwrap();
    let socket = format!(
        "/proc/self/fd/{}/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dir),
        crius_api::shim::CONTROL_SOCKET
    );
    let shim = ShimClient::connect(&socket).await.unwrap();
    (dir, shim)
}

/// crius dies in the middle of StopContainer or RemoveContainer, after the shim killed (and,
/// for a remove, deleted) the container and before the database said so. After a restart the
/// containers are EXITED, a second RemoveContainer (kubelet retries) succeeds, and nothing is
/// left behind.
#[tokio::test]
async fn a_stop_or_remove_the_database_missed_is_settled() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("window-rm", false);
    let pod = env.run_pod(config.clone()).await;
    let stopped = env
        .create_start(
            &pod,
            &config,
            env.container_config("stopped", &["sleep", "1000"]),
        )
        .await;
    let removed = env
        .create_start(
            &pod,
            &config,
            env.container_config("removed", &["sleep", "1000"]),
        )
        .await;

    // Containers that have been running a while: their records are on disk (unflushed
    // writes are flushed within 100 ms, see the next test).
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.crius.kill9().unwrap();
    let (_dir, shim) = shim_of(&env, &pod).await;
    shim.kill(&stopped, nix::sys::signal::Signal::SIGKILL as i32, true)
        .await
        .unwrap();
    shim.kill(&removed, nix::sys::signal::Signal::SIGKILL as i32, true)
        .await
        .unwrap();
    shim.delete(&removed, true).await.unwrap();
    env.crius.restart().await.unwrap();

    for id in [&stopped, &removed] {
        let s = env.wait_exited(id, Duration::from_secs(10)).await;
        assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");
    }
    env.remove_all_and_check(&[&removed, &stopped], &pod).await;
}

/// crius dies after its shim started a container and before `Running` was written: the
/// record says created while the process runs. After a restart the container is RUNNING,
/// StartContainer refuses a second start and StopContainer really stops it.
#[tokio::test]
async fn a_start_the_database_missed_is_recovered_from_the_shim() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("window", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(env.container_config("worker", &["sleep", "1000"])),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;

    // The window: crius is gone and the shim starts the container.
    env.crius.kill9().unwrap();
    // The socket's full path is longer than a socket address holds: reach it through the
    // shim directory's descriptor, as crius does.
    let dir = std::fs::File::open(env.crius.state().join("shims").join(&pod)).unwrap();
    let socket = format!(
        "/proc/self/fd/{}/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dir),
        crius_api::shim::CONTROL_SOCKET
    );
    let shim = ShimClient::connect(&socket).await;
    let (pid, shim_started_at) = shim.unwrap().start(&c).await.unwrap();
    let pid = pid as u32;
    assert!(alive(pid));
    env.crius.restart().await.unwrap();

    let s = env.status(&c).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32, "{s:?}");
    // The start the shim made is the one crius reports: the same instant, not a time of its own.
    assert_eq!(Some(s.started_at), shim_started_at, "{s:?}");
    refuses_a_second_start_and_stops(&env, &c).await;
    for _ in 0..50 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !alive(pid),
        "the container's process survived StopContainer"
    );

    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// StartContainer writes `Running` without a disk flush: crius killed right after it answered
/// may come back with the record still saying created. The recovery learns the start from
/// the shim: the container is RUNNING with its start time, and stops for real.
#[tokio::test]
async fn a_start_crius_died_right_after_is_still_running_after_a_restart() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("unflushed", false);
    let pod = env.run_pod(config.clone()).await;
    let worker = env.container_config("worker", &["sleep", "1000"]);
    let c = env.create_start(&pod, &config, worker).await;
    let before = env.status(&c).await;
    assert_eq!(before.state, ContainerState::ContainerRunning as i32);
    env.crius.kill9().unwrap();
    env.crius.restart().await.unwrap();

    let s = env.status(&c).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32, "{s:?}");
    assert!(s.started_at > 0, "{s:?}");
    // The shim's start time, a moment after the one crius took before asking for the start.
    let drift = (s.started_at - before.started_at).abs();
    assert!(drift < 5_000_000_000, "{s:?} against {before:?}");
    refuses_a_second_start_and_stops(&env, &c).await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// CreateContainer writes `Created` without a disk flush: crius killed right after it
/// answered comes back with a durable record that says creating. The shim has the container
/// and its image lease is on disk, so recovery adopts it: CREATED, startable, and it runs.
/// Unflushed writes reach the disk within 100 ms (`store::FLUSH_WITHIN`): a crius killed later
/// finds the start on disk and has nothing to adopt.
#[tokio::test]
async fn a_create_crius_died_right_after_is_kept_after_a_restart() {
    const ADOPTED_CREATE: &str = "the shim created this container before crius recorded it";
    const ADOPTED_START: &str = "the shim started this container before crius recorded it";
    let mut env = Env::with_image().await;
    let config = env.pod_config("unflushed-create", false);
    let pod = env.run_pod(config.clone()).await;
    // The kill has to come before the flush: tried again if this machine was too slow.
    let mut c = String::new();
    for attempt in 0..3 {
        let name = format!("worker{attempt}");
        c = env
            .create(
                &pod,
                &config,
                env.container_config(&name, &["sleep", "1000"]),
            )
            .await;
        env.crius.kill9().unwrap();
        env.crius.restart().await.unwrap();
        let s = env.status(&c).await;
        assert_eq!(s.state, ContainerState::ContainerCreated as i32, "{s:?}");
        if env.crius.log().contains(ADOPTED_CREATE) {
            break;
        }
        assert!(
            attempt < 2,
            "the record survived every kill: adoption not covered"
        );
        env.remove(&c).await;
    }
    env.start(&c).await;
    let out = env.exec(&c, &["echo", "ok"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.crius.kill9().unwrap();
    env.crius.restart().await.unwrap();
    let s = env.status(&c).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32, "{s:?}");
    assert!(
        !env.crius.log().contains(ADOPTED_START),
        "the start was not flushed within 500 ms"
    );
    refuses_a_second_start_and_stops(&env, &c).await;
    env.remove_all_and_check(&[c.as_str()], &pod).await;
}

/// RemoveContainer's commit is not flushed: crius killed right after it answered finds the
/// record again at its start. The container is back as exited, without its bundle and layer,
/// and a second RemoveContainer removes it with nothing left behind. Flushed within 100 ms: a
/// crius killed later does not see it again.
#[tokio::test]
async fn a_remove_crius_died_right_after_is_undone_and_done_again() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("unflushed-remove", false);
    let pod = env.run_pod(config.clone()).await;
    // The kill has to come before the flush: tried again if this machine was too slow.
    let mut back = None;
    for attempt in 0..3 {
        let name = format!("gone{attempt}");
        let c = env
            .create_start(
                &pod,
                &config,
                env.container_config(&name, &["sleep", "1000"]),
            )
            .await;
        env.stop(&c, 0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        env.remove(&c).await;
        env.crius.kill9().unwrap();
        env.crius.restart().await.unwrap();
        let listed = env.list_containers(ContainerFilter::default()).await;
        if listed.iter().any(|l| l.id == c) {
            back = Some(c);
            break;
        }
        assert!(
            attempt < 2,
            "the removal reached the disk before every kill"
        );
    }
    let c = back.unwrap_or_default();
    let s = env.status(&c).await;
    assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");
    env.remove(&c).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.crius.kill9().unwrap();
    env.crius.restart().await.unwrap();
    let left = env.list_containers(ContainerFilter::default()).await;
    assert!(
        left.is_empty(),
        "containers back after a flushed removal: {left:?}"
    );
    env.remove_all_and_check(&[], &pod).await;
}

/// A container recovered as running: StartContainer refuses it, StopContainer ends it.
async fn refuses_a_second_start_and_stops(env: &Env, c: &str) {
    let again = env
        .rt()
        .start_container(StartContainerRequest {
            container_id: c.to_owned(),
        })
        .await;
    assert!(again.is_err(), "a running container started twice");
    env.stop(c, 2).await;
    let s = env.status(c).await;
    assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");
}

/// A create's record reaches the disk while its rootfs and spec are made, before the shim is
/// asked: a crius killed in between leaves a rootfs, staged volumes and directories that no
/// record names, and no container. The next start removes them, and nothing of a recorded
/// container.
#[tokio::test]
async fn what_a_create_left_without_its_record_is_removed_at_start() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("unrecorded", false);
    let pod = env.run_pod(config.clone()).await;
    let kept = env
        .create_start(
            &pod,
            &config,
            env.container_config("kept", &["sleep", "1000"]),
        )
        .await;
    env.crius.kill9().unwrap();

    // What such a create leaves: its layer's directories, its bundle with the overlay rootfs
    // (a tmpfs here) and a staged volume (a bind mount) mounted in it.
    let id = "c0ffee".repeat(10) + "c0ff";
    let bundle = env.crius.state().join("containers").join(&id);
    let layer = env.crius.root().join("containers").join(&id);
    for dir in [
        layer.join("upper"),
        layer.join("work"),
        bundle.join("rootfs"),
        bundle.join("mounts").join("0"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let mount = |args: &[&str]| {
        let status = std::process::Command::new("mount")
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "mount {args:?}");
    };
    let rootfs = bundle.join("rootfs");
    let staged = bundle.join("mounts").join("0");
    mount(&["-t", "tmpfs", "tmpfs", rootfs.to_str().unwrap()]);
    mount(&[
        "--bind",
        layer.join("upper").to_str().unwrap(),
        staged.to_str().unwrap(),
    ]);

    env.crius.restart().await.unwrap();
    assert!(!bundle.exists() && !layer.exists());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&id), "{mountinfo}");
    assert!(env
        .crius
        .log()
        .contains("removing what a create crius has no record of left"));

    let s = env.status(&kept).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32, "{s:?}");
    assert!(env.crius.state().join("containers").join(&kept).exists());
    assert!(env.crius.root().join("containers").join(&kept).exists());
    env.remove_all_and_check(&[kept.as_str()], &pod).await;
}
