//! The mounts the daemon makes for pods and containers: a container's overlay rootfs and a
//! pod's `/dev/shm` tmpfs. Every mount here has its unmount beside it; both are idempotent.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount {what} on {target}")]
    Mount {
        what: &'static str,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unmount {target}")]
    Unmount {
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(crate) fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn mount(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let src = CString::new(source).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let tgt = cstr(target)?;
    let fs = CString::new(fstype).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let dat = CString::new(data).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fs.as_ptr(),
            flags,
            dat.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Remounts the filesystem at `target` with `data` as its filesystem options.
pub fn remount_with_data(target: &Path, data: &str) -> io::Result<()> {
    mount("", target, "", libc::MS_REMOUNT, data)
}

/// Whether `path` is a mount point (its device differs from its parent's, or it is listed in
/// mountinfo — a bind of the same filesystem keeps the device).
pub fn is_mountpoint(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let listed = crius_common::mountinfo::mounts(&info).any(|m| m.mount_point == path);
    listed
}

/// Unmounts `target` if it is mounted (lazily, so a busy mount does not fail a removal).
pub fn unmount(target: &Path) -> Result<(), MountError> {
    let tgt = cstr(target).map_err(|source| MountError::Unmount {
        target: target.to_path_buf(),
        source,
    })?;
    loop {
        // SAFETY: tgt is a valid NUL-terminated path.
        let rc = unsafe { libc::umount2(tgt.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
        if rc == 0 {
            // Stacked mounts on one target: take them all off.
            continue;
        }
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            // Not mounted, or not there at all: nothing to undo.
            Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()),
            _ => Err(MountError::Unmount {
                target: target.to_path_buf(),
                source: err,
            }),
        };
    }
}

fn mkdir(path: &Path) -> Result<(), MountError> {
    std::fs::create_dir_all(path).map_err(|source| MountError::Create {
        path: path.to_path_buf(),
        source,
    })
}

/// The `lowerdir=` option of an overlay of `lowerdirs` (top first), with `index=off`.
fn lower_options(lowerdirs: &[PathBuf]) -> String {
    let lower: Vec<String> = lowerdirs
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    format!("lowerdir={},index=off", lower.join(":"))
}

/// Mounts an overlay of `lowerdirs` (top first) with `upper` and `work` on `target`.
/// Without lowerdirs (an image with no layers) the rootfs is a bind of `upper`.
pub fn mount_overlay(
    lowerdirs: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), MountError> {
    mkdir(upper)?;
    mkdir(work)?;
    mkdir(target)?;
    let err = |source| MountError::Mount {
        what: "overlay",
        target: target.to_path_buf(),
        source,
    };
    if lowerdirs.is_empty() {
        return mount(&upper.to_string_lossy(), target, "", libc::MS_BIND, "").map_err(err);
    }
    let data = format!(
        "{},upperdir={},workdir={}",
        lower_options(lowerdirs),
        upper.display(),
        work.display()
    );
    mount("overlay", target, "overlay", 0, &data).map_err(err)
}

/// Mounts a read-only overlay of `lowerdirs` (top first, at least two) on `target`.
pub fn mount_overlay_read_only(lowerdirs: &[PathBuf], target: &Path) -> Result<(), MountError> {
    mkdir(target)?;
    mount(
        "overlay",
        target,
        "overlay",
        libc::MS_RDONLY,
        &lower_options(lowerdirs),
    )
    .map_err(|source| MountError::Mount {
        what: "overlay",
        target: target.to_path_buf(),
        source,
    })
}

/// Binds `source` on `target` (an existing directory) read-only.
pub fn bind_read_only(source: &Path, target: &Path) -> Result<(), MountError> {
    let err = |source| MountError::Mount {
        what: "bind",
        target: target.to_path_buf(),
        source,
    };
    mount(&source.to_string_lossy(), target, "", libc::MS_BIND, "").map_err(err)?;
    let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
    if let Err(e) = mount("", target, "", ro, "") {
        let _ = unmount(target);
        return Err(err(e));
    }
    Ok(())
}

/// Binds `source` (with its submounts) on `target` (an existing directory or file) and makes
/// the copy private, so that it neither receives nor sends mount events.
pub fn bind_private(source: &Path, target: &Path) -> Result<(), MountError> {
    let err = |source| MountError::Mount {
        what: "private bind",
        target: target.to_path_buf(),
        source,
    };
    let flags = libc::MS_BIND | libc::MS_REC;
    mount(&source.to_string_lossy(), target, "", flags, "").map_err(err)?;
    if let Err(e) = make_private(target) {
        let _ = unmount(target);
        return Err(e);
    }
    Ok(())
}

/// Makes the mount at `target` and its submounts private.
pub fn make_private(target: &Path) -> Result<(), MountError> {
    mount("", target, "", libc::MS_PRIVATE | libc::MS_REC, "").map_err(|source| MountError::Mount {
        what: "private propagation",
        target: target.to_path_buf(),
        source,
    })
}

/// Mounts a tmpfs of `size_bytes` with mode 1777 on `target` (a pod's /dev/shm).
pub fn mount_shm(target: &Path, size_bytes: u64) -> Result<(), MountError> {
    mkdir(target)?;
    let data = format!("mode=1777,size={size_bytes}");
    mount(
        "shm",
        target,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        &data,
    )
    .map_err(|source| MountError::Mount {
        what: "tmpfs",
        target: target.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_a_mountpoint_and_unmount_of_a_plain_dir_is_ok() {
        if !crius_common::test_needs_root("root_is_a_mountpoint_and_unmount_of_a_plain_dir_is_ok") {
            return;
        }
        assert!(is_mountpoint(Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mountpoint(dir.path()));
        unmount(dir.path()).unwrap();
        unmount(&dir.path().join("missing")).unwrap();
    }
}
