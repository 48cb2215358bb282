//! A pod whose `cgroup_parent` names a cgroup crius did not make (a shared one, like
//! `/system.slice`) gets its limits on a cgroup of its own below that parent; the parent's
//! limits are never written and the parent outlives the pod unchanged. A `cgroup_parent` that
//! could leave the hierarchy or cannot be a path is refused at the door.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use crate::common::{assert_status, cgroup_v2, Env, HostCgroup, CGROUP_ROOT};
use crius_api::v1::*;
use tonic::Code;

/// `file` of `cgroup` (a path from the hierarchy's root): in the unified tree, or in the v1
/// hierarchy of `controller`.
fn cgroup_file(cgroup: &str, controller: &str, v1: &str, v2: &str) -> String {
    let rel = cgroup.trim_start_matches('/');
    let path = if cgroup_v2() {
        Path::new(CGROUP_ROOT).join(rel).join(v2)
    } else {
        Path::new(CGROUP_ROOT).join(controller).join(rel).join(v1)
    };
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}

/// The memory limit and CPU quota of `cgroup`, as the kernel shows them.
fn limits(cgroup: &str) -> (String, String) {
    (
        cgroup_file(cgroup, "memory", "memory.limit_in_bytes", "memory.max"),
        cgroup_file(cgroup, "cpu", "cpu.cfs_quota_us", "cpu.max"),
    )
}

#[tokio::test]
async fn pod_limits_go_below_a_foreign_cgroup_parent_never_into_it() {
    // Declared first, dropped last: crius has removed its pods by then.
    let parent = HostCgroup::new("crius-e2e54-shared.slice");
    let mut env = Env::new().await;
    let before = limits(&parent.name);

    let mut config = env.pod_config("foreign-parent", true);
    let linux = config.linux.as_mut().unwrap();
    linux.cgroup_parent = parent.name.clone();
    linux.resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 64 << 20,
        cpu_period: 100_000,
        cpu_quota: 50_000,
        ..Default::default()
    });
    let pod = env.run_pod(config).await;

    let info = env
        .rt()
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info;
    let info: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
    let own = info["cgroup"].as_str().unwrap().to_string();
    assert_eq!(limits(&parent.name), before, "the shared parent's limits");
    assert!(
        own.starts_with(&format!("{}/", parent.name)) && own != parent.name,
        "pod cgroup {own} is not below {}",
        parent.name
    );
    let want_cpu = if cgroup_v2() { "50000 100000" } else { "50000" };
    assert_eq!(
        limits(&own),
        ((64u64 << 20).to_string(), want_cpu.to_string()),
        "the pod's own cgroup carries its limits"
    );

    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_pod_gone(&pod).await;
    for d in &parent.dirs {
        assert!(d.is_dir(), "{} removed with the pod", d.display());
    }
    assert_eq!(
        limits(&parent.name),
        before,
        "the shared parent after the pod"
    );
    assert_eq!(
        parent.children(),
        Vec::<PathBuf>::new(),
        "left below the parent"
    );
}

#[tokio::test]
async fn a_bad_cgroup_parent_is_refused_at_the_door() {
    let env = Env::new().await;
    let huge = format!("/{}", "kubepods/".repeat(1 << 17));
    for (value, why) in [
        ("/kubepods/../../etc", "`..`"),
        ("/kubepods\0pod1", "NUL"),
        (huge.as_str(), "longer than"),
    ] {
        let mut config = env.pod_config("bad-parent", true);
        config.linux.as_mut().unwrap().cgroup_parent = value.to_string();
        let result = env
            .rt()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await;
        let len = result.as_ref().err().map_or(0, |s| s.message().len());
        assert_status(
            result,
            Code::InvalidArgument,
            &["config.linux.cgroup_parent", why],
        );
        assert!(len < 1024, "status message of {len} bytes");
    }
    assert!(env.list_pods(PodSandboxFilter::default()).await.is_empty());
}
