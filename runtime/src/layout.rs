//! Where things of a pod or container are, all derived from ids, and the one writer of the
//! OCI spec files they run from.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::spec::HostFacts;

/// Paths of a pod, all derived from its id.
pub struct PodPaths {
    pub dir: PathBuf,
    pub shm: PathBuf,
    pub pause_bundle: PathBuf,
    pub netns_dir: PathBuf,
    /// Where the pin of the pod's user namespace is, when it has one: `<userns_dir>/<id>`.
    pub userns_dir: PathBuf,
    pub userns: PathBuf,
}

impl PodPaths {
    pub fn new(state: &Path, id: &str) -> PodPaths {
        let dir = state.join("pods").join(id);
        PodPaths {
            shm: dir.join("shm"),
            pause_bundle: dir.join("pause"),
            dir,
            netns_dir: state.join("netns"),
            userns_dir: state.join("userns"),
            userns: state.join("userns").join(id),
        }
    }
}

/// Paths of a container, all derived from its id.
pub struct ContainerPaths {
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub layer: PathBuf,
}

impl ContainerPaths {
    pub fn new(root: &Path, state: &Path, id: &str) -> ContainerPaths {
        let bundle = state.join("containers").join(id);
        ContainerPaths {
            rootfs: bundle.join("rootfs"),
            bundle,
            layer: root.join("containers").join(id),
        }
    }
}

/// Writes `config.json` into a bundle directory, adapted to what this node has:
/// `oom_score_adj` clamped to what it allows ([`HostFacts::min_oom_score_adj`]), and
/// hugepage limits dropped when there is no hugetlb controller (kubelet sends a zero limit
/// for every page size, and libcontainer refuses limits of a missing controller).
pub fn write_spec(bundle: &Path, spec: &oci_spec::runtime::Spec, host: &HostFacts) -> Result<()> {
    let mut spec = spec.clone();
    if let Some(process) = spec.process_mut() {
        if let Some(adj) = process.oom_score_adj() {
            if adj < host.min_oom_score_adj {
                process.set_oom_score_adj(Some(host.min_oom_score_adj));
            }
        }
    }
    if !host.hugetlb {
        if let Some(resources) = spec
            .linux_mut()
            .as_mut()
            .and_then(|l| l.resources_mut().as_mut())
        {
            resources.set_hugepage_limits(None);
        }
    }
    let spec = &spec;
    std::fs::create_dir_all(bundle)
        .map_err(|e| Error::internal(format!("create {}", bundle.display()), e))?;
    let json = serde_json::to_vec(spec).map_err(|e| Error::internal("encode OCI spec", e))?;
    // Bundles live in the state directory, which a reboot empties along with every container:
    // the file only has to outlive processes, not the machine, so it is not synced (as the
    // shim's exit records are not). A sync cost one disk flush per CreateContainer where the
    // state directory is not a tmpfs.
    crius_common::fs::write_atomic(
        &bundle.join("config.json"),
        &json,
        None,
        crius_common::fs::Durability::None,
    )
    .map_err(|e| Error::internal(format!("write {}/config.json", bundle.display()), e))
}
