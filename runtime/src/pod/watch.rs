//! Following a ready pod's pause process, so its exit makes the pod not ready.

use std::sync::Arc;

use crius_api::v1::ContainerEventType;

use super::SandboxState;
use crate::daemon::Daemon;

impl Daemon {
    /// Follows a ready pod's pause process: when it exits, or the pod's shim dies, the pod is
    /// no longer ready (kubelet then stops it and creates a new one), as containerd reports a
    /// sandbox whose task exited.
    pub fn watch_pod(self: &Arc<Self>, id: String) {
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            let ready = || {
                daemon
                    .sandboxes
                    .get(&id)
                    .is_some_and(|r| r.state == SandboxState::Ready)
            };
            let why = match daemon.shims.follow_exit(&id, &id, ready).await {
                Some(Ok(exit)) => format!("its pause process exited with {}", exit.exit_code),
                Some(Err(e)) => format!("its pause cannot be followed: {e}"),
                None => return,
            };
            // Under the pod lock: a stop or removal in progress decides, not this watch.
            let _lock = daemon.locks.lock(&id).await;
            if ready() {
                tracing::warn!(pod = %id, "pod is not ready: {why}");
                if let Err(e) = daemon.sandboxes.update(&daemon.store, &id, |r| {
                    r.state = SandboxState::NotReady;
                }) {
                    tracing::error!(pod = %id, "record pod not ready: {e}");
                }
                daemon
                    .events
                    .emit(ContainerEventType::ContainerStoppedEvent, &id, &id);
            }
        });
    }
}
