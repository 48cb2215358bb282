//! Checkpoint and restore with CRIU, end to end: a counter that lives only in a shell's memory
//! and a file in its writable layer are checkpointed (the container runs on), the container
//! is removed, and a `CreateContainer` whose image is the archive restores it into another
//! pod, where it goes on counting after `StartContainer` with the file intact. Also: the
//! archive's layout, a checkpoint under the built-in handler (whose pods restore through runc,
//! libcontainer having no restore), a timeout too short for the dump (the container runs on, no
//! archive), a dump CRIU refuses, bad requests, gVisor (Unimplemented), and a crius without a
//! usable criu. Prints the checkpoint and restore times it measures. Run as root.
//!
//! crius is pointed at `/opt/crius/criu/bin/criu` when `contrib/criu/install` put one there
//! (kernels Debian 12's criu does not know), else at `criu` in `$PATH`; one test leaves it
//! to crius's default, which finds the same criu.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::checkpoints::{
    big_shell, checkpoint_info, counted, counter_named, counts_on_from, criu_config, files_in,
    gvisor_sleeper, numbers, pod_config, remove_all,
};
use crate::common::{assert_status, Env};
use crius_api::v1::{
    CheckpointContainerRequest, ContainerConfig, ContainerState, NamespaceMode, StatusRequest,
};
use tonic::Code;

/// The counter of these tests: `kept-in-the-layer` in `/root/note`, then counting.
fn counter(env: &Env) -> ContainerConfig {
    counter_named(env, "counter", "kept-in-the-layer")
}

async fn checkpoint(
    env: &Env,
    id: &str,
    location: &Path,
    timeout: i64,
) -> Result<(), tonic::Status> {
    env.rt()
        .checkpoint_container(CheckpointContainerRequest {
            container_id: id.into(),
            location: location.display().to_string(),
            timeout,
        })
        .await
        .map(|_| ())
}

/// The names of the archive's entries.
fn entries(archive: &Path) -> BTreeSet<String> {
    let mut ar = tar::Archive::new(std::fs::File::open(archive).unwrap());
    ar.entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect()
}

/// The contents of one entry of a tar file.
fn entry(archive: &Path, name: &str) -> Vec<u8> {
    let mut ar = tar::Archive::new(std::fs::File::open(archive).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().display().to_string() == name {
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            return data;
        }
    }
    panic!("{name} not in {}", archive.display());
}

#[tokio::test]
async fn a_counter_is_checkpointed_and_restored_into_another_pod() {
    let _turn = common::checkpoints::criu_turn().await;
    let cgroup2 = common::checkpoints::cgroup2_options();
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let ck = checkpoint_info(&env).await;
    assert_eq!(ck["handlers"]["runc"], "checkpoint, restore", "{ck}");
    assert_eq!(
        ck["handlers"]["crius"], "checkpoint, restore (through runc)",
        "{ck}"
    );
    assert_eq!(ck["handlers"]["runsc"], "none", "{ck}");

    let config_a = pod_config(&env, "ck-a");
    let pod_a = env.run_pod_with_handler(config_a.clone(), "runc").await;
    let id = env.create_start(&pod_a, &config_a, counter(&env)).await;
    let log_a = env.log_dir("ck-a").join("counter.log");
    env.wait_log(&log_a, Duration::from_secs(10), |l| l.len() >= 5)
        .await;

    let dir = env.crius.dir().join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let archive = dir.join("counter.tar");
    let began = Instant::now();
    checkpoint(&env, &id, &archive, 60).await.unwrap();
    let took = began.elapsed();
    let at_checkpoint = *numbers(&log_a).last().unwrap();
    eprintln!("checkpoint of the busybox counter (runc): {took:?}");

    // Left running: it goes on counting.
    let s = env.status(&id).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32);
    env.wait_log(&log_a, Duration::from_secs(10), |_| {
        numbers(&log_a)
            .last()
            .is_some_and(|n| *n >= at_checkpoint + 5)
    })
    .await;

    // Root's alone: it holds the processes' memory.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&archive).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "archive mode {mode:o}");

    // The layout CRI-O and containerd write, and what checkpointctl reads.
    let names = entries(&archive);
    for name in [
        "config.dump",
        "spec.dump",
        "rootfs-diff.tar",
        "checkpoint/inventory.img",
        "checkpoint/pstree.img",
        "container.log",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    let dump: serde_json::Value = serde_json::from_slice(&entry(&archive, "config.dump")).unwrap();
    assert_eq!(dump["id"], id.as_str());
    assert_eq!(dump["rootfsImageName"], env.image.as_str());
    assert_eq!(dump["rootfsImage"], env.image_ref.as_str());
    assert_eq!(dump["runtime"], "runc");
    let spec: serde_json::Value = serde_json::from_slice(&entry(&archive, "spec.dump")).unwrap();
    assert!(spec["process"]["args"]
        .to_string()
        .contains("kept-in-the-layer"));
    let diff = dir.join("diff.tar");
    std::fs::write(&diff, entry(&archive, "rootfs-diff.tar")).unwrap();
    assert_eq!(entry(&diff, "root/note"), b"kept-in-the-layer\n");
    // Nothing else in the directory: no temporary file left beside the archive.
    let mut left = files_in(&dir);
    left.sort();
    assert_eq!(left, vec![archive.clone(), diff.clone()]);

    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod_a).await;
    env.remove_pod(&pod_a).await;

    // Restored into another pod: created, not counting until started.
    let config_b = pod_config(&env, "ck-b");
    let pod_b = env.run_pod_with_handler(config_b.clone(), "runc").await;
    let mut c = counter(&env);
    c.image.as_mut().unwrap().image = archive.display().to_string();
    // Not into the pod's PID namespace: runc cannot restore there.
    let mut shared = c.clone();
    common::sc(&mut shared).namespace_options = Some(crius_api::v1::NamespaceOption {
        pid: NamespaceMode::Pod as i32,
        ..Default::default()
    });
    let err = env
        .rt()
        .create_container(crius_api::v1::CreateContainerRequest {
            pod_sandbox_id: pod_b.clone(),
            config: Some(shared),
            sandbox_config: Some(config_b.clone()),
        })
        .await
        .unwrap_err();
    assert_status::<()>(Err(err), Code::FailedPrecondition, &["PID namespace"]);
    let began = Instant::now();
    let restored = env.create(&pod_b, &config_b, c).await;
    let restore_took = began.elapsed();
    eprintln!("restore (CreateContainer) of the busybox counter (runc): {restore_took:?}");
    let s = env.status(&restored).await;
    assert_eq!(s.state, ContainerState::ContainerCreated as i32);
    assert_eq!(s.image.as_ref().unwrap().image, env.image);
    let log_b = env.log_dir("ck-b").join("counter.log");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(numbers(&log_b).is_empty(), "counted before its start");

    env.start(&restored).await;
    // It goes on from where the checkpoint found it, not from 1.
    counts_on_from(&env, &log_b, at_checkpoint).await;
    let out = env
        .exec(&restored, &["cat", "/root/note"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept-in-the-layer\n");
    env.stop(&restored, 0).await;
    env.remove(&restored).await;
    env.stop_pod(&pod_b).await;
    env.remove_pod(&pod_b).await;
    env.assert_no_leaks().await;
    // CRIU mounted cgroup2 for a moment in both calls, which resets the mount's options (its
    // root's flags, favordynmods among them); crius put them back.
    assert_eq!(common::checkpoints::cgroup2_options(), cgroup2);
}

#[tokio::test]
async fn the_builtin_handler_checkpoints_and_its_pods_restore_through_runc() {
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let config = pod_config(&env, "ck-builtin");
    let pod = env.run_pod(config.clone()).await;
    let id = env.create_start(&pod, &config, counter(&env)).await;
    let log = env.log_dir("ck-builtin").join("counter.log");
    env.wait_log(&log, Duration::from_secs(10), |l| l.len() >= 5)
        .await;
    let archive = env.crius.dir().join("builtin.tar");
    let began = Instant::now();
    checkpoint(&env, &id, &archive, 60).await.unwrap();
    eprintln!(
        "checkpoint of the busybox counter (built-in): {:?}",
        began.elapsed()
    );
    let at = *numbers(&log).last().unwrap();
    env.wait_log(&log, Duration::from_secs(10), |_| {
        numbers(&log).last().is_some_and(|n| *n >= at + 5)
    })
    .await;
    assert!(entries(&archive).contains("checkpoint/inventory.img"));
    let dump: serde_json::Value = serde_json::from_slice(&entry(&archive, "config.dump")).unwrap();
    assert_eq!(dump["runtime"], "crius");

    // Restored into the same (built-in) pod, the container runs under runc: libcontainer has
    // no restore. It counts on from the checkpoint, beside the original.
    let mut c = counter(&env);
    c.metadata.as_mut().unwrap().attempt = 1;
    c.log_path = "counter_1.log".into();
    c.image.as_mut().unwrap().image = archive.display().to_string();
    let began = Instant::now();
    let restored = env.create(&pod, &config, c).await;
    eprintln!(
        "restore (CreateContainer) of the busybox counter (built-in pod, through runc): {:?}",
        began.elapsed()
    );
    env.start(&restored).await;
    let log_b = env.log_dir("ck-builtin").join("counter_1.log");
    env.wait_log(&log_b, Duration::from_secs(10), |_| {
        numbers(&log_b).len() >= 3
    })
    .await;
    let counted = numbers(&log_b);
    assert!(
        counted[0] > 1 && counted[0] <= at + 1,
        "{counted:?} (checkpointed at {at})"
    );
    let out = env
        .exec(&restored, &["cat", "/root/note"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept-in-the-layer\n");

    // And the restored container checkpoints again (through runc, whose state it has).
    let again = env.crius.dir().join("again.tar");
    checkpoint(&env, &restored, &again, 60).await.unwrap();
    let dump: serde_json::Value = serde_json::from_slice(&entry(&again, "config.dump")).unwrap();
    assert_eq!(dump["runtime"], "runc");
    assert_eq!(dump["rootfsImageName"], env.image.as_str());
    // Left to the pod's stop and removal below, which reach it through runc.

    // The archive restores into a pod of the runc handler too.
    let config_b = pod_config(&env, "ck-builtin-runc");
    let pod_b = env.run_pod_with_handler(config_b.clone(), "runc").await;
    let mut c = counter(&env);
    c.image.as_mut().unwrap().image = archive.display().to_string();
    let restored = env.create(&pod_b, &config_b, c).await;
    env.start(&restored).await;
    let log_b = env.log_dir("ck-builtin-runc").join("counter.log");
    env.wait_log(&log_b, Duration::from_secs(10), |_| {
        numbers(&log_b).len() >= 3
    })
    .await;
    assert!(numbers(&log_b)[0] > 1, "{:?}", numbers(&log_b));
    env.stop(&restored, 0).await;
    env.remove(&restored).await;
    env.stop_pod(&pod_b).await;
    env.remove_pod(&pod_b).await;

    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn a_too_short_timeout_leaves_the_container_running_and_no_archive() {
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let config = pod_config(&env, "ck-big");
    let pod = env.run_pod_with_handler(config.clone(), "runc").await;
    let c = big_shell(&env);
    let id = env.create_start(&pod, &config, c).await;
    let log = env.log_dir("ck-big").join("big.log");
    env.wait_log(&log, Duration::from_secs(60), |l| l.len() >= 3)
        .await;
    let pid = env.pid(&id).await;
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap()
        .to_string();
    eprintln!("big container {rss}");

    let dir = env.crius.dir().join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let archive = dir.join("big.tar");
    let began = Instant::now();
    let err = checkpoint(&env, &id, &archive, 1).await.unwrap_err();
    assert_status::<()>(Err(err), Code::DeadlineExceeded, &["runs on"]);
    assert!(!archive.exists());
    // The dump finishes in the background; then nothing of it is left, there or in the
    // container's directory.
    let layer = env.crius.root().join("containers").join(&id);
    common::wait_for(
        "the abandoned dump to be cleaned up",
        Duration::from_secs(60),
        || async {
            let staged = files_in(&layer).iter().any(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("checkpoint-")
            });
            (!staged && files_in(&dir).is_empty()).then_some(())
        },
    )
    .await;
    assert!(!archive.exists());
    eprintln!(
        "the abandoned dump (with 60 MB in /dev) was gone after {:?}",
        began.elapsed()
    );
    let at = numbers(&log).last().copied().unwrap_or(0);
    env.wait_log(&log, Duration::from_secs(20), |_| {
        numbers(&log).last().is_some_and(|n| *n >= at + 5)
    })
    .await;
    assert_eq!(
        env.status(&id).await.state,
        ContainerState::ContainerRunning as i32
    );

    // With time enough it works; the measured figures for a large process, without the
    // ballast. (The dump that timed out finishes first: this checkpoint waits for the
    // container's lock.)
    env.exec(&id, &["rm", "/dev/ballast"], 10).await.unwrap();
    let began = Instant::now();
    checkpoint(&env, &id, &archive, 120).await.unwrap();
    eprintln!(
        "checkpoint of the 256 MiB shell (runc): {:?}",
        began.elapsed()
    );
    assert_eq!(files_in(&dir), vec![archive.clone()]);
    let size = std::fs::metadata(&archive).unwrap().len();
    eprintln!("archive size: {} MiB", size >> 20);
    env.stop(&id, 0).await;
    env.remove(&id).await;

    let mut c = env.container_config("big", &["true"]);
    c.metadata.as_mut().unwrap().attempt = 1;
    c.image.as_mut().unwrap().image = archive.display().to_string();
    let began = Instant::now();
    let restored = env.create(&pod, &config, c).await;
    eprintln!(
        "restore (CreateContainer) of the 256 MiB shell (runc): {:?}",
        began.elapsed()
    );
    env.start(&restored).await;
    let log = env.log_dir("ck-big").join("big.log");
    let before = numbers(&log).len();
    env.wait_log(&log, Duration::from_secs(20), |_| {
        numbers(&log).len() >= before + 5
    })
    .await;
    env.stop(&restored, 0).await;
    env.remove(&restored).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn bad_checkpoint_requests_are_refused_by_field() {
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let config = pod_config(&env, "ck-bad");
    let pod = env.run_pod(config.clone()).await;
    let created = env.create(&pod, &config, counter(&env)).await;
    let ok = env.crius.dir().join("x.tar");

    let err = checkpoint(&env, &created, Path::new(""), 0)
        .await
        .unwrap_err();
    assert_status::<()>(Err(err), Code::InvalidArgument, &["location"]);
    let err = checkpoint(&env, &created, Path::new("relative.tar"), 0)
        .await
        .unwrap_err();
    assert_status::<()>(Err(err), Code::InvalidArgument, &["location"]);
    let err = checkpoint(&env, &created, Path::new("/no/such/dir/x.tar"), 0)
        .await
        .unwrap_err();
    assert_status::<()>(Err(err), Code::InvalidArgument, &["directory"]);
    let err = checkpoint(&env, &created, &ok, -1).await.unwrap_err();
    assert_status::<()>(Err(err), Code::InvalidArgument, &["timeout"]);
    let err = checkpoint(&env, "no-such-container", &ok, 0)
        .await
        .unwrap_err();
    assert_status::<()>(Err(err), Code::NotFound, &["no-such-container"]);
    let err = checkpoint(&env, &created, &ok, 0).await.unwrap_err();
    assert_status::<()>(Err(err), Code::FailedPrecondition, &["not running"]);
    assert!(!ok.exists());

    // A restore from something that is not there, or not an archive.
    let mut c = counter(&env);
    c.metadata.as_mut().unwrap().attempt = 1;
    c.image.as_mut().unwrap().image = "/no/such/archive.tar".into();
    let err = env
        .rt()
        .create_container(crius_api::v1::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(c),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_err();
    assert_status::<()>(Err(err), Code::NotFound, &["checkpoint archive"]);

    // A dump CRIU refuses (an established TCP connection, not dumped by default) fails with
    // CRIU's reason, leaves the container running and writes nothing.
    let tcp = env.container_config(
        "tcp",
        &[
            "sh",
            "-c",
            "sleep 100000 | nc -l -p 7000 > /dev/null & \
             until netstat -tln | grep -q ':7000 '; do sleep 0.1; done; \
             sleep 100000 | nc 127.0.0.1 7000 > /dev/null & \
             until netstat -tn | grep -q ESTABLISHED; do sleep 0.1; done; echo connected; \
             i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done",
        ],
    );
    let id = env.create_start(&pod, &config, tcp).await;
    let log = env.log_dir("ck-bad").join("tcp.log");
    env.wait_log(&log, Duration::from_secs(10), |l| l.len() >= 3)
        .await;
    let err = checkpoint(&env, &id, &ok, 30).await.unwrap_err();
    eprintln!("refused dump: {}", err.message());
    assert_status::<()>(Err(err), Code::FailedPrecondition, &["criu"]);
    assert!(!ok.exists());
    assert!(
        !files_in(env.crius.dir()).iter().any(|p| p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .contains("crius-")),
        "temporary archive left: {:?}",
        files_in(env.crius.dir())
    );
    let at = numbers(&log).last().copied().unwrap_or(0);
    env.wait_log(&log, Duration::from_secs(10), |_| {
        numbers(&log).last().is_some_and(|n| *n >= at + 5)
    })
    .await;
    assert_eq!(
        env.status(&id).await.state,
        ContainerState::ContainerRunning as i32
    );
    env.stop(&id, 0).await;
    env.remove(&id).await;

    // gVisor's checkpoints are not CRIU's: Unimplemented, saying so, for both directions.
    if let Some((g_pod, g_config, g)) = gvisor_sleeper(&mut env, "ck-gvisor").await {
        let err = checkpoint(&env, &g, &ok, 0).await.unwrap_err();
        assert_status::<()>(Err(err), Code::Unimplemented, &["runsc", "gVisor"]);
        let mut c = counter(&env);
        // The archive's existence is checked first; any file reaches the handler's check.
        let any_file = env.crius.dir().join("not-an-archive.tar");
        std::fs::write(&any_file, b"x").unwrap();
        c.image.as_mut().unwrap().image = any_file.display().to_string();
        let err = env
            .rt()
            .create_container(crius_api::v1::CreateContainerRequest {
                pod_sandbox_id: g_pod.clone(),
                config: Some(c),
                sandbox_config: Some(g_config.clone()),
            })
            .await
            .unwrap_err();
        assert_status::<()>(Err(err), Code::Unimplemented, &["cannot restore"]);
        remove_all(&env, &g_pod, &g).await;
    }

    env.remove(&created).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// With the built-in defaults (no `criu_path`), a checkpoint works where `make run` set the
/// node up: crius takes the system's criu when it passes `criu check`, else the one
/// `contrib/criu/install` put in /opt/crius/criu for kernels the system's does not know.
#[tokio::test]
async fn the_default_criu_path_finds_the_criu_make_run_installs() {
    let system_works = Command::new("criu")
        .arg("check")
        .output()
        .is_ok_and(|o| o.status.success());
    let private = Path::new(common::checkpoints::PROJECT_CRIU);
    if !system_works && !private.exists() {
        eprintln!("skipped: no criu that works on this kernel");
        return;
    }
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image().await;
    let ck = checkpoint_info(&env).await;
    let criu = ck["criu"].as_str().unwrap_or_else(|| panic!("{ck}"));
    if !system_works {
        assert_eq!(Path::new(criu), private, "{ck}");
    }
    let config = pod_config(&env, "ck-default");
    let pod = env.run_pod_with_handler(config.clone(), "runc").await;
    let id = env.create_start(&pod, &config, counter(&env)).await;
    let archive = env.crius.dir().join("default-criu.tar");
    checkpoint(&env, &id, &archive, 0).await.unwrap();
    assert!(entries(&archive).contains("checkpoint/inventory.img"));
    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn without_criu_checkpoints_fail_naming_the_package() {
    let mut env = Env::with_image_and_config("[runtime]\ncriu_path = \"no-such-criu\"\n").await;
    let ck = checkpoint_info(&env).await;
    assert_eq!(ck["handlers"]["runc"], "none", "{ck}");
    assert!(
        ck["error"].as_str().unwrap().contains("criu package"),
        "{ck}"
    );

    let config = pod_config(&env, "ck-none");
    let pod = env.run_pod(config.clone()).await;
    let id = env.create_start(&pod, &config, counter(&env)).await;
    let ok = env.crius.dir().join("x.tar");
    let err = checkpoint(&env, &id, &ok, 0).await.unwrap_err();
    assert_status::<()>(Err(err), Code::FailedPrecondition, &["criu package"]);
    assert!(!ok.exists());
    assert_eq!(
        env.status(&id).await.state,
        ContainerState::ContainerRunning as i32
    );
    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// Runs pod `name` under `handler` and restores the counter from `image` (an archive path or
/// a checkpoint image) into it, started: (pod, container).
async fn restore_counter(
    env: &mut Env,
    name: &str,
    handler: &str,
    image: &str,
    tty: bool,
) -> (String, String) {
    let config = pod_config(env, name);
    let pod = env.run_pod_with_handler(config.clone(), handler).await;
    let mut c = counter(env);
    c.tty = tty;
    c.image.as_mut().unwrap().image = image.to_string();
    let restored = env.create(&pod, &config, c).await;
    let s = env.status(&restored).await;
    assert_eq!(s.state, ContainerState::ContainerCreated as i32);
    // It runs the image it was checkpointed from.
    assert_eq!(s.image.as_ref().unwrap().image, env.image);
    env.start(&restored).await;
    (pod, restored)
}

/// Runs pod `name` under `handler` with the counter (a terminal one with `tty`), checkpoints it
/// into `<crius dir>/checkpoints/<name>.tar` and removes it all: the archive and the last
/// number counted before the checkpoint.
async fn checkpointed_counter(
    env: &mut Env,
    name: &str,
    handler: &str,
    tty: bool,
) -> (PathBuf, u64) {
    let config = pod_config(env, name);
    let pod = env.run_pod_with_handler(config.clone(), handler).await;
    let mut c = counter(env);
    c.tty = tty;
    let id = env.create_start(&pod, &config, c).await;
    let log = env.log_dir(name).join("counter.log");
    counted(env, &log, 3).await;
    let dir = env.crius.dir().join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let archive = dir.join(format!("{name}.tar"));
    checkpoint(env, &id, &archive, 60).await.unwrap();
    let at_checkpoint = *numbers(&log).last().unwrap();
    remove_all(env, &pod, &id).await;
    (archive, at_checkpoint)
}

/// crun checkpoints and restores through the same commands as runc when it is built with
/// CRIU: a counter checkpointed in a crun pod goes on counting in another crun pod. Debian 12's
/// crun 1.8.1 is built without CRIU (no `checkpoint` command); crius finds that at start,
/// Status says so, and the RPC is Unimplemented naming the handler.
#[tokio::test]
async fn crun_checkpoints_as_its_build_allows() {
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let status = env
        .rt()
        .status(StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    if !status.runtime_handlers.iter().any(|h| h.name == "crun") {
        println!("skipped: crun is not usable on this node (see the crius log)");
        return;
    }
    let knows = Command::new("crun")
        .args(["checkpoint", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    let ck: serde_json::Value = serde_json::from_str(&status.info["checkpoint"]).unwrap();
    let expected = if knows { "checkpoint, restore" } else { "none" };
    assert_eq!(ck["handlers"]["crun"], expected, "{ck}");

    let config_a = pod_config(&env, "ck-crun-a");
    let pod_a = env.run_pod_with_handler(config_a.clone(), "crun").await;
    let id = env.create_start(&pod_a, &config_a, counter(&env)).await;
    let log_a = env.log_dir("ck-crun-a").join("counter.log");
    counted(&env, &log_a, 3).await;
    let dir = env.crius.dir().join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let archive = dir.join("crun.tar");
    if !knows {
        let err = checkpoint(&env, &id, &archive, 60).await.unwrap_err();
        assert_status::<()>(Err(err), Code::Unimplemented, &["\"crun\"", "checkpoint"]);
        assert!(files_in(&dir).is_empty(), "{:?}", files_in(&dir));
        let s = env.status(&id).await;
        assert_eq!(s.state, ContainerState::ContainerRunning as i32);
        remove_all(&env, &pod_a, &id).await;
        env.assert_no_leaks().await;
        return;
    }
    checkpoint(&env, &id, &archive, 60).await.unwrap();
    let at_checkpoint = *numbers(&log_a).last().unwrap();
    let dump: serde_json::Value = serde_json::from_slice(&entry(&archive, "config.dump")).unwrap();
    assert_eq!(dump["runtime"], "crun");
    remove_all(&env, &pod_a, &id).await;
    let (pod_b, restored) = restore_counter(
        &mut env,
        "ck-crun-b",
        "crun",
        &archive.display().to_string(),
        false,
    )
    .await;
    counts_on_from(
        &env,
        &env.log_dir("ck-crun-b").join("counter.log"),
        at_checkpoint,
    )
    .await;
    remove_all(&env, &pod_b, &restored).await;
    env.assert_no_leaks().await;
}

/// An OCI image whose one layer is a checkpoint archive and whose manifest carries CRI-O's
/// `io.kubernetes.cri-o.annotations.checkpoint.name` (what `checkpointctl build` makes),
/// pulled from a registry, restores like the archive itself.
#[tokio::test]
async fn a_checkpoint_image_restores_like_its_archive() {
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    let (archive, at_checkpoint) = checkpointed_counter(&mut env, "ck-img-a", "runc", false).await;

    // The archive (an uncompressed tar) is the layer as it is.
    let client = env.registry.client();
    let layer = std::fs::read(&archive).unwrap();
    let layer_digest = client.push_blob("checkpoints/counter", &layer).unwrap();
    let config = serde_json::json!({
        "architecture": crius_tests::images::host_arch(),
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "config": {},
    })
    .to_string();
    let config_digest = client
        .push_blob("checkpoints/counter", config.as_bytes())
        .unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
        "annotations": {"io.kubernetes.cri-o.annotations.checkpoint.name": "counter"},
    })
    .to_string();
    client
        .push_manifest(
            "checkpoints/counter",
            "v1",
            "application/vnd.oci.image.manifest.v1+json",
            manifest.as_bytes(),
        )
        .unwrap();
    let reference = format!("{}/checkpoints/counter:v1", env.registry.host_port());
    env.pull(&reference).await;

    let (pod_b, restored) = restore_counter(&mut env, "ck-img-b", "runc", &reference, false).await;
    counts_on_from(
        &env,
        &env.log_dir("ck-img-b").join("counter.log"),
        at_checkpoint,
    )
    .await;
    let out = env
        .exec(&restored, &["cat", "/root/note"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept-in-the-layer\n");
    remove_all(&env, &pod_b, &restored).await;
    env.assert_no_leaks().await;
}

/// A terminal (`tty`) container round-trips too, under the built-in handler and runc: the
/// restored counter writes on through the new pod's terminal into its CRI log.
#[tokio::test]
async fn terminal_containers_round_trip() {
    let _turn = common::checkpoints::criu_turn().await;
    let mut env = Env::with_image_and_config(&criu_config()).await;
    for h in ["runc", "crius"] {
        let (name_a, name_b) = (format!("ck-tty-{h}"), format!("ck-tty-{h}-b"));
        let (archive, at_checkpoint) = checkpointed_counter(&mut env, &name_a, h, true).await;
        let image = archive.display().to_string();
        let (pod_b, restored) = restore_counter(&mut env, &name_b, "runc", &image, true).await;
        counts_on_from(
            &env,
            &env.log_dir(&name_b).join("counter.log"),
            at_checkpoint,
        )
        .await;
        let s = env.status(&restored).await;
        assert_eq!(s.state, ContainerState::ContainerRunning as i32);
        remove_all(&env, &pod_b, &restored).await;
    }
    env.assert_no_leaks().await;
}
