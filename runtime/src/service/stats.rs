//! `ContainerStats`, `ListContainerStats`, `StreamContainerStats`, `PodSandboxStats`,
//! `ListPodSandboxStats`, `StreamPodSandboxStats`: cgroup usage (`crate::cgroups`), the
//! writable layer's disk use, and a pod's network counters from its pause process's view of
//! `/proc/net/dev`.
//!
//! `usage_nano_cores` is a rate (`crate::cpu_rates`): it is computed from the previous sample of the same cgroup
//! when that is at least a second old (kubelet polls every ~10 s, and its own rate
//! computation takes over while it is unset). All file reading runs on the blocking pool.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Arc;

use crius_api::v1::*;

use super::BoxStream;
use crate::cgroups::{CgroupError, CgroupStats, Hierarchy};
use crate::container::{ContainerPaths, ContainerRecord, ContainerState};
use crate::cpu_rates::CpuRates;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::pod::{SandboxRecord, SandboxState};
use crate::util::now_nanos;

pub async fn container(
    d: &Arc<Daemon>,
    req: ContainerStatsRequest,
) -> Result<ContainerStatsResponse> {
    let c = d.container(&req.container_id)?;
    let stats = blocking(d, move |d| {
        let pod = d.sandboxes.get(&c.sandbox_id);
        container_stats(d, &c, pod.as_ref())
    })
    .await?;
    Ok(ContainerStatsResponse { stats: Some(stats) })
}

pub async fn list_containers(
    d: &Arc<Daemon>,
    req: ListContainerStatsRequest,
) -> Result<ListContainerStatsResponse> {
    let filter = req.filter.unwrap_or_default();
    let stats = blocking(d, move |d| list_container_stats(d, &filter)).await?;
    Ok(ListContainerStatsResponse { stats })
}

pub async fn stream_containers(
    d: &Arc<Daemon>,
    req: StreamContainerStatsRequest,
) -> Result<BoxStream<StreamContainerStatsResponse>> {
    let filter = req.filter.unwrap_or_default();
    let container_stats = blocking(d, move |d| list_container_stats(d, &filter)).await?;
    Ok(super::in_chunks(container_stats, |container_stats| {
        StreamContainerStatsResponse { container_stats }
    }))
}

pub async fn pod(d: &Arc<Daemon>, req: PodSandboxStatsRequest) -> Result<PodSandboxStatsResponse> {
    let pod = d.pod(&req.pod_sandbox_id)?;
    let stats = blocking(d, move |d| pod_stats(d, &pod)).await?;
    Ok(PodSandboxStatsResponse { stats: Some(stats) })
}

pub async fn list_pods(
    d: &Arc<Daemon>,
    req: ListPodSandboxStatsRequest,
) -> Result<ListPodSandboxStatsResponse> {
    let filter = req.filter.unwrap_or_default();
    let stats = blocking(d, move |d| list_pod_stats(d, &filter)).await?;
    Ok(ListPodSandboxStatsResponse { stats })
}

pub async fn stream_pods(
    d: &Arc<Daemon>,
    req: StreamPodSandboxStatsRequest,
) -> Result<BoxStream<StreamPodSandboxStatsResponse>> {
    let filter = req.filter.unwrap_or_default();
    let pod_sandbox_stats = blocking(d, move |d| list_pod_stats(d, &filter)).await?;
    Ok(super::in_chunks(pod_sandbox_stats, |pod_sandbox_stats| {
        StreamPodSandboxStatsResponse { pod_sandbox_stats }
    }))
}

async fn blocking<T: Send + 'static>(
    d: &Arc<Daemon>,
    f: impl FnOnce(&Daemon) -> T + Send + 'static,
) -> Result<T> {
    let d = Arc::clone(d);
    tokio::task::spawn_blocking(move || f(&d))
        .await
        .map_err(|e| Error::internal("read stats", e))
}

fn list_container_stats(d: &Daemon, f: &ContainerStatsFilter) -> Vec<ContainerStats> {
    d.cpu_rates.prune(now_nanos());
    let pod_filter = if f.pod_sandbox_id.is_empty() {
        None
    } else {
        Some(
            d.resolve_pod_id(&f.pod_sandbox_id)
                .ok()
                .flatten()
                .unwrap_or_else(|| f.pod_sandbox_id.clone()),
        )
    };
    let pods: HashMap<String, SandboxRecord> = d
        .sandboxes
        .all()
        .into_iter()
        .map(|p| (p.id.clone(), p))
        .collect();
    d.containers
        .all()
        .into_iter()
        .filter(|c| f.id.is_empty() || c.id.starts_with(&f.id))
        .filter(|c| {
            pod_filter
                .as_ref()
                .is_none_or(|p| c.sandbox_id.starts_with(p))
        })
        .filter(|c| super::labels_match(&f.label_selector, &c.config().labels))
        .map(|c| container_stats(d, &c, pods.get(&c.sandbox_id)))
        .collect()
}

fn list_pod_stats(d: &Daemon, f: &PodSandboxStatsFilter) -> Vec<PodSandboxStats> {
    d.cpu_rates.prune(now_nanos());
    d.sandboxes
        .all()
        .into_iter()
        .filter(|p| p.state != SandboxState::Creating)
        .filter(|p| f.id.is_empty() || p.id.starts_with(&f.id))
        .filter(|p| super::labels_match(&f.label_selector, &p.config().labels))
        .map(|p| pod_stats(d, &p))
        .collect()
}

/// The cgroup stats at `path`, or `None` when there is no such cgroup (a container not
/// created yet or gone) or no cgroup fs.
fn cgroup_stats(path: Result<String>) -> Option<CgroupStats> {
    let path = path.ok()?;
    let h = Hierarchy::host().ok()?;
    match h.stats(&path) {
        Ok(s) => Some(s),
        Err(CgroupError::NotFound(_)) => None,
        Err(e) => {
            tracing::debug!("stats of cgroup {path}: {e}");
            None
        }
    }
}

fn container_stats(d: &Daemon, c: &ContainerRecord, pod: Option<&SandboxRecord>) -> ContainerStats {
    let config = c.config();
    let now = now_nanos();
    let live = matches!(c.state, ContainerState::Created | ContainerState::Running);
    let cg = pod
        .filter(|_| live)
        .and_then(|p| cgroup_stats(d.container_cgroup_path(p, &c.id)));
    let (mut cpu, mut memory, swap) = match &cg {
        Some(s) => usage(&d.cpu_rates, &format!("container:{}", c.id), s, now),
        None => (None, None, None),
    };
    let io = match (pod.filter(|_| live), &cg) {
        (Some(p), Some(_)) => {
            let path = d.container_cgroup_path(p, &c.id).ok();
            pressure(path.as_deref(), &mut cpu, &mut memory, now)
        }
        _ => None,
    };
    let layer = ContainerPaths::new(&d.config.root, &d.config.state, &c.id)
        .layer
        .join("upper");
    let writable_layer = disk_usage(&layer).map(|(bytes, inodes)| FilesystemUsage {
        timestamp: now,
        fs_id: Some(FilesystemIdentifier {
            mountpoint: d.config.root.display().to_string(),
        }),
        used_bytes: Some(UInt64Value { value: bytes }),
        inodes_used: Some(UInt64Value { value: inodes }),
    });
    ContainerStats {
        attributes: Some(ContainerAttributes {
            id: c.id.clone(),
            metadata: config.metadata,
            labels: config.labels,
            annotations: config.annotations,
        }),
        cpu,
        memory,
        writable_layer,
        swap,
        io,
    }
}

fn pod_stats(d: &Daemon, pod: &SandboxRecord) -> PodSandboxStats {
    let config = pod.config();
    let now = now_nanos();
    let cg = cgroup_stats(d.pod_cgroup_path(pod));
    let (mut cpu, mut memory, _) = match &cg {
        Some(s) => usage(&d.cpu_rates, &format!("pod:{}", pod.id), s, now),
        None => (None, None, None),
    };
    let io = match &cg {
        Some(_) => {
            let path = d.pod_cgroup_path(pod).ok();
            pressure(path.as_deref(), &mut cpu, &mut memory, now)
        }
        None => None,
    };
    let process = cg.as_ref().and_then(|s| s.pids).map(|n| ProcessUsage {
        timestamp: now,
        process_count: Some(UInt64Value { value: n }),
    });
    let network = match (pod.state, &pod.netns, pod.pause_pid) {
        (SandboxState::Ready, Some(_), Some(pid)) => {
            std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
                .ok()
                .map(|text| network_usage(&text, now))
        }
        _ => None,
    };
    let containers = d
        .containers_of(&pod.id)
        .iter()
        .filter(|c| c.state != ContainerState::Exited)
        .map(|c| container_stats(d, c, Some(pod)))
        .collect();
    PodSandboxStats {
        attributes: Some(PodSandboxAttributes {
            id: pod.id.clone(),
            metadata: config.metadata,
            labels: config.labels,
            annotations: config.annotations,
        }),
        linux: Some(LinuxPodSandboxStats {
            cpu,
            memory,
            network,
            process,
            containers,
            io,
        }),
        windows: None,
    }
}

/// Pressure stall information of cgroup `path` (cgroup v2 with PSI: `cpu.pressure`,
/// `memory.pressure`, `io.pressure`) into `cpu` and `memory`; the io one is returned as the
/// `IoUsage`. Nothing on cgroup v1 or a kernel without PSI.
fn pressure(
    path: Option<&str>,
    cpu: &mut Option<CpuUsage>,
    memory: &mut Option<MemoryUsage>,
    now: i64,
) -> Option<IoUsage> {
    let path = path?;
    let h = Hierarchy::host().ok()?;
    if !matches!(h, Hierarchy::V2(_)) {
        return None;
    }
    let read = |file: &str| h.file("", path, file).and_then(|t| psi(&t));
    if let Some(cpu) = cpu.as_mut() {
        cpu.psi = read("cpu.pressure");
    }
    if let Some(memory) = memory.as_mut() {
        memory.psi = read("memory.pressure");
    }
    read("io.pressure").map(|psi| IoUsage {
        timestamp: now,
        psi: Some(psi),
    })
}

/// A PSI file: `some` and `full` lines of `avg10=… avg60=… avg300=… total=<µs>`; the total
/// becomes nanoseconds.
fn psi(text: &str) -> Option<PsiStats> {
    let line = |kind: &str| -> Option<PsiData> {
        let rest = text.lines().find_map(|l| l.strip_prefix(kind))?;
        let mut data = PsiData::default();
        for field in rest.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "avg10" => data.avg10 = value.parse().ok()?,
                "avg60" => data.avg60 = value.parse().ok()?,
                "avg300" => data.avg300 = value.parse().ok()?,
                "total" => data.total = value.parse::<u64>().ok()?.saturating_mul(1000),
                _ => {}
            }
        }
        Some(data)
    };
    let some = line("some ")?;
    Some(PsiStats {
        full: line("full "),
        some: Some(some),
    })
}

fn u64_value(v: u64) -> Option<UInt64Value> {
    Some(UInt64Value { value: v })
}

/// CRI's CPU, memory and swap messages from cgroup stats; `key` names the cgroup in the rate
/// cache.
fn usage(
    rates: &CpuRates,
    key: &str,
    s: &CgroupStats,
    now: i64,
) -> (Option<CpuUsage>, Option<MemoryUsage>, Option<SwapUsage>) {
    let cpu = s.cpu_usage_ns.map(|ns| CpuUsage {
        timestamp: now,
        usage_core_nano_seconds: u64_value(ns),
        usage_nano_cores: rates
            .nano_cores(key, now, ns)
            .map(|value| UInt64Value { value }),
        psi: None,
    });
    let memory = s.memory.as_ref().map(|m| MemoryUsage {
        timestamp: now,
        working_set_bytes: u64_value(m.working_set),
        available_bytes: m.available().map(|value| UInt64Value { value }),
        usage_bytes: u64_value(m.usage),
        rss_bytes: u64_value(m.rss),
        page_faults: u64_value(m.page_faults),
        major_page_faults: u64_value(m.major_page_faults),
        psi: None,
    });
    let swap = s
        .memory
        .as_ref()
        .and_then(|m| m.swap_usage.map(|u| (u, m.swap_limit)))
        .map(|(used, limit)| SwapUsage {
            timestamp: now,
            swap_available_bytes: limit.map(|l| UInt64Value {
                value: l.saturating_sub(used),
            }),
            swap_usage_bytes: u64_value(used),
        });
    (cpu, memory, swap)
}

/// Bytes (allocated blocks) and inodes used under `dir`, each hard-linked inode counted once;
/// `None` when `dir` does not exist. Entries that vanish during the walk are skipped.
pub(super) fn disk_usage(dir: &Path) -> Option<(u64, u64)> {
    let root = std::fs::symlink_metadata(dir).ok()?;
    let mut seen = HashSet::new();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut count = |m: &std::fs::Metadata| {
        if m.nlink() > 1 && !seen.insert((m.dev(), m.ino())) {
            return;
        }
        bytes = bytes.saturating_add(m.blocks().saturating_mul(512));
        inodes += 1;
    };
    count(&root);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            count(&m);
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Some((bytes, inodes))
}

/// Interface counters from the text of `/proc/<pid>/net/dev`; `eth0` is the default
/// interface, loopback is left out.
fn network_usage(text: &str, now: i64) -> NetworkUsage {
    let interfaces: Vec<NetworkInterfaceUsage> = text
        .lines()
        .filter_map(|l| {
            let (name, counters) = l.split_once(':')?;
            let name = name.trim();
            let f: Vec<u64> = counters
                .split_whitespace()
                .map(|v| v.parse().ok())
                .collect::<Option<_>>()?;
            if name == "lo" || f.len() < 16 {
                return None;
            }
            Some(NetworkInterfaceUsage {
                name: name.to_string(),
                rx_bytes: u64_value(f[0]),
                rx_errors: u64_value(f[2]),
                tx_bytes: u64_value(f[8]),
                tx_errors: u64_value(f[10]),
            })
        })
        .collect();
    NetworkUsage {
        timestamp: now,
        default_interface: interfaces.iter().find(|i| i.name == "eth0").cloned(),
        interfaces,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       0          0
  eth0:    5000      40    1    0    0     0          0         0     3000      30    2    0    0     0       0          0
";

    #[test]
    fn psi_files_parse() {
        let p = psi("some avg10=1.50 avg60=0.25 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n").unwrap();
        let some = p.some.unwrap();
        assert_eq!((some.avg10, some.avg60, some.total), (1.5, 0.25, 1_234_000));
        assert_eq!(p.full.unwrap().total, 5000);
        // cpu.pressure of older kernels has no full line
        assert!(psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
            .unwrap()
            .full
            .is_none());
        assert!(psi("garbage").is_none());
    }

    #[test]
    fn net_dev_gives_eth0_and_no_loopback() {
        let n = network_usage(NET_DEV, 7);
        assert_eq!(n.timestamp, 7);
        assert_eq!(n.interfaces.len(), 1);
        let eth0 = n.default_interface.unwrap();
        assert_eq!(eth0.name, "eth0");
        assert_eq!(eth0.rx_bytes.unwrap().value, 5000);
        assert_eq!(eth0.rx_errors.unwrap().value, 1);
        assert_eq!(eth0.tx_bytes.unwrap().value, 3000);
        assert_eq!(eth0.tx_errors.unwrap().value, 2);
    }

    #[test]
    fn disk_usage_counts_hard_links_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), vec![1u8; 8192]).unwrap();
        std::fs::hard_link(dir.path().join("d/f"), dir.path().join("g")).unwrap();
        let (bytes, inodes) = disk_usage(dir.path()).unwrap();
        assert_eq!(inodes, 3);
        assert!(bytes >= 8192, "{bytes}");
        assert!(disk_usage(&dir.path().join("none")).is_none());
    }

    #[test]
    fn usage_maps_memory_and_swap() {
        let s = CgroupStats {
            cpu_usage_ns: Some(5),
            memory: Some(crate::cgroups::MemoryStats {
                usage: 100,
                working_set: 80,
                rss: 50,
                limit: Some(200),
                swap_usage: Some(10),
                swap_limit: Some(30),
                ..Default::default()
            }),
            pids: Some(2),
        };
        let (cpu, mem, swap) = usage(&CpuRates::default(), "test:usage", &s, 1);
        assert_eq!(cpu.unwrap().usage_core_nano_seconds.unwrap().value, 5);
        let mem = mem.unwrap();
        assert_eq!(mem.working_set_bytes.unwrap().value, 80);
        assert_eq!(mem.available_bytes.unwrap().value, 120);
        let swap = swap.unwrap();
        assert_eq!(swap.swap_usage_bytes.unwrap().value, 10);
        assert_eq!(swap.swap_available_bytes.unwrap().value, 20);
    }
}
