//! `CheckpointContainer`. Thin: the work is in `crate::container::checkpoint`.

use std::sync::Arc;

use crius_api::v1::*;

use crate::daemon::Daemon;
use crate::error::Result;

pub async fn checkpoint(
    d: &Arc<Daemon>,
    req: CheckpointContainerRequest,
) -> Result<CheckpointContainerResponse> {
    d.checkpoint_container(&req.container_id, &req.location, req.timeout)
        .await?;
    Ok(CheckpointContainerResponse {})
}
