//! Following a running container to its exit, and recording how it ended.

use std::sync::Arc;

use crius_api::shim::ExitInfo;
use crius_api::v1::ContainerEventType;

use super::ContainerState;
use crate::cgroups;
use crate::daemon::Daemon;
use crate::util::now_nanos;

/// CRI's reason for an exit.
fn exit_reason(exit: &ExitInfo) -> &'static str {
    if exit.oom_killed {
        "OOMKilled"
    } else if exit.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

impl Daemon {
    /// Follows a created or running container until its init exits, then records how.
    pub fn watch_exit(self: &Arc<Self>, pod_id: String, id: String) {
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            let running = || {
                daemon.containers.get(&id).is_some_and(|c| {
                    matches!(c.state, ContainerState::Created | ContainerState::Running)
                })
            };
            match daemon.shims.follow_exit(&pod_id, &id, running).await {
                Some(Ok(exit)) => {
                    daemon.record_exit(&id, &exit);
                    daemon.release_later(&id);
                }
                Some(Err(crate::shims::Lost::ShimGone(why))) => {
                    daemon.settle_lost(&pod_id, &id, &why);
                }
                Some(Err(crate::shims::Lost::NotInShim)) => {
                    // Deleted by the shim while crius was away (a removal the database
                    // missed): it has ended; kubelet's next RemoveContainer finishes the job.
                    daemon.record_lost_exit(
                        &id,
                        "the pod's shim no longer has this container: it was removed while \
                         crius was not running",
                    );
                }
                None => return,
            }
            // Boxed: the NRI call's future (4.3 KB) would otherwise size the task for as long
            // as the container lives, beside the 1.7 KB of the wait.
            Box::pin(daemon.nri_container_stopped(&id)).await;
        });
    }

    /// When the shim cannot tell how a container ended: read its exit file, or, if the shim is
    /// gone without one, record the container as exited with the reason. Returns whether the
    /// container's end is now recorded.
    pub(super) fn settle_lost(&self, pod_id: &str, id: &str, why: &str) -> bool {
        let shim_dir = self.shims.state_dir(pod_id);
        if let Ok(Some(exit)) = crius_api::shim::read_exit_file(&shim_dir, id) {
            self.record_exit(id, &exit);
            return true;
        }
        // The same liveness test as everywhere else: the pid file's process, checked to be
        // this pod's shim (a pid reused by another process does not count).
        if self.shims.running_pid(pod_id).is_some() {
            return false;
        }
        // Without its shim nobody reaps or stops the container: its processes were reparented
        // to init and may still run. Kill them so "exited" is true.
        if let Some(pod) = self.sandboxes.get(pod_id) {
            cgroups::reap::kill_cgroup_tree(&cgroups::container_cgroup(&pod.cgroup, id));
        }
        self.record_lost_exit(
            id,
            &format!("the pod's shim is gone and left no exit record ({why})"),
        );
        true
    }

    /// Records that container `id` ended in a way nobody saw (exit code 255, reason `Error`,
    /// `message` saying why), unless its exit is recorded already.
    pub(super) fn record_lost_exit(&self, id: &str, message: &str) {
        self.record_unseen_exit(id, "Error", message);
    }

    /// Records that container `id` ended unseen with exit code 255 and `reason`, unless its
    /// exit is recorded already.
    pub(super) fn record_unseen_exit(&self, id: &str, reason: &str, message: &str) {
        let mut ended_in = None;
        let written = self.containers.update(&self.store, id, |r| {
            if r.state == ContainerState::Exited {
                return;
            }
            ended_in = Some(r.sandbox_id.clone());
            r.state = ContainerState::Exited;
            r.finished_at = now_nanos();
            r.exit_code = 255;
            r.reason = reason.to_string();
            r.message = message.to_string();
        });
        if let Err(e) = written {
            tracing::error!(container = id, "record an exit nobody saw ({message}): {e}");
        }
        if let Some(pod) = ended_in {
            self.events
                .emit(ContainerEventType::ContainerStoppedEvent, id, &pod);
        }
    }

    pub(super) fn record_exit(&self, id: &str, exit: &ExitInfo) {
        let mut ended_in = None;
        let res = self.containers.update(&self.store, id, |r| {
            if r.state == ContainerState::Exited {
                return;
            }
            ended_in = Some(r.sandbox_id.clone());
            if exit.oom_killed {
                crate::telemetry::metrics().oom_kills.inc();
            }
            r.state = ContainerState::Exited;
            r.finished_at = exit.finished_at_unix_nano;
            r.exit_code = exit.exit_code;
            r.reason = exit_reason(exit).to_string();
            if let Some(sig) = exit.signal {
                r.message = format!("killed by signal {sig}");
            }
        });
        if let Err(e) = res {
            tracing::error!(container = id, "record exit: {e}");
        }
        if let Some(pod) = ended_in {
            self.events
                .emit(ContainerEventType::ContainerStoppedEvent, id, &pod);
        }
    }
}
