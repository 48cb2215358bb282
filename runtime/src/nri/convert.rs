//! Pods and containers as NRI describes them, from crius's records and OCI specs; and NRI
//! resources as CRI resources, for updates plugins ask for.

use crius_api::nri::api;
use crius_api::v1::LinuxContainerResources;
use serde_json::Value;

use crate::container::ContainerRecord;
use crate::records::{ContainerState, SandboxRecord};

/// `pod` in NRI form.
pub fn pod(pod: &SandboxRecord) -> api::PodSandbox {
    let config = pod.config();
    let meta = config.metadata.clone().unwrap_or_default();
    let linux = config.linux.clone().unwrap_or_default();
    let mut namespaces = Vec::new();
    if let Some(netns) = &pod.netns {
        namespaces.push(api::LinuxNamespace {
            r#type: "network".into(),
            path: netns.display().to_string(),
        });
    }
    api::PodSandbox {
        id: pod.id.clone(),
        name: meta.name,
        uid: meta.uid,
        namespace: meta.namespace,
        labels: config.labels,
        annotations: config.annotations,
        runtime_handler: pod.runtime_handler.clone(),
        linux: Some(api::LinuxPodSandbox {
            pod_overhead: linux.overhead.as_ref().map(cri_resources),
            pod_resources: linux.resources.as_ref().map(cri_resources),
            cgroup_parent: linux.cgroup_parent.clone(),
            cgroups_path: crate::cgroups::container_cgroup(&pod.cgroup, &pod.id),
            namespaces,
            resources: None,
        }),
        pid: pod.pause_pid.unwrap_or(0),
        ips: pod.ips.clone(),
    }
}

/// `record` in NRI form, with what its OCI spec (`config.json` as JSON) says of its process,
/// mounts, hooks and Linux settings.
pub fn container(record: &ContainerRecord, spec: Option<&Value>) -> api::Container {
    let config = record.config();
    let meta = config.metadata.clone().unwrap_or_default();
    let state = match record.state {
        ContainerState::Creating | ContainerState::Created => api::ContainerState::ContainerCreated,
        ContainerState::Running => api::ContainerState::ContainerRunning,
        ContainerState::Exited => api::ContainerState::ContainerStopped,
    };
    let empty = Value::Null;
    let spec = spec.unwrap_or(&empty);
    let process = &spec["process"];
    let linux = &spec["linux"];
    api::Container {
        id: record.id.clone(),
        pod_sandbox_id: record.sandbox_id.clone(),
        name: meta.name,
        state: state as i32,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        args: strings(&process["args"]),
        env: strings(&process["env"]),
        mounts: spec["mounts"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .map(|m| api::Mount {
                        destination: text(&m["destination"]),
                        r#type: text(&m["type"]),
                        source: text(&m["source"]),
                        options: strings(&m["options"]),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        hooks: None,
        linux: Some(api::LinuxContainer {
            namespaces: linux["namespaces"]
                .as_array()
                .map(|ns| {
                    ns.iter()
                        .map(|n| api::LinuxNamespace {
                            r#type: text(&n["type"]),
                            path: text(&n["path"]),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            devices: Vec::new(),
            resources: Some(resources(&linux["resources"])),
            oom_score_adj: process["oomScoreAdj"]
                .as_i64()
                .map(|value| api::OptionalInt { value }),
            cgroups_path: text(&linux["cgroupsPath"]),
            ..Default::default()
        }),
        pid: record.pid.unwrap_or(0),
        rlimits: process["rlimits"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| api::PosixRlimit {
                        r#type: text(&r["type"]),
                        hard: r["hard"].as_u64().unwrap_or(0),
                        soft: r["soft"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        created_at: record.created_at,
        started_at: record.started_at,
        finished_at: record.finished_at,
        exit_code: record.exit_code,
        status_reason: record.reason.clone(),
        status_message: record.message.clone(),
        cdi_devices: Vec::new(),
        user: None,
    }
}

/// OCI `linux.resources` (JSON) in NRI form.
pub fn resources(r: &Value) -> api::LinuxResources {
    let mem = &r["memory"];
    let cpu = &r["cpu"];
    let i64_of = |v: &Value| v.as_i64().map(|value| api::OptionalInt64 { value });
    let u64_of = |v: &Value| v.as_u64().map(|value| api::OptionalUInt64 { value });
    api::LinuxResources {
        memory: mem.is_object().then(|| api::LinuxMemory {
            limit: i64_of(&mem["limit"]),
            reservation: i64_of(&mem["reservation"]),
            swap: i64_of(&mem["swap"]),
            swappiness: u64_of(&mem["swappiness"]),
            ..Default::default()
        }),
        cpu: cpu.is_object().then(|| api::LinuxCpu {
            shares: u64_of(&cpu["shares"]),
            quota: i64_of(&cpu["quota"]),
            period: u64_of(&cpu["period"]),
            realtime_runtime: i64_of(&cpu["realtimeRuntime"]),
            realtime_period: u64_of(&cpu["realtimePeriod"]),
            cpus: text(&cpu["cpus"]),
            mems: text(&cpu["mems"]),
        }),
        hugepage_limits: r["hugepageLimits"]
            .as_array()
            .map(|hs| {
                hs.iter()
                    .map(|h| api::HugepageLimit {
                        page_size: text(&h["pageSize"]),
                        limit: h["limit"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        unified: r["unified"]
            .as_object()
            .map(|u| u.iter().map(|(k, v)| (k.clone(), text(v))).collect())
            .unwrap_or_default(),
        pids: r["pids"]["limit"]
            .as_i64()
            .map(|limit| api::LinuxPids { limit }),
        ..Default::default()
    }
}

/// CRI resources in NRI form.
pub fn cri_resources(r: &LinuxContainerResources) -> api::LinuxResources {
    let some_i64 = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: some_i64(r.memory_limit_in_bytes),
            swap: some_i64(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: (r.cpu_shares != 0).then_some(api::OptionalUInt64 {
                value: r.cpu_shares as u64,
            }),
            quota: some_i64(r.cpu_quota),
            period: (r.cpu_period != 0).then_some(api::OptionalUInt64 {
                value: r.cpu_period as u64,
            }),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// What of NRI resources `r` CRI's `UpdateContainerResources` carries, over `current`.
pub fn to_cri(
    r: &api::LinuxResources,
    current: &LinuxContainerResources,
) -> LinuxContainerResources {
    let mut out = current.clone();
    if let Some(m) = &r.memory {
        if let Some(v) = &m.limit {
            out.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = &m.swap {
            out.memory_swap_limit_in_bytes = v.value;
        }
    }
    if let Some(c) = &r.cpu {
        if let Some(v) = &c.shares {
            out.cpu_shares = i64::try_from(v.value).unwrap_or(i64::MAX);
        }
        if let Some(v) = &c.quota {
            out.cpu_quota = v.value;
        }
        if let Some(v) = &c.period {
            out.cpu_period = i64::try_from(v.value).unwrap_or(i64::MAX);
        }
        if !c.cpus.is_empty() {
            out.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            out.cpuset_mems = c.mems.clone();
        }
    }
    for h in &r.hugepage_limits {
        out.hugepage_limits.retain(|l| l.page_size != h.page_size);
        out.hugepage_limits.push(crius_api::v1::HugepageLimit {
            page_size: h.page_size.clone(),
            limit: h.limit,
        });
    }
    out.unified.extend(r.unified.clone());
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
