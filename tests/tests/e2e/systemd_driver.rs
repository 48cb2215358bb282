//! The systemd cgroup driver end to end, against a real systemd (Debian's, run as a user
//! manager by [`crius_tests::systemd::Systemd`]): pods get slices, containers and pause
//! processes transient scopes with their limits as unit properties, the processes sit in
//! the scopes' cgroups in every hierarchy, updates reach both the files and systemd, and
//! teardown stops the units and removes the cgroups. Real crius, real containers. Run as root.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::common::{wait_for, Env};
use crius_api::v1::*;
use crius_tests::crius::Crius;
use crius_tests::systemd::Systemd;
use crius_tests::TestDir;

/// Restarts the test's crius with the systemd driver, talking to `systemd`.
async fn use_systemd(env: &mut Env, systemd: &Systemd) {
    let path = env.crius.config_path();
    let mut config = std::fs::read_to_string(&path).unwrap();
    config.push_str(&format!(
        "\n[cgroup]\ndriver = \"systemd\"\nsystemd_socket = \"{}\"\n",
        systemd.socket().display()
    ));
    std::fs::write(&path, config).unwrap();
    env.crius.restart().await.unwrap();
}

/// The content of `file` in the cgroup `cgroup` of the v1 hierarchy `controller`.
fn cgroup_file(controller: &str, cgroup: &str, file: &str) -> String {
    let path = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(cgroup.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Whether `cgroup` is gone from every hierarchy: the v2 tree at `/sys/fs/cgroup` itself
/// (which the per-controller check alone would never look at) and each v1 hierarchy below it.
fn cgroup_gone(cgroup: &str) -> bool {
    let rel = cgroup.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    !root.join(rel).exists()
        && std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .all(|h| !h.path().join(rel).exists())
}

/// Waits until systemd no longer has `unit` active.
async fn wait_unit_gone(systemd: &Systemd, unit: &str) {
    wait_for(
        &format!("{unit} to stop"),
        Duration::from_secs(10),
        || async {
            let p = systemd.show(unit, &["ActiveState"]).unwrap();
            (p["ActiveState"] == "inactive").then_some(())
        },
    )
    .await;
}

fn is_v1_host() -> bool {
    Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_and_containers_run_in_systemd_units() {
    // Declared first, dropped last: crius removes its pods while systemd still answers.
    let systemd = Systemd::start().unwrap();
    let mut env = Env::with_image().await;
    use_systemd(&mut env, &systemd).await;
    let root = systemd.cgroup_root().to_string();

    let rc = env
        .rt()
        .runtime_config(RuntimeConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rc.linux.unwrap().cgroup_driver,
        CgroupDriver::Systemd as i32,
        "RuntimeConfig reports the configured driver"
    );

    // A pod without a parent: crius's own transient slice with the pod's limits, the pause
    // process in a scope.
    let mut config = env.pod_config("sd-own", true);
    config.linux.as_mut().unwrap().resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    });
    let pod = env.run_pod(config.clone()).await;
    let slice = format!("crius-{pod}.slice");
    let slice_cg = format!("{root}/crius.slice/{slice}");
    let p = systemd
        .show(
            &slice,
            &[
                "ActiveState",
                "ControlGroup",
                "Transient",
                "MemoryLimit",
                "MemoryMax",
            ],
        )
        .unwrap();
    assert_eq!(p["ActiveState"], "active", "{slice}: {p:?}");
    assert_eq!(p["ControlGroup"], slice_cg);
    assert_eq!(p["Transient"], "yes");
    let want = (256u64 << 20).to_string();
    if is_v1_host() {
        assert_eq!(p["MemoryLimit"], want);
        assert_eq!(
            cgroup_file("memory", &slice_cg, "memory.limit_in_bytes"),
            want
        );
    } else {
        assert_eq!(p["MemoryMax"], want);
    }
    let pause_scope = format!("crius-{pod}.scope");
    let p = systemd
        .show(&pause_scope, &["ActiveState", "ControlGroup", "Slice"])
        .unwrap();
    assert_eq!(p["ActiveState"], "active", "{pause_scope}: {p:?}");
    assert_eq!(p["ControlGroup"], format!("{slice_cg}/{pause_scope}"));
    assert_eq!(p["Slice"], slice);

    // A container with limits: its scope carries them as properties, the files hold them.
    let mut c = env.container_config("sd-limits", &["sleep", "3600"]);
    c.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 20_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let ctr = env.create_start(&pod, &config, c).await;
    let scope = format!("crius-{ctr}.scope");
    let cg = format!("{slice_cg}/{scope}");
    let p = systemd
        .show(
            &scope,
            &[
                "ActiveState",
                "ControlGroup",
                "Slice",
                "Delegate",
                "TasksMax",
                "CPUShares",
                "CPUWeight",
                "CPUQuotaPerSecUSec",
                "MemoryLimit",
                "MemoryMax",
            ],
        )
        .unwrap();
    assert_eq!(p["ActiveState"], "active", "{scope}: {p:?}");
    assert_eq!(p["ControlGroup"], cg);
    assert_eq!(p["Slice"], slice);
    assert_eq!(p["Delegate"], "yes");
    assert_eq!(
        p["TasksMax"], "infinity",
        "no DefaultTasksMax for containers"
    );
    assert_eq!(p["CPUQuotaPerSecUSec"], "200ms");
    if is_v1_host() {
        assert_eq!(p["CPUShares"], "512");
        assert_eq!(p["MemoryLimit"], (64u64 << 20).to_string());
    } else {
        assert_eq!(p["CPUWeight"], "59");
        assert_eq!(p["MemoryMax"], (64u64 << 20).to_string());
    }

    // The container's process is in its scope in every hierarchy, also those systemd does not
    // manage (devices, freezer, cpuset), where it moved it to the slice.
    let pid = env.pid(&ctr).await;
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in own.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap();
        assert_eq!(path, cg, "container process cgroups:\n{own}");
    }
    // An exec'd process joins the same cgroups (seen as "/" inside a cgroup namespace).
    let out = env
        .exec(&ctr, &["cat", "/proc/self/cgroup"], 10)
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap();
        assert!(path == cg || path == "/", "exec process cgroups:\n{text}");
    }
    if is_v1_host() {
        assert_eq!(
            cgroup_file("memory", &cg, "memory.limit_in_bytes"),
            (64u64 << 20).to_string()
        );
        assert_eq!(cgroup_file("cpu", &cg, "cpu.shares"), "512");
        assert_eq!(cgroup_file("cpu", &cg, "cpu.cfs_quota_us"), "20000");
        assert_eq!(cgroup_file("pids", &cg, "pids.max"), "max");
        let devices = cgroup_file("devices", &cg, "devices.list");
        assert_ne!(devices, "a *:* rwm", "the device rules are in force");
        assert!(devices.contains("c 1:3 rwm"), "{devices}");
    }

    // UpdateContainerResources: the file and the unit property.
    env.rt()
        .update_container_resources(UpdateContainerResourcesRequest {
            container_id: ctr.clone(),
            linux: Some(LinuxContainerResources {
                memory_limit_in_bytes: 128 << 20,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let want = (128u64 << 20).to_string();
    let p = systemd
        .show(&scope, &["MemoryLimit", "MemoryMax", "CPUShares"])
        .unwrap();
    if is_v1_host() {
        assert_eq!(cgroup_file("memory", &cg, "memory.limit_in_bytes"), want);
        assert_eq!(p["MemoryLimit"], want);
        assert_eq!(p["CPUShares"], "512", "the update keeps what it left unset");
        assert_eq!(cgroup_file("cpu", &cg, "cpu.shares"), "512");
    } else {
        assert_eq!(p["MemoryMax"], want);
    }

    // An OOM kill is still seen as one, although systemd collects the scope (and its cgroup)
    // as soon as the container's last process is gone.
    let hog = env
        .create_start(&pod, &config, env.memory_hog_config("sd-hog"))
        .await;
    let s = env.wait_exited(&hog, Duration::from_secs(60)).await;
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "{s:?}"
    );
    env.remove(&hog).await;
    wait_unit_gone(&systemd, &format!("crius-{hog}.scope")).await;

    // A container that ends by itself: systemd collects its scope at once (cgroup included),
    // crius still reports how it ended and removes it cleanly.
    let done = env
        .create_start(&pod, &config, env.container_config("sd-done", &["true"]))
        .await;
    let done_scope = format!("crius-{done}.scope");
    let s = env.wait_exited(&done, Duration::from_secs(30)).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"), "{s:?}");
    wait_unit_gone(&systemd, &done_scope).await;
    env.remove(&done).await;
    assert!(cgroup_gone(&format!("{slice_cg}/{done_scope}")));

    // A pod in a kubelet slice (kubelet would have made it; systemd makes it on demand): a
    // slice of its own below it carries the pod's limits, kubelet's slice keeps its own.
    let kube_slice = "kubepods-besteffort-podcriuse2e87.slice";
    let kube_cg = format!("{root}/kubepods.slice/kubepods-besteffort.slice/{kube_slice}");
    let mut kconfig = env.pod_config("sd-kube", true);
    let klinux = kconfig.linux.as_mut().unwrap();
    klinux.cgroup_parent = kube_slice.to_string();
    klinux.resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 96 << 20,
        ..Default::default()
    });
    let kpod = env.run_pod(kconfig).await;
    let kown = format!("kubepods-besteffort-podcriuse2e87-crius{kpod}.slice");
    let kscope = format!("crius-{kpod}.scope");
    let kown_cg = format!("{kube_cg}/{kown}");
    let kcg = format!("{kown_cg}/{kscope}");
    let p = systemd
        .show(&kscope, &["ActiveState", "ControlGroup", "Slice"])
        .unwrap();
    assert_eq!(p["ActiveState"], "active", "{kscope}: {p:?}");
    assert_eq!(p["ControlGroup"], kcg);
    assert_eq!(p["Slice"], kown);
    let want = (96u64 << 20).to_string();
    let limit_key = if is_v1_host() {
        "MemoryLimit"
    } else {
        "MemoryMax"
    };
    let own = systemd.show(&kown, &[limit_key]).unwrap();
    assert_eq!(own[limit_key], want, "{kown}: {own:?}");
    let kube = systemd.show(kube_slice, &[limit_key]).unwrap();
    assert_ne!(kube[limit_key], want, "kubelet's slice got the pod's limit");
    if is_v1_host() {
        assert_eq!(
            cgroup_file("memory", &kown_cg, "memory.limit_in_bytes"),
            want
        );
        assert_ne!(
            cgroup_file("memory", &kube_cg, "memory.limit_in_bytes"),
            want
        );
    }

    // A parent that is no slice is refused, naming the mismatch.
    let mut bad = env.pod_config("sd-bad", true);
    bad.linux.as_mut().unwrap().cgroup_parent = "/kubepods/besteffort/pod1".into();
    let err = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(bad),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("cgroupDriver"), "{err:?}");

    // A restarted crius finds systemd again and tears down what it made before.
    env.crius.restart().await.unwrap();
    let p = systemd.show(&scope, &["ActiveState"]).unwrap();
    assert_eq!(
        p["ActiveState"], "active",
        "a restart leaves the containers running"
    );

    // Teardown stops the units and leaves no cgroup.
    env.stop(&ctr, 0).await;
    env.remove(&ctr).await;
    wait_unit_gone(&systemd, &scope).await;
    assert!(cgroup_gone(&cg), "{cg} left behind");
    env.remove_pod(&pod).await;
    wait_unit_gone(&systemd, &pause_scope).await;
    wait_unit_gone(&systemd, &slice).await;
    assert!(cgroup_gone(&slice_cg), "{slice_cg} left behind");
    env.remove_pod(&kpod).await;
    wait_unit_gone(&systemd, &kscope).await;
    wait_unit_gone(&systemd, &kown).await;
    assert!(cgroup_gone(&kown_cg), "{kown_cg} left behind");
    env.assert_no_leaks().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn systemd_driver_without_systemd_refuses_to_start() {
    let dir = TestDir::new("no-systemd").unwrap();
    let socket = dir.join("private");
    let config = format!(
        "[cgroup]\ndriver = \"systemd\"\nsystemd_socket = \"{}\"\n",
        socket.display()
    );
    let err = Crius::start(&config).await.unwrap_err();
    let msg = format!("{err:?}");
    assert!(
        msg.contains(&format!("systemd does not answer at {}", socket.display())),
        "{msg}"
    );
}
