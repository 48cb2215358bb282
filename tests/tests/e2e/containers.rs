//! Containers end to end: lifecycle of a pod with two containers, CRI logs, exit codes and
//! reasons, stop timeouts, ExecSync, name reservation, the short-name pull, log reopening,
//! the image a container reports.
//! Real crius, real registry, real containers. Run as root.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::common;
use crate::common::{assert_status, texts, wait_for, Env};
use crius_api::v1::*;
use tonic::Code;

const EXIT_LIMIT: Duration = Duration::from_secs(20);

fn ids(containers: &[Container]) -> Vec<String> {
    let mut ids: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    ids
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn pod_with_two_containers_full_lifecycle() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("two", true);
    let pod = env.run_pod(pod_config.clone()).await;

    let talker_cmd = "echo out-1; echo err-1 >&2; echo out-2; exec sleep 1000";
    let talker = env
        .create(
            &pod,
            &pod_config,
            env.container_config("talker", &["sh", "-c", talker_cmd]),
        )
        .await;
    let sleeper = env
        .create(
            &pod,
            &pod_config,
            env.container_config("sleeper", &["sleep", "1000"]),
        )
        .await;

    // Created: listed, status filled in, nothing started.
    let status = env.status(&talker).await;
    assert_eq!(status.state, ContainerState::ContainerCreated as i32);
    assert_eq!(status.metadata.as_ref().unwrap().name, "talker");
    assert!(status.created_at > 0);
    assert_eq!(status.started_at, 0);
    assert_eq!(status.image.as_ref().unwrap().image, env.image);
    assert_eq!(status.image_id, env.image_ref);
    assert!(!status.image_ref.is_empty());
    let log_path = env.log_dir("two").join("talker.log");
    assert_eq!(status.log_path, log_path.display().to_string());
    assert_eq!(status.labels.get("container").unwrap(), "talker");
    let created = env
        .list_containers(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerCreated as i32,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(&created), sorted(vec![talker.clone(), sleeper.clone()]));
    // Starting an unstarted container twice is refused only once it runs.
    env.start(&talker).await;
    env.start(&sleeper).await;
    assert_status(
        env.rt()
            .start_container(StartContainerRequest {
                container_id: talker.clone(),
            })
            .await,
        Code::FailedPrecondition,
        &[&talker],
    );

    let status = env.status(&talker).await;
    assert_eq!(status.state, ContainerState::ContainerRunning as i32);
    assert!(status.started_at >= status.created_at);

    // Filters: pod id (and its prefix), label, id prefix, state.
    let in_pod = env
        .list_containers(ContainerFilter {
            pod_sandbox_id: pod.clone(),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(&in_pod), sorted(vec![talker.clone(), sleeper.clone()]));
    assert!(in_pod.iter().all(|c| c.pod_sandbox_id == pod));
    let by_prefix = env
        .list_containers(ContainerFilter {
            pod_sandbox_id: pod[..10].to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(by_prefix.len(), 2);
    let by_label = env
        .list_containers(ContainerFilter {
            label_selector: [("container".to_string(), "sleeper".to_string())].into(),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(&by_label), vec![sleeper.clone()]);
    let by_id = env
        .list_containers(ContainerFilter {
            id: talker[..12].to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(&by_id), vec![talker.clone()]);
    let running = env
        .list_containers(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(running.len(), 2);

    // Logs: CRI format, stdout and stderr tagged apart, full lines.
    let lines = env
        .wait_log(&log_path, Duration::from_secs(10), |l| l.len() >= 3)
        .await;
    assert_eq!(texts(&lines, "stdout"), vec!["out-1", "out-2"]);
    assert_eq!(texts(&lines, "stderr"), vec!["err-1"]);
    assert!(lines.iter().all(|l| l.tag == "F"), "{lines:?}");

    // ContainerStatus names the signal StopContainer will send: the image's StopSignal.
    assert_eq!(
        env.status(&talker).await.stop_signal,
        Signal::Sigusr1 as i32,
        "stop_signal in ContainerStatus"
    );
    // Stop honours the image's StopSignal (SIGUSR1 kills `sleep`): quick, not the timeout.
    let begin = Instant::now();
    env.stop(&talker, 10).await;
    assert!(
        begin.elapsed() < Duration::from_secs(5),
        "{:?}",
        begin.elapsed()
    );
    let status = env.status(&talker).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    assert_eq!(status.exit_code, 128 + 10, "killed by SIGUSR1: {status:?}");
    assert_eq!(status.reason, "Error");
    assert!(status.finished_at >= status.started_at);
    env.stop(&talker, 10).await;
    env.remove(&talker).await;
    env.remove(&talker).await;
    assert_status(
        env.rt()
            .container_status(ContainerStatusRequest {
                container_id: talker.clone(),
                verbose: false,
            })
            .await,
        Code::NotFound,
        &[&talker],
    );
    // The log file stays: it is kubelet's.
    assert!(log_path.exists());

    // Stopping the pod stops its containers.
    env.stop_pod(&pod).await;
    let status = env.status(&sleeper).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    env.remove_pod(&pod).await;
    assert!(env
        .list_containers(ContainerFilter::default())
        .await
        .is_empty());
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn exit_codes_and_reasons() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("exits", true);
    let pod = env.run_pod(pod_config.clone()).await;

    let three = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("three", &["sh", "-c", "exit 3"]),
        )
        .await;
    let zero = env
        .create_start(&pod, &pod_config, env.container_config("zero", &["true"]))
        .await;
    let hog = env
        .create_start(&pod, &pod_config, env.memory_hog_config("hog"))
        .await;

    let s = env.wait_exited(&three, EXIT_LIMIT).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (3, "Error"), "{s:?}");
    assert!(s.finished_at >= s.started_at && s.started_at > 0);
    let s = env.wait_exited(&zero, EXIT_LIMIT).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"), "{s:?}");
    let s = env.wait_exited(&hog, Duration::from_secs(60)).await;
    assert_eq!(s.reason, "OOMKilled", "{s:?}");
    assert_eq!(s.exit_code, 137, "{s:?}");
    let resources = s.resources.unwrap().linux.unwrap();
    assert_eq!(resources.memory_limit_in_bytes, 32 << 20);

    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn stop_timeouts() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("stops", true);
    let pod = env.run_pod(pod_config.clone()).await;

    let stubborn_cmd = "trap '' TERM USR1; echo ready; while true; do sleep 0.1; done";
    // The CRI stop signal wins over the image's: SIGTERM, which the command ignores.
    let mut stubborn = env.container_config("stubborn", &["sh", "-c", stubborn_cmd]);
    stubborn.stop_signal = Signal::Sigterm as i32;
    let stubborn = env.create_start(&pod, &pod_config, stubborn).await;
    let polite_cmd =
        "trap 'echo got-usr1; exit 0' USR1; echo ready; while true; do sleep 0.1; done";
    let polite = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("polite", &["sh", "-c", polite_cmd]),
        )
        .await;
    for name in ["stubborn", "polite"] {
        let log = env.log_dir("stops").join(format!("{name}.log"));
        env.wait_log(&log, Duration::from_secs(10), |l| {
            texts(l, "stdout").contains(&"ready".to_string())
        })
        .await;
    }

    // Ignores its stop signal: SIGKILL after the timeout, within timeout + 1 s.
    let timeout = 2;
    let begin = Instant::now();
    env.stop(&stubborn, timeout).await;
    let took = begin.elapsed();
    assert!(
        took >= Duration::from_secs(timeout as u64) - Duration::from_millis(100),
        "stop returned after {took:?}, before the {timeout}s timeout"
    );
    assert!(
        took <= Duration::from_secs(timeout as u64 + 1),
        "stop took {took:?} for a {timeout}s timeout"
    );
    let s = env.status(&stubborn).await;
    assert_eq!(s.state, ContainerState::ContainerExited as i32);
    assert_eq!((s.exit_code, s.reason.as_str()), (137, "Error"), "{s:?}");

    // Handles the image's StopSignal (SIGUSR1) and exits 0 at once.
    let begin = Instant::now();
    env.stop(&polite, 30).await;
    assert!(
        begin.elapsed() < Duration::from_secs(5),
        "{:?}",
        begin.elapsed()
    );
    let s = env.status(&polite).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"), "{s:?}");
    let log = env.log_dir("stops").join("polite.log");
    let lines = common::read_log(&log);
    assert!(texts(&lines, "stdout").contains(&"got-usr1".to_string()));

    // A timeout of 0 kills at once.
    let quick = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("quick", &["sh", "-c", stubborn_cmd]),
        )
        .await;
    let begin = Instant::now();
    env.stop(&quick, 0).await;
    assert!(
        begin.elapsed() < Duration::from_secs(2),
        "{:?}",
        begin.elapsed()
    );
    assert_eq!(env.status(&quick).await.exit_code, 137);

    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn exec_sync() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("exec", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("target", &["sleep", "1000"]),
        )
        .await;

    let out = env
        .exec(&c, &["sh", "-c", "echo out; echo err >&2; exit 7"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    assert_eq!(out.exit_code, 7);

    // The container's environment and working dir (the image's).
    let out = env
        .exec(&c, &["sh", "-c", "echo $CRIUS_TEST_IMAGE; pwd"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "busybox\n/tmp\n");
    assert_eq!(out.exit_code, 0);

    // A command that outlives its timeout: DeadlineExceeded, promptly.
    let begin = Instant::now();
    assert_status(
        env.exec(&c, &["sleep", "30"], 1).await,
        Code::DeadlineExceeded,
        &[],
    );
    assert!(
        begin.elapsed() < Duration::from_secs(4),
        "{:?}",
        begin.elapsed()
    );

    // A background child holding stdout open must not make it hang.
    let begin = Instant::now();
    let out = env
        .exec(&c, &["sh", "-c", "sleep 30 & echo started"], 20)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n");
    assert_eq!(out.exit_code, 0);
    assert!(
        begin.elapsed() < Duration::from_secs(5),
        "{:?}",
        begin.elapsed()
    );

    // Output is cut to fit one 16 MiB gRPC message (kubelet's limit), not failing the call.
    let mut big_client = env.rt().max_decoding_message_size(64 << 20);
    let out = big_client
        .exec_sync(ExecSyncRequest {
            container_id: c.clone(),
            cmd: vec![
                "head".into(),
                "-c".into(),
                "20000000".into(),
                "/dev/zero".into(),
            ],
            timeout: 30,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        out.stdout.len() >= 15 << 20 && out.stdout.len() < 16 << 20,
        "{} bytes of stdout",
        out.stdout.len()
    );
    assert!(out.stdout.iter().all(|b| *b == 0));
    assert_eq!(out.exit_code, 0);

    // A command that does not exist: an error or a non-zero exit, never success.
    match env.exec(&c, &["/no/such/binary"], 5).await {
        Ok(out) => assert_ne!(out.exit_code, 0, "{out:?}"),
        Err(s) => assert!(s.message().contains("/no/such/binary"), "{s:?}"),
    }

    // The container still runs after all that; exec into an exited one is refused.
    assert_eq!(
        env.status(&c).await.state,
        ContainerState::ContainerRunning as i32
    );
    env.stop(&c, 0).await;
    assert_status(
        env.exec(&c, &["true"], 5).await,
        Code::FailedPrecondition,
        &[&c],
    );
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn container_name_is_reserved_until_removal() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("names", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let config = env.container_config("dup", &["sleep", "1000"]);
    let first = env.create(&pod, &pod_config, config.clone()).await;
    assert_status(
        env.rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config.clone()),
                sandbox_config: Some(pod_config.clone()),
            })
            .await,
        Code::AlreadyExists,
        &["dup_names_crius-e2e_uid-names_0", &first],
    );
    let mut retry = config.clone();
    retry.metadata.as_mut().unwrap().attempt = 1;
    let second = env.create(&pod, &pod_config, retry).await;
    assert_ne!(first, second);
    env.remove(&first).await;
    let third = env.create(&pod, &pod_config, config).await;
    assert_ne!(third, first);
    assert_eq!(
        env.list_containers(ContainerFilter::default()).await.len(),
        2
    );
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn short_name_pull_through_mirror() {
    let mut env = Env::new().await;
    // `busybox` is docker.io/library/busybox:latest, which the hosts dir sends to the local
    // registry.
    let image_ref = env.pull("busybox").await;
    assert_eq!(image_ref, env.pushed.config_digest);
    let status = env
        .image_status("busybox")
        .await
        .expect("image listed after the pull");
    assert!(status
        .repo_tags
        .contains(&"docker.io/library/busybox:latest".to_string()));

    let pod_config = env.pod_config("short", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut config = env.container_config("hello", &["echo", "hello"]);
    config.image.as_mut().unwrap().image = "busybox".into();
    let c = env.create_start(&pod, &pod_config, config).await;
    let s = env.wait_exited(&c, EXIT_LIMIT).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    assert_eq!(s.image_id, env.pushed.config_digest);
    let lines = common::read_log(&env.log_dir("short").join("hello.log"));
    assert_eq!(texts(&lines, "stdout"), vec!["hello"]);
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn reopen_log_continues_in_a_new_file() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("reopen", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let cmd = "i=0; while true; do echo line-$i; i=$((i+1)); sleep 0.05; done";
    let (c, log) = env.start_ticker(&pod, &pod_config, "reopen", cmd).await;
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    env.rt()
        .reopen_container_log(ReopenContainerLogRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap();
    let new_lines = env
        .wait_log(&log, Duration::from_secs(10), |l| l.len() >= 3)
        .await;
    // Nothing lost or repeated across the two files.
    let mut all = texts(&common::read_log(&rotated), "stdout");
    all.extend(texts(&new_lines, "stdout"));
    for (i, text) in all.iter().enumerate() {
        assert_eq!(text, &format!("line-{i}"), "{all:?}");
    }
    env.stop(&c, 0).await;
    assert_status(
        env.rt()
            .reopen_container_log(ReopenContainerLogRequest {
                container_id: c.clone(),
            })
            .await,
        Code::FailedPrecondition,
        &[&c],
    );
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn pod_files_namespaces_and_tty() {
    let mut env = Env::with_image().await;
    let mut pod_config = env.pod_config("files", false);
    pod_config.hostname = "crius-e2e-host".into();
    pod_config.dns_config = Some(DnsConfig {
        servers: vec!["10.88.27.53".into()],
        searches: vec!["crius.test".into()],
        options: vec!["ndots:3".into()],
    });
    let pod = env.run_pod(pod_config.clone()).await;
    let a = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("a", &["sleep", "1000"]),
        )
        .await;
    let b = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("b", &["sleep", "2000"]),
        )
        .await;
    let run = |id: String, cmd: &'static str| {
        let env = &env;
        async move {
            let out = env.exec(&id, &["sh", "-c", cmd], 10).await.unwrap();
            assert_eq!(out.exit_code, 0, "{cmd}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    assert_eq!(run(a.clone(), "hostname").await, "crius-e2e-host\n");
    assert_eq!(
        run(a.clone(), "cat /etc/hostname").await,
        "crius-e2e-host\n"
    );
    let resolv = run(a.clone(), "cat /etc/resolv.conf").await;
    for want in [
        "nameserver 10.88.27.53",
        "search crius.test",
        "options ndots:3",
    ] {
        assert!(resolv.contains(want), "{resolv}");
    }
    let hosts = run(a.clone(), "cat /etc/hosts").await;
    assert!(hosts.contains("localhost"), "{hosts}");
    // /dev/shm is the pod's own size-limited tmpfs, shared by its containers.
    let shm = run(a.clone(), "grep ' /dev/shm ' /proc/mounts").await;
    assert!(
        shm.contains("tmpfs") && shm.contains("size=65536k"),
        "{shm}"
    );
    run(a.clone(), "echo shared > /dev/shm/crius-e2e").await;
    assert_eq!(run(b.clone(), "cat /dev/shm/crius-e2e").await, "shared\n");
    // One PID namespace per pod: pause is PID 1, each container sees the other.
    let ps = run(
        b.clone(),
        "cat /proc/1/cmdline | tr '\\0' ' '; echo; ps -o args",
    )
    .await;
    assert!(ps.lines().next().unwrap().contains("pause"), "{ps}");
    assert!(
        ps.contains("sleep 1000") && ps.contains("sleep 2000"),
        "{ps}"
    );

    // A TTY container: its output is logged as stdout.
    let mut tty = env.container_config("tty", &["sh", "-c", "echo out-tty; echo err-tty >&2"]);
    tty.tty = true;
    let tty = env.create_start(&pod, &pod_config, tty).await;
    env.wait_exited(&tty, EXIT_LIMIT).await;
    let lines = env
        .wait_log(
            &env.log_dir("files").join("tty.log"),
            Duration::from_secs(10),
            |l| l.len() >= 2,
        )
        .await;
    let out: Vec<String> = texts(&lines, "stdout")
        .iter()
        .map(|t| t.trim_end_matches('\r').to_string())
        .collect();
    assert_eq!(out, vec!["out-tty", "err-tty"], "{lines:?}");
    assert!(texts(&lines, "stderr").is_empty());

    // Exited containers by state filter; verbose status has the spec and the sandbox.
    let exited = env
        .list_containers(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerExited as i32,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(&exited), vec![tty.clone()]);
    let info = env.status_info(&a).await;
    assert_eq!(info["sandboxID"], pod.as_str());
    assert!(info["runtimeSpec"]["process"]["args"].is_array(), "{info}");
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn lifecycle_edges() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("edges", true);
    let pod = env.run_pod(pod_config.clone()).await;

    // RemoveContainer of a running container kills it.
    let running = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("running", &["sleep", "1000"]),
        )
        .await;
    let pid = env.pid(&running).await;
    env.remove(&running).await;
    assert!(!common::alive(pid), "removed container still runs");
    assert!(common::mounts_containing(&running).is_empty());

    // A command that is not in the image: the error names it and nothing is left.
    let missing = env.container_config("missing", &["/no/such/cmd"]);
    let created = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(missing.clone()),
            sandbox_config: Some(pod_config.clone()),
        })
        .await;
    match created {
        Err(s) => assert!(s.message().contains("/no/such/cmd"), "{s:?}"),
        Ok(resp) => {
            let id = resp.into_inner().container_id;
            let started = env
                .rt()
                .start_container(StartContainerRequest {
                    container_id: id.clone(),
                })
                .await;
            match started {
                Err(s) => assert!(s.message().contains("/no/such/cmd"), "{s:?}"),
                Ok(_) => {
                    let s = env.wait_exited(&id, EXIT_LIMIT).await;
                    assert_ne!(s.exit_code, 0, "{s:?}");
                }
            }
            env.remove(&id).await;
        }
    }
    // Its name is free again either way.
    let again = env
        .create(
            &pod,
            &pod_config,
            env.container_config("missing", &["true"]),
        )
        .await;
    env.remove(&again).await;

    // A pod without a log directory: containers run, no log path.
    let mut quiet_config = env.pod_config("quiet", true);
    quiet_config.log_directory.clear();
    let quiet = env.run_pod(quiet_config.clone()).await;
    let c = env
        .create_start(
            &quiet,
            &quiet_config,
            env.container_config("c", &["echo", "x"]),
        )
        .await;
    let s = env.wait_exited(&c, EXIT_LIMIT).await;
    assert_eq!((s.exit_code, s.log_path.as_str()), (0, ""));

    // A stopped pod takes no new containers; its created ones cannot start.
    let waiting = env
        .create(
            &pod,
            &pod_config,
            env.container_config("waiting", &["true"]),
        )
        .await;
    env.stop_pod(&pod).await;
    assert_status(
        env.rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(env.container_config("late", &["true"])),
                sandbox_config: Some(pod_config.clone()),
            })
            .await,
        Code::FailedPrecondition,
        &[&pod],
    );
    let started = env
        .rt()
        .start_container(StartContainerRequest {
            container_id: waiting.clone(),
        })
        .await;
    assert!(started.is_err(), "a container of a stopped pod started");
    for id in [&pod, &quiet] {
        env.remove_pod(id).await;
    }
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn long_and_unterminated_log_lines() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("long", true);
    let pod = env.run_pod(pod_config.clone()).await;
    // 40000 'a' and a newline on stdout, then "tail" with no newline at all on stderr.
    let cmd = "head -c 40000 /dev/zero | tr '\\0' a; echo; printf tail >&2";
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("long", &["sh", "-c", cmd]),
        )
        .await;
    let s = env.wait_exited(&c, EXIT_LIMIT).await;
    assert_eq!(s.exit_code, 0);
    let log = env.log_dir("long").join("long.log");
    let lines = env
        .wait_log(&log, Duration::from_secs(10), |l| {
            l.iter().any(|l| l.stream == "stderr")
        })
        .await;
    let out: Vec<&common::LogLine> = lines.iter().filter(|l| l.stream == "stdout").collect();
    assert!(
        out.len() >= 3,
        "a 40000-byte line is split: {} pieces",
        out.len()
    );
    let (last, pieces) = out.split_last().unwrap();
    assert!(
        pieces.iter().all(|l| l.tag == "P"),
        "pieces before the end are partial"
    );
    assert_eq!(last.tag, "F");
    let joined: String = out.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(joined.len(), 40000);
    assert!(joined.bytes().all(|b| b == b'a'));
    // Output cut short by the exit still reaches the log, whole, and as a partial line: no
    // newline ended it, so a reader joining chunks must not add one.
    assert_eq!(texts(&lines, "stderr").concat(), "tail");
    let err: Vec<&str> = lines
        .iter()
        .filter(|l| l.stream == "stderr")
        .map(|l| l.tag.as_str())
        .collect();
    assert_eq!(err, ["P"], "tags of the unterminated stderr line");
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// Host pids of the pod's processes whose command line contains `needle`.
fn pod_processes_running(pod: &str, needle: &str) -> Vec<i32> {
    common::processes_of_pod(pod)
        .into_iter()
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .contains(needle)
                && common::alive(*pid)
        })
        .collect()
}

/// An ExecSync whose client gives up (its deadline passes, or it cancels) kills its process,
/// as containerd does: a probe that timed out leaves nothing running.
#[tokio::test]
async fn exec_sync_ends_with_its_client() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("exec-cancel", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("sleeper", &["sleep", "3600"]),
        )
        .await;

    // The client's deadline passes: DeadlineExceeded, and the command is gone.
    let mut req = tonic::Request::new(ExecSyncRequest {
        container_id: c.clone(),
        cmd: vec!["sleep".into(), "1001".into()],
        timeout: 0,
    });
    req.set_timeout(Duration::from_millis(700));
    let got = env.rt().exec_sync(req).await;
    assert_status(got, Code::DeadlineExceeded, &["ExecSync", "killed"]);
    wait_for(
        "the sleep 1001 of a timed-out ExecSync to end",
        EXIT_LIMIT,
        || {
            let left = pod_processes_running(&pod, "sleep 1001");
            async move { left.is_empty().then_some(()) }
        },
    )
    .await;

    // The client cancels (drops the call): the command is gone too.
    let mut rt = env.rt();
    let call = tokio::spawn(async move {
        rt.exec_sync(ExecSyncRequest {
            container_id: c.clone(),
            cmd: vec!["sleep".into(), "1002".into()],
            timeout: 0,
        })
        .await
    });
    wait_for("the sleep 1002 of an ExecSync to start", EXIT_LIMIT, || {
        let running = pod_processes_running(&pod, "sleep 1002");
        async move { (!running.is_empty()).then_some(()) }
    })
    .await;
    call.abort();
    wait_for(
        "the sleep 1002 of a cancelled ExecSync to end",
        EXIT_LIMIT,
        || {
            let left = pod_processes_running(&pod, "sleep 1002");
            async move { left.is_empty().then_some(()) }
        },
    )
    .await;

    // The container itself runs on, and a later ExecSync works.
    let c = env.list_containers(ContainerFilter::default()).await[0]
        .id
        .clone();
    let out = env.exec(&c, &["echo", "still here"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still here\n");
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// Containers that exit at once are reported EXITED every time: the exit, followed from
/// create, may reach crius before StartContainer records the start, and must not be undone.
#[tokio::test]
async fn quick_exits_are_never_lost_to_the_start() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("quick", true);
    let pod = env.run_pod(pod_config.clone()).await;
    for i in 0..30 {
        let id = env
            .create_start(
                &pod,
                &pod_config,
                env.container_config(&format!("quick-{i}"), &["true"]),
            )
            .await;
        let s = env.wait_exited(&id, Duration::from_secs(10)).await;
        assert_eq!(s.exit_code, 0, "{s:?}");
        assert!(s.started_at > 0 && s.finished_at >= s.started_at, "{s:?}");
    }
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// A container writing its log as fast as it can does not starve its shim's control socket:
/// creating, starting and exec-ing into another container of the pod, and exec-ing into the
/// flooding one, all answer (the times are printed, not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_leaves_the_shim_responsive() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("flood", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let flood = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("flood", &["yes", "a line of output"]),
        )
        .await;
    let log = env.log_dir("flood").join("flood.log");
    wait_for("the flood to fill its log", EXIT_LIMIT, || {
        let big = std::fs::metadata(&log)
            .map(|m| m.len() > (8 << 20))
            .unwrap_or(false);
        async move { big.then_some(()) }
    })
    .await;
    let t = Instant::now();
    let other = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("quiet", &["sleep", "100"]),
        )
        .await;
    let create_start = t.elapsed();
    let t = Instant::now();
    let out = env.exec(&other, &["echo", "here"], 30).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "here\n");
    let exec_quiet = t.elapsed();
    let t = Instant::now();
    let out = env.exec(&flood, &["echo", "also"], 30).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "also\n");
    let exec_flood = t.elapsed();
    let t = Instant::now();
    env.status(&flood).await;
    let status = t.elapsed();
    println!(
        "under a log flood: create+start {create_start:?}, exec (quiet) {exec_quiet:?}, \
         exec (flooding) {exec_flood:?}, status {status:?}"
    );
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// StreamContainers sends a long list in several messages (64 containers at most each), which
/// together hold exactly what ListContainers does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_containers_sends_bounded_chunks() {
    use tokio_stream::StreamExt as _;
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("many", true);
    let pod = env.run_pod(pod_config.clone()).await;
    for i in 0..70 {
        env.create(
            &pod,
            &pod_config,
            env.container_config(&format!("c{i}"), &["true"]),
        )
        .await;
    }
    let mut stream = env
        .rt()
        .stream_containers(StreamContainersRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut sizes = Vec::new();
    let mut streamed = Vec::new();
    while let Some(msg) = stream.next().await {
        let msg = msg.unwrap();
        sizes.push(msg.containers.len());
        streamed.extend(msg.containers.into_iter().map(|c| c.id));
    }
    assert_eq!(sizes, [64, 6]);
    let mut listed: Vec<String> = env
        .list_containers(ContainerFilter::default())
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    listed.sort();
    streamed.sort();
    assert_eq!(streamed, listed);
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// `[runtime] max_container_log_line_size` reaches the shims: lines are cut at the configured
/// size, not at the 16 KiB default.
#[tokio::test]
async fn configured_max_log_line_size() {
    let mut env = Env::with_config("[runtime]\nmax_container_log_line_size = 100\n").await;
    let pushed = env.pushed.clone();
    env.pull(&pushed.reference).await;
    let pod_config = env.pod_config("short-lines", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let cmd = "head -c 250 /dev/zero | tr '\\0' b; echo";
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("short", &["sh", "-c", cmd]),
        )
        .await;
    assert_eq!(env.wait_exited(&c, EXIT_LIMIT).await.exit_code, 0);
    let log = env.log_dir("short-lines").join("short.log");
    let lines = env
        .wait_log(&log, Duration::from_secs(10), |l| {
            l.iter().any(|l| l.tag == "F")
        })
        .await;
    let shape: Vec<(usize, &str)> = lines
        .iter()
        .map(|l| (l.text.len(), l.tag.as_str()))
        .collect();
    assert_eq!(shape, [(100, "P"), (100, "P"), (50, "F")]);
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_stop_and_remove() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("racy", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let cmd = "trap '' TERM USR1; while true; do sleep 0.1; done";
        let id = env
            .create_start(
                &pod,
                &pod_config,
                env.container_config(&format!("c{i}"), &["sh", "-c", cmd]),
            )
            .await;
        ids.push(id);
    }
    let created = env
        .create(
            &pod,
            &pod_config,
            env.container_config("created", &["true"]),
        )
        .await;
    ids.push(created);

    // Everything at once: per-container stop and remove, and the pod's stop and remove.
    let mut calls = Vec::new();
    for container in &ids {
        let (mut rt, id) = (env.rt(), container.clone());
        calls.push(tokio::spawn(async move {
            rt.stop_container(StopContainerRequest {
                container_id: id.clone(),
                timeout: 1,
            })
            .await
            .map(|_| ())?;
            rt.remove_container(RemoveContainerRequest { container_id: id })
                .await
                .map(|_| ())
        }));
        let (mut rt, id) = (env.rt(), container.clone());
        calls.push(tokio::spawn(async move {
            rt.remove_container(RemoveContainerRequest { container_id: id })
                .await
                .map(|_| ())
        }));
    }
    for _ in 0..2 {
        let (mut rt, pod) = (env.rt(), pod.clone());
        calls.push(tokio::spawn(async move {
            rt.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            })
            .await
            .map(|_| ())?;
            rt.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod,
            })
            .await
            .map(|_| ())
        }));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert!(env
        .list_containers(ContainerFilter::default())
        .await
        .is_empty());
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn exec_ends_with_its_container() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("exec-stop", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("target", &["sleep", "1000"]),
        )
        .await;
    let mut rt = env.rt();
    let id = c.clone();
    let exec = tokio::spawn(async move {
        rt.exec_sync(ExecSyncRequest {
            container_id: id,
            cmd: vec!["sleep".into(), "60".into()],
            timeout: 60,
        })
        .await
    });
    // The exec runs once the pod has four processes: shim, pause, the container, the exec.
    wait_for("the exec to run", Duration::from_secs(10), || async {
        (common::processes_of_pod(&pod).len() >= 4).then_some(())
    })
    .await;
    let begin = Instant::now();
    env.stop(&c, 0).await;
    // The exec's process is in the container's cgroup and dies with it: ExecSync returns long
    // before its 60 s.
    let out = tokio::time::timeout(Duration::from_secs(10), exec)
        .await
        .expect("ExecSync still running 10 s after its container was stopped")
        .unwrap();
    match out {
        Ok(r) => assert_ne!(r.into_inner().exit_code, 0),
        Err(s) => assert_ne!(s.code(), Code::Ok),
    }
    assert!(begin.elapsed() < Duration::from_secs(10));
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// Container `id`'s cgroup directories that still exist, in every hierarchy.
fn container_cgroups(pod: &str, id: &str) -> Vec<std::path::PathBuf> {
    common::pod_cgroups(pod)
        .into_iter()
        .map(|p| p.join(id))
        .filter(|p| p.exists())
        .collect()
}

/// An exited container gives back its rootfs mount and its cgroup at its exit, not at its
/// removal (kubelet removes exited containers much later): at once for a `StopContainer`,
/// shortly after for a container that exits by itself. What kubelet still reads stays: the
/// status with the exit code, the log, the writable layer's usage; the removal then finishes.
#[tokio::test]
async fn exited_containers_give_back_mounts_and_cgroups() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("release", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let done = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("done", &["sh", "-c", "echo bye > /left; echo bye; exit 4"]),
        )
        .await;
    let sleeper = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("sleeper", &["sleep", "1000"]),
        )
        .await;
    assert!(!common::mounts_containing(&sleeper).is_empty());
    assert!(!container_cgroups(&pod, &sleeper).is_empty());

    let s = env.wait_exited(&done, EXIT_LIMIT).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (4, "Error"), "{s:?}");
    wait_for(
        "the exited container's mounts and cgroup to go",
        EXIT_LIMIT,
        || async {
            (common::mounts_containing(&done).is_empty()
                && container_cgroups(&pod, &done).is_empty())
            .then_some(())
        },
    )
    .await;

    env.stop(&sleeper, 0).await;
    assert!(
        common::mounts_containing(&sleeper).is_empty(),
        "rootfs still mounted after StopContainer answered"
    );
    assert!(
        container_cgroups(&pod, &sleeper).is_empty(),
        "cgroup left after StopContainer answered: {:?}",
        container_cgroups(&pod, &sleeper)
    );

    // What stays until the removal.
    let s = env.status(&done).await;
    assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");
    assert_eq!(s.exit_code, 4, "{s:?}");
    let log = common::read_log(&env.log_dir("release").join("done.log"));
    assert_eq!(texts(&log, "stdout"), ["bye"]);
    let stats = env
        .rt()
        .container_stats(ContainerStatsRequest {
            container_id: done.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let layer = stats
        .writable_layer
        .expect("writable layer usage of an exited container");
    assert!(layer.used_bytes.unwrap().value > 0, "{layer:?}");
    let s = env.status(&sleeper).await;
    assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");

    env.remove_all_and_check(&[&done, &sleeper], &pod).await;
}

/// The shim's children that are helpers started ahead of a create (`crius-shim-helper
/// standby`), not yet handed their call. A container's init, cloned from such a helper, has
/// its command line until it runs its own program, but a mount namespace of its own.
fn standby_helpers(shim: i32) -> Vec<i32> {
    let mount_ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let shim_ns = mount_ns(shim);
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let mut after = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split(' ');
        let (state, ppid) = (after.nth(1), after.next());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(shim.to_string().as_str())
            && state != Some("Z")
            && cmdline.split(|b| *b == 0).any(|a| a == b"standby")
            && mount_ns(pid) == shim_ns
        {
            found.push(pid);
        }
    }
    found
}

/// A pod's shim has a helper ready before its first create and again once a container has
/// started (kubelet creates the pod's next one then); the create takes it, an exec does not.
#[tokio::test]
async fn a_helper_waits_ahead_of_the_next_create() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("ahead", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let shim = env.shim_pid(&pod);
    let limit = Duration::from_secs(5);
    let one = || async move {
        let waiting = standby_helpers(shim);
        (waiting.len() == 1).then_some(waiting)
    };
    let first = wait_for("a helper waiting after RunPodSandbox", limit, one).await;

    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("one", &["sleep", "1000"]),
        )
        .await;
    let gone =
        |pid: i32| move || async move { (!standby_helpers(shim).contains(&pid)).then_some(()) };
    wait_for("the create's helper to end", limit, gone(first[0])).await;
    let next = wait_for("a helper waiting after StartContainer", limit, one).await;
    assert_ne!(next, first);

    let out = env.exec(&c, &["true"], 10).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(
        standby_helpers(shim),
        next,
        "an exec took the prepared helper"
    );

    let second = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("two", &["sleep", "1000"]),
        )
        .await;
    wait_for("the second create's helper to end", limit, gone(next[0])).await;
    env.remove_all_and_check(&[&c, &second], &pod).await;
}

/// The subdirectories of the pod's cgroup in every hierarchy that has it.
fn pod_cgroup_children(pod: &str) -> Vec<String> {
    let mut children: Vec<String> = common::pod_cgroups(pod)
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(dir).unwrap().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    children.sort();
    children.dedup();
    children
}

/// crius makes a container's cgroup directories beside its rootfs, before libcontainer would:
/// a create that fails before the shim has it, or in the shim, leaves none behind.
#[tokio::test]
async fn a_failed_create_leaves_no_cgroup() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("failed-cgroup", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let before = pod_cgroup_children(&pod);
    assert!(!before.is_empty(), "the pause's cgroup is missing");

    // Fails in crius, after the rootfs and spec: the working directory cannot be made.
    let mut bad_cwd = env.container_config("bad-cwd", &["sleep", "1000"]);
    bad_cwd.working_dir = "/bin/sh/below-a-file".into();
    // Fails in the shim: libcontainer's create finds no such program.
    let no_program = env.container_config("no-program", &["/no/such/program"]);
    for config in [bad_cwd, no_program] {
        let refused = env
            .rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(pod_cgroup_children(&pod), before);
    }
    assert!(env
        .list_containers(ContainerFilter::default())
        .await
        .is_empty());
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// A container reports its image as containerd's CRI reports it. kubelet sends the image id it
/// resolved in `image.image` and the user's string in `user_specified_image`: the status,
/// ListContainers, the pod's status, the events and the metrics name the image by the user's
/// string. Without one, by a repo tag the image has; by the id only once the image is gone.
/// `image_ref` is a repo digest while the image has one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_is_reported_by_the_name_the_user_gave() {
    use tokio_stream::StreamExt as _;
    let mut env = Env::with_image().await;
    let mut events = env
        .rt()
        .get_container_events(GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let pod_config = env.pod_config("names", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let as_kubelet = |name: &str, user: &str| {
        let mut c = env.container_config(name, &["sleep", "1000"]);
        c.image = Some(ImageSpec {
            image: env.image_ref.clone(),
            user_specified_image: user.into(),
            ..Default::default()
        });
        c
    };
    let user = "team/busybox:as-written";
    let named = env
        .create_start(&pod, &pod_config, as_kubelet("named", user))
        .await;
    let unnamed = env
        .create_start(&pod, &pod_config, as_kubelet("unnamed", ""))
        .await;
    let repo = env.image.rsplit_once(':').unwrap().0.to_string();
    let digest_ref = |r: &str| r.starts_with(&format!("{repo}@sha256:"));

    let status = env.status(&named).await;
    let image = status.image.as_ref().unwrap();
    assert_eq!(image.image, user);
    assert_eq!(image.user_specified_image, user);
    assert_eq!(status.image_id, env.image_ref);
    assert!(digest_ref(&status.image_ref), "{status:?}");
    let status = env.status(&unnamed).await;
    assert_eq!(status.image.as_ref().unwrap().image, env.image);
    assert!(digest_ref(&status.image_ref), "{status:?}");

    let listed = env.list_containers(ContainerFilter::default()).await;
    let shown = |id: &str| {
        let c = listed.iter().find(|c| c.id == id).unwrap();
        (c.image.as_ref().unwrap().image.clone(), c.image_ref.clone())
    };
    assert_eq!(shown(&named).0, user);
    assert_eq!(shown(&unnamed).0, env.image);
    assert!(digest_ref(&shown(&named).1));

    let pod_status = env
        .rt()
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    let in_pod = pod_status
        .containers_statuses
        .iter()
        .find(|c| c.id == named)
        .unwrap();
    assert_eq!(in_pod.image.as_ref().unwrap().image, user);

    // The CREATED event of the named container carries its status.
    let event = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = events.next().await {
            let e = e.unwrap();
            if e.container_id == named
                && e.container_event_type == ContainerEventType::ContainerCreatedEvent as i32
            {
                return e;
            }
        }
        panic!("the event stream ended");
    })
    .await
    .expect("no CREATED event for the named container");
    let in_event = event
        .containers_statuses
        .iter()
        .find(|c| c.id == named)
        .unwrap();
    assert_eq!(in_event.image.as_ref().unwrap().image, user);

    let metrics = env
        .rt()
        .list_pod_sandbox_metrics(ListPodSandboxMetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_metrics;
    let ours = metrics.iter().find(|p| p.pod_sandbox_id == pod).unwrap();
    let label_of = |id: &str| {
        let c = ours
            .container_metrics
            .iter()
            .find(|m| m.container_id == id)
            .unwrap();
        c.metrics[0].label_values[2].clone()
    };
    assert_eq!(label_of(&named), user);
    assert_eq!(label_of(&unnamed), env.image);

    // The annotation in the spec names the image as the status does.
    let spec = &env.status_info(&named).await["runtimeSpec"];
    assert_eq!(spec["annotations"]["io.kubernetes.cri.image-name"], user);

    // The image removed under its containers: the user's string stays, the other container
    // falls back to the id, and image_ref to the digest the create recorded.
    let recorded_ref = env.status(&unnamed).await.image_ref;
    env.crius
        .image()
        .remove_image(RemoveImageRequest {
            image: Some(ImageSpec {
                image: env.image_ref.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(env.status(&named).await.image.unwrap().image, user);
    let status = env.status(&unnamed).await;
    assert_eq!(status.image.as_ref().unwrap().image, env.image_ref);
    assert_eq!(status.image_ref, recorded_ref);

    env.remove_all_and_check(&[&named, &unnamed], &pod).await;
}
