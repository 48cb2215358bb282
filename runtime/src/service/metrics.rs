//! `ListMetricDescriptors`, `ListPodSandboxMetrics`, `StreamPodSandboxMetrics`: the cAdvisor
//! metrics kubelet serves on `/metrics/cadvisor` when its stats come from the runtime.
//!
//! Every metric of a container carries the labels `container`, `id`, `image`, `name`,
//! `namespace`, `pod` (those of the pod itself have an empty `container`), then its own
//! (`interface`, `device`, `failure_type` and `scope`, …), in the order its descriptor lists.
//! Values are read when asked for, from the cgroup files (v1 or v2), `/proc` and the writable
//! layer. The CRI carries whole numbers: times are in whole seconds, truncated.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::{
    ContainerMetrics, ListMetricDescriptorsRequest, ListMetricDescriptorsResponse,
    ListPodSandboxMetricsRequest, ListPodSandboxMetricsResponse, Metric, MetricDescriptor,
    MetricType, PodSandboxMetrics, StreamPodSandboxMetricsRequest, StreamPodSandboxMetricsResponse,
    UInt64Value,
};

use super::BoxStream;
use crate::cgroups::{flat_keyed, Hierarchy};
use crate::container::{ContainerPaths, ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::error::Result;
use crate::pod::{SandboxRecord, SandboxState};
use crate::util::now_nanos;

const BASE: &[&str] = &["container", "id", "image", "name", "namespace", "pod"];

/// (name, help, extra label keys, counter?)
type Spec = (&'static str, &'static str, &'static [&'static str], bool);

const SPECS: &[Spec] = &[
    (
        "container_blkio_device_usage_total",
        "Blkio device bytes usage",
        &["device", "major", "minor", "operation"],
        true,
    ),
    (
        "container_cpu_cfs_periods_total",
        "Number of elapsed enforcement period intervals.",
        &[],
        true,
    ),
    (
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals.",
        &[],
        true,
    ),
    (
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled.",
        &[],
        true,
    ),
    (
        "container_cpu_system_seconds_total",
        "Cumulative system cpu time consumed in seconds.",
        &[],
        true,
    ),
    (
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        &["cpu"],
        true,
    ),
    (
        "container_cpu_user_seconds_total",
        "Cumulative user cpu time consumed in seconds.",
        &[],
        true,
    ),
    (
        "container_file_descriptors",
        "Number of open file descriptors for the container.",
        &[],
        false,
    ),
    (
        "container_fs_inodes_free",
        "Number of available Inodes",
        &["device"],
        false,
    ),
    (
        "container_fs_inodes_total",
        "Number of Inodes",
        &["device"],
        false,
    ),
    (
        "container_fs_limit_bytes",
        "Number of bytes that can be consumed by the container on this filesystem.",
        &["device"],
        false,
    ),
    (
        "container_fs_reads_bytes_total",
        "Cumulative count of bytes read",
        &["device"],
        true,
    ),
    (
        "container_fs_reads_total",
        "Cumulative count of reads completed",
        &["device"],
        true,
    ),
    (
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        &["device"],
        false,
    ),
    (
        "container_fs_writes_bytes_total",
        "Cumulative count of bytes written",
        &["device"],
        true,
    ),
    (
        "container_fs_writes_total",
        "Cumulative count of writes completed",
        &["device"],
        true,
    ),
    (
        "container_last_seen",
        "Last time a container was seen by the exporter",
        &[],
        false,
    ),
    (
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        &[],
        false,
    ),
    (
        "container_memory_failcnt",
        "Number of memory usage hits limits",
        &[],
        true,
    ),
    (
        "container_memory_failures_total",
        "Cumulative count of memory allocation failures.",
        &["failure_type", "scope"],
        true,
    ),
    (
        "container_memory_kernel_usage",
        "Size of kernel memory allocated in bytes.",
        &[],
        false,
    ),
    (
        "container_memory_mapped_file",
        "Size of memory mapped files in bytes.",
        &[],
        false,
    ),
    (
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded in bytes",
        &[],
        false,
    ),
    ("container_memory_rss", "Size of RSS in bytes.", &[], false),
    (
        "container_memory_swap",
        "Container swap usage in bytes.",
        &[],
        false,
    ),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        &[],
        false,
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        &[],
        false,
    ),
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
        &["interface"],
        true,
    ),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
        &["interface"],
        true,
    ),
    (
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
        &["interface"],
        true,
    ),
    (
        "container_network_receive_packets_total",
        "Cumulative count of packets received",
        &["interface"],
        true,
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
        &["interface"],
        true,
    ),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
        &["interface"],
        true,
    ),
    (
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        &["interface"],
        true,
    ),
    (
        "container_network_transmit_packets_total",
        "Cumulative count of packets transmitted",
        &["interface"],
        true,
    ),
    (
        "container_oom_events_total",
        "Count of out of memory events observed for the container",
        &[],
        true,
    ),
    (
        "container_processes",
        "Number of processes running inside the container.",
        &[],
        false,
    ),
    (
        "container_sockets",
        "Number of open sockets for the container.",
        &[],
        false,
    ),
    (
        "container_spec_cpu_period",
        "CPU period of the container.",
        &[],
        false,
    ),
    (
        "container_spec_cpu_shares",
        "CPU share of the container.",
        &[],
        false,
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        &[],
        false,
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        "Memory swap limit for the container.",
        &[],
        false,
    ),
    (
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        &[],
        false,
    ),
    (
        "container_threads",
        "Number of threads running inside the container",
        &[],
        false,
    ),
    (
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        &[],
        false,
    ),
];

fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.0 == name)
}

pub async fn descriptors(
    _d: &Arc<Daemon>,
    _req: ListMetricDescriptorsRequest,
) -> Result<ListMetricDescriptorsResponse> {
    Ok(ListMetricDescriptorsResponse {
        descriptors: SPECS
            .iter()
            .map(|(name, help, extra, _)| MetricDescriptor {
                name: name.to_string(),
                help: help.to_string(),
                label_keys: BASE
                    .iter()
                    .chain(extra.iter())
                    .map(|k| k.to_string())
                    .collect(),
            })
            .collect(),
    })
}

pub async fn list(
    d: &Arc<Daemon>,
    _req: ListPodSandboxMetricsRequest,
) -> Result<ListPodSandboxMetricsResponse> {
    let d = Arc::clone(d);
    let pod_metrics = tokio::task::spawn_blocking(move || all_pods(&d))
        .await
        .unwrap_or_default();
    Ok(ListPodSandboxMetricsResponse { pod_metrics })
}

pub async fn stream(
    d: &Arc<Daemon>,
    req: StreamPodSandboxMetricsRequest,
) -> Result<BoxStream<StreamPodSandboxMetricsResponse>> {
    let _ = req;
    let list = list(d, ListPodSandboxMetricsRequest {}).await?;
    Ok(super::in_chunks(list.pod_metrics, |pod_sandbox_metrics| {
        StreamPodSandboxMetricsResponse {
            pod_sandbox_metrics,
        }
    }))
}

fn all_pods(d: &Daemon) -> Vec<PodSandboxMetrics> {
    d.sandboxes
        .all()
        .iter()
        .filter(|p| p.state == SandboxState::Ready)
        .map(|p| pod_metrics(d, p))
        .collect()
}

/// Metrics with the labels of one object, gathered as values are found.
struct Out {
    labels: Vec<String>,
    metrics: Vec<Metric>,
}

impl Out {
    fn put(&mut self, name: &str, extra: &[&str], value: u64) {
        let Some((_, _, keys, counter)) = spec(name) else {
            return;
        };
        debug_assert_eq!(keys.len(), extra.len(), "{name}");
        self.metrics.push(Metric {
            name: name.to_string(),
            timestamp: 0,
            metric_type: if *counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            } as i32,
            label_values: self
                .labels
                .iter()
                .cloned()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect(),
            value: Some(UInt64Value { value }),
        });
    }
}

fn pod_metrics(d: &Daemon, pod: &SandboxRecord) -> PodSandboxMetrics {
    let config = pod.config();
    let meta = config.metadata.unwrap_or_default();
    let mut out = Out {
        labels: vec![
            String::new(),
            pod.id.clone(),
            String::new(),
            pod.name.clone(),
            meta.namespace.clone(),
            meta.name.clone(),
        ],
        metrics: Vec::new(),
    };
    if let Some(pid) = pod.pause_pid.filter(|_| pod.netns.is_some()) {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/dev")) {
            network(&mut out, &text);
        }
    }
    let container_metrics = d
        .containers_of(&pod.id)
        .iter()
        .filter(|c| c.state == ContainerState::Running)
        .map(|c| ContainerMetrics {
            container_id: c.id.clone(),
            metrics: container_metrics(d, pod, c, &meta.name, &meta.namespace),
        })
        .collect();
    PodSandboxMetrics {
        pod_sandbox_id: pod.id.clone(),
        metrics: out.metrics,
        container_metrics,
    }
}

/// Interface counters of the pod's network namespace (`/proc/<pid>/net/dev`), loopback left
/// out.
fn network(out: &mut Out, net_dev: &str) {
    for line in net_dev.lines() {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        let f: Vec<u64> = counters
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if name == "lo" || f.len() < 16 {
            continue;
        }
        for (metric, i) in [
            ("container_network_receive_bytes_total", 0),
            ("container_network_receive_packets_total", 1),
            ("container_network_receive_errors_total", 2),
            ("container_network_receive_packets_dropped_total", 3),
            ("container_network_transmit_bytes_total", 8),
            ("container_network_transmit_packets_total", 9),
            ("container_network_transmit_errors_total", 10),
            ("container_network_transmit_packets_dropped_total", 11),
        ] {
            out.put(metric, &[name], f[i]);
        }
    }
}

fn container_metrics(
    d: &Daemon,
    pod: &SandboxRecord,
    c: &ContainerRecord,
    pod_name: &str,
    namespace: &str,
) -> Vec<Metric> {
    let config = c.config();
    let name = config.metadata.map(|m| m.name).unwrap_or_default();
    let user_specified = config.image.map(|i| i.user_specified_image);
    let image = d.shown_image(c, user_specified.as_deref().unwrap_or_default());
    let mut out = Out {
        labels: vec![
            name,
            c.id.clone(),
            image.name,
            c.name.clone(),
            namespace.to_string(),
            pod_name.to_string(),
        ],
        metrics: Vec::new(),
    };
    let now = now_nanos();
    out.put("container_last_seen", &[], (now / 1_000_000_000) as u64);
    if c.started_at > 0 {
        out.put(
            "container_start_time_seconds",
            &[],
            (c.started_at / 1_000_000_000) as u64,
        );
    }
    if let (Ok(path), Ok(h)) = (d.container_cgroup_path(pod, &c.id), Hierarchy::host()) {
        cgroup(&mut out, h, &path);
        processes(&mut out, h, &path);
    }
    filesystem(&mut out, d, &c.id);
    out.metrics
}

fn seconds(ns: u64) -> u64 {
    ns / 1_000_000_000
}

fn cgroup(out: &mut Out, h: &Hierarchy, path: &str) {
    let v2 = matches!(h, Hierarchy::V2(_));
    let keyed = |controller: &str, file: &str| -> HashMap<String, u64> {
        h.file(controller, path, file)
            .map(|t| {
                flat_keyed(&t)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect()
            })
            .unwrap_or_default()
    };
    let single = |controller: &str, file: &str| -> Option<u64> {
        h.file(controller, path, file)?.trim().parse().ok()
    };
    if let Ok(stats) = h.stats(path) {
        if let Some(ns) = stats.cpu_usage_ns {
            out.put("container_cpu_usage_seconds_total", &["total"], seconds(ns));
        }
        if let Some(m) = &stats.memory {
            out.put("container_memory_usage_bytes", &[], m.usage);
            out.put("container_memory_working_set_bytes", &[], m.working_set);
            out.put("container_memory_rss", &[], m.rss);
            out.put(
                "container_memory_failures_total",
                &["pgfault", "container"],
                m.page_faults,
            );
            out.put(
                "container_memory_failures_total",
                &["pgmajfault", "container"],
                m.major_page_faults,
            );
            out.put("container_memory_swap", &[], m.swap_usage.unwrap_or(0));
            out.put(
                "container_spec_memory_limit_bytes",
                &[],
                m.limit.unwrap_or(0),
            );
            out.put(
                "container_spec_memory_swap_limit_bytes",
                &[],
                m.swap_limit.unwrap_or(0),
            );
            out.put("container_oom_events_total", &[], m.oom_events.unwrap_or(0));
        }
        if let Some(n) = stats.pids {
            out.put("container_threads", &[], n);
        }
    }
    let cpu = keyed("cpu", "cpu.stat");
    if let (Some(p), Some(t)) = (cpu.get("nr_periods"), cpu.get("nr_throttled")) {
        out.put("container_cpu_cfs_periods_total", &[], *p);
        out.put("container_cpu_cfs_throttled_periods_total", &[], *t);
    }
    let memory_stat = keyed("memory", "memory.stat");
    if v2 {
        if let Some(us) = cpu.get("throttled_usec") {
            out.put(
                "container_cpu_cfs_throttled_seconds_total",
                &[],
                us / 1_000_000,
            );
        }
        for (metric, key) in [
            ("container_cpu_user_seconds_total", "user_usec"),
            ("container_cpu_system_seconds_total", "system_usec"),
        ] {
            if let Some(us) = cpu.get(key) {
                out.put(metric, &[], us / 1_000_000);
            }
        }
        let events = keyed("memory", "memory.events");
        out.put(
            "container_memory_failcnt",
            &[],
            events.get("max").copied().unwrap_or(0),
        );
        for (metric, key) in [
            ("container_memory_cache", "file"),
            ("container_memory_mapped_file", "file_mapped"),
            ("container_memory_kernel_usage", "kernel"),
        ] {
            out.put(metric, &[], memory_stat.get(key).copied().unwrap_or(0));
        }
        if let Some(peak) = single("memory", "memory.peak") {
            out.put("container_memory_max_usage_bytes", &[], peak);
        }
        if let Some(max) = h.file("cpu", path, "cpu.max") {
            let period = max.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            out.put("container_spec_cpu_period", &[], period.unwrap_or(100_000));
        }
        if let Some(weight) = single("cpu", "cpu.weight") {
            // the inverse of the v1 → v2 mapping: weight 1..10000 onto shares 2..262144
            out.put(
                "container_spec_cpu_shares",
                &[],
                2 + (weight.saturating_sub(1)) * 262_142 / 9_999,
            );
        }
        let max = h
            .file("pids", path, "pids.max")
            .and_then(|t| t.trim().parse().ok());
        out.put("container_threads_max", &[], max.unwrap_or(0));
    } else {
        if let Some(ns) = cpu.get("throttled_time") {
            out.put(
                "container_cpu_cfs_throttled_seconds_total",
                &[],
                seconds(*ns),
            );
        }
        // cpuacct.stat counts USER_HZ ticks (100 a second on Linux).
        let ticks = keyed("cpuacct", "cpuacct.stat");
        for (metric, key) in [
            ("container_cpu_user_seconds_total", "user"),
            ("container_cpu_system_seconds_total", "system"),
        ] {
            if let Some(t) = ticks.get(key) {
                out.put(metric, &[], t / 100);
            }
        }
        out.put(
            "container_memory_failcnt",
            &[],
            single("memory", "memory.failcnt").unwrap_or(0),
        );
        for (metric, key) in [
            ("container_memory_cache", "total_cache"),
            ("container_memory_mapped_file", "total_mapped_file"),
        ] {
            out.put(metric, &[], memory_stat.get(key).copied().unwrap_or(0));
        }
        out.put(
            "container_memory_kernel_usage",
            &[],
            single("memory", "memory.kmem.usage_in_bytes").unwrap_or(0),
        );
        if let Some(max) = single("memory", "memory.max_usage_in_bytes") {
            out.put("container_memory_max_usage_bytes", &[], max);
        }
        if let Some(period) = single("cpu", "cpu.cfs_period_us") {
            out.put("container_spec_cpu_period", &[], period);
        }
        if let Some(shares) = single("cpu", "cpu.shares") {
            out.put("container_spec_cpu_shares", &[], shares);
        }
        let max = h
            .file("pids", path, "pids.max")
            .and_then(|t| t.trim().parse().ok());
        out.put("container_threads_max", &[], max.unwrap_or(0));
    }
    let io = if v2 {
        h.file("io", path, "io.stat").map(|t| block_io_v2(&t))
    } else {
        let bytes = h.file("blkio", path, "blkio.throttle.io_service_bytes_recursive");
        let ops = h.file("blkio", path, "blkio.throttle.io_serviced_recursive");
        bytes.map(|b| block_io_v1(&b, ops.as_deref().unwrap_or("")))
    };
    for dev in io.unwrap_or_default() {
        block_io(out, &dev);
    }
}

/// One block device's I/O by a cgroup.
#[derive(Debug, Default, PartialEq, Eq)]
struct DeviceIo {
    major: u32,
    minor: u32,
    read_bytes: u64,
    write_bytes: u64,
    reads: u64,
    writes: u64,
}

/// `io.stat` (v2): `MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N` per device.
fn block_io_v2(text: &str) -> Vec<DeviceIo> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (major, minor) = device_numbers(words.next()?)?;
            let mut dev = DeviceIo {
                major,
                minor,
                ..DeviceIo::default()
            };
            for (k, v) in words.filter_map(|w| w.split_once('=')) {
                let v = v.parse().unwrap_or(0);
                match k {
                    "rbytes" => dev.read_bytes = v,
                    "wbytes" => dev.write_bytes = v,
                    "rios" => dev.reads = v,
                    "wios" => dev.writes = v,
                    _ => {}
                }
            }
            Some(dev)
        })
        .collect()
}

/// `blkio.throttle.io_service_bytes_recursive` and `io_serviced_recursive` (v1):
/// `MAJ:MIN Read N` / `Write` / ... per device, then `Total N`.
fn block_io_v1(bytes: &str, ops: &str) -> Vec<DeviceIo> {
    let mut devices: Vec<DeviceIo> = Vec::new();
    let mut add = |text: &str, counts_bytes: bool| {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(dev), Some(op), Some(n)) = (words.next(), words.next(), words.next()) else {
                continue;
            };
            let (Some((major, minor)), Ok(n)) = (device_numbers(dev), n.parse::<u64>()) else {
                continue;
            };
            let i = match devices
                .iter()
                .position(|d| (d.major, d.minor) == (major, minor))
            {
                Some(i) => i,
                None => {
                    devices.push(DeviceIo {
                        major,
                        minor,
                        ..DeviceIo::default()
                    });
                    devices.len() - 1
                }
            };
            let d = &mut devices[i];
            match (op, counts_bytes) {
                ("Read", true) => d.read_bytes = n,
                ("Write", true) => d.write_bytes = n,
                ("Read", false) => d.reads = n,
                ("Write", false) => d.writes = n,
                _ => {}
            }
        }
    };
    add(bytes, true);
    add(ops, false);
    devices
}

fn device_numbers(word: &str) -> Option<(u32, u32)> {
    let (major, minor) = word.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The device's node as cAdvisor names it (`/dev/sda`), from sysfs; empty when unknown.
fn device_name(major: u32, minor: u32) -> String {
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("DEVNAME="))
                .map(|n| format!("/dev/{n}"))
        })
        .unwrap_or_default()
}

fn block_io(out: &mut Out, dev: &DeviceIo) {
    let name = device_name(dev.major, dev.minor);
    let (major, minor) = (dev.major.to_string(), dev.minor.to_string());
    for (op, n) in [("Read", dev.read_bytes), ("Write", dev.write_bytes)] {
        out.put(
            "container_blkio_device_usage_total",
            &[&name, &major, &minor, op],
            n,
        );
    }
    out.put("container_fs_reads_bytes_total", &[&name], dev.read_bytes);
    out.put("container_fs_writes_bytes_total", &[&name], dev.write_bytes);
    out.put("container_fs_reads_total", &[&name], dev.reads);
    out.put("container_fs_writes_total", &[&name], dev.writes);
}

/// Processes, file descriptors and sockets of the container's cgroup.
fn processes(out: &mut Out, h: &Hierarchy, path: &str) {
    let controller = if matches!(h, Hierarchy::V2(_)) {
        ""
    } else {
        "pids"
    };
    let procs = h
        .file(controller, path, "cgroup.procs")
        .or_else(|| h.file("memory", path, "cgroup.procs"))
        .unwrap_or_default();
    let pids: Vec<&str> = procs.lines().filter(|l| !l.trim().is_empty()).collect();
    let (mut fds, mut sockets) = (0u64, 0u64);
    for pid in &pids {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in entries.flatten() {
            fds += 1;
            if std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            {
                sockets += 1;
            }
        }
    }
    out.put("container_processes", &[], pids.len() as u64);
    out.put("container_file_descriptors", &[], fds);
    out.put("container_sockets", &[], sockets);
}

/// The writable layer's use and the filesystem under crius's root.
fn filesystem(out: &mut Out, d: &Daemon, id: &str) {
    let upper = ContainerPaths::new(&d.config.root, &d.config.state, id)
        .layer
        .join("upper");
    let device = d.config.root.display().to_string();
    if let Some((bytes, _inodes)) = super::stats::disk_usage(&upper) {
        out.put("container_fs_usage_bytes", &[&device], bytes);
    }
    if let Some(fs) = statvfs(&d.config.root) {
        let frsize = fs.f_frsize;
        out.put("container_fs_limit_bytes", &[&device], fs.f_blocks * frsize);
        out.put("container_fs_inodes_total", &[&device], fs.f_files);
        out.put("container_fs_inodes_free", &[&device], fs.f_ffree);
    }
}

fn statvfs(path: &std::path::Path) -> Option<libc::statvfs> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain data, filled by the kernel.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs reads the NUL-terminated path and writes into the struct we own.
    (unsafe { libc::statvfs(c.as_ptr(), &mut fs) } == 0).then_some(fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_io_of_both_cgroup_versions() {
        let v2 = block_io_v2("8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n");
        let dev = DeviceIo {
            major: 8,
            minor: 0,
            read_bytes: 4096,
            write_bytes: 8192,
            reads: 1,
            writes: 2,
        };
        assert_eq!(v2, [dev]);
        let v1 = block_io_v1(
            "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Total 12288\nTotal 12288\n",
            "8:0 Read 1\n8:0 Write 2\n8:0 Total 3\nTotal 3\n",
        );
        assert_eq!(v1, v2);
        assert!(block_io_v1("Total 0\n", "Total 0\n").is_empty());
    }

    #[test]
    fn descriptors_are_unique_and_labelled() {
        let mut names: Vec<_> = SPECS.iter().map(|s| s.0).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SPECS.len());
        assert!(SPECS.iter().all(|s| !s.1.is_empty()));
    }

    #[test]
    fn interface_counters_become_network_metrics() {
        let mut out = Out {
            labels: BASE.iter().map(|s| s.to_string()).collect(),
            metrics: Vec::new(),
        };
        network(
            &mut out,
            "Inter-|\n face |\n    lo: 1 2 3 4 0 0 0 0 5 6 7 8 0 0 0 0\n  eth0: 5000 40 1 2 0 0 0 0 3000 30 4 5 0 0 0 0\n",
        );
        let get = |n: &str| out.metrics.iter().find(|m| m.name == n).unwrap();
        assert_eq!(
            get("container_network_receive_bytes_total")
                .value
                .unwrap()
                .value,
            5000
        );
        assert_eq!(
            get("container_network_transmit_packets_dropped_total")
                .value
                .unwrap()
                .value,
            5
        );
        assert_eq!(
            get("container_network_receive_bytes_total")
                .label_values
                .last()
                .unwrap(),
            "eth0"
        );
        assert_eq!(out.metrics.len(), 8, "loopback left out");
    }
}
