//! The request resolved once: after the checks, one [`CreateRequest`] carries everything the
//! create's steps read (containerd's `createContainerRequest` is the model), so no step looks
//! up the pod, its handler, the image or the id maps again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crius_api::v1::{ContainerConfig, PodSandboxConfig};
use crius_image::ImageRecord;
use prost::Message as _;

use super::super::restore::RestoreSource;
use super::super::volumes::{self, PodUserns};
use super::super::{ContainerPaths, ContainerRecord, ContainerState};
use super::validate;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::Handler;
use crate::layout::PodPaths;
use crate::records::{SandboxRecord, SandboxState};
use crate::userns::IdMaps;
use crate::util::{excerpt, new_id, now_nanos};

/// A `CreateContainer` request with what it refers to looked up and checked.
pub(super) struct CreateRequest {
    pub id: String,
    /// `<name>_<pod name>_<namespace>_<pod uid>_<attempt>`, reserved for the container.
    pub name: String,
    pub config: ContainerConfig,
    /// The pod, `Ready` under its lock.
    pub pod: SandboxRecord,
    pub pod_config: PodSandboxConfig,
    /// The handler that runs the container: the pod's, or for a restore its restorer.
    pub handler: Handler,
    /// The image as the client named it (for a restore, the one checkpointed from).
    pub image_name: String,
    pub image: ImageRecord,
    /// The image's OCI config JSON.
    pub image_config: serde_json::Value,
    /// The signal that stops the container: the request's, the image's, else SIGTERM.
    pub stop_signal: i32,
    /// The pod's user namespace and its id maps, when it has one.
    pub userns: Option<PodUserns>,
    /// Where a restore starts from.
    pub restore: Option<RestoreSource>,
    pub paths: ContainerPaths,
    pub pod_paths: PodPaths,
    /// Where mounts are staged (`<bundle>/mounts`).
    pub staging: PathBuf,
}

impl CreateRequest {
    /// Where a restore's archive is unpacked.
    pub fn restore_dir(&self) -> PathBuf {
        self.paths.layer.join("restore")
    }

    /// The owner of what is made for the container: the pod's root in its user namespace.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.userns.as_ref().and_then(|u| u.maps.host_root())
    }

    /// The container's record as it is first written: `Creating`.
    pub fn record(&self) -> ContainerRecord {
        let log_path = match (
            self.pod_config.log_directory.is_empty(),
            self.config.log_path.is_empty(),
        ) {
            (false, false) => {
                Some(Path::new(&self.pod_config.log_directory).join(&self.config.log_path))
            }
            _ => None,
        };
        ContainerRecord {
            id: self.id.clone(),
            name: self.name.clone(),
            sandbox_id: self.pod.id.clone(),
            config: self.config.encode_to_vec(),
            image_id: self.image.id.clone(),
            image_name: self.image_name.clone(),
            image_ref: self
                .image
                .repo_digests
                .first()
                .cloned()
                .unwrap_or_else(|| self.image.id.clone()),
            state: ContainerState::Creating,
            created_at: now_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: None,
            log_path,
            stop_signal: self.stop_signal,
            resources: self
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .map(|r| r.encode_to_vec())
                .unwrap_or_default(),
        }
    }
}

/// The image a create runs: found by name, or what a restore source names.
struct Image {
    name: String,
    record: ImageRecord,
    restore: Option<RestoreSource>,
}

impl Daemon {
    /// Refuses a create in a pod still starting at once, not after its start (which may be
    /// waiting for an NRI plugin) releases the lock. The pod's full id.
    pub(super) fn pod_not_starting(&self, pod_id: &str) -> Result<String> {
        let pod = self.pod(pod_id)?;
        if pod.state == SandboxState::Creating {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready: it is still starting",
                pod.id
            )));
        }
        Ok(pod.id)
    }

    /// Looks up and checks what the request names, under the pod's lock: the pod (`Ready`),
    /// its handler, the image (or the checkpoint to restore) and its config, the pod's user
    /// namespace.
    pub(super) async fn resolve_create(
        self: &Arc<Self>,
        pod_id: &str,
        config: ContainerConfig,
    ) -> Result<CreateRequest> {
        let pod = self.pod(pod_id)?;
        if pod.state != SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let pod_config = pod.config();
        let pod_handler = self.handlers().get(&pod.runtime_handler)?;
        validate::for_handler(&config, pod_handler)?;
        let id_maps = self.pod_id_maps(&pod.id, &pod_config)?;
        let image = self.create_image(&config, &pod_config, pod_handler).await?;
        let userns = id_maps
            .map(|maps| self.open_userns(&pod.id, maps))
            .transpose()?;
        let image_config = self.image_config(&image.record)?;
        let stop_signal = crate::spec::stop_signal(&config, &image_config)?;
        // A built-in pod's restored container runs under runc (see `restore.rs`).
        let handler = match image.restore {
            Some(_) => self.handlers().restorer(pod_handler).unwrap_or(pod_handler),
            None => pod_handler,
        };
        let id = new_id().map_err(|e| Error::internal("draw a container id", e))?;
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, &id);
        Ok(CreateRequest {
            name: container_name(&config, &pod_config),
            handler: handler.clone(),
            image_name: image.name,
            image: image.record,
            restore: image.restore,
            image_config,
            stop_signal,
            userns,
            staging: volumes::staging_dir(&paths.bundle),
            pod_paths: PodPaths::new(&self.config.state, &pod.id),
            paths,
            id,
            config,
            pod,
            pod_config,
        })
    }

    /// The image of the create. An image that is an absolute path is a checkpoint archive to
    /// restore, and so is an image marked as one (as CRI-O takes both): the container runs
    /// the image it was checkpointed from.
    async fn create_image(
        self: &Arc<Self>,
        config: &ContainerConfig,
        pod_config: &PodSandboxConfig,
        handler: &Handler,
    ) -> Result<Image> {
        let name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let found = match name.starts_with('/') {
            true => None,
            false => self.images.get(&name)?,
        };
        let restore = match &found {
            None if name.starts_with('/') => Some(self.restore_source(&name, handler).await?),
            None => None,
            Some(record) => self.checkpoint_image(&name, record, handler).await?,
        };
        if let Some(r) = restore {
            super::super::restore::check_restorable(config, pod_config)?;
            return Ok(Image {
                name: r.image_name.clone(),
                record: r.image.clone(),
                restore: Some(r),
            });
        }
        let record = found
            .ok_or_else(|| Error::NotFound(format!("image {:?} not found", excerpt(&name))))?;
        Ok(Image {
            name,
            record,
            restore: None,
        })
    }

    /// The OCI config of an image, parsed.
    fn image_config(&self, image: &ImageRecord) -> Result<serde_json::Value> {
        serde_json::from_str(&self.images.config_json(image)?)
            .map_err(|e| Error::internal(format!("parse config of image {}", image.id), e))
    }

    /// The id maps of the pod's user namespace, when it has one. A directory may have been
    /// closed since the pod started: the pod's ids must still reach crius's root, state and
    /// pause binary, or the create fails inside.
    fn pod_id_maps(&self, pod_id: &str, pod_config: &PodSandboxConfig) -> Result<Option<IdMaps>> {
        let Some(maps) = crate::spec::pod_id_maps(pod_config)? else {
            return Ok(None);
        };
        if let Some((uid, gid)) = maps.host_root() {
            let dirs = [self.config.root.as_path(), self.config.state.as_path()];
            crate::userns::reachable(&dirs, &self.pause_binary, uid, gid).map_err(|why| {
                Error::FailedPrecondition(format!("pod {pod_id} has a user namespace: {why}"))
            })?;
        }
        Ok(Some(maps))
    }

    /// The pod's user namespace, for the container's idmapped mounts.
    fn open_userns(&self, pod_id: &str, maps: IdMaps) -> Result<PodUserns> {
        let pin = PodPaths::new(&self.config.state, pod_id).userns;
        let fd = crate::userns::open(&pin).map_err(|e| {
            Error::FailedPrecondition(format!(
                "pod {pod_id} has no user namespace any more: {}",
                crate::error::chain(&e)
            ))
        })?;
        Ok(PodUserns { fd, maps })
    }
}

/// The name a container reserves: `<name>_<pod name>_<namespace>_<pod uid>_<attempt>`.
fn container_name(config: &ContainerConfig, pod_config: &PodSandboxConfig) -> String {
    let pod_meta = pod_config.metadata.clone().unwrap_or_default();
    let meta = config.metadata.clone().unwrap_or_default();
    format!(
        "{}_{}_{}_{}_{}",
        meta.name, pod_meta.name, pod_meta.namespace, pod_meta.uid, meta.attempt
    )
}
