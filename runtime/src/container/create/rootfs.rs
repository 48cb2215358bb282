//! The container's files: its rootfs over the leased image layers (with a restore's files
//! applied), the host directories its mounts name, the image's `VOLUME`s and the staged
//! volumes, which give the config its spec is built from.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crius_api::v1::{ContainerConfig, Mount};

use super::super::{image_volumes, volumes};
use super::resolved::CreateRequest;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::util::{excerpt, Phases};

impl Daemon {
    /// Mounts the rootfs over `lowerdirs` and makes and stages what the mounts need: the
    /// config to build the spec from (image volumes and idmapped volumes as binds of staged
    /// mounts).
    pub(super) async fn make_rootfs(
        &self,
        req: &CreateRequest,
        lowerdirs: &[PathBuf],
        phases: &mut Phases,
    ) -> Result<ContainerConfig> {
        let paths = &req.paths;
        volumes::mount_rootfs(
            lowerdirs,
            &paths.layer.join("upper"),
            &paths.layer.join("work"),
            &paths.rootfs,
            &req.staging,
            req.userns.as_ref(),
        )?;
        phases.mark("rootfs");
        if let Some(restore) = &req.restore {
            self.unpack_checkpoint(&restore.archive, &req.restore_dir(), &paths.rootfs)
                .await?;
            phases.mark("unpack_checkpoint");
        }
        make_missing_host_paths(&req.config)?;
        let mount_config = self.with_image_volumes(req)?;
        phases.mark("image_config");
        let staged =
            self.stage_volumes(&req.id, &mount_config, &req.staging, req.userns.as_ref())?;
        phases.mark("volumes");
        Ok(staged)
    }

    /// The request's config with the image's own VOLUMEs added as mounts of copies, as
    /// containerd gives them, unless the node turned them off.
    fn with_image_volumes<'a>(&self, req: &'a CreateRequest) -> Result<Cow<'a, ContainerConfig>> {
        let declared = image_volumes::declared(&req.image_config);
        if declared.is_empty() || self.config.runtime.ignore_image_defined_volumes {
            return Ok(Cow::Borrowed(&req.config));
        }
        let extra = image_volumes::stage(
            &declared,
            &req.config,
            &req.paths.rootfs,
            &req.paths.layer.join("volumes"),
            req.owner().unwrap_or((0, 0)),
        )?;
        let mut config = req.config.clone();
        config.mounts.extend(extra);
        Ok(Cow::Owned(config))
    }
}

/// A bind mount of a missing host path gets a directory, as kubelet users expect.
fn make_missing_host_paths(config: &ContainerConfig) -> Result<()> {
    for (i, m) in config.mounts.iter().enumerate() {
        let host = Path::new(&m.host_path);
        if host.is_absolute() && !host.exists() {
            std::fs::create_dir_all(host).map_err(|e| missing_host_path(i, m, e))?;
        }
    }
    Ok(())
}

/// Why the directory for a mount's missing host path could not be made (see [`dir_error`]).
fn missing_host_path(i: usize, m: &Mount, e: std::io::Error) -> Error {
    dir_error(
        format!(
            "mounts[{i}] ({}): host_path {} does not exist and cannot be made a directory",
            excerpt(&m.container_path),
            excerpt(&m.host_path)
        ),
        e,
    )
}

/// A directory a request names that could not be made: the path's fault (something there
/// that cannot be followed or is not a directory, a file on the way, too long, a file system
/// such as procfs that makes no directories and answers ENOENT) is InvalidArgument; a node
/// that refuses it (read-only, full, permissions) FailedPrecondition.
pub(super) fn dir_error(what: String, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EEXIST | libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP | libc::ENOENT) => {
            Error::InvalidArgument(format!("{what}: {e}"))
        }
        Some(libc::EROFS | libc::EACCES | libc::EPERM | libc::ENOSPC | libc::EDQUOT) => {
            Error::FailedPrecondition(format!("{what}: {e}"))
        }
        _ => Error::internal(what, e),
    }
}
