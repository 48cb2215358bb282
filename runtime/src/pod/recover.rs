//! At start: pods a killed crius left half-created are torn down, ready ones followed again.

use std::sync::Arc;

use crius_api::v1::ContainerEventType;

use super::SandboxState;
use crate::daemon::Daemon;

impl Daemon {
    /// At start after a reboot: no pod of the earlier boot has its pause any more. Ready ones
    /// are recorded not ready at once (kubelet then stops them and creates new ones), and every
    /// pod that still holds a network (IPs in host-local's store, which a reboot keeps) is
    /// stopped in the background as StopPodSandbox would, so the addresses are free before
    /// kubelet asks; its later StopPodSandbox finds nothing left to do.
    pub fn settle_pods_after_reboot(self: &Arc<Self>) {
        // Before any ADD of this boot (crius does not serve yet).
        for file in self.network.release_blank_reservations_after_reboot() {
            tracing::info!(
                file = %file.display(),
                "removed an empty host-local reservation a power loss left"
            );
        }
        let mut holding = Vec::new();
        for record in self.sandboxes.all() {
            if record.state == SandboxState::Ready {
                if let Err(e) = self.sandboxes.update(&self.store, &record.id, |r| {
                    r.state = SandboxState::NotReady;
                }) {
                    tracing::error!(pod = %record.id, "record pod not ready after a reboot: {e}");
                    continue;
                }
                self.events.emit(
                    ContainerEventType::ContainerStoppedEvent,
                    &record.id,
                    &record.id,
                );
            }
            let holds_network =
                record.netns.is_some() || !record.ips.is_empty() || record.network_error.is_some();
            if record.state != SandboxState::Creating && !record.host_network && holds_network {
                holding.push(record.id);
            }
        }
        if holding.is_empty() {
            return;
        }
        tracing::info!(
            pods = holding.len(),
            "releasing the networks of the pods of the earlier boot"
        );
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            for id in holding {
                let lock = daemon.locks.lock(&id).await;
                if let Err(e) = daemon.stop_pod_locked(&lock).await {
                    // Kept on the record (`network_error`): kubelet's StopPodSandbox retries.
                    tracing::warn!(pod = %id, "release the network of a pod of the earlier boot: {e}");
                }
            }
        });
    }

    /// At start: finishes what a killed crius left half-done.
    pub async fn recover_pods(self: &Arc<Self>) {
        for record in self.sandboxes.all() {
            match record.state {
                SandboxState::Creating => {
                    tracing::info!(pod = %record.id, "removing a pod whose start was interrupted");
                    let lock = self.locks.lock(&record.id).await;
                    if let Err(e) = self.teardown_pod(&lock, true).await {
                        tracing::error!(pod = %record.id, "clean up interrupted pod: {e}");
                    }
                }
                SandboxState::Ready => self.watch_pod(record.id.clone()),
                SandboxState::NotReady => {}
            }
        }
        // Attachments the CNI cache still holds for pods crius no longer has (a failed start
        // whose undo could not release its network) get their DEL retried.
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            let valid = daemon.sandboxes.all().into_iter().map(|r| r.id).collect();
            if let Err(e) = daemon.network.gc(&valid).await {
                tracing::warn!("CNI garbage collection: {}", crate::error::chain(&e));
            }
        });
    }
}
