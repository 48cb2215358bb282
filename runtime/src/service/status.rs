//! `Status`: whether the runtime and the pod network are ready, and what this runtime can do.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::{
    RuntimeCondition, RuntimeFeatures, RuntimeStatus, StatusRequest, StatusResponse,
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
    let info = if req.verbose {
        let mut info = verbose_info(daemon);
        info.insert("checkpoint".to_string(), checkpoint_json(daemon).await);
        info
    } else {
        HashMap::new()
    };
    Ok(StatusResponse {
        status: Some(RuntimeStatus {
            conditions: vec![runtime, network],
        }),
        info,
        // The default handler under "", then each usable one by name, with its probed features
        // (built-in: rro with mount_setattr(AT_RECURSIVE), Linux 5.12+, tests/tests/e2e/security.rs;
        // user namespaces from `userns::probe`, tests/tests/e2e/userns.rs): see `handlers.rs`.
        runtime_handlers: daemon.handlers().status(),
        features: Some(RuntimeFeatures {
            // Merge and Strict are both applied when the process user is resolved.
            supplemental_groups_policy: true,
            user_namespaces_host_network: false,
            // Mount.mount_options: the bind flags of `spec::mounts::BIND_FLAGS`, every handler.
            mount_options: true,
        }),
    })
}

/// `info` keys of a verbose Status (values are JSON, as the CRI asks): `config`, the effective
/// configuration; `configPath`, the file crius was told to read (null without one);
/// `configFiles`, the files it did read (that file if it exists, then its drop-ins);
/// `startedAt`, when this crius started, in nanoseconds since the epoch like every CRI
/// timestamp; `pid`; `pulls`, the image pulls under way (`image`, `doneBytes`, `totalBytes`,
/// `elapsedSeconds`); `nri`, whether NRI is on (`enabled`), its socket or why there is none
/// (`socket`) and the connected plugins in event order (`plugins`: `index`, `name`,
/// `launched` for those crius started); `checkpoint`, what each handler can do with CRIU
/// (`handlers`: name to `none`, `checkpoint` or `checkpoint, restore`), whether whole pods can
/// be (`pods`: `CheckpointPod, RestorePod`, for the handlers that can checkpoint and restore
/// containers, or `none`), the criu binary (`criu`) or why there is none usable (`error`,
/// and then every handler has `none`); `node`, the node's layout (see `node_json`).
/// `crius status` prints them.
fn verbose_info(daemon: &Daemon) -> HashMap<String, String> {
    let json_path = |p: &std::path::Path| serde_json::Value::from(p.display().to_string());
    let source = &daemon.config.source;
    let config_path = source
        .path
        .as_deref()
        .map_or(serde_json::Value::Null, json_path);
    let config_files: Vec<_> = source.files.iter().map(|p| json_path(p)).collect();
    let started_at = daemon
        .started_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    HashMap::from([
        ("config".to_string(), daemon.config.to_json()),
        ("configPath".to_string(), config_path.to_string()),
        (
            "configFiles".to_string(),
            serde_json::Value::from(config_files).to_string(),
        ),
        ("startedAt".to_string(), started_at.to_string()),
        ("pid".to_string(), std::process::id().to_string()),
        ("pulls".to_string(), pulls_json(daemon)),
        ("nri".to_string(), nri_json(daemon)),
        ("node".to_string(), node_json(daemon)),
    ])
}

/// What crius found of the node's layout: `cgroup` (`v1` or `v2`, the unified hierarchy at
/// `/sys/fs/cgroup`), `cgroupDriver` and `apparmor` (`off`, or what became of crius's default
/// profile: `crius-default loaded`, `no apparmor_parser: RuntimeDefault runs unconfined`,
/// `crius-default failed to load: <why>`).
fn node_json(daemon: &Daemon) -> String {
    use crate::apparmor::DefaultProfile;
    let unified = !daemon.host().cgroup_v1;
    let apparmor = if !crate::apparmor::enabled() {
        "off".to_string()
    } else {
        let name = crate::apparmor::DEFAULT_PROFILE;
        match crate::apparmor::default_profile() {
            Some(DefaultProfile::Loaded) => format!("{name} loaded"),
            Some(DefaultProfile::NoParser) => {
                "no apparmor_parser: RuntimeDefault runs unconfined".to_string()
            }
            Some(DefaultProfile::Failed(why)) => format!("{name} failed to load: {why}"),
            None => format!("{name} not loaded"),
        }
    };
    let driver = match daemon.config.cgroup.driver {
        crate::config::CgroupDriver::Cgroupfs => "cgroupfs",
        crate::config::CgroupDriver::Systemd => "systemd",
    };
    serde_json::json!({
        "cgroup": if unified { "v2" } else { "v1" },
        "cgroupDriver": driver,
        "apparmor": apparmor,
    })
    .to_string()
}

async fn checkpoint_json(daemon: &Daemon) -> String {
    let criu = crate::container::checkpoint::criu_binary(&daemon.config.runtime.criu_path).await;
    let handlers: serde_json::Map<String, serde_json::Value> = daemon
        .handlers()
        .usable()
        .map(|h| {
            let handlers = daemon.handlers();
            let can = match (&criu, h.checkpoint_support(), handlers.restorer(h)) {
                (Err(_), _, _) => crate::handlers::CheckpointSupport::None.describe(),
                (Ok(_), crate::handlers::CheckpointSupport::Checkpoint, Some(_)) => {
                    "checkpoint, restore (through runc)"
                }
                (Ok(_), support, _) => support.describe(),
            };
            (h.name.clone(), serde_json::Value::from(can))
        })
        .collect();
    // CheckpointPod freezes the containers' cgroups: v2, or v1 with the freezer mounted.
    let freezer = crate::cgroups::Hierarchy::host()
        .is_ok_and(|h| h.mode() == crate::cgroups::Mode::V2 || h.has_controller("freezer"));
    let pods = match (&criu, freezer) {
        (Ok(_), true) => "CheckpointPod, RestorePod",
        (Ok(_), false) => "none (no cgroup freezer)",
        (Err(_), _) => "none",
    };
    match criu {
        Ok(path) => serde_json::json!({
            "criu": path.display().to_string(), "handlers": handlers, "pods": pods
        }),
        Err(why) => serde_json::json!({
            "criu": null, "error": why, "handlers": handlers, "pods": pods
        }),
    }
    .to_string()
}

fn nri_json(daemon: &Daemon) -> String {
    let plugins: Vec<serde_json::Value> = daemon
        .nri
        .plugins()
        .iter()
        .map(|p| serde_json::json!({"index": p.index, "name": p.name, "launched": p.launched}))
        .collect();
    serde_json::json!({
        "enabled": daemon.nri.enabled(),
        "socket": daemon.nri.socket_state(),
        "plugins": plugins,
    })
    .to_string()
}

fn pulls_json(daemon: &Daemon) -> String {
    let pulls: Vec<serde_json::Value> = daemon
        .images
        .pulls_in_progress()
        .iter()
        .map(|p| {
            serde_json::json!({
                "image": p.image,
                "doneBytes": p.done_bytes,
                "totalBytes": p.total_bytes,
                "elapsedSeconds": p.elapsed.as_secs_f64(),
            })
        })
        .collect();
    serde_json::Value::from(pulls).to_string()
}
