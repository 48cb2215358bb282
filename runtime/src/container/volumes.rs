//! The host side of a container's mounts: what must be mounted before the container is
//! created, in `<bundle>/mounts/`, and taken down before the bundle is removed.
//!
//! - The rootfs of a user-namespaced pod's container: an overlay over idmapped binds of the
//!   image layers (staged as `layer-<n>` only while the overlay is mounted; overlayfs keeps
//!   its own reference to each layer), with upper and work directories owned by the pod's root.
//! - Image volumes (`Mount.image`): the image's layers, read-only, at `image-<i>` (an overlay,
//!   or a bind for a one-layer image), bound into the container from there or from its
//!   `image_sub_path`. The image's snapshots are leased by `<container id>.vol<i>`.
//! - Idmapped volumes (`Mount.uid_mappings`/`gid_mappings`, which kubelet sends in a
//!   user-namespaced pod): an idmapped bind of the host path at `volume-<i>`.
//! - PRIVATE mounts of a container that also has a propagating one: a private bind of the host
//!   path at `private-<i>` (see `isolate_private_mounts`).
//!
//! Nothing here is ever removed recursively: a staged mount is unmounted, then its mount
//! point removed, so a failed unmount never reaches into the host files behind it.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crius_api::v1::{ContainerConfig, MountPropagation};

use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::mounts;
use crate::userns::{self, IdMaps};

/// The user namespace of a container's pod, for idmapped mounts.
pub(crate) struct PodUserns {
    pub fd: OwnedFd,
    pub maps: IdMaps,
}

pub(crate) fn staging_dir(bundle: &Path) -> PathBuf {
    bundle.join("mounts")
}

/// The lease holder of image volume `i` of container `id`.
pub(crate) fn image_lease(id: &str, i: usize) -> String {
    format!("{id}.vol{i}")
}

fn internal(what: &str, path: &Path, e: impl Into<crate::error::BoxError>) -> Error {
    Error::internal(format!("{what} {}", path.display()), e)
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| internal("create", path, e))
}

/// Idmapped binds of `lowerdirs` at `<staging>/<prefix>-<n>`, in order.
fn idmap_layers(
    lowerdirs: &[PathBuf],
    staging: &Path,
    prefix: &str,
    userns: &PodUserns,
) -> Result<Vec<PathBuf>> {
    let mut staged = Vec::with_capacity(lowerdirs.len());
    for (n, lower) in lowerdirs.iter().enumerate() {
        let target = staging.join(format!("{prefix}-{n}"));
        mkdir(&target)?;
        let bound = userns::idmapped_bind(lower, &target, userns.fd.as_fd(), false);
        if let Err(e) = bound {
            let _ = std::fs::remove_dir(&target);
            drop_staged(&staged);
            return Err(e.into());
        }
        staged.push(target);
    }
    Ok(staged)
}

/// Unmounts and removes staged mount points (best effort: used on the way out).
fn drop_staged(staged: &[PathBuf]) {
    for p in staged {
        if mounts::unmount(p).is_ok() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Mounts the container's rootfs on `target`: the plain overlay, or with `userns` the overlay
/// over idmapped layers with an upper directory the pod's root owns.
pub(crate) fn mount_rootfs(
    lowerdirs: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
    staging: &Path,
    userns: Option<&PodUserns>,
) -> Result<()> {
    let Some((ns, (uid, gid))) = userns.and_then(|ns| Some((ns, ns.maps.host_root()?))) else {
        return Ok(mounts::mount_overlay(lowerdirs, upper, work, target)?);
    };
    for dir in [upper, work] {
        mkdir(dir)?;
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .map_err(|e| internal("chown", dir, e))?;
    }
    mkdir(staging)?;
    let staged = idmap_layers(lowerdirs, staging, "layer", ns)?;
    let mounted = mounts::mount_overlay(&staged, upper, work, target);
    // the overlay holds its own references to the layers
    drop_staged(&staged);
    Ok(mounted?)
}

/// A relative path inside an image volume, without `..` or a root.
fn clean_sub_path(sub: &str, container_path: &str) -> Result<PathBuf> {
    let p = Path::new(sub);
    if p.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(p.to_path_buf())
    } else {
        Err(Error::InvalidArgument(format!(
            "mount {container_path}: image_sub_path {sub:?} must be a relative path inside the image"
        )))
    }
}

/// Makes `<staging>/<name>`, a directory or a file as `m`'s host path is, to mount it on.
fn mount_point_for(m: &crius_api::v1::Mount, staging: &Path, name: &str) -> Result<PathBuf> {
    let meta = std::fs::metadata(&m.host_path).map_err(|e| {
        Error::InvalidArgument(format!(
            "mount {}: host_path {}: {e}",
            m.container_path, m.host_path
        ))
    })?;
    let target = staging.join(name);
    mkdir(staging)?;
    if meta.is_dir() {
        mkdir(&target)?;
    } else {
        std::fs::File::create(&target).map_err(|e| internal("create", &target, e))?;
    }
    Ok(target)
}

/// Gives PRIVATE mounts a private source when another mount of the container propagates.
/// libcontainer 0.7 ignores the propagation of each bind: a bind is a clone of its source
/// in the container's mount namespace, which the root's propagation (`slave` or `shared`
/// as soon as one mount propagates) made a receiver of host mounts. A private staged copy
/// stays private there, and so does the container's bind of it.
fn isolate_private_mounts(config: &mut ContainerConfig, staging: &Path) -> Result<()> {
    let private = MountPropagation::PropagationPrivate as i32;
    if config.mounts.iter().all(|m| m.propagation == private) {
        return Ok(());
    }
    for (i, m) in config.mounts.iter_mut().enumerate() {
        if m.propagation != private {
            continue;
        }
        let source = PathBuf::from(&m.host_path);
        // already staged (image or idmapped volume): its mount point is the first
        // component under the staging directory
        if let Ok(rest) = source.strip_prefix(staging) {
            if let Some(first) = rest.components().next() {
                mounts::make_private(&staging.join(first))?;
            }
            continue;
        }
        let target = mount_point_for(m, staging, &format!("private-{i}"))?;
        mounts::bind_private(&source, &target)?;
        m.host_path = target.to_string_lossy().into_owned();
    }
    Ok(())
}

impl Daemon {
    /// Mounts what the container's CRI mounts need on the host and returns the config to build
    /// the spec from: image volumes and idmapped volumes replaced by binds of the staged mounts.
    pub(crate) fn stage_volumes(
        &self,
        id: &str,
        config: &ContainerConfig,
        staging: &Path,
        userns: Option<&PodUserns>,
    ) -> Result<ContainerConfig> {
        // Image volumes are read-only by the CRI's definition; refused before anything is
        // mounted, so nothing needs undoing.
        if let Some(m) = config
            .mounts
            .iter()
            .find(|m| m.image.as_ref().is_some_and(|s| !s.image.is_empty()) && !m.readonly)
        {
            return Err(Error::InvalidArgument(format!(
                "mount {}: an image volume must be readonly (readonly is false)",
                m.container_path
            )));
        }
        let mut out = config.clone();
        for (i, m) in out.mounts.iter_mut().enumerate() {
            let image = m
                .image
                .as_ref()
                .map_or("", |s| s.image.as_str())
                .to_string();
            if !image.is_empty() && m.host_path.is_empty() {
                let mountpoint = self.mount_image_volume(id, i, &image, staging, userns)?;
                let source = if m.image_sub_path.is_empty() {
                    mountpoint
                } else {
                    let sub =
                        mountpoint.join(clean_sub_path(&m.image_sub_path, &m.container_path)?);
                    // symlinks in the image may not lead out of it
                    let real = sub.canonicalize().map_err(|_| {
                        Error::InvalidArgument(format!(
                            "mount {}: image_sub_path {:?} does not exist in image {image}",
                            m.container_path, m.image_sub_path
                        ))
                    })?;
                    if !real.starts_with(&mountpoint) {
                        return Err(Error::InvalidArgument(format!(
                            "mount {}: image_sub_path {:?} leads out of image {image}",
                            m.container_path, m.image_sub_path
                        )));
                    }
                    real
                };
                m.host_path = source.to_string_lossy().into_owned();
                m.image = None;
                m.image_sub_path.clear();
                m.readonly = true;
                continue;
            }
            if m.uid_mappings.is_empty() && m.gid_mappings.is_empty() {
                continue;
            }
            if m.uid_mappings.is_empty() || m.gid_mappings.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "mount {}: an idmapped mount needs both uid_mappings and gid_mappings",
                    m.container_path
                )));
            }
            let maps = IdMaps {
                uids: crate::spec::id_mappings(&m.uid_mappings)?,
                gids: crate::spec::id_mappings(&m.gid_mappings)?,
            };
            let source = Path::new(&m.host_path);
            let target = mount_point_for(m, staging, &format!("volume-{i}"))?;
            let own;
            let fd = match userns {
                Some(ns) if ns.maps == maps => ns.fd.as_fd(),
                _ => {
                    own = userns::open_new(&maps).map_err(Error::from)?;
                    own.as_fd()
                }
            };
            userns::idmapped_bind(source, &target, fd, true).map_err(|e| match Error::from(e) {
                Error::FailedPrecondition(why) => {
                    Error::FailedPrecondition(format!("mount {}: {why}", m.container_path))
                }
                other => other,
            })?;
            m.host_path = target.to_string_lossy().into_owned();
            m.uid_mappings.clear();
            m.gid_mappings.clear();
        }
        isolate_private_mounts(&mut out, staging)?;
        Ok(out)
    }

    /// Mounts image `image`'s layers read-only at `<staging>/image-<i>`.
    fn mount_image_volume(
        &self,
        id: &str,
        i: usize,
        image: &str,
        staging: &Path,
        userns: Option<&PodUserns>,
    ) -> Result<PathBuf> {
        let record = self.images.get(image)?.ok_or_else(|| {
            Error::NotFound(format!("image {image:?} of an image volume not found"))
        })?;
        let lowerdirs = self.images.lease(&image_lease(id, i), &record.id)?;
        let target = staging.join(format!("image-{i}"));
        mkdir(&target)?;
        let staged = match userns {
            Some(ns) => idmap_layers(&lowerdirs, staging, &format!("image-{i}-layer"), ns)?,
            None => lowerdirs,
        };
        let mounted = match staged.as_slice() {
            [] => Err(Error::InvalidArgument(format!(
                "image {image:?} of an image volume has no layers"
            ))),
            [only] => mounts::bind_read_only(only, &target).map_err(Error::from),
            many => mounts::mount_overlay_read_only(many, &target).map_err(Error::from),
        };
        if userns.is_some() {
            drop_staged(&staged);
        }
        mounted?;
        Ok(target)
    }
}

/// Unmounts everything staged in `staging` and removes it. Fails (leaving the directory) if a
/// mount will not go, so that the caller never removes a tree with host files mounted in it.
pub(crate) fn unstage(staging: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(staging) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(internal("read", staging, e)),
    };
    for entry in entries {
        let path = entry.map_err(|e| internal("read", staging, e))?.path();
        mounts::unmount(&path)?;
        let removed = if path.is_dir() {
            std::fs::remove_dir(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(internal("remove", &path, e)),
        }
    }
    match std::fs::remove_dir(staging) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal("remove", staging, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside() {
        assert_eq!(
            clean_sub_path("etc/conf", "/c").unwrap(),
            PathBuf::from("etc/conf")
        );
        for bad in ["/etc", "../x", "a/../../b", "."] {
            assert!(clean_sub_path(bad, "/c").is_err(), "{bad}");
        }
    }

    #[test]
    fn unstage_removes_mount_points_and_never_host_files() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("keep"), "x").unwrap();
        let staging = dir.path().join("mounts");
        let point = staging.join("image-0");
        std::fs::create_dir_all(&point).unwrap();
        mounts::bind_read_only(&host, &point).unwrap();
        std::fs::write(staging.join("volume-1"), "").unwrap();
        unstage(&staging).unwrap();
        assert!(!staging.exists());
        assert!(host.join("keep").exists());
        unstage(&staging).unwrap();
    }
}
