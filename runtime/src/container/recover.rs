//! At start: interrupted creates removed, finished ones whose record the crash lost adopted,
//! running containers followed again, and those that ended while crius was away given their
//! exit.

use std::sync::Arc;
use std::time::Duration;

use crius_api::shim::{ContainerInfo as ShimContainerInfo, ContainerStatus as ShimStatus};

use super::{volumes, ContainerPaths, ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::util::now_nanos;
use crate::{mounts, trash};

/// How long crius keeps trying to remove a container whose create a crash interrupted (a
/// shim gives up on a create after 60 s).
const INTERRUPTED_CREATE_PATIENCE: Duration = Duration::from_secs(90);

impl Daemon {
    /// Removes what a create left whose record a crash lost (a create's record reaches the
    /// disk while its rootfs and spec are made, see `create_container`): a container directory
    /// in the state or the root tree that no record names, with the rootfs and the staged
    /// volumes mounted in it. No shim has such a container: the shim is asked only once the
    /// record is on disk. Before serving, so no create is under way.
    pub fn remove_unrecorded_containers(&self) {
        let (root, state) = (&self.config.root, &self.config.state);
        let mut ids = std::collections::BTreeSet::new();
        for tree in [state, root] {
            let dir = tree.join("containers");
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::warn!("list {}: {e}", dir.display());
                    continue;
                }
            };
            ids.extend(
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok()),
            );
        }
        for id in ids {
            if self.containers.get(&id).is_some() {
                continue;
            }
            tracing::info!(container = %id, "removing what a create crius has no record of left");
            let paths = ContainerPaths::new(root, state, &id);
            let unmounted = volumes::unstage(&volumes::staging_dir(&paths.bundle))
                .and_then(|()| mounts::unmount(&paths.rootfs).map_err(Into::into));
            if let Err(e) = unmounted {
                // Kept: its directories would take the upper layer from under a mount.
                tracing::warn!(container = %id, "unmount what an unrecorded create left: {e}");
                continue;
            }
            for (tree, dir) in [(state, &paths.bundle), (root, &paths.layer)] {
                if let Err(e) = trash::discard(&trash::dir(tree), dir) {
                    tracing::warn!(container = %id, "remove {}: {e}", dir.display());
                }
            }
        }
    }

    /// Brings a record that says created in line with its shim: a container the shim started
    /// (crius died before recording it) becomes running and is followed; one that has already
    /// exited gets its start and exit recorded. Returns whether the record changed.
    pub(super) fn adopt_shim_state(
        self: &Arc<Self>,
        c: &ContainerRecord,
        info: &ShimContainerInfo,
    ) -> bool {
        if c.state != ContainerState::Created
            || !matches!(info.status, ShimStatus::Running | ShimStatus::Stopped)
        {
            return false;
        }
        if info.status == ShimStatus::Stopped && info.started_at_unix_nano.is_none() {
            // Never started (its init was killed while created): only the exit is news.
            if let Some(exit) = &info.exit {
                self.record_exit(&c.id, exit);
            }
            return true;
        }
        let started_at = info.started_at_unix_nano.unwrap_or_else(now_nanos);
        let updated = self.containers.update(&self.store, &c.id, |r| {
            if r.state == ContainerState::Created {
                r.state = ContainerState::Running;
            }
            r.started_at = started_at;
            r.pid = info.pid.and_then(|p| u32::try_from(p).ok());
        });
        if let Err(e) = updated {
            tracing::error!(container = %c.id, "record the start the shim reports: {e}");
            return false;
        }
        tracing::info!(container = %c.id, "the shim started this container before crius recorded it");
        match (&info.status, &info.exit) {
            (ShimStatus::Stopped, Some(exit)) => self.record_exit(&c.id, exit),
            _ => self.watch_exit(c.sandbox_id.clone(), c.id.clone()),
        }
        true
    }

    /// A record that says creating for a container whose create may have finished: its image
    /// lease is on disk, which CreateContainer waits for before it records the container
    /// created (a write it does not flush). If the shim has the container, the record says
    /// created again, and then whatever the shim has seen since. If the shim itself is gone,
    /// nobody can tell whether the create finished: the container is kept and settled as a
    /// created one whose shim died is, rather than lost. Returns whether it was kept; if not,
    /// the create was cut short and is undone.
    async fn adopt_created(self: &Arc<Self>, c: &ContainerRecord) -> bool {
        match self.images.lease_holders() {
            Ok(holders) if holders.contains(&c.id) => {}
            _ => return false,
        }
        let Ok(shim) = self.shims.get(&c.sandbox_id).await else {
            if self.mark_created(c, None).is_some() {
                self.settle_lost(&c.sandbox_id, &c.id, "shim not reachable at start");
                return true;
            }
            return false;
        };
        let info = match shim.state(&c.id).await {
            Ok(info) if info.status != ShimStatus::Creating => info,
            // Still creating: crius died before it could answer, so the create is undone
            // once the shim is done with it.
            Ok(_) => return false,
            // Never created, or deleted since.
            Err(e)
                if e.shim_error()
                    .is_some_and(|s| s.kind == crius_api::shim::ErrorKind::NotFound) =>
            {
                return false
            }
            // No answer: kept and followed as a created container is, whose watcher settles it.
            Err(e) => {
                tracing::warn!(container = %c.id, "state of a container being created: {e}");
                let Some(record) = self.mark_created(c, None) else {
                    return false;
                };
                self.watch_exit(record.sandbox_id, record.id);
                return true;
            }
        };
        let pid = info.pid.and_then(|p| u32::try_from(p).ok());
        let Some(record) = self.mark_created(c, pid) else {
            return false;
        };
        tracing::info!(container = %c.id, "the shim created this container before crius recorded it");
        if !self.adopt_shim_state(&record, &info) {
            self.watch_exit(record.sandbox_id.clone(), record.id.clone());
        }
        true
    }

    /// Records `c` created (durably), with its init's `pid`.
    fn mark_created(&self, c: &ContainerRecord, pid: Option<u32>) -> Option<ContainerRecord> {
        let marked = self.containers.update(&self.store, &c.id, |r| {
            r.state = ContainerState::Created;
            r.pid = pid;
        });
        match marked {
            Ok(record) => record,
            Err(e) => {
                tracing::error!(container = %c.id, "record an adopted create: {e}");
                None
            }
        }
    }

    /// Removes a container whose create crius did not see through. Its shim may still be
    /// creating it (the shim outlived crius and refuses a delete until the create is done), so
    /// this retries for a while.
    pub(super) async fn remove_interrupted(self: &Arc<Self>, id: &str) {
        let deadline = tokio::time::Instant::now() + INTERRUPTED_CREATE_PATIENCE;
        let mut delay = Duration::from_millis(50);
        loop {
            let result = {
                let lock = self.locks.lock(id).await;
                self.remove_container_locked(&lock).await
            };
            match result {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(container = id, "interrupted create not removable yet: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(container = id, "clean up interrupted container: {e}");
                    return;
                }
            }
        }
    }

    /// At start after a reboot: every container that was created or running in the earlier
    /// boot ended with it. Each is recorded exited (255, reason `NodeRestarted`, the boot ids
    /// in the message) without asking its shim, which went with the boot.
    ///
    /// A `Creating` container whose image lease is on disk had its create done by the shim
    /// before the boot ended ([`Daemon::recover_containers`] adopts such a container when its
    /// shim still has it); after a power loss its `Created` write may be what was lost. It is
    /// recorded the same way, so its answered create is not reported as a failure. Other
    /// interrupted creates are left to [`Daemon::recover_containers`], which removes them.
    pub fn settle_containers_after_reboot(&self, boot: &crate::boot::Boot) {
        let message = boot.message();
        let leased = match self.images.lease_holders() {
            Ok(holders) => holders,
            Err(e) => {
                tracing::warn!("list image leases: {e}");
                Default::default()
            }
        };
        for c in self.containers.all() {
            let ended = match c.state {
                ContainerState::Created | ContainerState::Running => true,
                ContainerState::Creating => leased.contains(&c.id),
                ContainerState::Exited => false,
            };
            if ended {
                self.record_unseen_exit(&c.id, "NodeRestarted", &message);
            }
        }
    }

    /// At start: cleans up interrupted creates and follows running containers again, finding
    /// out how those that ended while crius was away ended.
    pub async fn recover_containers(self: &Arc<Self>) {
        for c in self.containers.all() {
            match c.state {
                ContainerState::Creating => {
                    if self.adopt_created(&c).await {
                        continue;
                    }
                    tracing::info!(container = %c.id, "removing a container whose create was interrupted");
                    let daemon = Arc::clone(self);
                    tokio::spawn(async move { daemon.remove_interrupted(&c.id).await });
                }
                ContainerState::Running => {
                    self.thaw_left_frozen(&c);
                    self.watch_exit(c.sandbox_id.clone(), c.id.clone())
                }
                ContainerState::Created => {
                    // The shim has the truth: a crius killed between the shim's start and the
                    // database write left a record that says created for a process that runs
                    // (or ran).
                    // (StartContainer's `Running` is not flushed to disk, so this is any
                    // crash soon after a start.) A container its shim no longer has is
                    // settled by the watcher, as a running one's would be.
                    if let Ok(shim) = self.shims.get(&c.sandbox_id).await {
                        let adopted = match shim.state(&c.id).await {
                            Ok(info) => self.adopt_shim_state(&c, &info),
                            Err(_) => false,
                        };
                        if !adopted {
                            self.watch_exit(c.sandbox_id.clone(), c.id.clone());
                        }
                    } else {
                        self.settle_lost(&c.sandbox_id, &c.id, "shim not reachable at start");
                    }
                }
                ContainerState::Exited => {}
            }
        }
    }
}
