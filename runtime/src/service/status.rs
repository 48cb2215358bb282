//! `Status`: whether the runtime and the pod network are ready, and what this runtime can do.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::{
    RuntimeCondition, RuntimeFeatures, RuntimeHandler, RuntimeHandlerFeatures, RuntimeStatus,
    StatusRequest, StatusResponse,
};

use crate::daemon::Daemon;
use crate::error::Result;

/// The condition kubelet requires before it runs any pod.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// The condition kubelet requires before it runs a pod that is not on the host network.
pub const NETWORK_READY: &str = "NetworkReady";
/// Reason of a NetworkReady=false condition, as kubelet and other runtimes report it.
pub const NETWORK_NOT_READY_REASON: &str = "NetworkPluginNotReady";

pub async fn status(daemon: &Arc<Daemon>, req: StatusRequest) -> Result<StatusResponse> {
    let runtime = RuntimeCondition {
        r#type: RUNTIME_READY.to_string(),
        status: true,
        reason: String::new(),
        message: String::new(),
    };
    let network = match daemon.network_ready().await {
        Ok(()) => RuntimeCondition {
            r#type: NETWORK_READY.to_string(),
            status: true,
            reason: String::new(),
            message: String::new(),
        },
        Err(e) => RuntimeCondition {
            r#type: NETWORK_READY.to_string(),
            status: false,
            reason: NETWORK_NOT_READY_REASON.to_string(),
            message: format!("Network plugin returns error: {e}"),
        },
    };
    let mut info = HashMap::new();
    if req.verbose {
        info.insert("config".to_string(), daemon.config.to_json());
    }
    Ok(StatusResponse {
        status: Some(RuntimeStatus {
            conditions: vec![runtime, network],
        }),
        info,
        runtime_handlers: vec![RuntimeHandler {
            // The default handler: the empty name is what kubelet sends without a RuntimeClass.
            name: String::new(),
            features: Some(RuntimeHandlerFeatures {
                // libcontainer applies `rro` with mount_setattr(AT_RECURSIVE): Linux 5.12+
                // (e2e: tests/tests/security.rs).
                recursive_read_only_mounts: kernel_at_least(5, 12),
                user_namespaces: false,
            }),
        }],
        features: Some(RuntimeFeatures {
            // Merge and Strict are both applied when the process user is resolved.
            supplemental_groups_policy: true,
            user_namespaces_host_network: false,
        }),
    })
}

/// Whether the running kernel's release (`/proc/sys/kernel/osrelease`) is at least
/// `major.minor`; false when it cannot be read.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_kernel_has_mount_setattr() {
        // the e2e tests run on 6.x
        assert!(super::kernel_at_least(5, 12));
        assert!(!super::kernel_at_least(999, 0));
    }
}
