//! At start: pods a killed crius left half-created are torn down, ready ones followed again.

use std::sync::Arc;

use super::SandboxState;
use crate::daemon::Daemon;

impl Daemon {
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
