//! `StopContainer`: the stop signal, then SIGKILL after the timeout.

use std::sync::Arc;
use std::time::Duration;

use super::ContainerState;
use crate::daemon::Daemon;
use crate::error::Result;
use crate::util::LockGuard;

impl Daemon {
    /// `StopContainer`: the stop signal, `timeout` seconds, then SIGKILL. Idempotent; an
    /// unknown id is success.
    pub async fn stop_container(self: &Arc<Self>, id: &str, timeout: i64) -> Result<()> {
        let Some(id) = self.resolve_container_id(id)? else {
            return Ok(());
        };
        let lock = self.locks.lock(&id).await;
        self.stop_container_locked(&lock, timeout).await?;
        // As containerd deletes the task before its StopContainer answers: what the stopped
        // container held goes now, not at a RemoveContainer that may come much later.
        self.release_exited(&lock).await;
        Ok(())
    }

    /// Stops the container whose lock `held` is, then tells NRI plugins it stopped (once;
    /// its own exit may have told them already).
    pub(crate) async fn stop_container_locked(
        self: &Arc<Self>,
        held: &LockGuard<'_>,
        timeout: i64,
    ) -> Result<()> {
        self.stop_container_process(held, timeout).await?;
        self.nri_container_stopped(held.id()).await;
        Ok(())
    }

    /// Tells NRI plugins that container `id` has stopped, unless they were told already; the
    /// updates of other containers they answer are applied in the background (their locks
    /// may be held by the caller's caller).
    pub(crate) async fn nri_container_stopped(self: &Arc<Self>, id: &str) {
        if !self.nri.enabled() {
            return;
        }
        let Some(c) = self.containers.get(id) else {
            return;
        };
        if c.state != ContainerState::Exited {
            return;
        }
        let updates = self
            .nri
            .stop_container(
                id,
                || self.nri_pod(&c.sandbox_id),
                || self.nri_container(&c),
            )
            .await;
        self.nri_apply_later(updates);
    }

    /// Stops the process of the container whose lock `held` is.
    async fn stop_container_process(
        self: &Arc<Self>,
        held: &LockGuard<'_>,
        timeout: i64,
    ) -> Result<()> {
        let id = held.id();
        let Some(mut c) = self.containers.get(id) else {
            return Ok(());
        };
        // A record that says created may hide a process its shim started: stop what runs.
        if c.state == ContainerState::Created {
            if let Ok(shim) = self.shims.get(&c.sandbox_id).await {
                if let Ok(info) = shim.state(id).await {
                    if self.adopt_shim_state(&c, &info) {
                        c = self.containers.get(id).unwrap_or(c);
                    }
                }
            }
        }
        if c.state != ContainerState::Running {
            return Ok(());
        }
        let shim = match self.shims.get(&c.sandbox_id).await {
            Ok(s) => s,
            Err(e) => {
                self.settle_lost(&c.sandbox_id, id, &e.to_string());
                return Ok(());
            }
        };
        let stopped = async {
            if timeout > 0 {
                shim.kill(id, c.stop_signal, false).await?;
                if let Ok(exit) = shim
                    .wait(id, Some(Duration::from_secs(timeout as u64)))
                    .await
                {
                    return Ok(exit);
                }
            }
            shim.kill(id, libc::SIGKILL, true).await?;
            shim.wait(id, Some(Duration::from_secs(10))).await
        };
        match stopped.await {
            Ok(exit) => {
                self.record_exit(id, &exit);
                Ok(())
            }
            // The shim died (its client was still cached): the container is lost, not stuck.
            Err(e) if self.settle_lost(&c.sandbox_id, id, &e.to_string()) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
