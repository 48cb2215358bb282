//! Faults end to end: crius killed with SIGKILL while pods run and started again, and a pod's
//! shim killed with SIGKILL. Real crius, real containers, real CNI. Run as root.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::{alive, assert_status, texts, wait_for, Env};
use crius_api::v1::*;
use tonic::Code;

/// The numbers of `tick-<n>` lines of a log, in order.
fn ticks(log: &Path) -> Vec<u64> {
    texts(&common::read_log(log), "stdout")
        .iter()
        .filter_map(|t| t.strip_prefix("tick-").and_then(|n| n.parse().ok()))
        .collect()
}

fn assert_consecutive(ticks: &[u64]) {
    for (i, n) in ticks.iter().enumerate() {
        assert_eq!(*n, i as u64, "tick lines lost or repeated: {ticks:?}");
    }
}

#[tokio::test]
async fn crius_killed_while_pods_run() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("survivor", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let ip = env.pod_status(&pod).await.network.unwrap().ip;
    assert!(ip.starts_with(&env.subnet_prefix()), "{ip}");

    let ticker_cmd = "i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.05; done";
    let ticker = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("ticker", &["sh", "-c", ticker_cmd]),
        )
        .await;
    // Exits with 5 once /tmp/go exists: the test creates it while crius is down.
    let exiter_cmd = "while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 5";
    let exiter = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("exiter", &["sh", "-c", exiter_cmd]),
        )
        .await;
    // Runs out of its 32 MiB once /tmp/go exists.
    let hog_cmd = "while [ ! -e /tmp/go ]; do sleep 0.05; done; x=0123456789abcdef; while true; do x=$x$x; done";
    let mut hog = env.container_config("hog", &["sh", "-c", hog_cmd]);
    hog.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let hog = env.create_start(&pod, &pod_config, hog).await;
    let done = env
        .create_start(&pod, &pod_config, env.container_config("done", &["true"]))
        .await;
    let created = env
        .create(
            &pod,
            &pod_config,
            env.container_config("created", &["true"]),
        )
        .await;
    env.wait_exited(&done, Duration::from_secs(20)).await;

    // A second pod, stopped before the crash.
    let stopped_config = env.pod_config("stopped", true);
    let stopped = env.run_pod(stopped_config).await;
    env.stop_pod(&stopped).await;

    let ticker_pid = env.pid(&ticker).await;
    let exiter_pid = env.pid(&exiter).await;
    let hog_pid = env.pid(&hog).await;
    let log = env.log_dir("survivor").join("ticker.log");
    env.wait_log(&log, Duration::from_secs(10), |l| l.len() >= 3)
        .await;
    // Started just before the crash, its start not yet flushed: the time crius answered with
    // is the one it reports after the restart, for it and for every other container.
    let late = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("late", &["sleep", "1000"]),
        )
        .await;
    let mut started = Vec::new();
    for id in [&ticker, &exiter, &hog, &done, &late] {
        started.push((id.clone(), env.status(id).await.started_at));
    }

    env.crius.kill9().unwrap();
    let before = ticks(&log).len();
    for id in [&exiter, &hog] {
        let go = env
            .crius
            .state()
            .join("containers")
            .join(id)
            .join("rootfs/tmp/go");
        std::fs::write(&go, "").unwrap();
    }
    wait_for(
        "the exiter and the hog to end while crius is down",
        Duration::from_secs(30),
        || async { (!alive(exiter_pid) && !alive(hog_pid)).then_some(()) },
    )
    .await;
    // The ticker keeps logging while nobody watches.
    wait_for(
        "ticks while crius is down",
        Duration::from_secs(10),
        || async { (ticks(&log).len() >= before + 10).then_some(()) },
    )
    .await;

    env.crius.restart().await.unwrap();

    let pods = env.list_pods(PodSandboxFilter::default()).await;
    let state_of = |id: &str| pods.iter().find(|p| p.id == id).map(|p| p.state);
    assert_eq!(state_of(&pod), Some(PodSandboxState::SandboxReady as i32));
    assert_eq!(
        state_of(&stopped),
        Some(PodSandboxState::SandboxNotready as i32)
    );
    assert_eq!(env.pod_status(&pod).await.network.unwrap().ip, ip);

    let s = env.status(&ticker).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32, "{s:?}");
    assert_eq!(env.pid(&ticker).await, ticker_pid);
    assert!(alive(ticker_pid));
    let s = env.wait_exited(&exiter, Duration::from_secs(10)).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (5, "Error"), "{s:?}");
    let s = env.wait_exited(&hog, Duration::from_secs(10)).await;
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "{s:?}"
    );
    let s = env.status(&done).await;
    assert_eq!(s.state, ContainerState::ContainerExited as i32);
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    let s = env.status(&created).await;
    assert_eq!(s.state, ContainerState::ContainerCreated as i32, "{s:?}");
    assert_eq!(
        env.list_containers(ContainerFilter::default()).await.len(),
        6
    );
    for (id, at) in &started {
        let s = env.status(id).await;
        assert_eq!(
            s.started_at, *at,
            "started_at of {id} changed across the crash"
        );
    }

    // The shim is reachable again: exec, stop, start the created one.
    let out = env
        .exec(&ticker, &["echo", "still-here"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still-here\n");
    env.start(&created).await;
    let s = env.wait_exited(&created, Duration::from_secs(20)).await;
    assert_eq!(s.exit_code, 0);
    let n = ticks(&log).len();
    env.wait_log(&log, Duration::from_secs(10), |_| {
        ticks(&log).len() >= n + 5
    })
    .await;
    env.stop(&ticker, 0).await;
    assert_eq!(env.status(&ticker).await.exit_code, 137);
    assert_consecutive(&ticks(&log));

    // A second crash with everything exited, then a clean teardown.
    env.crius.kill9().unwrap();
    env.crius.restart().await.unwrap();
    for id in [&pod, &stopped] {
        env.stop_pod(id).await;
        env.remove_pod(id).await;
    }
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn shim_killed() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("orphan", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let sleeper = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("sleeper", &["sleep", "1000"]),
        )
        .await;
    let created = env
        .create(
            &pod,
            &pod_config,
            env.container_config("created", &["true"]),
        )
        .await;
    let sleeper_pid = env.pid(&sleeper).await;
    // An ExecSync in flight when the shim dies.
    let mut rt = env.rt();
    let exec_id = sleeper.clone();
    let exec = tokio::spawn(async move {
        rt.exec_sync(ExecSyncRequest {
            container_id: exec_id,
            cmd: vec!["sleep".into(), "1003".into()],
            timeout: 0,
        })
        .await
    });
    // In flight: its process runs (a fixed wait could end before it does on a slow node).
    wait_for(
        "the exec's sleep 1003 to run",
        Duration::from_secs(20),
        || async {
            let procs = std::fs::read_dir("/proc").ok()?;
            procs
                .flatten()
                .any(|p| {
                    std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x001003\x00")
                })
                .then_some(())
        },
    )
    .await;
    let shim = env.shim_pid(&pod);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(shim), nix::sys::signal::SIGKILL).unwrap();
    assert_status(exec.await.unwrap(), Code::Unavailable, &["shim went away"]);

    let s = env.wait_exited(&sleeper, Duration::from_secs(20)).await;
    assert_ne!(s.exit_code, 0, "{s:?}");
    // The pod is not ready any more: kubelet will replace it.
    env.wait_pod_not_ready(&pod).await;
    assert!(!s.reason.is_empty(), "{s:?}");
    assert!(s.message.contains("shim"), "message should say why: {s:?}");
    // Nothing of the container keeps running once crius reports it exited.
    wait_for(
        "the sleeper to be gone",
        Duration::from_secs(10),
        || async { (!alive(sleeper_pid)).then_some(()) },
    )
    .await;
    // The container that was only created is reported exited too, and says why.
    let s = env.wait_exited(&created, Duration::from_secs(20)).await;
    assert_eq!(s.reason, "Error", "{s:?}");
    assert!(s.message.contains("shim"), "{s:?}");
    assert_eq!(s.started_at, 0, "never started: {s:?}");
    // A new container cannot go into a pod without a shim.
    assert!(env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(env.container_config("late", &["true"])),
            sandbox_config: Some(pod_config.clone()),
        })
        .await
        .is_err());

    env.stop_pod(&pod).await;
    assert_eq!(
        env.pod_status(&pod).await.state,
        PodSandboxState::SandboxNotready as i32
    );
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn shim_killed_while_crius_is_down() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("orphan2", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let sleeper = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("sleeper", &["sleep", "1000"]),
        )
        .await;
    let shim = env.shim_pid(&pod);
    env.crius.kill9().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(shim), nix::sys::signal::SIGKILL).unwrap();
    wait_for("the shim to die", Duration::from_secs(10), || async {
        (!alive(shim)).then_some(())
    })
    .await;
    env.crius.restart().await.unwrap();

    let s = env.wait_exited(&sleeper, Duration::from_secs(20)).await;
    assert!(s.message.contains("shim"), "{s:?}");
    env.wait_pod_not_ready(&pod).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// The first entry of `dir`, if any.
fn first_entry(dir: &Path) -> Option<String> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
}

#[tokio::test]
async fn crius_killed_during_run_pod_sandbox() {
    let mut env = Env::new().await;
    // Kill crius as soon as RunPodSandbox reaches each of these steps: its files, its netns,
    // its shim. Whatever it had done is undone at the next start.
    for (round, step) in ["pods", "netns", "shims"].into_iter().enumerate() {
        let config = env.pod_config(&format!("interrupted-{round}"), false);
        let mut rt = env.rt();
        let call = tokio::spawn(async move {
            rt.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        });
        let dir = env.crius.state().join(step);
        let id = wait_for(
            &format!("RunPodSandbox to reach {step}"),
            Duration::from_secs(20),
            || {
                let dir = dir.clone();
                async move { first_entry(&dir) }
            },
        )
        .await;
        env.crius.kill9().unwrap();
        let finished = call.await.unwrap();
        env.pods.push(id.clone());
        env.crius.restart().await.unwrap();
        let listed = env.list_pods(PodSandboxFilter::default()).await;
        // Either the start was undone, or it had completed (the reply was lost with crius):
        // then the pod is whole, ready and removable.
        match listed.as_slice() {
            [] => assert!(finished.is_err(), "a started pod is not listed"),
            [p] => {
                assert_eq!(p.id, id);
                assert_eq!(p.state, PodSandboxState::SandboxReady as i32, "{p:?}");
                let ip = env.pod_status(&id).await.network.unwrap().ip;
                assert!(ip.starts_with(&env.subnet_prefix()), "{ip}");
                env.remove_pod(&id).await;
            }
            more => panic!("one start, several pods: {more:?}"),
        }
        env.assert_pod_gone(&id).await;
        assert!(env.allocated_ips().is_empty(), "{:?}", env.allocated_ips());
    }
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn crius_killed_during_create_container() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("half-created", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let config = env.container_config("interrupted", &["sleep", "1000"]);
    let mut rt = env.rt();
    let request = CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(config.clone()),
        sandbox_config: Some(pod_config.clone()),
    };
    let call = tokio::spawn(async move { rt.create_container(request).await });
    let containers = env.crius.state().join("containers");
    let id = wait_for(
        "CreateContainer to start on its bundle",
        Duration::from_secs(20),
        || {
            let dir = containers.clone();
            async move { first_entry(&dir) }
        },
    )
    .await;
    env.crius.kill9().unwrap();
    let finished = call.await.unwrap();
    env.crius.restart().await.unwrap();
    let listed = env.list_containers(ContainerFilter::default()).await;
    // Either the create was undone, or it had completed (the reply was lost with crius): then
    // the container is whole and usable.
    match listed.as_slice() {
        [] => assert!(finished.is_err(), "a created container is not listed"),
        [c] => {
            assert_eq!(c.id, id);
            assert_eq!(c.state, ContainerState::ContainerCreated as i32, "{c:?}");
            env.start(&id).await;
            env.remove(&id).await;
        }
        more => panic!("one create, several containers: {more:?}"),
    }
    // Nothing of it is left (crius may have to wait for the shim to finish the create before
    // it can undo it), and its name is free again.
    let layer = env.crius.root().join("containers").join(&id);
    let bundle = containers.join(&id);
    wait_for(
        "the interrupted container to be removed",
        Duration::from_secs(30),
        || async {
            let record_gone = env
                .rt()
                .container_status(ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await
                .is_err_and(|s| s.code() == tonic::Code::NotFound);
            (record_gone
                && !bundle.exists()
                && !layer.exists()
                && common::mounts_containing(&id).is_empty())
            .then_some(())
        },
    )
    .await;
    let again = env.create_start(&pod, &pod_config, config).await;
    let out = env.exec(&again, &["echo", "ok"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn crius_killed_during_stop_container() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("stopping", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let cmd = "trap '' TERM USR1; i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.05; done";
    let (c, log) = env.start_ticker(&pod, &pod_config, "stopping", cmd).await;
    let mut rt = env.rt();
    let id = c.clone();
    let call = tokio::spawn(async move {
        rt.stop_container(StopContainerRequest {
            container_id: id,
            timeout: 30,
        })
        .await
    });
    // Let the stop signal go out (the container ignores it), then crash mid-wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.crius.kill9().unwrap();
    assert!(call.await.unwrap().is_err());
    env.crius.restart().await.unwrap();

    let s = env.status(&c).await;
    assert_eq!(s.state, ContainerState::ContainerRunning as i32, "{s:?}");
    // The log can be rotated through the restarted crius.
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    env.rt()
        .reopen_container_log(ReopenContainerLogRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap();
    env.wait_log(&log, Duration::from_secs(10), |l| l.len() >= 3)
        .await;
    let begin = std::time::Instant::now();
    env.stop(&c, 1).await;
    assert!(
        begin.elapsed() < Duration::from_secs(3),
        "{:?}",
        begin.elapsed()
    );
    assert_eq!(env.status(&c).await.exit_code, 137);
    let mut all = ticks(&rotated);
    all.extend(ticks(&log));
    assert_consecutive(&all);
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn network_left_by_a_failed_start_is_released_after_restart() {
    let mut env = Env::new().await;
    // A plugin after the bridge whose ADD fails and whose DEL fails until the file `del-ok`
    // exists: the failed RunPodSandbox cannot release its address at once.
    let del_ok = env.net_path("del-ok");
    env.script_plugin(
        "crius-e2e-flaky",
        &format!(
            "cat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
             ADD) echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"crius-e2e flaky add\"}}'; exit 1 ;;\n\
             DEL) [ -e {del_ok} ] && exit 0\n\
             echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"crius-e2e flaky del\"}}'; exit 1 ;;\n\
             esac\nexit 0",
            del_ok = del_ok.display()
        ),
    );
    let flaky = env.bridge_conflist_with(r#"{ "type": "crius-e2e-flaky" }"#);
    env.write_cni_config(&flaky);
    let config = env.pod_config("leaky", false);
    let failed = wait_for(
        "RunPodSandbox to fail in the flaky plugin",
        Duration::from_secs(10),
        || {
            let mut rt = env.rt();
            let config = config.clone();
            async move {
                rt.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
                .err()
            }
        },
    )
    .await;
    assert!(failed.message().contains("flaky add"), "{failed:?}");
    assert!(env.list_pods(PodSandboxFilter::default()).await.is_empty());
    // Nothing else of the pod is left.
    assert!(common::mounts_under(env.crius.dir()).is_empty());
    // The flaky plugin's DEL failed, but the rest of the chain's DEL still ran: the address is
    // back already. The attachment stays recorded, since one of its plugins is not undone.
    assert!(env.allocated_ips().is_empty(), "{:?}", env.allocated_ips());
    let cache = env.crius.root().join("cni");
    let recorded = || std::fs::read_dir(&cache).map_or(0, |d| d.count());
    assert_eq!(recorded(), 1, "the failed attachment is remembered");

    // Once DEL can succeed, the next start of crius finishes it and forgets the attachment.
    std::fs::write(&del_ok, "").unwrap();
    env.crius.restart().await.unwrap();
    wait_for(
        "the attachment to be released",
        Duration::from_secs(20),
        || async { (recorded() == 0 && env.allocated_ips().is_empty()).then_some(()) },
    )
    .await;
    env.write_cni_config(&env.bridge_conflist());
    env.assert_no_leaks().await;
}

/// The same failed start, but DEL starts to work while crius runs on: the failed undo is
/// retried in the background and the attachment released without a restart.
#[tokio::test]
async fn network_left_by_a_failed_start_is_released_by_a_retry() {
    let env = Env::new().await;
    let del_ok = env.net_path("del-ok");
    let dels = env.net_path("dels");
    env.script_plugin(
        "crius-e2e-flaky",
        &format!(
            "cat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
             ADD) echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"crius-e2e flaky add\"}}'; exit 1 ;;\n\
             DEL) echo del >> {dels}; [ -e {del_ok} ] && exit 0\n\
             echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"crius-e2e flaky del\"}}'; exit 1 ;;\n\
             esac\nexit 0",
            del_ok = del_ok.display(),
            dels = dels.display()
        ),
    );
    let flaky = env.bridge_conflist_with(r#"{ "type": "crius-e2e-flaky" }"#);
    env.write_cni_config(&flaky);
    let config = env.pod_config("retried", false);
    let failed = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert!(failed.message().contains("flaky add"), "{failed:?}");
    let cache = env.crius.root().join("cni");
    let recorded = || std::fs::read_dir(&cache).map_or(0, |d| d.count());
    assert_eq!(recorded(), 1, "the failed attachment is remembered");

    // DEL works from now on; crius retries by itself.
    std::fs::write(&del_ok, "").unwrap();
    wait_for(
        "the attachment to be released by a retry",
        Duration::from_secs(20),
        || async { (recorded() == 0).then_some(()) },
    )
    .await;
    let calls = std::fs::read_to_string(&dels).unwrap().lines().count();
    assert!(calls >= 2, "DEL ran {calls} times");
    env.write_cni_config(&env.bridge_conflist());
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn crius_killed_during_remove_pod_sandbox() {
    let mut env = Env::with_image().await;
    // Kill crius at different moments of a RemovePodSandbox; whatever it had done, a second
    // RemovePodSandbox after the restart finishes the job and leaves nothing.
    for (round, delay_ms) in [0u64, 15, 30, 60, 120].into_iter().enumerate() {
        let pod_config = env.pod_config(&format!("removing-{round}"), false);
        let pod = env.run_pod(pod_config.clone()).await;
        for name in ["a", "b"] {
            env.create_start(
                &pod,
                &pod_config,
                env.container_config(name, &["sleep", "1000"]),
            )
            .await;
        }
        let mut rt = env.rt();
        let id = pod.clone();
        let call = tokio::spawn(async move {
            rt.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
        });
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        env.crius.kill9().unwrap();
        let _ = call.await.unwrap();
        env.crius.restart().await.unwrap();
        env.remove_pod(&pod).await;
        env.assert_pod_gone(&pod).await;
        assert!(env.allocated_ips().is_empty(), "{:?}", env.allocated_ips());
    }
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn pause_killed() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("pauseless", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("c", &["sleep", "1000"]),
        )
        .await;
    let pause = env.pause_pid(&pod).await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pause), nix::sys::signal::SIGKILL).unwrap();
    // PID 1 of the pod's PID namespace is gone: so is everything in it, and the pod is not
    // ready any more.
    let s = env.wait_exited(&c, Duration::from_secs(10)).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (137, "Error"), "{s:?}");
    env.wait_pod_not_ready(&pod).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// RemoveContainer and RemovePodSandbox rename the directories they remove into a trash and
/// delete them after returning: the directories are gone when the calls return and the trash
/// empties. What a crius killed before such a deletion finished left in the trash (here: a
/// tree put there while crius is down, one with a read-only directory inside) is deleted
/// after its next start.
#[tokio::test]
async fn removed_dirs_go_through_a_trash_a_restart_empties() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("trash", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let config = env.container_config("writer", &["sh", "-c", "echo x > /f; sleep 1000"]);
    let id = env.create_start(&pod, &pod_config, config).await;
    let bundle = env.crius.state().join("containers").join(&id);
    let layer = env.crius.root().join("containers").join(&id);
    let pod_dir = env.crius.state().join("pods").join(&pod);
    for dir in [&bundle, &layer, &pod_dir] {
        assert!(dir.exists(), "{}", dir.display());
    }
    env.stop(&id, 0).await;
    env.remove(&id).await;
    assert!(!bundle.exists() && !layer.exists(), "container dirs left");
    assert!(common::mounts_containing(&id).is_empty());
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    assert!(!pod_dir.exists(), "pod dir left");
    env.wait_trash_empty().await;

    env.crius.kill9().unwrap();
    for base in [env.crius.root(), env.crius.state()] {
        let left = base.join("trash").join("0123abcd");
        std::fs::create_dir_all(left.join("upper/etc")).unwrap();
        std::fs::write(left.join("upper/etc/f"), b"x").unwrap();
        std::fs::create_dir_all(left.join("ro/d")).unwrap();
        std::fs::set_permissions(
            left.join("ro"),
            std::os::unix::fs::PermissionsExt::from_mode(0o500),
        )
        .unwrap();
    }
    env.crius.restart().await.unwrap();
    env.wait_trash_empty().await;
    env.assert_no_leaks().await;
}

/// RemoveContainer does not sync its image lease's removal, so a power loss may bring the lease
/// back; crius releases, at its start, every lease of a container it does not have. Here such a
/// lease (a copy of a live container's, under another holder) is put there while crius is down:
/// after the restart it is gone, the live container's own lease is kept.
#[tokio::test]
async fn a_lease_of_a_container_that_is_gone_is_released_at_start() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("leases", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let config = env.container_config("live", &["sleep", "1000"]);
    let id = env.create_start(&pod, &pod_config, config).await;
    let leases = env.crius.root().join("leases");
    let own = leases.join(format!("{id}.json"));
    assert!(own.exists(), "{}", own.display());
    env.crius.kill9().unwrap();
    let orphan = leases.join(format!("{}.json", "0".repeat(64)));
    std::fs::copy(&own, &orphan).unwrap();
    env.crius.restart().await.unwrap();
    assert!(!orphan.exists(), "the orphan lease is still there");
    assert!(own.exists(), "the live container's lease was released");
    assert_eq!(
        env.status(&id).await.state,
        ContainerState::ContainerRunning as i32
    );
    env.stop(&id, 0).await;
    env.remove(&id).await;
    assert!(!own.exists());
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
