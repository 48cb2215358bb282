//! What the checkpoint tests (`checkpoint.rs`, `checkpoint_pod.rs`) share: crius's criu, pods
//! whose containers restore, counters whose progress shows where a restore resumed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crius_api::v1::*;

use super::{pod_sc, read_log, texts, Env};

/// Where `contrib/criu/install` puts its criu when the system's does not work on this kernel.
pub const PROJECT_CRIU: &str = "/opt/crius/criu/bin/criu";

/// The `[runtime] criu_path` of the tests: [`PROJECT_CRIU`] when it is there, else `criu`.
pub fn criu_config() -> String {
    let private = Path::new(PROJECT_CRIU);
    let criu = if private.exists() {
        private.display().to_string()
    } else {
        "criu".to_string()
    };
    format!("[runtime]\ncriu_path = \"{criu}\"\n")
}

/// One CRIU-running test of a binary at a time, for the one that checks what CRIU leaves of
/// the node: CRIU's runs reset the cgroup2 mount's options, and each crius puts back what it
/// saw before its own runs, which another crius's run in between would spoil.
pub async fn criu_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// The options of the host's cgroup2 mount (`rw,favordynmods`, ...), if it has one.
pub fn cgroup2_options() -> Option<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            let (_, right) = l.split_once(" - ")?;
            let mut fields = right.split(' ');
            (fields.next()? == "cgroup2").then(|| fields.nth(1).map(str::to_string))?
        })
}

/// A pod config whose containers have their own PID namespace (kubelet's default; runc
/// cannot restore into the pod's).
pub fn pod_config(env: &Env, name: &str) -> PodSandboxConfig {
    let mut config = env.pod_config(name, false);
    pod_sc(&mut config).namespace_options.as_mut().unwrap().pid = NamespaceMode::Container as i32;
    config
}

/// A container `name` that writes `note` into `/root/note` of its writable layer, then counts
/// in the shell's memory, one number a line every 100 ms.
pub fn counter_named(env: &Env, name: &str, note: &str) -> ContainerConfig {
    env.container_config(
        name,
        &[
            "sh",
            "-c",
            &format!(
                "echo {note} > /root/note; i=0; \
                 while true; do i=$((i+1)); echo $i; sleep 0.1; done"
            ),
        ],
    )
}

/// The numbers a counter logged.
pub fn numbers(log: &Path) -> Vec<u64> {
    texts(&read_log(log), "stdout")
        .iter()
        .filter_map(|t| t.trim().parse().ok())
        .collect()
}

/// The entries of `dir`, sorted.
pub fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// Waits until the counter logging to `log` has logged `n` numbers.
pub async fn counted(env: &Env, log: &Path, n: usize) {
    env.wait_log(log, Duration::from_secs(10), |_| numbers(log).len() >= n)
        .await;
}

/// Asserts that the counter logging to `log` resumed where a checkpoint taken at
/// `at_checkpoint` left it (not from 1) and counts one after another.
pub async fn counts_on_from(env: &Env, log: &Path, at_checkpoint: u64) {
    counted(env, log, 3).await;
    let counted = numbers(log);
    assert!(
        counted[0] > 1 && counted[0] <= at_checkpoint + 1,
        "restored counter starts at {} (checkpointed at {at_checkpoint})",
        counted[0]
    );
    assert!(
        counted.windows(2).all(|w| w[1] == w[0] + 1),
        "not one count after another: {counted:?}"
    );
}

/// Stops and removes container `id`, then stops and removes its pod.
pub async fn remove_all(env: &Env, pod: &str, id: &str) {
    env.stop(id, 0).await;
    env.remove(id).await;
    env.stop_pod(pod).await;
    env.remove_pod(pod).await;
}

/// A container `big`: a shell holding a 256 MiB string (about 260 MB resident), then counting,
/// with 60 MB of random bytes in its /dev tmpfs, which CRIU dumps gzip-compressed, slowly:
/// without them the dump of the big shell alone can finish within a 1 s timeout, the shortest
/// the CRI can ask for. It logs `ready` once the string is whole.
pub fn big_shell(env: &Env) -> ContainerConfig {
    env.container_config(
        "big",
        &[
            "sh",
            "-c",
            "head -c 60000000 /dev/urandom > /dev/ballast; \
             x=0123456789abcdef; while [ ${#x} -lt 268435456 ]; do x=$x$x; done; echo ready; \
             i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done",
        ],
    )
}

/// The `checkpoint` entry of a verbose Status: what each handler can do, criu's path.
pub async fn checkpoint_info(env: &Env) -> serde_json::Value {
    env.runtime_info("checkpoint").await
}

/// A pod `name` under gVisor (runsc) with one sleeping container: (pod, its config, the
/// container), or `None` where runsc is not installed.
pub async fn gvisor_sleeper(
    env: &mut Env,
    name: &str,
) -> Option<(String, PodSandboxConfig, String)> {
    if !Path::new("/usr/bin/runsc").exists() {
        return None;
    }
    let config = env.pod_config(name, false);
    let pod = env.run_pod_with_handler(config.clone(), "runsc").await;
    let sleeper = env.container_config("sleeper", &["sleep", "1000"]);
    let id = env.create_start(&pod, &config, sleeper).await;
    Some((pod, config, id))
}
