//! `StartContainer`: the shim runs the created container's process.

use std::sync::Arc;

use crius_api::v1::ContainerEventType;

use super::ContainerState;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::util::now_nanos;

impl Daemon {
    /// `StartContainer`.
    pub async fn start_container(self: &Arc<Self>, id: &str) -> Result<()> {
        let c = self.container(id)?;
        let _lock = self.locks.lock(&c.id).await;
        let c = self.container(&c.id)?;
        if c.state != ContainerState::Created {
            let now = format!("{:?}", c.state).to_lowercase();
            return Err(Error::FailedPrecondition(format!(
                "container {} is {now}, not created",
                c.id
            )));
        }
        let shim = self.shims.get(&c.sandbox_id).await?;
        // Plugins see the start before the process runs; a refusal leaves it created.
        self.nri
            .start_container(|| self.nri_pod(&c.sandbox_id), || self.nri_container(&c))
            .await?;
        // Taken before the start, for a shim that reports no start time: a quick process may
        // be done before the call returns, and its finish time must not come before its start.
        let asked_at = now_nanos();
        let (pid, shim_started_at) = shim.start(&c.id).await?;
        // The shim's own start time: it is what a recovery reads back from the shim, so the
        // value answered now is the one reported after a restart.
        let started_at = shim_started_at.unwrap_or(asked_at);
        // Not flushed to disk: should crius die before its next durable commit, the recovery
        // learns the start from the shim (`adopt_shim_state`) and records it again. For the
        // same reason a write that fails (a full disk) does not fail the start: the process
        // runs, and the record says so in memory until its next write or a recovery.
        let (_, failed) = self.containers.update_recoverable(&self.store, &c.id, |r| {
            // The watcher started at create follows the init through its start to its exit,
            // and may already have recorded the exit of a quick process: never undo that.
            if r.state == ContainerState::Created {
                r.state = ContainerState::Running;
            }
            r.started_at = started_at;
            r.pid = u32::try_from(pid).ok();
        });
        if let Some(e) = failed {
            tracing::warn!(
                container = %c.id,
                "the start is recorded in memory only until the record's next write: {}",
                crius_common::error_chain(&e)
            );
        }
        self.events.emit(
            ContainerEventType::ContainerStartedEvent,
            &c.id,
            &c.sandbox_id,
        );
        self.nri
            .post(
                crius_api::nri::api::Event::PostStartContainer,
                || self.nri_pod(&c.sandbox_id),
                || self.nri_container_id(&c.id),
            )
            .await;
        // The pod's next container, if any, is created with a helper that is ready.
        self.prepare_shim_helper_after_reply(&c.sandbox_id);
        Ok(())
    }
}
