//! `RemoveContainer`: the one teardown of whatever a container reached.

use std::sync::Arc;

use super::{volumes, ContainerPaths, ContainerRecord, ContainerState};
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::mounts;
use crate::store::Flush;
use crate::trash;
use crate::util::LockGuard;

impl Daemon {
    /// `RemoveContainer`: kills it if it runs, then removes everything it had. Idempotent.
    pub async fn remove_container(self: &Arc<Self>, id: &str) -> Result<()> {
        let Some(id) = self.resolve_container_id(id)? else {
            return Ok(());
        };
        let lock = self.locks.lock(&id).await;
        self.remove_container_locked(&lock).await
    }

    pub(crate) async fn remove_container_locked(
        self: &Arc<Self>,
        held: &LockGuard<'_>,
    ) -> Result<()> {
        let id = held.id();
        let Some(c) = self.containers.get(id) else {
            return Ok(());
        };
        let mut phases = crate::util::Phases::start();
        self.stop_container_locked(held, 0).await?;
        phases.mark("stop");
        // Released at its exit: the shim has forgotten it, its cgroup and mounts are gone.
        if !self.released.take(id) {
            self.remove_runtime_parts(&c.sandbox_id, id).await?;
            phases.mark("runtime_parts");
        }
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, id);
        // Renamed into the trash and deleted after this call returns (a restart empties it).
        trash::discard(&trash::dir(&self.config.state), &paths.bundle)?;
        trash::discard(&trash::dir(&self.config.root), &paths.layer)?;
        phases.mark("dirs");
        // The record and its name go in one commit on a blocking thread while the image
        // leases are released: a crash between the two leaves a lease whose holder crius does
        // not know, which the next start releases, or a record whose leases are gone, which
        // the next RemoveContainer removes (releasing is idempotent). The commit is not
        // flushed: the next durable one carries it, within `store::FLUSH_WITHIN`. crius
        // killed before that finds the record again at its start: the container is back as
        // exited, without its bundle and layer (in the trash, which the start empties), and
        // a second RemoveContainer removes it. Nothing of a container is lost that way, only
        // its removal undone; the flush was 0.3 ms of the call's 1 ms.
        let forget = {
            let daemon = Arc::clone(self);
            let (id, name) = (id.to_owned(), c.name.clone());
            tokio::task::spawn_blocking(move || {
                daemon
                    .containers
                    .remove_named(&daemon.store, &id, &name, Flush::Later)
            })
        };
        let released = self.release_leases(id, &c).await;
        phases.mark("image_release");
        forget
            .await
            .map_err(|e| Error::internal("remove the container's record", e))??;
        released?;
        phases.mark("records");
        let updates = self
            .nri
            .remove_container(
                id,
                || self.nri_pod(&c.sandbox_id),
                || self.nri_container(&c),
            )
            .await;
        self.nri_apply_later(updates);
        if c.state != ContainerState::Creating {
            self.events.emit_container_deleted(id, &c.sandbox_id, || {
                let pod = self.sandboxes.get(&c.sandbox_id)?;
                Some(crate::service::sandbox::pod_status(self, &pod).0)
            });
        }
        tracing::debug!(container = id, phases = %phases, "remove phases");
        Ok(())
    }

    /// The container's image leases: its image's and its image volumes'.
    async fn release_leases(&self, id: &str, c: &ContainerRecord) -> Result<()> {
        self.images.release(id).await?;
        for (i, m) in c.config().mounts.iter().enumerate() {
            if m.image.as_ref().is_some_and(|s| !s.image.is_empty()) {
                self.images.release(&volumes::image_lease(id, i)).await?;
            }
        }
        Ok(())
    }

    /// The container in its shim, its cgroup and its mounts: what an exit releases
    /// ([`Daemon::release_exited`]) when all goes well.
    pub(super) async fn remove_runtime_parts(&self, pod_id: &str, id: &str) -> Result<()> {
        if let Ok(shim) = self.shims.get(pod_id).await {
            match shim.delete(id, true).await {
                Ok(()) => {}
                Err(e)
                    if e.shim_error()
                        .is_some_and(|s| s.kind == crius_api::shim::ErrorKind::NotFound) => {}
                // A dead shim has nothing to delete; what it left is removed below.
                Err(e) if self.shims.running_pid(pod_id).is_none() => {
                    tracing::warn!(container = id, "shim gone, removing without it: {e}");
                }
                Err(e) => return Err(e.into()),
            }
        }
        // libcontainer's delete removes the container cgroup, but not when the shim is dead;
        // under a kubelet pod cgroup nobody else would.
        if let Some(pod) = self.sandboxes.get(pod_id) {
            let cgroup = cgroups::container_cgroup(&pod.cgroup, id);
            let patience = cgroups::REMOVE_PATIENCE;
            if let Err(e) = cgroups::reap::remove_cgroup(&cgroup, patience).await {
                tracing::warn!(container = id, "remove container cgroup: {e}");
            }
        }
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, id);
        volumes::unstage(&volumes::staging_dir(&paths.bundle))?;
        mounts::unmount(&paths.rootfs)?;
        Ok(())
    }
}
