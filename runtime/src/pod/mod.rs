//! Pod sandboxes: their records and their lifecycle.
//!
//! A pod is: a record (written before any side effect), a directory of shared files
//! (`<state>/pods/<id>`: hostname, hosts, resolv.conf, the `/dev/shm` tmpfs, the pause bundle),
//! a pinned network namespace (`<state>/netns/<id>`) attached through CNI, a shim
//! (`<state>/shims/<id>`) and the pause process it runs. Every path derives from the id, so one
//! idempotent teardown undoes a failed `RunPodSandbox`, serves `Stop`/`RemovePodSandbox`, and
//! cleans up after a crius killed mid-way.

pub mod checkpoint;
pub mod files;
mod recover;
mod remove;
mod restore;
mod run;
mod stop;
mod watch;

use crius_api::v1::{NamespaceMode, PodSandboxConfig};

use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::util::excerpt;

pub use crate::layout::{write_spec, PodPaths};
pub use crate::records::{SandboxRecord, SandboxState};

/// The namespace modes a pod asked for.
pub fn namespace_modes(config: &PodSandboxConfig) -> (NamespaceMode, NamespaceMode, NamespaceMode) {
    let opts = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let mode = |v: Option<i32>| {
        v.and_then(|v| NamespaceMode::try_from(v).ok())
            .unwrap_or(NamespaceMode::Pod)
    };
    (
        mode(opts.map(|o| o.network)),
        mode(opts.map(|o| o.pid)),
        mode(opts.map(|o| o.ipc)),
    )
}

impl Daemon {
    /// The full id of a pod from an id or a unique prefix of one; `None` when none matches.
    pub fn resolve_pod_id(&self, id: &str) -> Result<Option<String>> {
        self.sandboxes.resolve("pod_sandbox_id", "pods", id)
    }

    /// The record of a pod that must exist.
    pub fn pod(&self, id: &str) -> Result<SandboxRecord> {
        self.resolve_pod_id(id)?
            .and_then(|id| self.sandboxes.get(&id))
            .ok_or_else(|| Error::NotFound(format!("pod sandbox {:?} not found", excerpt(id))))
    }
}
