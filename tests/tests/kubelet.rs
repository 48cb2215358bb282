//! A real kubelet drives crius, when one is given: `CRIUS_KUBELET_BIN=/path/to/kubelet` (built by
//! hand; this project ships none and no script that builds one). Without it the test says it is
//! skipped. Standalone kubelet with static pods, `--pod-cidr` and Evented PLEG
//! (`--feature-gates=EventedPLEG=true`, which reads crius's GetContainerEvents stream and
//! PodSandboxStatus with its containers): each pod runs exactly its containers, a crashing
//! container is restarted with back-off, and the kubelet logs no CRI error but the NotFound
//! of its own second RemoveContainer. Network 52. (Removing a manifest is not tested: the
//! standalone kubelet that could be built here, from KubeEdge's fork, refuses every pod
//! deletion with "skipping delete because sources aren't ready yet".)
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{wait_for, Env};
use crius_api::v1::*;

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
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers:\n"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubelet_with_evented_pleg() {
    let Ok(kubelet) = std::env::var("CRIUS_KUBELET_BIN") else {
        println!("skipped a_real_kubelet_with_evented_pleg: CRIUS_KUBELET_BIN is not set");
        return;
    };
    let env = Env::with_image(52).await;
    let dir = crius_tests::TestDir::new("kubelet").unwrap();
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let image = env.image.clone();
    std::fs::write(
        manifests.join("two.yaml"),
        manifest(
            "two",
            &image,
            &[
                ("tick", "while true; do date; sleep 5; done"),
                ("idle", "exec sleep 100000"),
            ],
        ),
    )
    .unwrap();
    std::fs::write(
        manifests.join("crasher.yaml"),
        manifest(
            "crasher",
            &image,
            &[("crash", "echo crashing; sleep 1; exit 1")],
        ),
    )
    .unwrap();
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
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // Both pods up with their containers, the crasher restarted at least twice.
    let running = |v: &Vec<(String, i32, u32)>, name: &str| {
        v.iter()
            .filter(|c| c.0 == name && c.1 == ContainerState::ContainerRunning as i32)
            .count()
    };
    wait_for("the kubelet's pods", Duration::from_secs(90), || async {
        let by_pod = containers_by_pod(&env).await;
        let two = by_pod.get("two-crius-e2e-node")?;
        let crasher = by_pod.get("crasher-crius-e2e-node")?;
        let restarts = crasher.iter().map(|c| c.2).max()?;
        (running(two, "tick") == 1 && running(two, "idle") == 1 && restarts >= 2).then_some(())
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

    let log = log();
    assert!(
        log.contains("Updating runtime config through cri with podcidr"),
        "{log}"
    );
    assert!(!log.contains("Error updating pod CIDR"), "{log}");
    for line in log.lines().filter(|l| l.contains("rpc error")) {
        // kubelet asks for the status of a container it has just removed (its container GC and
        // its pod worker both remove it); every runtime answers NotFound there.
        assert!(
            line.contains("code = NotFound")
                && (line.contains("ContainerStatus") || line.contains("DeleteContainer")),
            "a CRI error in kubelet's log: {line}"
        );
    }
}
