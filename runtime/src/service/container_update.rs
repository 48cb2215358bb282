//! `UpdateContainerResources` and `UpdatePodSandboxResources`. Thin: the work is in
//! `crate::container::update` and `crate::cgroups`.

use std::sync::Arc;

use crius_api::v1::*;

use crate::cgroups::check_resources;
use crate::daemon::Daemon;
use crate::error::Result;

pub async fn update_container(
    d: &Arc<Daemon>,
    req: UpdateContainerResourcesRequest,
) -> Result<UpdateContainerResourcesResponse> {
    if let Some(r) = &req.linux {
        check_resources("linux", r)?;
    }
    d.update_container_resources(&req.container_id, req.linux)
        .await?;
    Ok(UpdateContainerResourcesResponse {})
}

pub async fn update_pod(
    d: &Arc<Daemon>,
    req: UpdatePodSandboxResourcesRequest,
) -> Result<UpdatePodSandboxResourcesResponse> {
    for (field, r) in [("overhead", &req.overhead), ("resources", &req.resources)] {
        if let Some(r) = r {
            check_resources(field, r)?;
        }
    }
    d.update_pod_resources(&req.pod_sandbox_id, req.overhead, req.resources)
        .await?;
    Ok(UpdatePodSandboxResourcesResponse {})
}
