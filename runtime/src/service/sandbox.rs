//! Pod sandbox RPCs: `RunPodSandbox`, `StopPodSandbox`, `RemovePodSandbox`,
//! `PodSandboxStatus`, `ListPodSandbox`, `StreamPodSandboxes`. Thin: the lifecycle is in
//! `crate::pod`.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::*;

use super::BoxStream;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::pod::{namespace_modes, SandboxRecord, SandboxState};
use crate::telemetry::{metrics, Timer};
use crate::util::now_nanos;

pub async fn run(d: &Arc<Daemon>, req: RunPodSandboxRequest) -> Result<RunPodSandboxResponse> {
    let config = req
        .config
        .ok_or_else(|| Error::InvalidArgument("config is required".into()))?;
    let timer = Timer::start();
    let handler = d.handler_label(&req.runtime_handler);
    let id = d.run_pod(config, req.runtime_handler).await?;
    timer.observe_runtime(&metrics().sandbox_runtime_create, &handler);
    Ok(RunPodSandboxResponse { pod_sandbox_id: id })
}

/// The handler label of a pod's timers (empty when the pod is not known).
fn pod_handler(d: &Daemon, id: &str) -> String {
    d.pod(id)
        .map(|p| d.handler_label(&p.runtime_handler))
        .unwrap_or_default()
}

pub async fn stop(d: &Arc<Daemon>, req: StopPodSandboxRequest) -> Result<StopPodSandboxResponse> {
    let timer = Timer::start();
    d.stop_pod(&req.pod_sandbox_id).await?;
    let handler = pod_handler(d, &req.pod_sandbox_id);
    timer.observe_runtime(&metrics().sandbox_runtime_stop, &handler);
    Ok(StopPodSandboxResponse {})
}

pub async fn remove(
    d: &Arc<Daemon>,
    req: RemovePodSandboxRequest,
) -> Result<RemovePodSandboxResponse> {
    let timer = Timer::start();
    let handler = pod_handler(d, &req.pod_sandbox_id);
    d.remove_pod(&req.pod_sandbox_id).await?;
    timer.observe_runtime(&metrics().sandbox_remove, &handler);
    Ok(RemovePodSandboxResponse {})
}

fn cri_state(s: SandboxState) -> PodSandboxState {
    match s {
        SandboxState::Ready => PodSandboxState::SandboxReady,
        SandboxState::Creating | SandboxState::NotReady => PodSandboxState::SandboxNotready,
    }
}

pub async fn status(
    d: &Arc<Daemon>,
    req: PodSandboxStatusRequest,
) -> Result<PodSandboxStatusResponse> {
    let r = d.pod(&req.pod_sandbox_id)?;
    let (status, containers_statuses) = pod_status(d, &r);
    let mut info = HashMap::new();
    if req.verbose {
        info.insert("info".to_string(), verbose_info(&r));
    }
    // kubelet's Evented PLEG takes a set timestamp to mean the response carries the pod's
    // containers too, and reads it in seconds: both must hold, or it starts copies of
    // containers it thinks are missing.
    Ok(PodSandboxStatusResponse {
        status: Some(status),
        info,
        containers_statuses,
        timestamp: now_nanos() / 1_000_000_000,
    })
}

/// The CRI status of pod `r` and of every container of it, oldest first.
pub(crate) fn pod_status(
    d: &Daemon,
    r: &SandboxRecord,
) -> (PodSandboxStatus, Vec<ContainerStatus>) {
    let config = r.config();
    let (network, pid, ipc) = namespace_modes(&config);
    let mut ips = r.ips.iter();
    let status = PodSandboxStatus {
        id: r.id.clone(),
        metadata: config.metadata.clone(),
        state: cri_state(r.state) as i32,
        created_at: r.created_at,
        network: Some(PodSandboxNetworkStatus {
            ip: ips.next().cloned().unwrap_or_default(),
            additional_ips: ips.map(|ip| PodIp { ip: ip.clone() }).collect(),
        }),
        linux: Some(LinuxPodSandboxStatus {
            namespaces: Some(Namespace {
                options: Some(NamespaceOption {
                    network: network as i32,
                    pid: pid as i32,
                    ipc: ipc as i32,
                    ..Default::default()
                }),
            }),
        }),
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        runtime_handler: r.runtime_handler.clone(),
    };
    let mut containers: Vec<ContainerStatus> = d
        .containers_of(&r.id)
        .iter()
        .map(|c| super::container::container_status(d, c))
        .collect();
    containers.sort_by_key(|c| c.created_at);
    (status, containers)
}

/// The debug view of a pod, as JSON (crictl inspectp prints it).
fn verbose_info(r: &SandboxRecord) -> String {
    serde_json::json!({
        "id": r.id,
        "name": r.name,
        "state": format!("{:?}", r.state),
        "pid": r.pause_pid,
        "netns": r.netns,
        "cgroup": r.cgroup,
        "hostname": r.hostname,
        "ips": r.ips,
        "networkError": r.network_error,
    })
    .to_string()
}

fn matches(
    r: &SandboxRecord,
    labels: &std::collections::HashMap<String, String>,
    f: &PodSandboxFilter,
) -> bool {
    (f.id.is_empty() || r.id.starts_with(&f.id))
        && f.state
            .as_ref()
            .is_none_or(|s| s.state == cri_state(r.state) as i32)
        && super::labels_match(&f.label_selector, labels)
}

fn list_items(d: &Daemon, filter: Option<PodSandboxFilter>) -> Vec<PodSandbox> {
    let filter = filter.unwrap_or_default();
    // A pod whose start is under way (NRI plugins may be looking at it) is not listed yet.
    let mut items: Vec<PodSandbox> = d.sandboxes.filter_map(|r| {
        if r.state == SandboxState::Creating {
            return None;
        }
        let config = r.listed_config();
        matches(r, &config.labels, &filter).then(|| PodSandbox {
            id: r.id.clone(),
            metadata: config.metadata,
            state: cri_state(r.state) as i32,
            created_at: r.created_at,
            labels: config.labels,
            annotations: config.annotations,
            runtime_handler: r.runtime_handler.clone(),
        })
    });
    items.sort_by_key(|p| std::cmp::Reverse(p.created_at));
    items
}

pub async fn list(d: &Arc<Daemon>, req: ListPodSandboxRequest) -> Result<ListPodSandboxResponse> {
    let timer = Timer::start();
    let items = list_items(d, req.filter);
    timer.observe(&metrics().sandbox_list);
    Ok(ListPodSandboxResponse { items })
}

pub async fn stream(
    d: &Arc<Daemon>,
    req: StreamPodSandboxesRequest,
) -> Result<BoxStream<StreamPodSandboxesResponse>> {
    let items = list_items(d, req.filter);
    Ok(super::in_chunks(items, |pod_sandboxes| {
        StreamPodSandboxesResponse { pod_sandboxes }
    }))
}
