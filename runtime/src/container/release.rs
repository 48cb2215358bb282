//! What an exited container no longer needs, given back at its exit rather than at its
//! removal: its state and cgroup in the runtime (the shim's delete) and its mounts (the
//! overlay rootfs and staged volumes).
//!
//! kubelet removes an exited container much later than it exits (it keeps the last one of
//! each name for `kubectl logs --previous`), and until then nothing uses its rootfs or
//! cgroup. What stays until `RemoveContainer` is what the record still shows or the node
//! still counts: the record, the log, the bundle (`config.json` for a verbose status), the
//! writable layer on disk (its usage in `ContainerStats`) and the image leases.
//!
//! Which containers are released is kept in memory only ([`crate::records::Released`]). After
//! a crius restart none counts as released and `RemoveContainer` takes its whole path, every step of which does nothing
//! when its part is already gone.

use std::sync::Arc;

use crate::daemon::Daemon;
use crate::records::ContainerState;
use crate::util::LockGuard;

impl Daemon {
    /// Gives back what container `held` no longer needs once it has exited. A failure is
    /// logged and changes nothing else: `RemoveContainer` then does it all.
    pub(super) async fn release_exited(self: &Arc<Self>, held: &LockGuard<'_>) {
        let id = held.id();
        let Some(c) = self.containers.get(id) else {
            return;
        };
        if c.state != ContainerState::Exited || self.released.contains(id) {
            return;
        }
        let mut phases = crate::util::Phases::start();
        if let Err(e) = self.remove_runtime_parts(&c.sandbox_id, id).await {
            tracing::debug!(
                container = id,
                "release at exit left to RemoveContainer: {e}"
            );
            return;
        }
        self.released.insert(id);
        phases.mark("release");
        tracing::debug!(container = id, phases = %phases, "release phases");
    }

    /// After a container's own exit (not a `StopContainer`, which releases it itself):
    /// releases it under its lock, once whatever holds that lock is done.
    pub(super) fn release_later(self: &Arc<Self>, id: &str) {
        if self.released.contains(id) {
            return;
        }
        let daemon = Arc::clone(self);
        let id = id.to_owned();
        tokio::spawn(async move {
            let lock = daemon.locks.lock(&id).await;
            daemon.release_exited(&lock).await;
        });
    }
}
