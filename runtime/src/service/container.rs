//! Container RPCs: `CreateContainer`, `StartContainer`, `StopContainer`, `RemoveContainer`,
//! `ContainerStatus`, `ListContainers`, `StreamContainers`, `ExecSync`, `ReopenContainerLog`.
//! Thin: the lifecycle is in `crate::container`.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::*;

use super::BoxStream;
use crate::container::{ContainerRecord, ContainerState as State};
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::telemetry::{metrics, Timer};

/// The handler label of the timers of a container (its pod's handler; empty when unknown).
fn container_handler(d: &Daemon, id: &str) -> String {
    d.container(id)
        .and_then(|c| d.pod(&c.sandbox_id))
        .map(|p| d.handler_label(&p.runtime_handler))
        .unwrap_or_default()
}

pub async fn create(
    d: &Arc<Daemon>,
    req: CreateContainerRequest,
) -> Result<CreateContainerResponse> {
    let config = req
        .config
        .ok_or_else(|| Error::InvalidArgument("config is required".into()))?;
    let timer = Timer::start();
    let id = d.create_container(&req.pod_sandbox_id, config).await?;
    let handler = container_handler(d, &id);
    timer.observe_runtime(&metrics().container_create, &handler);
    Ok(CreateContainerResponse { container_id: id })
}

pub async fn start(d: &Arc<Daemon>, req: StartContainerRequest) -> Result<StartContainerResponse> {
    let timer = Timer::start();
    d.start_container(&req.container_id).await?;
    let handler = container_handler(d, &req.container_id);
    timer.observe_runtime(&metrics().container_start, &handler);
    Ok(StartContainerResponse {})
}

pub async fn stop(d: &Arc<Daemon>, req: StopContainerRequest) -> Result<StopContainerResponse> {
    if req.timeout < 0 {
        return Err(Error::InvalidArgument(format!(
            "timeout {} must not be negative",
            req.timeout
        )));
    }
    let timer = Timer::start();
    d.stop_container(&req.container_id, req.timeout).await?;
    let handler = container_handler(d, &req.container_id);
    timer.observe_runtime(&metrics().container_stop, &handler);
    Ok(StopContainerResponse {})
}

pub async fn remove(
    d: &Arc<Daemon>,
    req: RemoveContainerRequest,
) -> Result<RemoveContainerResponse> {
    let timer = Timer::start();
    let handler = container_handler(d, &req.container_id);
    d.remove_container(&req.container_id).await?;
    timer.observe_runtime(&metrics().container_remove, &handler);
    Ok(RemoveContainerResponse {})
}

fn cri_state(s: State) -> ContainerState {
    match s {
        State::Creating | State::Created => ContainerState::ContainerCreated,
        State::Running => ContainerState::ContainerRunning,
        State::Exited => ContainerState::ContainerExited,
    }
}

/// The container's image as it reports it, and its `image_ref`.
fn image_spec(d: &Daemon, r: &ContainerRecord, image: Option<&ImageSpec>) -> (ImageSpec, String) {
    let (annotations, user_specified_image) = image
        .map(|i| (i.annotations.clone(), i.user_specified_image.clone()))
        .unwrap_or_default();
    let shown = d.shown_image(r, &user_specified_image);
    let spec = ImageSpec {
        image: shown.name,
        annotations,
        user_specified_image,
        ..Default::default()
    };
    (spec, shown.image_ref)
}

pub async fn status(
    d: &Arc<Daemon>,
    req: ContainerStatusRequest,
) -> Result<ContainerStatusResponse> {
    let r = d.container(&req.container_id)?;
    // Not listed either: it exists for clients once CreateContainer has returned its id.
    if r.state == State::Creating {
        return Err(Error::NotFound(format!(
            "container {} is still being created",
            r.id
        )));
    }
    let status = container_status(d, &r);
    let mut info = HashMap::new();
    if req.verbose {
        let spec = d.container_spec(&r.id).ok();
        info.insert(
            "info".to_string(),
            serde_json::json!({
                "sandboxID": r.sandbox_id,
                "pid": r.pid,
                "name": r.name,
                "runtimeSpec": spec,
            })
            .to_string(),
        );
    }
    Ok(ContainerStatusResponse {
        status: Some(status),
        info,
    })
}

/// The CRI status of one container (`ContainerStatus`, and each of a pod's containers in
/// `PodSandboxStatus`).
/// The container's mounts, an image volume's with the digest (image id) of its image in
/// `image.image_ref`, which kubelet reports as the volume's image (KEP-5365).
fn mounts_with_image_refs(
    d: &Daemon,
    mounts: &[crius_api::v1::Mount],
) -> Vec<crius_api::v1::Mount> {
    let mut mounts = mounts.to_vec();
    for m in &mut mounts {
        let Some(spec) = m.image.as_mut().filter(|s| !s.image.is_empty()) else {
            continue;
        };
        if spec.image_ref.is_empty() {
            if let Ok(Some(image)) = d.images.get(&spec.image) {
                spec.image_ref = image.id.clone();
            }
        }
    }
    mounts
}

pub(super) fn container_status(d: &Daemon, r: &ContainerRecord) -> ContainerStatus {
    let config = r.config();
    let (image, image_ref) = image_spec(d, r, config.image.as_ref());
    ContainerStatus {
        id: r.id.clone(),
        metadata: config.metadata.clone(),
        state: cri_state(r.state) as i32,
        created_at: r.created_at,
        started_at: r.started_at,
        finished_at: r.finished_at,
        exit_code: r.exit_code,
        image: Some(image),
        image_ref,
        reason: r.reason.clone(),
        message: r.message.clone(),
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        mounts: mounts_with_image_refs(d, &config.mounts),
        log_path: r
            .log_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        resources: r.resources().map(|linux| ContainerResources {
            linux: Some(linux),
            windows: None,
        }),
        image_id: r.image_id.clone(),
        user: d
            .container_process(&r.id)
            .ok()
            .flatten()
            .map(|p| crate::spec::process_user(&p)),
        stop_signal: crate::spec::cri_signal(r.stop_signal) as i32,
    }
}

/// Whether a container passes `f`; `pod` is the pod id `f.pod_sandbox_id` resolves to, if any.
fn matches(
    r: &ContainerRecord,
    labels: &std::collections::HashMap<String, String>,
    f: &ContainerFilter,
    pod: Option<&str>,
) -> bool {
    (f.id.is_empty() || r.id.starts_with(&f.id))
        && (f.pod_sandbox_id.is_empty()
            || r.sandbox_id.starts_with(&f.pod_sandbox_id)
            || pod == Some(r.sandbox_id.as_str()))
        && f.state
            .as_ref()
            .is_none_or(|s| s.state == cri_state(r.state) as i32)
        && super::labels_match(&f.label_selector, labels)
}

fn list_items(d: &Daemon, filter: Option<ContainerFilter>) -> Vec<Container> {
    let filter = filter.unwrap_or_default();
    // Resolved once, before the containers' lock is taken (the pods' is another).
    let pod = match filter.pod_sandbox_id.is_empty() {
        true => None,
        false => d.resolve_pod_id(&filter.pod_sandbox_id).ok().flatten(),
    };
    let mut items: Vec<Container> = d.containers.filter_map(|r| {
        // A container whose create is under way (or was interrupted and is being removed)
        // does not exist yet for the client.
        if r.state == State::Creating {
            return None;
        }
        let config = r.listed_config();
        if !matches(r, &config.labels, &filter, pod.as_deref()) {
            return None;
        }
        let (image, image_ref) = image_spec(d, r, config.image.as_ref());
        Some(Container {
            id: r.id.clone(),
            pod_sandbox_id: r.sandbox_id.clone(),
            image: Some(image),
            metadata: config.metadata,
            image_ref,
            state: cri_state(r.state) as i32,
            created_at: r.created_at,
            labels: config.labels,
            annotations: config.annotations,
            image_id: r.image_id.clone(),
        })
    });
    items.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    items
}

pub async fn list(d: &Arc<Daemon>, req: ListContainersRequest) -> Result<ListContainersResponse> {
    let timer = Timer::start();
    let containers = list_items(d, req.filter);
    timer.observe(&metrics().container_list);
    Ok(ListContainersResponse { containers })
}

pub async fn stream(
    d: &Arc<Daemon>,
    req: StreamContainersRequest,
) -> Result<BoxStream<StreamContainersResponse>> {
    Ok(super::in_chunks(list_items(d, req.filter), |containers| {
        StreamContainersResponse { containers }
    }))
}

pub async fn exec_sync(d: &Arc<Daemon>, req: ExecSyncRequest) -> Result<ExecSyncResponse> {
    if req.timeout < 0 {
        return Err(Error::InvalidArgument(format!(
            "timeout {} must not be negative",
            req.timeout
        )));
    }
    let out = d.exec_sync(&req.container_id, req.cmd, req.timeout).await?;
    Ok(ExecSyncResponse {
        stdout: out.stdout,
        stderr: out.stderr,
        exit_code: out.exit_code,
    })
}

pub async fn reopen_log(
    d: &Arc<Daemon>,
    req: ReopenContainerLogRequest,
) -> Result<ReopenContainerLogResponse> {
    d.reopen_log(&req.container_id).await?;
    Ok(ReopenContainerLogResponse {})
}
