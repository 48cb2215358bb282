//! A real kubelet drives crius, when one is given: `CRIUS_KUBELET_BIN=/path/to/kubelet` (built by
//! hand; this project ships none and no script that builds one). Without it the test says it is
//! skipped. Standalone kubelet with static pods, `--pod-cidr` and Evented PLEG
//! (`--feature-gates=EventedPLEG=true`, which reads crius's GetContainerEvents stream and
//! PodSandboxStatus with its containers):
//! - each pod runs exactly its containers;
//! - a crashing container is restarted on time: the first restart right after it exits (kubelet
//!   learns of the exit from crius's event, not from a relist minutes later), the next one after
//!   kubelet's 10 s back-off, counted from the `finished_at` crius reports;
//! - removing pods' manifests stops them on time and removes them: a container that exits on
//!   its stop signal stops at once (its grace period is 30 s), one that ignores it is killed
//!   when its 3 s grace period is over and not before, each sandbox stops right after its
//!   containers, and kubelet's container GC (every minute) removes sandboxes and containers,
//!   which leave ListPodSandbox/ListContainers, each pod's DELETED event carrying its last
//!   status; the other pods are untouched;
//! - kubelet logs no CRI error but the NotFound of its own second RemoveContainer (and of the
//!   stale `/var/log/containers` links its GC checks), and no Evented PLEG complaint.
//!
//! Network 52. Pod deletion needs a kubelet whose pod sources become ready: a kubelet built from
//! KubeEdge's fork (which vendors kubelet) refuses every deletion with "skipping delete because
//! sources aren't ready yet" unless its `SeenAllSources` is made upstream's again.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::common::{wait_for, Env};
use crius_api::v1::*;
use tokio_stream::StreamExt as _;

/// The kubelet, stopped (SIGTERM, then SIGKILL) by its PID on drop.
struct Kubelet(Child);

impl Drop for Kubelet {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn manifest(name: &str, image: &str, containers: &[(&str, &str)]) -> String {
    manifest_with_grace(name, image, None, containers)
}

/// A static pod, with `terminationGracePeriodSeconds` when `grace` is set.
fn manifest_with_grace(
    name: &str,
    image: &str,
    grace: Option<u32>,
    containers: &[(&str, &str)],
) -> String {
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n"
    );
    if let Some(grace) = grace {
        text.push_str(&format!("  terminationGracePeriodSeconds: {grace}\n"));
    }
    text.push_str("  containers:\n");
    for (c, script) in containers {
        text.push_str(&format!(
            "  - {{name: {c}, image: \"{image}\", command: [\"sh\", \"-c\", \"{script}\"]}}\n"
        ));
    }
    text
}

/// The containers of pods named `<prefix>-...` by pod name: (container name, state, attempt).
async fn containers_by_pod(env: &Env) -> HashMap<String, Vec<(String, i32, u32)>> {
    let pods = env.list_pods(PodSandboxFilter::default()).await;
    let mut out: HashMap<String, Vec<_>> = HashMap::new();
    for c in env.list_containers(ContainerFilter::default()).await {
        let Some(pod) = pods.iter().find(|p| p.id == c.pod_sandbox_id) else {
            continue;
        };
        let name = pod.metadata.as_ref().unwrap().name.clone();
        let m = c.metadata.unwrap();
        out.entry(name)
            .or_default()
            .push((m.name, c.state, m.attempt));
    }
    out
}

/// On a failure, prints kubelet's log (its directory goes with the test).
struct LogOnPanic(std::path::PathBuf);

impl Drop for LogOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            eprintln!("--- kubelet log ({}) ---\n{log}", self.0.display());
        }
    }
}

type Events = Arc<Mutex<Vec<ContainerEventResponse>>>;

/// Every GetContainerEvents event from now on (subscribed when this returns), as read.
async fn collect_events(env: &Env) -> Events {
    let mut stream = env
        .rt()
        .get_container_events(GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let seen: Events = Arc::default();
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            out.lock().unwrap().push(event);
        }
    });
    seen
}

/// The last status the events carried of each container of pod `pod_name`, by attempt.
fn history(events: &Events, pod_name: &str) -> Vec<ContainerStatus> {
    let mut by_id: HashMap<String, ContainerStatus> = HashMap::new();
    for e in events.lock().unwrap().iter() {
        let name = e
            .pod_sandbox_status
            .as_ref()
            .and_then(|p| p.metadata.as_ref())
            .map(|m| m.name.as_str());
        if name == Some(pod_name) {
            for c in &e.containers_statuses {
                by_id.insert(c.id.clone(), c.clone());
            }
        }
    }
    let mut out: Vec<_> = by_id.into_values().collect();
    out.sort_by_key(|c| c.metadata.as_ref().map_or(0, |m| m.attempt));
    out
}

/// When the events say pod `id` had `kind` happen to it (nanoseconds), if they did.
fn pod_event(
    events: &Events,
    id: &str,
    kind: ContainerEventType,
) -> Option<ContainerEventResponse> {
    events
        .lock()
        .unwrap()
        .iter()
        .find(|e| e.container_id == id && e.container_event_type == kind as i32)
        .cloned()
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn secs(nanos: i64) -> f64 {
    nanos as f64 / 1e9
}

async fn pod_id(env: &Env, name: &str) -> Option<String> {
    env.list_pods(PodSandboxFilter::default())
        .await
        .into_iter()
        .find(|p| p.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|p| p.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubelet_with_evented_pleg() {
    let Ok(kubelet) = std::env::var("CRIUS_KUBELET_BIN") else {
        println!("skipped a_real_kubelet_with_evented_pleg: CRIUS_KUBELET_BIN is not set");
        return;
    };
    let env = Env::with_image().await;
    let events = collect_events(&env).await;
    let dir = crius_tests::TestDir::new("kubelet").unwrap();
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let image = env.image.clone();
    let write = |file: &str, text: String| std::fs::write(manifests.join(file), text).unwrap();
    write(
        "two.yaml",
        manifest(
            "two",
            &image,
            &[
                ("tick", "while true; do date; sleep 5; done"),
                ("idle", "exec sleep 100000"),
            ],
        ),
    );
    write(
        "crasher.yaml",
        manifest(
            "crasher",
            &image,
            &[("crash", "echo crashing; sleep 1; exit 1")],
        ),
    );
    // Exits on its stop signal (the test image's is SIGUSR1, crius sends it instead of
    // SIGTERM), at once: the default 30 s grace period must not be waited out.
    write(
        "polite.yaml",
        manifest(
            "polite",
            &image,
            &[("listener", "trap 'exit 0' TERM USR1; sleep 100000 & wait")],
        ),
    );
    // Ignores its stop signal (and is its PID namespace's init): killed when 3 s are over.
    write(
        "stubborn.yaml",
        manifest_with_grace(
            "stubborn",
            &image,
            Some(3),
            &[("deaf", "trap '' TERM USR1; while true; do sleep 1; done")],
        ),
    );
    let log_path = dir.join("kubelet.log");
    let port = crius_tests::free_port().unwrap();
    let _kubelet = Kubelet(
        Command::new(&kubelet)
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                env.crius.socket().display()
            ))
            .arg(format!("--pod-manifest-path={}", manifests.display()))
            .arg(format!("--root-dir={}", dir.join("root").display()))
            .args([
                "--file-check-frequency=2s",
                "--cgroup-driver=cgroupfs",
                "--fail-swap-on=false",
                "--pod-cidr=10.89.52.0/24",
                "--cgroups-per-qos=false",
                "--enforce-node-allocatable=",
                "--address=127.0.0.1",
                "--healthz-port=0",
                "--read-only-port=0",
                "--anonymous-auth=true",
                "--authorization-mode=AlwaysAllow",
                "--feature-gates=EventedPLEG=true",
                "--hostname-override=crius-e2e-node",
                "--v=2",
            ])
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let _print = LogOnPanic(log_path.clone());
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // All pods up with their containers, the crasher restarted at least twice.
    let running = |v: &Vec<(String, i32, u32)>, name: &str| {
        v.iter()
            .filter(|c| c.0 == name && c.1 == ContainerState::ContainerRunning as i32)
            .count()
    };
    wait_for("the kubelet's pods", Duration::from_secs(90), || async {
        let by_pod = containers_by_pod(&env).await;
        let two = by_pod.get("two-crius-e2e-node")?;
        let crasher = by_pod.get("crasher-crius-e2e-node")?;
        let polite = by_pod.get("polite-crius-e2e-node")?;
        let stubborn = by_pod.get("stubborn-crius-e2e-node")?;
        let restarts = crasher.iter().map(|c| c.2).max()?;
        (running(two, "tick") == 1
            && running(two, "idle") == 1
            && running(polite, "listener") == 1
            && running(stubborn, "deaf") == 1
            && restarts >= 2)
            .then_some(())
    })
    .await;
    // Evented PLEG: never a second copy of a running container (kubelet 1.32 once started
    // dozens when PodSandboxStatus left out the pod's containers).
    for _ in 0..20 {
        let by_pod = containers_by_pod(&env).await;
        let two = &by_pod["two-crius-e2e-node"];
        assert_eq!(two.len(), 2, "{two:?}\n{}", log());
        assert!(
            by_pod["crasher-crius-e2e-node"].len() <= 2,
            "kubelet keeps the last exited attempt: {by_pod:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Restarts on time, by what crius reported: attempt 1 right after attempt 0 exited (no
    // back-off the first time; only crius's STOPPED event tells kubelet that soon: its relist
    // runs every 5 minutes with Evented PLEG), attempt 2 after kubelet's 10 s back-off
    // (counted from finished_at) and its pod worker's retry (10-15 s).
    let crashes = history(&events, "crasher-crius-e2e-node");
    let at = |n: u32| {
        crashes
            .iter()
            .find(|c| c.metadata.as_ref().unwrap().attempt == n)
            .unwrap_or_else(|| panic!("no attempt {n} in {crashes:?}"))
    };
    for n in 0..2 {
        assert_eq!(at(n).state, ContainerState::ContainerExited as i32);
        assert_eq!(at(n).exit_code, 1);
    }
    let first_gap = secs(at(1).started_at - at(0).finished_at);
    let second_gap = secs(at(2).started_at - at(1).finished_at);
    println!("crasher restarted {first_gap:.2} s and {second_gap:.2} s after exiting");
    assert!(
        (0.0..5.0).contains(&first_gap),
        "attempt 1 started {first_gap:.2} s after attempt 0 exited\n{crashes:?}"
    );
    assert!(
        (10.0..40.0).contains(&second_gap),
        "attempt 2 started {second_gap:.2} s after attempt 1 exited\n{crashes:?}"
    );

    // Remove two pods' manifests.
    let polite = pod_id(&env, "polite-crius-e2e-node").await.unwrap();
    let stubborn = pod_id(&env, "stubborn-crius-e2e-node").await.unwrap();
    let two = pod_id(&env, "two-crius-e2e-node").await.unwrap();
    let removed_at = now_nanos();
    let removing = Instant::now();
    std::fs::remove_file(manifests.join("polite.yaml")).unwrap();
    std::fs::remove_file(manifests.join("stubborn.yaml")).unwrap();
    let exited = |pod: String| {
        let env = &env;
        async move {
            let c = env
                .list_containers(ContainerFilter {
                    pod_sandbox_id: pod,
                    ..Default::default()
                })
                .await;
            let c = c.first()?;
            (c.state == ContainerState::ContainerExited as i32).then_some(c.id.clone())
        }
    };
    let (listener, deaf) = wait_for(
        "the removed pods' containers to stop",
        Duration::from_secs(20),
        || async {
            Some((
                exited(polite.clone()).await?,
                exited(stubborn.clone()).await?,
            ))
        },
    )
    .await;
    let (listener, deaf) = (env.status(&listener).await, env.status(&deaf).await);
    let polite_stop = secs(listener.finished_at - removed_at);
    let stubborn_stop = secs(deaf.finished_at - removed_at);
    println!(
        "after the manifests went: listener (exits on its stop signal, grace 30 s) stopped in \
         {polite_stop:.3} s, deaf (ignores it, grace 3 s) in {stubborn_stop:.3} s"
    );
    // kubelet sees a removed manifest at once (inotify), at worst at its next 2 s check.
    assert!(
        (0.0..5.0).contains(&polite_stop),
        "stop signal, then {polite_stop:.2} s\n{listener:?}"
    );
    assert_eq!(listener.exit_code, 0, "{listener:?}");
    assert!(
        (3.0..10.0).contains(&stubborn_stop),
        "a 3 s grace period, killed after {stubborn_stop:.2} s\n{deaf:?}"
    );
    assert_eq!(deaf.exit_code, 137, "SIGKILL: {deaf:?}");
    // Each sandbox stops right after its container.
    let stopped = wait_for("the sandboxes to stop", Duration::from_secs(10), || async {
        let p = pod_event(&events, &polite, ContainerEventType::ContainerStoppedEvent)?;
        let s = pod_event(
            &events,
            &stubborn,
            ContainerEventType::ContainerStoppedEvent,
        )?;
        Some((p.created_at, s.created_at))
    })
    .await;
    for (what, container, pod) in [
        ("polite", &listener, stopped.0),
        ("stubborn", &deaf, stopped.1),
    ] {
        let after = secs(pod - container.finished_at);
        println!("{what}'s sandbox stopped {after:.2} s after its container");
        assert!((0.0..3.0).contains(&after), "{what}: {after:.2} s");
    }
    // Sandboxes and containers removed by kubelet's container GC, which runs every minute.
    wait_for(
        "kubelet to remove the pods",
        Duration::from_secs(80),
        || async {
            let pods = env.list_pods(PodSandboxFilter::default()).await;
            let containers = env.list_containers(ContainerFilter::default()).await;
            let gone = |id: &String| {
                !pods.iter().any(|p| &p.id == id)
                    && !containers.iter().any(|c| &c.pod_sandbox_id == id)
            };
            (gone(&polite) && gone(&stubborn)).then_some(())
        },
    )
    .await;
    println!(
        "both pods removed {:.1} s after their manifests",
        removing.elapsed().as_secs_f64()
    );
    for pod in [&polite, &stubborn] {
        let deleted = pod_event(&events, pod, ContainerEventType::ContainerDeletedEvent)
            .unwrap_or_else(|| panic!("no DELETED event for {pod}"));
        let last = deleted.pod_sandbox_status.as_ref().unwrap();
        assert_eq!(last.state, PodSandboxState::SandboxNotready as i32);
    }
    // The others untouched.
    let by_pod = containers_by_pod(&env).await;
    let left = &by_pod["two-crius-e2e-node"];
    assert!(
        left.iter()
            .all(|c| c.1 == ContainerState::ContainerRunning as i32 && c.2 == 0),
        "{left:?}"
    );
    assert_eq!(
        env.pod_status(&two).await.state,
        PodSandboxState::SandboxReady as i32
    );

    let log = log();
    // What kubelet logged as errors, by where (for the record; the asserts below judge).
    let mut errors: HashMap<&str, usize> = HashMap::new();
    for line in log.lines().filter(|l| l.starts_with('E')) {
        let at = line.split_whitespace().nth(3).unwrap_or(line);
        *errors.entry(at).or_default() += 1;
    }
    println!("kubelet's error lines by source: {errors:?}");
    assert!(
        log.contains("Updating runtime config through cri with podcidr"),
        "{log}"
    );
    assert!(!log.contains("Error updating pod CIDR"), "{log}");
    assert!(!log.contains("sources aren't ready"), "{log}");
    // kubelet logs an error for (and ignores) an event without the pod's status.
    assert!(!log.contains("Evented PLEG: received"), "{log}");
    for line in log.lines().filter(|l| l.contains("rpc error")) {
        // kubelet asks for the status of a container it has just removed (its container GC and
        // its pod worker both remove it), and its GC asks about the containers of stale links
        // in /var/log/containers (other runs'); every runtime answers NotFound there.
        assert!(
            line.contains("code = NotFound")
                && (line.contains("ContainerStatus") || line.contains("DeleteContainer")),
            "a CRI error in kubelet's log: {line}"
        );
    }
}
