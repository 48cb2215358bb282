//! `CheckpointPod` and `RestorePod`. Thin: the work is in `crate::pod::checkpoint` and
//! `crate::pod::restore`.

use std::sync::Arc;

use crius_api::v1::*;

use crate::daemon::Daemon;
use crate::error::Result;

pub async fn checkpoint(
    d: &Arc<Daemon>,
    req: CheckpointPodRequest,
) -> Result<CheckpointPodResponse> {
    d.checkpoint_pod(req, super::answer_by()).await?;
    Ok(CheckpointPodResponse {})
}

pub async fn restore(d: &Arc<Daemon>, req: RestorePodRequest) -> Result<RestorePodResponse> {
    let (pod_sandbox_id, restored) = d.restore_pod(req, super::answer_by()).await?;
    Ok(RestorePodResponse {
        pod_sandbox_id,
        restored_containers: restored
            .into_iter()
            .map(|(name, container_id)| RestoredContainer { name, container_id })
            .collect(),
    })
}
