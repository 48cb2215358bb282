//! Containers: their records and their lifecycle through the pod's shim.
//!
//! A container is: a record (written before any side effect), a lease on its image's
//! snapshots, an overlay rootfs (`<root>/containers/<id>/{upper,work}` mounted on
//! `<state>/containers/<id>/rootfs`), an OCI bundle beside it, and the container in the pod's
//! shim. As for pods, one idempotent teardown undoes a failed create, serves
//! `RemoveContainer` and cleans up after a crius killed mid-way.

pub mod checkpoint;
mod create;
mod diagnose;
mod exec;
mod image_volumes;
mod recover;
mod release;
mod remove;
mod restore;
mod start;
mod stop;
mod update;
mod volumes;
mod watch;

use std::sync::Arc;

use crate::daemon::Daemon;
use crate::error::{Error, Result};
pub use crate::layout::ContainerPaths;
pub use crate::records::{ContainerRecord, ContainerState};
use crate::util::excerpt;
pub(crate) use restore::check_restorable;

/// The name a container's image is shown by, as containerd's CRI shows it: the name the user
/// gave (kubelet's `user_specified_image`), else the client's name unless that is the image's
/// id (kubelet sends the id it resolved), else a repo tag the image has, else its id.
pub fn shown_image_name(user_specified: &str, client: &str, tag: Option<&str>, id: &str) -> String {
    let pick = [user_specified, client]
        .into_iter()
        .find(|n| !n.is_empty() && !crius_image::is_image_id(n));
    pick.or(tag).unwrap_or(id).to_string()
}

/// What a container reports of its image.
pub struct ShownImage {
    /// `ImageSpec.image`: see [`shown_image_name`].
    pub name: String,
    /// `image_ref`: a repo digest the image has now, else the one it had at create (or its id).
    pub image_ref: String,
}

impl Daemon {
    /// `ReopenContainerLog`: only for a running container.
    pub async fn reopen_log(self: &Arc<Self>, id: &str) -> Result<()> {
        let c = self.container(id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        let shim = self.shims.get(&c.sandbox_id).await?;
        shim.reopen_log(&c.id).await?;
        Ok(())
    }

    /// What `r` reports of its image (ContainerStatus, ListContainers, events, metrics);
    /// `user_specified` is its config's `image.user_specified_image`. The image's names are
    /// those it has now: a tag moved to another image or the image removed changes them.
    pub fn shown_image(&self, r: &ContainerRecord, user_specified: &str) -> ShownImage {
        let (tag, digest) = self
            .images
            .names_of(&r.image_id)
            .ok()
            .flatten()
            .unwrap_or_default();
        ShownImage {
            name: shown_image_name(user_specified, &r.image_name, tag.as_deref(), &r.image_id),
            image_ref: digest.unwrap_or_else(|| r.image_ref.clone()),
        }
    }

    /// The OCI spec a container was created with.
    pub fn container_spec(&self, id: &str) -> Result<oci_spec::runtime::Spec> {
        self.read_container_spec(id)
    }

    /// The process of the OCI spec a container was created with; the rest of the spec is
    /// skipped, not built. ExecSync and ContainerStatus need only this, and kubelet's probes
    /// make ExecSync calls all the time: the whole spec's mounts, namespaces, seccomp profile
    /// and masked paths took most of the daemon's share of a probe.
    pub fn container_process(&self, id: &str) -> Result<Option<oci_spec::runtime::Process>> {
        #[derive(serde::Deserialize)]
        struct ProcessOnly {
            #[serde(default)]
            process: Option<oci_spec::runtime::Process>,
        }
        Ok(self.read_container_spec::<ProcessOnly>(id)?.process)
    }

    /// A container's `config.json`, read as `T`.
    fn read_container_spec<T: serde::de::DeserializeOwned>(&self, id: &str) -> Result<T> {
        let path = ContainerPaths::new(&self.config.root, &self.config.state, id)
            .bundle
            .join("config.json");
        let data = std::fs::read(&path)
            .map_err(|e| Error::internal(format!("read {}", path.display()), e))?;
        serde_json::from_slice(&data)
            .map_err(|e| Error::internal(format!("parse {}", path.display()), e))
    }

    /// The full id of a container from an id or a unique prefix of one.
    pub fn resolve_container_id(&self, id: &str) -> Result<Option<String>> {
        self.containers.resolve("container_id", "containers", id)
    }

    /// The record of a container that must exist.
    pub fn container(&self, id: &str) -> Result<ContainerRecord> {
        self.resolve_container_id(id)?
            .and_then(|id| self.containers.get(&id))
            .ok_or_else(|| Error::NotFound(format!("container {:?} not found", excerpt(id))))
    }

    /// The containers of a pod.
    pub fn containers_of(&self, pod_id: &str) -> Vec<ContainerRecord> {
        self.containers
            .filter_map(|c| (c.sandbox_id == pod_id).then(|| c.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::shown_image_name;

    #[test]
    fn an_image_is_shown_by_a_name_before_its_id() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let hex = "ab".repeat(32);
        let name = "docker.io/library/busybox:1.36";
        let tag = Some(name);
        // kubelet: the id it resolved, and the user's string.
        assert_eq!(shown_image_name("busybox", &id, tag, &id), "busybox");
        // An older kubelet, or a client naming the image by its id, bare or prefixed.
        assert_eq!(shown_image_name("", &id, tag, &id), name);
        assert_eq!(shown_image_name("", &hex, tag, &id), name);
        // crictl: the client's name as it gave it.
        assert_eq!(
            shown_image_name("", "busybox:1.36", tag, &id),
            "busybox:1.36"
        );
        // Nothing but the id left.
        assert_eq!(shown_image_name("", &id, None, &id), id);
        assert_eq!(shown_image_name("", "", None, &id), id);
    }
}
