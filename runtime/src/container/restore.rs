//! Restore: a `CreateContainer` whose image is the path of a checkpoint archive (written by
//! `CheckpointContainer`, see [`super::checkpoint`]) makes the container from the image the
//! checkpoint was taken of, applies the archive's writable layer to its rootfs, and has the
//! OCI runtime restore its processes (`<rt> restore`) instead of creating them. CRIU leaves
//! them stopped (`leave-stopped`, through the configuration file the spec's `org.criu.config`
//! annotation names), so nothing runs before `StartContainer`, which continues them.
//!
//! Only runtimes with a restore can do it (runc, crun): libcontainer 0.7 has none. In a pod
//! of the built-in handler the restored container is run by the `runc` handler's runc instead
//! (the pod's shim keeps the runtime of each container, so its later operations go to runc
//! too; `Handlers::restorer`). runc restores the built-in handler's checkpoints as well as its
//! own (the CRIU images do not depend on who dumped them; libcontainer marks bind mounts and
//! the network namespace external as runc does). The container's processes, memory and open files come from the archive; its command
//! and arguments in the request are not used. Its mounts must be the ones it was
//! checkpointed with (CRIU finds each bind mount by its destination), its pod may be another
//! one: the network namespace is the new pod's, TCP connections are not restored.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crius_image::ImageRecord;

use super::checkpoint::{self, archive, names, ConfigDump};
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::{CheckpointSupport, Handler};
use crate::util::excerpt;

/// The CRIU configuration a restore gets: the processes wait, stopped, for the start.
const CRIU_RESTORE_CONF: &str = "leave-stopped\n";

/// What a restore starts from.
pub(super) struct RestoreSource {
    pub archive: PathBuf,
    /// The criu binary that restores it.
    pub criu: PathBuf,
    pub image_name: String,
    pub image: ImageRecord,
}

/// What a restore cannot do with this container: join the pod's (or another container's) PID
/// namespace (runc 1.1 cannot restore into an existing one), or run in a user namespace
/// (untested).
pub(crate) fn check_restorable(
    config: &crius_api::v1::ContainerConfig,
    pod_config: &crius_api::v1::PodSandboxConfig,
) -> Result<()> {
    let own = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let pod = pod_config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let ns = own.or(pod);
    if ns.map_or(0, |n| n.pid) != crius_api::v1::NamespaceMode::Container as i32 {
        return Err(Error::FailedPrecondition(
            "config.linux.security_context.namespace_options.pid: a restored container needs \
             its own PID namespace (CONTAINER); runc 1.1 cannot restore into the pod's or \
             another container's"
                .into(),
        ));
    }
    if ns
        .and_then(|n| n.userns_options.as_ref())
        .is_some_and(|u| u.mode != crius_api::v1::NamespaceMode::Node as i32)
    {
        return Err(Error::FailedPrecondition(
            "namespace_options.userns_options: restoring into a user-namespaced pod is not \
             supported"
                .into(),
        ));
    }
    Ok(())
}

/// The manifest annotation that marks an image as a checkpoint: its one layer is a checkpoint
/// archive's contents (as `checkpointctl build` or `buildah add` + `buildah config
/// --annotation` make it); the value is the checkpointed container's name.
pub(crate) const CHECKPOINT_IMAGE_ANNOTATION: &str =
    "io.kubernetes.cri-o.annotations.checkpoint.name";

/// `config.dump` of the archive at `path` (a tar, or the directory of a checkpoint image's
/// unpacked layer), read without unpacking the rest.
fn read_config_dump(path: &Path) -> std::io::Result<Option<ConfigDump>> {
    if path.is_dir() {
        let file = match std::fs::File::open(path.join(names::CONFIG_DUMP)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut data = Vec::new();
        file.take(1 << 20).read_to_end(&mut data)?;
        return serde_json::from_slice(&data)
            .map(Some)
            .map_err(std::io::Error::other);
    }
    let mut ar = tar::Archive::new(std::io::BufReader::new(std::fs::File::open(path)?));
    for entry in ar.entries()? {
        let mut entry = entry?;
        if entry.path()?.as_os_str() == names::CONFIG_DUMP {
            let mut data = Vec::new();
            entry.by_ref().take(1 << 20).read_to_end(&mut data)?;
            return serde_json::from_slice(&data)
                .map(Some)
                .map_err(std::io::Error::other);
        }
    }
    Ok(None)
}

/// Adds the CRIU configuration of a restore to `spec`, written beside the unpacked archive.
pub(super) fn restore_spec(
    mut spec: oci_spec::runtime::Spec,
    restore_dir: &Path,
) -> Result<oci_spec::runtime::Spec> {
    let conf = restore_dir.join("criu-restore.conf");
    std::fs::write(&conf, CRIU_RESTORE_CONF)
        .map_err(|e| Error::internal(format!("write {}", conf.display()), e))?;
    let mut notes = spec.annotations().clone().unwrap_or_default();
    notes.insert("org.criu.config".to_owned(), conf.display().to_string());
    spec.set_annotations(Some(notes));
    Ok(spec)
}

impl Daemon {
    /// When image `name` (found as `record`) is a checkpoint image (see
    /// [`CHECKPOINT_IMAGE_ANNOTATION`]), the source of its restore: its unpacked layer is the
    /// archive. `None` for any other image.
    pub(super) async fn checkpoint_image(
        self: &Arc<Self>,
        name: &str,
        record: &ImageRecord,
        handler: &Handler,
    ) -> Result<Option<RestoreSource>> {
        // Only a one-layer image can be one; others are not read further.
        if record.layers.len() != 1 {
            return Ok(None);
        }
        let annotations = self.images.manifest_annotations(record)?;
        if !annotations.contains_key(CHECKPOINT_IMAGE_ANNOTATION) {
            return Ok(None);
        }
        let layer = self
            .images
            .lowerdirs(name)?
            .into_iter()
            .next()
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "checkpoint image {:?} has no unpacked layer",
                    excerpt(name)
                ))
            })?;
        self.restore_source_at(layer, name, handler).await.map(Some)
    }

    /// Checks that `path` (`config.image.image`) is a checkpoint archive this pod's handler
    /// can restore, and finds the image it was taken of.
    pub(super) async fn restore_source(
        self: &Arc<Self>,
        path: &str,
        handler: &Handler,
    ) -> Result<RestoreSource> {
        let bad = |why: String| {
            Error::InvalidArgument(format!("config.image.image {:?}: {why}", excerpt(path)))
        };
        if path.contains('\0') || path.len() > 4096 {
            return Err(bad("not a path (NUL, or longer than 4096 bytes)".into()));
        }
        let archive = PathBuf::from(path);
        if !archive.is_file() {
            return Err(Error::NotFound(format!(
                "config.image.image {:?}: no checkpoint archive at this path",
                excerpt(path)
            )));
        }
        self.restore_source_at(archive, path, handler).await
    }

    /// [`Daemon::restore_source`] once the archive (a tar, or an unpacked checkpoint image) is
    /// found; `path` is how the request named it.
    async fn restore_source_at(
        self: &Arc<Self>,
        archive: PathBuf,
        path: &str,
        handler: &Handler,
    ) -> Result<RestoreSource> {
        let bad = |why: String| {
            Error::InvalidArgument(format!("config.image.image {:?}: {why}", excerpt(path)))
        };
        if self.handlers().restorer(handler).is_none() {
            let why = match handler.checkpoint_support() {
                CheckpointSupport::None => "cannot restore CRIU checkpoints",
                _ => {
                    "(the built-in one, libcontainer 0.7) cannot restore a checkpoint, and no \
                      usable runc handler can restore it instead"
                }
            };
            return Err(Error::Unsupported(format!(
                "restore of {:?}: runtime handler {:?} ({}) {why}",
                excerpt(path),
                handler.name,
                handler.config.binary.display()
            )));
        }
        let criu = checkpoint::criu_binary(&self.config.runtime.criu_path)
            .await
            .map_err(Error::FailedPrecondition)?;
        let archive2 = archive.clone();
        let dump = tokio::task::spawn_blocking(move || read_config_dump(&archive2))
            .await
            .map_err(|e| Error::internal("read checkpoint archive task", e))?
            .map_err(|e| bad(format!("not a checkpoint archive: {e}")))?
            .ok_or_else(|| {
                bad(format!(
                    "not a checkpoint archive: no {}",
                    names::CONFIG_DUMP
                ))
            })?;
        let image = [&dump.rootfs_image_name, &dump.rootfs_image]
            .into_iter()
            .filter(|n| !n.is_empty())
            .find_map(|n| self.images.get(n).ok().flatten())
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "image {:?} ({}) that checkpoint {:?} was taken of is not on this node: \
                     pull it first",
                    excerpt(&dump.rootfs_image_name),
                    excerpt(&dump.rootfs_image),
                    excerpt(path)
                ))
            })?;
        Ok(RestoreSource {
            archive,
            criu,
            image_name: dump.rootfs_image_name,
            image,
        })
    }

    /// Unpacks the archive into `dir` and applies its writable layer to the mounted `rootfs`.
    pub(super) async fn unpack_checkpoint(
        &self,
        archive: &Path,
        dir: &Path,
        rootfs: &Path,
    ) -> Result<()> {
        let (archive, dir, rootfs) = (
            archive.to_path_buf(),
            dir.to_path_buf(),
            rootfs.to_path_buf(),
        );
        let shown = archive.display().to_string();
        tokio::task::spawn_blocking(move || {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            std::fs::create_dir_all(&dir)?;
            archive::unpack(&archive, &dir)?;
            if !dir.join(names::CHECKPOINT_DIR).is_dir() {
                return Err(std::io::Error::other(format!(
                    "no {}/ directory of CRIU images",
                    names::CHECKPOINT_DIR
                )));
            }
            archive::apply_rootfs_diff(&dir, &rootfs)
        })
        .await
        .map_err(|e| Error::internal("unpack checkpoint task", e))?
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "config.image.image {:?}: cannot unpack the checkpoint archive: {e}",
                excerpt(&shown)
            ))
        })
    }
}
