//! `Status`: whether the runtime and the pod network are ready, and what this runtime can do.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::{
    RuntimeCondition, RuntimeFeatures, RuntimeHandler, RuntimeHandlerFeatures, RuntimeStatus,
    StatusRequest, StatusResponse,
};

use crate::daemon::Daemon;
use crate::error::Result;
use crate::util::kernel_at_least;

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
                // probed at start: see `userns::probe` (e2e: tests/tests/userns.rs, userns_root.rs)
                user_namespaces: daemon.userns_supported(),
            }),
        }],
        features: Some(RuntimeFeatures {
            // Merge and Strict are both applied when the process user is resolved.
            supplemental_groups_policy: true,
            user_namespaces_host_network: false,
        }),
    })
}
