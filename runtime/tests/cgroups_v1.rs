#![allow(clippy::unwrap_used)]
//! The cgroup v1 back end against this host's real hierarchies (run as root): limits land in
//! the kernel files, read back, and a value the kernel refuses leaves the old values in force.
//! Each test makes throwaway cgroups `crius-cg-test-*` that `Drop` removes, killing what runs
//! in them first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crius::cgroups::v1::{CONTROLLERS, V1};
use crius::cgroups::{apply_pod_resources, CgroupError, Hierarchy, Mode};
use crius_api::v1::{
    HugepageLimit, LinuxContainerResources, LinuxPodSandboxConfig, PodSandboxConfig,
};

const MIB: i64 = 1 << 20;

fn v1() -> Option<(&'static Hierarchy, &'static V1)> {
    let h = Hierarchy::host().unwrap();
    match h {
        Hierarchy::V1(v) => Some((h, v)),
        Hierarchy::V2(_) => {
            eprintln!("skipped: this host is cgroup v2");
            None
        }
    }
}

/// A cgroup made in every mounted v1 controller, with maybe a process in it.
struct TestCgroup {
    /// The cgroup path, `/crius-cg-test-<pid>-<n>[/child]`.
    path: String,
    dirs: Vec<PathBuf>,
    child: Option<Child>,
}

impl TestCgroup {
    fn new(v1: &V1) -> TestCgroup {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = format!(
            "/crius-cg-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        Self::make(v1, path)
    }

    fn child(&self, v1: &V1, name: &str) -> TestCgroup {
        Self::make(v1, format!("{}/{name}", self.path))
    }

    fn make(v1: &V1, path: String) -> TestCgroup {
        let mut t = TestCgroup {
            path,
            dirs: Vec::new(),
            child: None,
        };
        for c in CONTROLLERS {
            let Some(dir) = v1.dir(c, &t.path) else {
                continue;
            };
            if t.dirs.contains(&dir) {
                continue; // co-mounted controllers (cpu,cpuacct) share a directory
            }
            std::fs::create_dir(&dir).unwrap();
            t.dirs.push(dir.clone());
            if *c == "cpuset" {
                // A new cpuset is empty; a task can only join once it has CPUs and nodes.
                let parent = dir.parent().unwrap();
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = std::fs::read_to_string(parent.join(f)).unwrap();
                    std::fs::write(dir.join(f), v.trim()).unwrap();
                }
            }
        }
        t
    }

    /// Starts `sh -c script` and moves it into this cgroup in every hierarchy.
    fn run(&mut self, script: &str) -> u32 {
        let child = Command::new("sh").arg("-c").arg(script).spawn().unwrap();
        let pid = child.id();
        self.child = Some(child);
        for d in &self.dirs {
            std::fs::write(d.join("cgroup.procs"), pid.to_string()).unwrap();
        }
        pid
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in &self.dirs {
            // Children first (a parent TestCgroup drops after its children in these tests, but
            // a panic may leave them): remove depth-first, retrying while tasks leave.
            remove_tree(d);
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while dir.exists() && std::fs::remove_dir(dir).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn file(v1: &V1, controller: &str, cgroup: &str, name: &str) -> String {
    std::fs::read_to_string(v1.dir(controller, cgroup).unwrap().join(name))
        .unwrap()
        .trim()
        .to_string()
}

fn has_memsw(v1: &V1, cgroup: &str) -> bool {
    v1.dir("memory", cgroup)
        .unwrap()
        .join("memory.memsw.limit_in_bytes")
        .exists()
}

#[test]
fn host_with_v1_controllers_is_detected_as_v1() {
    let Some((h, v1)) = v1() else { return };
    assert_eq!(h.mode(), Mode::V1);
    for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
        assert!(v1.mount(c).is_some(), "{c} not found");
        assert!(h.has_controller(c));
    }
    assert_eq!(
        h.has_controller("hugetlb"),
        Path::new("/sys/fs/cgroup/hugetlb").exists()
    );
}

#[test]
fn limits_land_in_the_kernel_files_and_read_back() {
    let Some((h, v1)) = v1() else { return };
    let cg = TestCgroup::new(v1);
    let swap = has_memsw(v1, &cg.path);
    let r = LinuxContainerResources {
        cpu_shares: 512,
        cpu_period: 50_000,
        cpu_quota: 25_000,
        cpuset_cpus: "0".into(),
        cpuset_mems: "0".into(),
        memory_limit_in_bytes: 64 * MIB,
        memory_swap_limit_in_bytes: if swap { 128 * MIB } else { 0 },
        ..Default::default()
    };
    h.apply(&cg.path, &r).unwrap();
    assert_eq!(file(v1, "cpu", &cg.path, "cpu.shares"), "512");
    assert_eq!(file(v1, "cpu", &cg.path, "cpu.cfs_period_us"), "50000");
    assert_eq!(file(v1, "cpu", &cg.path, "cpu.cfs_quota_us"), "25000");
    assert_eq!(file(v1, "cpuset", &cg.path, "cpuset.cpus"), "0");
    assert_eq!(
        file(v1, "memory", &cg.path, "memory.limit_in_bytes"),
        (64 * MIB).to_string()
    );
    if swap {
        assert_eq!(
            file(v1, "memory", &cg.path, "memory.memsw.limit_in_bytes"),
            (128 * MIB).to_string()
        );
    }
    let back = h.read(&cg.path).unwrap();
    assert_eq!(back.cpu_shares, 512);
    assert_eq!((back.cpu_period, back.cpu_quota), (50_000, 25_000));
    assert_eq!(back.cpuset_cpus, "0");
    assert_eq!(back.memory_limit_in_bytes, 64 * MIB);
    assert_eq!(
        back.memory_swap_limit_in_bytes,
        r.memory_swap_limit_in_bytes
    );

    // Unlimited again: quota -1 and memory -1 (which lifts memsw too).
    let unlimited = LinuxContainerResources {
        cpu_quota: -1,
        memory_limit_in_bytes: -1,
        ..Default::default()
    };
    h.apply(&cg.path, &unlimited).unwrap();
    let back = h.read(&cg.path).unwrap();
    assert_eq!(back.cpu_quota, -1);
    assert_eq!(back.memory_limit_in_bytes, 0);
    assert_eq!(back.memory_swap_limit_in_bytes, 0);
}

#[test]
fn memory_and_swap_can_be_raised_and_lowered() {
    let Some((h, v1)) = v1() else { return };
    let cg = TestCgroup::new(v1);
    if !has_memsw(v1, &cg.path) {
        eprintln!("skipped: no swap accounting (memory.memsw.*)");
        return;
    }
    let set = |mem: i64, swap: i64| {
        let r = LinuxContainerResources {
            memory_limit_in_bytes: mem,
            memory_swap_limit_in_bytes: swap,
            ..Default::default()
        };
        h.apply(&cg.path, &r).unwrap();
        let back = h.read(&cg.path).unwrap();
        assert_eq!(
            (back.memory_limit_in_bytes, back.memory_swap_limit_in_bytes),
            (mem, swap)
        );
    };
    set(64 * MIB, 128 * MIB);
    // Both above the current memsw: memsw must go first.
    set(256 * MIB, 512 * MIB);
    // Both below the current memory limit: memory must go first.
    set(32 * MIB, 48 * MIB);
    set(32 * MIB, 32 * MIB);
}

#[test]
fn a_refused_value_keeps_the_old_values() {
    let Some((h, v1)) = v1() else { return };
    let cg = TestCgroup::new(v1);
    let swap = has_memsw(v1, &cg.path);
    let before = LinuxContainerResources {
        cpu_shares: 256,
        cpu_quota: 50_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 * MIB,
        memory_swap_limit_in_bytes: if swap { 128 * MIB } else { 0 },
        ..Default::default()
    };
    h.apply(&cg.path, &before).unwrap();
    let in_force = h.read(&cg.path).unwrap();

    // memsw 200M goes in first, then memory 256M > memsw: EINVAL, memsw restored.
    if swap {
        let r = LinuxContainerResources {
            memory_limit_in_bytes: 256 * MIB,
            memory_swap_limit_in_bytes: 200 * MIB,
            ..Default::default()
        };
        let err = h.apply(&cg.path, &r).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("memory.limit_in_bytes") && msg.contains(&(256 * MIB).to_string()),
            "{msg}"
        );
        assert!(err.is_invalid_value(), "{err:?}");
        assert_eq!(h.read(&cg.path).unwrap(), in_force);
    }

    // A quota below the kernel's 1ms minimum is refused before anything is written.
    let r = LinuxContainerResources {
        memory_limit_in_bytes: 96 * MIB,
        cpu_shares: 1024,
        cpu_quota: 500,
        ..Default::default()
    };
    let err = h.apply(&cg.path, &r).unwrap_err();
    assert!(err.to_string().contains("cpu_quota"), "{err}");
    assert!(err.is_invalid_value(), "{err:?}");
    assert_eq!(h.read(&cg.path).unwrap(), in_force);

    // Memory is written, then CPUs this host does not have are refused by the kernel: the
    // memory limit is back.
    let r = LinuxContainerResources {
        memory_limit_in_bytes: 96 * MIB,
        cpuset_cpus: "0-4095".into(),
        ..Default::default()
    };
    let err = h.apply(&cg.path, &r).unwrap_err();
    assert!(err.to_string().contains("cpuset.cpus"), "{err}");
    assert_eq!(h.read(&cg.path).unwrap(), in_force);
    assert_eq!(
        file(v1, "memory", &cg.path, "memory.limit_in_bytes"),
        (64 * MIB).to_string()
    );
}

#[test]
fn a_child_quota_above_its_parents_is_refused() {
    let Some((h, v1)) = v1() else { return };
    let pod = TestCgroup::new(v1);
    let container = pod.child(v1, "c");
    h.apply(
        &pod.path,
        &LinuxContainerResources {
            cpu_quota: 50_000,
            cpu_period: 100_000,
            ..Default::default()
        },
    )
    .unwrap();
    let err = h
        .apply(
            &container.path,
            &LinuxContainerResources {
                cpu_quota: 200_000,
                cpu_period: 100_000,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("cpu.cfs_"), "{err}");
    assert_eq!(h.read(&container.path).unwrap().cpu_quota, -1);
    drop(container);
}

#[test]
fn v2_only_settings_are_refused_on_v1() {
    let Some((h, v1)) = v1() else { return };
    let cg = TestCgroup::new(v1);
    let r = LinuxContainerResources {
        memory_limit_in_bytes: 64 * MIB,
        unified: [("memory.high".to_string(), "1000000".to_string())].into(),
        ..Default::default()
    };
    let err = h.apply(&cg.path, &r).unwrap_err();
    assert!(matches!(err, CgroupError::Invalid(_)), "{err:?}");
    assert!(err.to_string().contains("memory.high"), "{err}");
    // Nothing was written.
    assert_eq!(h.read(&cg.path).unwrap().memory_limit_in_bytes, 0);

    if v1.mount("hugetlb").is_none() {
        let r = LinuxContainerResources {
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 20,
            }],
            ..Default::default()
        };
        let err = h.apply(&cg.path, &r).unwrap_err();
        assert!(err.to_string().contains("hugetlb"), "{err}");
        // kubelet's zero limit for every page size is accepted (nothing to enforce).
        let zero = LinuxContainerResources {
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 0,
            }],
            ..Default::default()
        };
        h.apply(&cg.path, &zero).unwrap();
    }
}

#[test]
fn missing_cgroup_is_not_found() {
    let Some((h, _)) = v1() else { return };
    let err = h
        .apply(
            "/crius-cg-test-none-such",
            &LinuxContainerResources::default(),
        )
        .unwrap_err();
    assert!(matches!(err, CgroupError::NotFound(_)), "{err:?}");
    assert!(matches!(
        h.stats("/crius-cg-test-none-such").unwrap_err(),
        CgroupError::NotFound(_)
    ));
}

#[test]
fn stats_count_what_runs_in_the_cgroup() {
    let Some((h, v1)) = v1() else { return };
    let mut cg = TestCgroup::new(v1);
    h.apply(
        &cg.path,
        &LinuxContainerResources {
            memory_limit_in_bytes: 128 * MIB,
            ..Default::default()
        },
    )
    .unwrap();
    // Wait for the move into the cgroup, burn some CPU there, then idle (the exec faults
    // pages in).
    cg.run("sleep 0.2; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; exec sleep 60");
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let s = h.stats(&cg.path).unwrap();
        let faults = s.memory.as_ref().map_or(0, |m| m.page_faults);
        if (s.cpu_usage_ns.unwrap_or(0) > 10_000_000 && faults > 0) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        stats.cpu_usage_ns.unwrap() > 10_000_000,
        "cpu usage {:?}",
        stats.cpu_usage_ns
    );
    let mem = stats.memory.unwrap();
    assert!(mem.usage > 0);
    assert!(mem.working_set <= mem.usage);
    assert_eq!(mem.limit, Some(128 << 20));
    assert_eq!(mem.available(), Some((128 << 20) - mem.working_set));
    assert!(mem.page_faults > 0);
    assert_eq!(mem.oom_kills.unwrap_or(0), 0);
    assert!(stats.pids.unwrap() >= 1);
}

#[test]
fn pod_resources_and_overhead_land_in_the_pod_cgroup() {
    let Some((h, v1)) = v1() else { return };
    let pod = TestCgroup::new(v1);
    let config = PodSandboxConfig {
        linux: Some(LinuxPodSandboxConfig {
            resources: Some(LinuxContainerResources {
                cpu_shares: 1024,
                cpu_quota: 200_000,
                cpu_period: 100_000,
                memory_limit_in_bytes: 256 * MIB,
                ..Default::default()
            }),
            overhead: Some(LinuxContainerResources {
                cpu_shares: 128,
                cpu_quota: 10_000,
                memory_limit_in_bytes: 32 * MIB,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    apply_pod_resources(&pod.path, &config).unwrap();
    let r = h.read(&pod.path).unwrap();
    assert_eq!(r.memory_limit_in_bytes, 288 * MIB);
    assert_eq!(r.cpu_shares, 1152);
    assert_eq!((r.cpu_quota, r.cpu_period), (210_000, 100_000));
    assert_eq!(
        file(v1, "memory", &pod.path, "memory.limit_in_bytes"),
        (288 * MIB).to_string()
    );
}
