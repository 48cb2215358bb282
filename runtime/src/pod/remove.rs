//! `RemovePodSandbox` and the one teardown that undoes whatever a pod reached.

use std::sync::Arc;

use super::{PodPaths, SandboxState};
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::Result;
use crate::mounts;
use crate::store::Flush;
use crate::trash;
use crate::util::LockGuard;

impl Daemon {
    /// `RemovePodSandbox`: stops and removes the pod and all its containers. Idempotent.
    pub async fn remove_pod(self: &Arc<Self>, id: &str) -> Result<()> {
        let Some(id) = self.resolve_pod_id(id)? else {
            return Ok(());
        };
        let lock = self.locks.lock(&id).await;
        self.teardown_pod(&lock, false).await
    }

    /// Undoes everything a pod has, whatever state it reached; the record goes last. With
    /// `force`, a network that cannot be released does not keep the rest.
    pub(super) async fn teardown_pod(
        self: &Arc<Self>,
        held: &LockGuard<'_>,
        force: bool,
    ) -> Result<()> {
        let id = held.id();
        let Some(record) = self.sandboxes.get(id) else {
            return Ok(());
        };
        let mut phases = crate::util::Phases::start();
        if let Err(e) = self.stop_pod_locked(held).await {
            if !force {
                return Err(e);
            }
            tracing::warn!(pod = id, "stop during teardown: {e}");
            // The pod goes; what its stop could not release (a CNI DEL that failed) is retried
            // in the background rather than forgotten until the next start.
            self.release_network_later();
        }
        phases.mark("stop");
        for c in self.containers_of(id) {
            let lock = self.locks.lock(&c.id).await;
            self.remove_container_locked(&lock).await?;
        }
        phases.mark("containers");
        if let Ok(shim) = self.shims.get(id).await {
            let _ = shim.delete(id, true).await;
        }
        phases.mark("pause_delete");
        self.shims.shutdown(id).await?;
        phases.mark("shim_shutdown");
        // Still pinned only when releasing the network failed on a forced teardown: the CNI
        // cache keeps what DEL needs (a retry works without the netns), the pin must go with
        // the pod.
        let paths = PodPaths::new(&self.config.state, id);
        if !record.host_network {
            crius_cni::netns::remove(&paths.netns_dir.join(id))?;
            crius_cni::netns::remove(&paths.userns)?;
        }
        mounts::unmount(&paths.shm)?;
        trash::discard(&trash::dir(&self.config.state), &paths.dir)?;
        phases.mark("netns_dirs");
        // The pause container's cgroup, which a dead shim could not delete.
        let pause_cgroup = cgroups::container_cgroup(&record.cgroup, id);
        if let Err(e) = cgroups::reap::remove_cgroup(&pause_cgroup, cgroups::REMOVE_PATIENCE).await
        {
            tracing::warn!(pod = id, "remove pause cgroup: {e}");
        }
        if cgroups::pod_cgroup_is_own(&record.cgroup, id) {
            if let Err(e) =
                cgroups::reap::remove_cgroup(&record.cgroup, cgroups::REMOVE_PATIENCE).await
            {
                tracing::warn!(pod = id, "remove pod cgroup: {e}");
            }
            cgroups::remove_parent_if_empty();
        }
        phases.mark("cgroups");
        // The status it leaves with (stopped, no containers), for its DELETED event.
        let last = self.sandboxes.get(id).unwrap_or_else(|| record.clone());
        self.sandboxes
            .remove_named(&self.store, id, &record.name, Flush::Now)?;
        phases.mark("record");
        self.nri
            .remove_pod_sandbox(id, || crate::nri::convert::pod(&record))
            .await;
        if record.state != SandboxState::Creating {
            self.events
                .emit_pod_deleted(id, || crate::service::sandbox::pod_status(self, &last).0);
        }
        tracing::debug!(pod = id, phases = %phases, "remove pod phases");
        Ok(())
    }
}
