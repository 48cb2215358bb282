//! The real `crius-shim` with real containers (busybox rootfs, libcontainer, cgroups). Needs
//! root.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::{alive, exec_process, ms, parse_log, runtime, wait_for, Pod, RecordingHelper};
use crius_api::shim::{ContainerStatus, ErrorKind, ExecSync};

#[test]
fn lifecycle_logs_and_exit_code() {
    let pod = Pod::start("life");
    let bundle = pod.bundle(
        "c1",
        &[
            "sh",
            "-c",
            "echo to-stdout; echo to-stderr >&2; printf no-newline; exit 3",
        ],
    );
    runtime().block_on(async {
        let client = pod.client().await;
        assert_eq!(client.pod_id(), pod.id);
        let pid = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap();
        pod.track(pid);
        let info = client.state(&bundle.id).await.unwrap();
        assert_eq!(info.status, ContainerStatus::Created);
        assert_eq!(info.pid, Some(pid));
        // Created: the user process has not run.
        std::thread::sleep(ms(200));
        assert!(parse_log(&pod.log_path(&bundle.id)).is_empty());

        let dup = client.create_container(pod.create_request(&bundle)).await;
        assert_eq!(
            dup.unwrap_err().shim_error().unwrap().kind,
            ErrorKind::AlreadyExists
        );

        assert_eq!(client.start(&bundle.id).await.unwrap().0, pid);
        let exit = client
            .wait(&bundle.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(exit.exit_code, 3);
        assert_eq!(exit.signal, None);
        assert!(!exit.oom_killed);
        assert_eq!(
            crius_api::shim::read_exit_file(&pod.state, &bundle.id).unwrap(),
            Some(exit.clone())
        );
        let info = client.state(&bundle.id).await.unwrap();
        assert_eq!(info.status, ContainerStatus::Stopped);
        assert!(info.started_at_unix_nano.unwrap() <= exit.finished_at_unix_nano);

        let lines = parse_log(&pod.log_path(&bundle.id));
        let find = |stream: &str, tag: &str, text: &str| {
            lines
                .iter()
                .any(|(s, t, c)| s == stream && t == tag && c == text)
        };
        assert!(find("stdout", "F", "to-stdout"), "{lines:?}");
        assert!(find("stderr", "F", "to-stderr"), "{lines:?}");
        // No newline ended it: a partial line, so a reader adds none.
        assert!(find("stdout", "P", "no-newline"), "{lines:?}");
        // Nothing else: no runtime chatter in the container's output.
        assert_eq!(lines.len(), 3, "{lines:?}");

        client.delete(&bundle.id, false).await.unwrap();
        let gone = client.state(&bundle.id).await.unwrap_err();
        assert_eq!(gone.shim_error().unwrap().kind, ErrorKind::NotFound);
        assert!(!pod.state.join("containers").join(&bundle.id).exists());
        assert!(client.list().await.unwrap().is_empty());
    });
}

#[test]
fn kill_and_forced_delete() {
    let pod = Pod::start("kill");
    let a = pod.bundle("a", &["sleep", "1000"]);
    let b = pod.bundle("b", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        for bundle in [&a, &b] {
            pod.run(&client, bundle).await;
        }
        // Not forced: a running container stays.
        let refused = client.delete(&a.id, false).await.unwrap_err();
        assert_eq!(
            refused.shim_error().unwrap().kind,
            ErrorKind::FailedPrecondition
        );
        client.kill(&a.id, libc::SIGKILL, false).await.unwrap();
        let exit = client
            .wait(&a.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!((exit.exit_code, exit.signal), (137, Some(9)));
        // Signalling an exited container is harmless.
        client.kill(&a.id, libc::SIGKILL, false).await.unwrap();
        client.delete(&a.id, false).await.unwrap();

        // A created container (never started) is deleted without force; a waiter hears.
        let c = pod.bundle("c", &["sleep", "1000"]);
        let pid_c = client
            .create_container(pod.create_request(&c))
            .await
            .unwrap();
        pod.track(pid_c);
        let waiter = client.wait(&c.id, Some(Duration::from_secs(10)));
        let delete = async {
            tokio::time::sleep(ms(100)).await;
            client.delete(&c.id, false).await
        };
        let (waited, deleted) = tokio::join!(waiter, delete);
        deleted.unwrap();
        assert_eq!(waited.unwrap().signal, Some(9));
        assert!(wait_for(Duration::from_secs(5), || !alive(pid_c)));
        assert!(parse_log(&pod.log_path(&c.id)).is_empty());

        // Kill every process of a container (its cgroup), not just the init.
        let d = pod.bundle("d", &["sh", "-c", "sleep 1000 & sleep 1000"]);
        pod.run(&client, &d).await;
        std::thread::sleep(ms(100));
        let procs = std::path::Path::new("/sys/fs/cgroup/pids/crius-test")
            .join(&d.id)
            .join("cgroup.procs");
        // (busybox sh execs its last command: the init and the background sleep.)
        assert_eq!(fs::read_to_string(&procs).unwrap().lines().count(), 2);
        client.kill(&d.id, libc::SIGKILL, true).await.unwrap();
        let exit = client
            .wait(&d.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(exit.signal, Some(9));
        assert!(wait_for(Duration::from_secs(5), || fs::read_to_string(
            &procs
        )
        .unwrap_or_default()
        .is_empty()));
        client.delete(&d.id, false).await.unwrap();

        let pid_b = client.state(&b.id).await.unwrap().pid.unwrap();
        client.delete(&b.id, true).await.unwrap();
        assert!(wait_for(Duration::from_secs(5), || !alive(pid_b)));
        assert!(!std::path::Path::new("/sys/fs/cgroup/memory/crius-test")
            .join(&b.id)
            .exists());
    });
}

#[test]
fn exec_sync_output_exit_code_timeout_and_background_child() {
    let pod = Pod::start("exec");
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        pod.run(&client, &bundle).await;
        let exec = |args: &[&str], timeout_ms: u64| ExecSync {
            id: bundle.id.clone(),
            process: exec_process(args),
            timeout_ms,
            output_limit: 0,
        };

        let out = client
            .exec_sync(exec(
                &["sh", "-c", "echo hi; echo oops >&2; exit 5"],
                10_000,
            ))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 5);
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr, b"oops\n");
        assert!(!out.timed_out);

        // A second request is served while an exec runs.
        let slow = client.exec_sync(exec(&["sleep", "1"], 10_000));
        let quick = async {
            let t = Instant::now();
            client.state(&bundle.id).await.unwrap();
            t.elapsed()
        };
        let (slow, quick) = tokio::join!(slow, quick);
        assert_eq!(slow.unwrap().exit_code, 0);
        assert!(quick < ms(500), "state took {quick:?} during an exec");

        let t = Instant::now();
        let out = client.exec_sync(exec(&["sleep", "10"], 300)).await.unwrap();
        assert!(out.timed_out);
        assert_eq!(out.signal, Some(9));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());

        let t = Instant::now();
        let out = client
            .exec_sync(exec(&["sh", "-c", "sleep 30 & echo started"], 10_000))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        assert_eq!(out.stdout, b"started\n");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

        let mut big = exec(&["sh", "-c", "head -c 100000 /dev/zero"], 10_000);
        big.output_limit = 1000;
        let out = client.exec_sync(big).await.unwrap();
        assert_eq!(out.stdout.len(), 1000);
        assert!(out.stdout_truncated && !out.stderr_truncated);

        let missing = client.exec_sync(exec(&["/no/such/binary"], 10_000)).await;
        assert!(missing.is_err() || missing.unwrap().exit_code != 0);

        let stopped = client
            .exec_sync(ExecSync {
                id: "no-such".into(),
                ..exec(&["true"], 0)
            })
            .await
            .unwrap_err();
        assert_eq!(stopped.shim_error().unwrap().kind, ErrorKind::NotFound);
    });
}

#[test]
fn reopen_log_continues_in_a_new_file() {
    let pod = Pod::start("reopen");
    let bundle = pod.bundle(
        "c",
        &[
            "sh",
            "-c",
            "i=0; while true; do echo line$i; i=$((i+1)); sleep 0.02; done",
        ],
    );
    runtime().block_on(async {
        let client = pod.client().await;
        pod.run(&client, &bundle).await;
        let log = pod.log_path(&bundle.id);
        assert!(wait_for(Duration::from_secs(5), || parse_log(&log).len() >= 5));
        let rotated = log.with_extension("log.1");
        fs::rename(&log, &rotated).unwrap();
        client.reopen_log(&bundle.id).await.unwrap();
        assert!(wait_for(Duration::from_secs(5), || parse_log(&log).len() >= 5));
        client.kill(&bundle.id, libc::SIGKILL, false).await.unwrap();
        client
            .wait(&bundle.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        // Nothing lost across the rotation: the numbers run on without a gap.
        let numbers: Vec<u64> = parse_log(&rotated)
            .into_iter()
            .chain(parse_log(&log))
            .map(|(_, _, c)| c.trim_start_matches("line").parse().unwrap())
            .collect();
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    });
}

#[test]
fn tty_container_logs_as_stdout() {
    let pod = Pod::start("tty");
    let mut bundle = pod.bundle(
        "c",
        &[
            "sh",
            "-c",
            "echo hello-tty; test -t 1 && echo is-a-tty; echo err-on-tty >&2",
        ],
    );
    bundle.set_terminal(true);
    runtime().block_on(async {
        let client = pod.client().await;
        let mut req = pod.create_request(&bundle);
        req.tty = true;
        req.stdin = true;
        let pid = client.create_container(req).await.unwrap();
        pod.track(pid);
        client.start(&bundle.id).await.unwrap();
        let exit = client
            .wait(&bundle.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(exit.exit_code, 0);
        let lines = parse_log(&pod.log_path(&bundle.id));
        for text in ["hello-tty", "is-a-tty", "err-on-tty"] {
            assert!(
                lines
                    .iter()
                    .any(|(s, t, c)| s == "stdout" && t == "F" && c == text),
                "{text} in {lines:?}"
            );
        }
    });
}

#[test]
fn pause_reaps_orphans_and_exits_on_sigterm() {
    let pod = Pod::start("pause");
    // The static pause, read-only bind-mounted into a rootfs with nothing else.
    let pause_bin = pod.dir.path().join("crius-pause");
    let status = std::process::Command::new(common::SHIM)
        .arg("--install-pause")
        .arg(&pause_bin)
        .status()
        .unwrap();
    assert!(status.success());
    let size = fs::metadata(&pause_bin).unwrap().len();
    assert!(size < 64 * 1024, "pause is {size} bytes");
    let mut sandbox = pod.bundle("sandbox", &["/pause"]);
    let rootfs = sandbox.rootfs();
    fs::remove_dir_all(&rootfs).unwrap();
    fs::create_dir_all(&rootfs).unwrap();
    fs::write(rootfs.join("pause"), b"").unwrap();
    sandbox.add_ro_bind(&pause_bin, "/pause");

    runtime().block_on(async {
        let client = pod.client().await;
        let pause_pid = pod.run(&client, &sandbox).await;

        // A container in the pod's pid namespace leaves an orphan behind for pause to reap.
        let mut worker = pod.bundle("worker", &["sh", "-c", "(sleep 0.3; true) & exit 0"]);
        worker.join_pid_ns(pause_pid);
        pod.run(&client, &worker).await;
        client
            .wait(&worker.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        std::thread::sleep(ms(800));
        let zombies = children_of(pause_pid)
            .into_iter()
            .filter(|(_, state)| *state == 'Z')
            .count();
        assert_eq!(zombies, 0, "pause left zombies");
        client.delete(&worker.id, false).await.unwrap();

        client
            .kill(&sandbox.id, libc::SIGTERM, false)
            .await
            .unwrap();
        let exit = client
            .wait(&sandbox.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!((exit.exit_code, exit.signal), (0, None));
        client.delete(&sandbox.id, false).await.unwrap();
    });
}

/// (pid, state) of the processes whose parent is `ppid`.
fn children_of(ppid: i32) -> Vec<(i32, char)> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut fields = rest.split(' ');
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let parent: i32 = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if parent == ppid {
            out.push((pid, state));
        }
    }
    out
}

#[test]
fn shim_outlives_its_launcher_and_shutdown_removes_state() {
    let pod = Pod::start("detach");
    let bundle = pod.bundle(
        "c",
        &["sh", "-c", "while true; do echo tick; sleep 0.05; done"],
    );
    // Launched, and the launching process is gone: the shim is in a session of its own (not
    // its leader: it forked once more) and not our child.
    let stat = fs::read_to_string(format!("/proc/{}/stat", pod.shim_pid)).unwrap();
    let (_, rest) = stat.rsplit_once(") ").unwrap();
    let fields: Vec<&str> = rest.split(' ').collect();
    let (ppid, sid): (i32, i32) = (fields[1].parse().unwrap(), fields[3].parse().unwrap());
    assert_ne!(ppid, std::process::id() as i32);
    // SAFETY: getsid(0) only reads our own session id.
    assert_ne!(sid, unsafe { libc::getsid(0) });
    assert_eq!(
        fs::read_to_string(pod.state.join("shim.pid")).unwrap(),
        pod.shim_pid.to_string()
    );

    runtime().block_on(async {
        let client = pod.client().await;
        let pid = pod.run(&client, &bundle).await;
        // The container is the shim's (re-parented) child, not ours: once the create helper
        // that cloned it has exited, which may be a moment after the reply.
        let parent_of = |pid: i32| -> i32 {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let fields = stat.rsplit_once(") ").unwrap().1;
            fields.split(' ').nth(1).unwrap().parse().unwrap()
        };
        let deadline = std::time::Instant::now() + ms(2000);
        while parent_of(pid) != pod.shim_pid && std::time::Instant::now() < deadline {
            std::thread::sleep(ms(10));
        }
        assert_eq!(parent_of(pid), pod.shim_pid);

        // Shutdown with a container left: the shim stays until the container is deleted.
        client.shutdown().await.unwrap();
        std::thread::sleep(ms(200));
        assert!(pod.shim_alive());
        let refused = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap_err();
        assert_eq!(
            refused.shim_error().unwrap().kind,
            ErrorKind::FailedPrecondition
        );
        client.delete(&bundle.id, true).await.unwrap();
    });
    assert!(wait_for(Duration::from_secs(5), || !pod.shim_alive()));
    assert!(!pod.state.exists(), "state dir left behind");
}

#[test]
fn sigterm_to_the_shim_kills_its_containers_and_records_exits() {
    let pod = Pod::start("term");
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    let pid = runtime().block_on(async {
        let client = pod.client().await;
        let pid = pod.run(&client, &bundle).await;
        pid
    });
    // SAFETY: kill(2) of the shim this test started.
    unsafe { libc::kill(pod.shim_pid, libc::SIGTERM) };
    assert!(wait_for(Duration::from_secs(5), || !pod.shim_alive()));
    assert!(!alive(pid));
    // The exit is on record for crius; nothing says a shim still serves.
    let exit = crius_api::shim::read_exit_file(&pod.state, &bundle.id)
        .unwrap()
        .unwrap();
    assert_eq!((exit.exit_code, exit.signal), (137, Some(9)));
    assert!(!pod.socket().exists());
    assert!(!pod.state.join("shim.pid").exists());
    assert!(!pod.state.join("runc").exists());
}

#[test]
fn oom_kill_is_recorded() {
    let pod = Pod::start("oom");
    let mut bundle = pod.bundle(
        "c",
        &[
            "sh",
            "-c",
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived",
        ],
    );
    bundle.set_memory_limit(16 * 1024 * 1024);
    runtime().block_on(async {
        let client = pod.client().await;
        pod.run(&client, &bundle).await;
        let exit = client
            .wait(&bundle.id, Some(Duration::from_secs(30)))
            .await
            .unwrap();
        assert!(exit.oom_killed, "{exit:?}");
        client.delete(&bundle.id, false).await.unwrap();
    });
}

#[test]
fn unknown_ids_and_bad_requests() {
    let pod = Pod::start("unknown");
    runtime().block_on(async {
        let client = pod.client().await;
        for err in [
            client.start("nope").await.unwrap_err(),
            client.kill("nope", 9, false).await.unwrap_err(),
            client.delete("nope", true).await.unwrap_err(),
            client.reopen_log("nope").await.unwrap_err(),
            client.wait("nope", None).await.unwrap_err(),
        ] {
            assert_eq!(err.shim_error().unwrap().kind, ErrorKind::NotFound);
        }
        let mut req = crius_api::shim::CreateContainer {
            id: "bad/id".into(),
            bundle: "/nonexistent".into(),
            stdin: false,
            stdin_once: false,
            tty: false,
            log_path: None,
            runtime: None,
            restore: None,
        };
        let e = client.create_container(req.clone()).await.unwrap_err();
        assert_eq!(e.shim_error().unwrap().kind, ErrorKind::InvalidArgument);
        req.id = "ok".into();
        let e = client.create_container(req).await.unwrap_err();
        assert_eq!(e.shim_error().unwrap().kind, ErrorKind::InvalidArgument);

        // A relative cgroupsPath would make libcontainer invent a cgroup: refused up front.
        let mut bundle = pod.bundle("relcg", &["true"]);
        let mut linux = bundle.spec.linux().clone().unwrap();
        linux.set_cgroups_path(Some("crius-test/relative".into()));
        bundle.spec.set_linux(Some(linux));
        bundle.save();
        let e = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap_err();
        assert_eq!(e.shim_error().unwrap().kind, ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("cgroupsPath"), "{e}");
        assert!(client.list().await.unwrap().is_empty());

        // libcontainer fails the create (a bind mount of a missing file): reported, and
        // nothing of the container is left.
        let mut broken = pod.bundle("broken", &["true"]);
        broken.add_ro_bind(&pod.dir.path().join("missing"), "/missing");
        let e = client
            .create_container(pod.create_request(&broken))
            .await
            .unwrap_err();
        assert_eq!(e.shim_error().unwrap().kind, ErrorKind::Internal, "{e}");
        assert!(client.list().await.unwrap().is_empty());
        assert!(!pod.state.join("runc").join(&broken.id).exists());
        assert!(!pod.state.join("containers").join(&broken.id).exists());
        assert!(!std::path::Path::new("/sys/fs/cgroup/memory/crius-test")
            .join(&broken.id)
            .exists());
    });
}

#[test]
fn after_a_shim_is_killed_its_containers_run_on_and_the_helper_cleans_up() {
    let pod = Pod::start("killed");
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    let pid = runtime().block_on(async {
        let client = pod.client().await;
        let pid = pod.run(&client, &bundle).await;
        pid
    });
    // SAFETY: kill(2) of the shim this test started.
    unsafe { libc::kill(pod.shim_pid, libc::SIGKILL) };
    assert!(wait_for(Duration::from_secs(5), || !pod.shim_alive()));
    std::thread::sleep(ms(100));
    assert!(alive(pid), "the container died with its shim");
    assert_eq!(
        crius_api::shim::read_exit_file(&pod.state, &bundle.id).unwrap(),
        None
    );

    let helper = std::path::Path::new(common::SHIM).with_file_name("crius-shim-helper");
    let out = std::process::Command::new(helper)
        .args(["delete", "--root"])
        .arg(pod.state.join("runc"))
        .args(["--id", &bundle.id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helper delete: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(wait_for(Duration::from_secs(5), || !alive(pid)));
    assert!(!std::path::Path::new("/sys/fs/cgroup/memory/crius-test")
        .join(&bundle.id)
        .exists());
}

#[test]
fn abandoned_waits_do_not_pile_up() {
    let pod = Pod::start("waits");
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        pod.run(&client, &bundle).await;
        for _ in 0..20 {
            let e = client.wait(&bundle.id, Some(ms(10))).await.unwrap_err();
            assert!(
                matches!(e, crius_api::shim::ClientError::Timeout { .. }),
                "{e}"
            );
        }
        std::thread::sleep(ms(200));
        // The shim holds no socket per abandoned wait: a listener, a signalfd, a log, pipes.
        let fds = fs::read_dir(format!("/proc/{}/fd", pod.shim_pid))
            .unwrap()
            .count();
        assert!(fds < 15, "shim has {fds} fds open");
        client.delete(&bundle.id, true).await.unwrap();
    });
}

#[test]
fn a_helper_that_dies_without_reporting_fails_the_request() {
    // `true` exits at once without a report, like a helper that crashed.
    let pod = Pod::start_with("nohelper", "debug", &["--helper", "/bin/true"]);
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        let e = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap_err();
        assert_eq!(e.shim_error().unwrap().kind, ErrorKind::Internal, "{e}");
        assert!(e.to_string().contains("without a report"), "{e}");
        assert!(client.list().await.unwrap().is_empty());
        client.shutdown().await.unwrap();
    });
    assert!(wait_for(Duration::from_secs(5), || !pod.shim_alive()));
}

/// libcontainer's status of a container, from its state file.
fn libct_status(pod: &Pod, id: &str) -> String {
    let text = fs::read_to_string(pod.state.join("runc").join(id).join("state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&text).unwrap();
    state["status"].as_str().unwrap().to_owned()
}

#[test]
fn start_kill_all_and_delete_run_in_the_shim() {
    let helper = RecordingHelper::new();
    let pod = Pod::start_with("inproc", "debug", &["--helper", &helper.path()]);
    let bundle = pod.bundle("c", &["sh", "-c", "sleep 1000 & sleep 1001"]);
    runtime().block_on(async {
        let client = pod.client().await;
        let pid = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap();
        pod.track(pid);
        assert_eq!(libct_status(&pod, &bundle.id), "created");
        assert_eq!(client.start(&bundle.id).await.unwrap().0, pid);
        // Recorded as libcontainer's own start would: its exec accepts only running ones.
        assert_eq!(libct_status(&pod, &bundle.id), "running");
        let info = client.state(&bundle.id).await.unwrap();
        assert_eq!(info.status, ContainerStatus::Running);
        assert!(info.started_at_unix_nano.is_some());
        let out = client
            .exec_sync(ExecSync {
                id: bundle.id.clone(),
                process: exec_process(&["sh", "-c", "echo exec-ok"]),
                timeout_ms: 10_000,
                output_limit: 0,
            })
            .await
            .unwrap();
        assert_eq!(out.stdout, b"exec-ok\n");

        let rel = format!("{}/{}", common::CGROUP_PARENT, bundle.id);
        let procs = std::path::Path::new("/sys/fs/cgroup/freezer")
            .join(&rel)
            .join("cgroup.procs");
        assert!(wait_for(Duration::from_secs(5), || fs::read_to_string(
            &procs
        )
        .unwrap_or_default()
        .lines()
        .count()
            == 2));
        // Nothing of the shim's or the helper's signal set-up reaches the container: nothing
        // blocked or handled, SIGPIPE not ignored (busybox sh itself ignores SIGQUIT).
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mask = |key: &str| {
            let line = status.lines().find(|l| l.starts_with(key)).unwrap();
            u64::from_str_radix(line[key.len()..].trim(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0);
        assert_eq!(mask("SigCgt:"), 0);
        assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0);
        let count = || {
            fs::read_to_string(&procs)
                .unwrap_or_default()
                .lines()
                .count()
        };
        // SIGTERM to all reaches the background sleep, which dies of it; the init, PID 1 of
        // its namespace without a handler, is immune to it.
        client.kill(&bundle.id, libc::SIGTERM, true).await.unwrap();
        // Frozen while signalled, thawed before the reply.
        let freezer_state = procs.with_file_name("freezer.state");
        assert_eq!(fs::read_to_string(&freezer_state).unwrap().trim(), "THAWED");
        assert!(wait_for(Duration::from_secs(5), || count() == 1));
        assert!(alive(pid));
        client.kill(&bundle.id, libc::SIGKILL, true).await.unwrap();
        let exit = client
            .wait(&bundle.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(exit.signal, Some(libc::SIGKILL));
        assert!(wait_for(Duration::from_secs(5), || count() == 0));

        client.delete(&bundle.id, false).await.unwrap();
        // Its cgroup is gone from every hierarchy, and libcontainer's state with it.
        assert_eq!(
            common::existing_cgroups(&rel),
            Vec::<std::path::PathBuf>::new()
        );
        assert!(!pod.state.join("runc").join(&bundle.id).exists());
    });
    // Only what needs libcontainer went to a helper.
    assert_eq!(helper.ops(), ["create", "exec"]);
}

#[test]
fn a_created_container_is_deleted_in_the_shim() {
    let helper = RecordingHelper::new();
    let pod = Pod::start_with("inproc-created", "debug", &["--helper", &helper.path()]);
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        let pid = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap();
        pod.track(pid);
        // Never started: its init waits on libcontainer's notify socket.
        client.delete(&bundle.id, false).await.unwrap();
        assert!(!alive(pid));
        let rel = format!("{}/{}", common::CGROUP_PARENT, bundle.id);
        assert_eq!(
            common::existing_cgroups(&rel),
            Vec::<std::path::PathBuf>::new()
        );
        assert!(!pod.state.join("runc").join(&bundle.id).exists());
    });
    assert_eq!(helper.ops(), ["create"]);
}

#[test]
fn hooks_leave_start_and_delete_to_libcontainer() {
    let helper = RecordingHelper::new();
    let pod = Pod::start_with("hooks", "debug", &["--helper", &helper.path()]);
    let mut bundle = pod.bundle("c", &["sleep", "1000"]);
    let marks = pod.dir.path().join("hook-marks");
    fs::create_dir_all(&marks).unwrap();
    bundle.add_hook(
        "poststart",
        &format!("echo ran > {}/poststart", marks.display()),
    );
    bundle.add_hook(
        "poststop",
        &format!("echo ran > {}/poststop", marks.display()),
    );
    runtime().block_on(async {
        let client = pod.client().await;
        pod.run(&client, &bundle).await;
        assert!(marks.join("poststart").exists());
        client.kill(&bundle.id, libc::SIGKILL, false).await.unwrap();
        client
            .wait(&bundle.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        client.delete(&bundle.id, false).await.unwrap();
        assert!(marks.join("poststop").exists());
        assert!(!pod.state.join("runc").join(&bundle.id).exists());
    });
    assert_eq!(helper.ops(), ["create", "start", "delete"]);
}

#[test]
fn kill_all_reaches_processes_that_outlive_the_init_in_a_shared_pid_namespace() {
    let pod = Pod::start("sharedpid");
    let pause_bin = pod.dir.path().join("crius-pause");
    let status = std::process::Command::new(common::SHIM)
        .arg("--install-pause")
        .arg(&pause_bin)
        .status()
        .unwrap();
    assert!(status.success());
    let mut sandbox = pod.bundle("sandbox", &["/pause"]);
    let rootfs = sandbox.rootfs();
    fs::remove_dir_all(&rootfs).unwrap();
    fs::create_dir_all(&rootfs).unwrap();
    fs::write(rootfs.join("pause"), b"").unwrap();
    sandbox.add_ro_bind(&pause_bin, "/pause");
    runtime().block_on(async {
        let client = pod.client().await;
        let pause_pid = pod.run(&client, &sandbox).await;

        // The init exits at once; its background child stays, in the container's cgroup.
        let mut worker = pod.bundle("worker", &["sh", "-c", "sleep 1000 & exit 0"]);
        worker.join_pid_ns(pause_pid);
        pod.run(&client, &worker).await;
        client
            .wait(&worker.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        let procs = std::path::Path::new("/sys/fs/cgroup/pids")
            .join(common::CGROUP_PARENT)
            .join(&worker.id)
            .join("cgroup.procs");
        let left: Vec<i32> = fs::read_to_string(&procs)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        for p in &left {
            pod.track(*p);
        }
        client.kill(&worker.id, libc::SIGKILL, true).await.unwrap();
        assert!(wait_for(Duration::from_secs(5), || !alive(left[0])));
        client.delete(&worker.id, false).await.unwrap();
        let rel = format!("{}/{}", common::CGROUP_PARENT, worker.id);
        assert_eq!(
            common::existing_cgroups(&rel),
            Vec::<std::path::PathBuf>::new()
        );
        client.delete(&sandbox.id, true).await.unwrap();
    });
}

/// The shim's children that are helpers waiting for a call (`prepare`). A container's init,
/// cloned from such a helper, has its command line until it runs its own program, but a
/// mount namespace of its own.
fn standby_helpers(shim_pid: i32) -> Vec<i32> {
    let mount_ns = |pid: i32| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let shim_ns = mount_ns(shim_pid);
    children_of(shim_pid)
        .into_iter()
        .filter(|(pid, state)| {
            *state != 'Z'
                && fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"standby"))
                && mount_ns(*pid) == shim_ns
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// The one helper a `prepare` starts: the shim answers the call first and starts it after,
/// so it is waited for.
fn one_standby_helper(shim_pid: i32) -> Vec<i32> {
    assert!(
        wait_for(Duration::from_secs(5), || !standby_helpers(shim_pid)
            .is_empty()),
        "no standby helper"
    );
    let waiting = standby_helpers(shim_pid);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    waiting
}

#[test]
fn a_prepared_helper_runs_the_next_create_and_an_unused_one_ends() {
    let pod = Pod::start("prepared");
    let bundle = pod.bundle("c", &["sh", "-c", "echo out; echo err >&2; exit 4"]);
    let sleeper = pod.bundle("s", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        client.prepare().await.unwrap();
        let waiting = one_standby_helper(pod.shim_pid);
        // One waits at most: asking again while it waits starts none.
        for _ in 0..3 {
            client.prepare().await.unwrap();
        }
        assert_eq!(standby_helpers(pod.shim_pid), waiting);

        // The create is handed to it, with the container's stdio.
        let pid = client
            .create_container(pod.create_request(&bundle))
            .await
            .unwrap();
        pod.track(pid);
        assert!(wait_for(Duration::from_secs(5), || !alive(waiting[0])));
        client.start(&bundle.id).await.unwrap();
        let exit = client
            .wait(&bundle.id, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(exit.exit_code, 4);
        let log = parse_log(&pod.log_path(&bundle.id));
        assert!(
            log.contains(&("stdout".into(), "F".into(), "out".into())),
            "{log:?}"
        );
        assert!(
            log.contains(&("stderr".into(), "F".into(), "err".into())),
            "{log:?}"
        );

        // Only a create takes a prepared helper: an exec (a probe) spawns its own, and the
        // prepared one still waits for the next create.
        pod.run(&client, &sleeper).await;
        client.prepare().await.unwrap();
        let waiting = one_standby_helper(pod.shim_pid);
        let out = client
            .exec_sync(ExecSync {
                id: sleeper.id.clone(),
                process: exec_process(&["true"]),
                timeout_ms: 10_000,
                output_limit: 0,
            })
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        assert_eq!(standby_helpers(pod.shim_pid), waiting);

        // Not needed: it ends after its time.
        let ttl = crius_api::shim::PREPARED_HELPER_TTL;
        assert!(wait_for(ttl + Duration::from_secs(5), || {
            standby_helpers(pod.shim_pid).is_empty()
        }));
        // A shutdown ends a waiting one at once.
        client.prepare().await.unwrap();
        one_standby_helper(pod.shim_pid);
        client.delete(&bundle.id, false).await.unwrap();
        client.delete(&sleeper.id, true).await.unwrap();
        client.shutdown().await.unwrap();
    });
    assert!(wait_for(Duration::from_secs(5), || !pod.shim_alive()));
}

/// The resident part of the shim's code: the `Rss` of its executable's `r-xp` mapping, in kB.
fn text_rss_kb(pid: i32) -> u64 {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut lines = smaps.lines();
    while let Some(line) = lines.next() {
        if line.contains(" r-xp ") && line.ends_with("crius-shim") {
            let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
            return rss["Rss:".len()..]
                .trim()
                .trim_end_matches(" kB")
                .parse()
                .unwrap();
        }
    }
    panic!("no text mapping of crius-shim in /proc/{pid}/smaps");
}

#[test]
fn the_shim_lets_go_of_the_text_its_start_mapped() {
    let pod = Pod::start("text");
    let bundle = pod.bundle("c", &["sleep", "1000"]);
    runtime().block_on(async {
        let client = pod.client().await;
        pod.run(&client, &bundle).await;
        let started = text_rss_kb(pod.shim_pid);
        // Unmapped, though what it runs next (its poll loop) faults back in at once, 64 KiB
        // around each page: a drop of four such windows at least. Without memory pressure a
        // process's mapped text only grows otherwise.
        let after = crius_shim::server::TEXT_RELEASE_AFTER + Duration::from_secs(5);
        assert!(
            wait_for(after, || text_rss_kb(pod.shim_pid) + 256 <= started),
            "text mapped: {started} kB after the start, {} kB now; {}",
            text_rss_kb(pod.shim_pid),
            fs::read_to_string(pod.state.join("shim.log")).unwrap_or_default()
        );
        // What it runs faults back in.
        let out = client
            .exec_sync(ExecSync {
                id: bundle.id.clone(),
                process: exec_process(&["echo", "still-serving"]),
                timeout_ms: 10_000,
                output_limit: 0,
            })
            .await
            .unwrap();
        assert_eq!(out.stdout, b"still-serving\n");
        client.delete(&bundle.id, true).await.unwrap();
        client.shutdown().await.unwrap();
    });
}
