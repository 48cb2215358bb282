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
    #[error("statvfs {path}")]
    Stat {
        path: PathBuf,
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

/// `<state>/bin`'s tmpfs: 4 MiB is room for the pause (a few KiB) and anything crius may one
/// day execute from there.
const EXEC_DIR_DATA: &str = "mode=0755,size=4m";
/// The source name of that tmpfs in mountinfo, which tells crius's own mount from others.
const EXEC_DIR_SOURCE: &str = "crius-bin";

/// Why crius cannot execute what it must from its state directory.
#[derive(Debug, thiserror::Error)]
#[error(
    "crius cannot execute files in {dir}: it is on {mount_point} mounted noexec, and crius could \
     not mount its own tmpfs there ({reason}); set `state` in the config to a directory on a \
     mount that allows exec, or let crius mount (it needs CAP_SYS_ADMIN)"
)]
pub struct NoExec {
    pub dir: PathBuf,
    pub mount_point: PathBuf,
    pub reason: String,
}

/// Whether files under `path` may be executed: its mount has no `noexec` (`statvfs(3)`).
pub fn allows_exec(path: &Path) -> io::Result<bool> {
    let c = cstr(path)?;
    // SAFETY: an all-zero statvfs is a valid value for the kernel to fill in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_flag & libc::ST_NOEXEC == 0)
}

/// The mount point of the mount `path` is on: the longest mount point in `mountinfo` that is
/// `path` or one of its parents (the last one listed wins, as the later mount covers).
pub fn mount_point_of(path: &Path, mountinfo: &str) -> PathBuf {
    let mut best = PathBuf::from("/");
    for m in crius_common::mountinfo::mounts(mountinfo) {
        if path.starts_with(&m.mount_point)
            && m.mount_point.components().count() >= best.components().count()
        {
            best = m.mount_point;
        }
    }
    best
}

/// Makes `dir` (`<state>/bin`) a mount crius controls, so that what crius executes from it
/// runs whatever the state directory is on: systemd mounts `/run` `noexec`, and the pause,
/// bind-mounted from there into each pod, kept that flag and failed its `execve` with EACCES.
/// A small tmpfs without `noexec` (but `nosuid`, `nodev`) is mounted on `dir` unless one of
/// crius's is already there (a restart of crius: the pods' binds hold the old one anyway).
/// Where the mount fails and the directory's own mount allows exec, crius goes on with the
/// plain directory; where it does not, [`NoExec`] names the mount and the setting.
/// `mount_fn` is the mount call ([`mount_exec_tmpfs`]; unit tests pass a failing one).
pub fn prepare_exec_dir(
    dir: &Path,
    mount_fn: impl Fn(&Path) -> io::Result<()>,
) -> Result<(), PrepareExecDirError> {
    mkdir(dir)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let ours = crius_common::mountinfo::mounts(&info)
        .filter(|m| m.mount_point == dir)
        .last()
        .is_some_and(|m| m.fs_type == "tmpfs" && m.source == EXEC_DIR_SOURCE);
    let exec = |p: &Path| {
        allows_exec(p).map_err(|source| MountError::Stat {
            path: p.to_path_buf(),
            source,
        })
    };
    if ours && exec(dir)? {
        return Ok(());
    }
    match mount_fn(dir) {
        Ok(()) if exec(dir)? => Ok(()),
        Ok(()) => {
            // Not left behind: the next start would take it for crius's own.
            unmount(dir)?;
            Err(NoExec {
                dir: dir.to_path_buf(),
                mount_point: dir.to_path_buf(),
                reason: "the new mount is noexec too".into(),
            }
            .into())
        }
        Err(e) if exec(dir)? => {
            tracing::warn!(
                "could not mount a tmpfs on {}: {e}; executing from the directory as it is",
                dir.display()
            );
            Ok(())
        }
        Err(e) => Err(NoExec {
            dir: dir.to_path_buf(),
            mount_point: mount_point_of(dir, &info),
            reason: e.to_string(),
        }
        .into()),
    }
}

/// Why [`prepare_exec_dir`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareExecDirError {
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    NoExec(#[from] NoExec),
}

/// Mounts crius's exec tmpfs on `dir` ([`prepare_exec_dir`]).
pub fn mount_exec_tmpfs(dir: &Path) -> io::Result<()> {
    mount(
        EXEC_DIR_SOURCE,
        dir,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        EXEC_DIR_DATA,
    )
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

    #[test]
    fn mount_point_of_takes_the_longest_covering_mount() {
        let info = "1 0 8:1 / / rw - ext4 /dev/vda rw\n\
                    2 1 0:5 / /run rw,noexec - tmpfs tmpfs rw\n\
                    3 2 0:6 / /run/crius/bin rw - tmpfs crius-bin rw\n\
                    4 1 0:7 / /running rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_point_of(Path::new("/run/crius"), info),
            Path::new("/run")
        );
        assert_eq!(
            mount_point_of(Path::new("/run/crius/bin"), info),
            Path::new("/run/crius/bin")
        );
        assert_eq!(mount_point_of(Path::new("/var/lib"), info), Path::new("/"));
    }

    /// A state directory on a `noexec` mount: crius's tmpfs makes `bin` executable, a second
    /// call keeps the mount it finds, and where the mount cannot be made the error names the
    /// `noexec` mount and the setting.
    #[test]
    fn exec_dir_on_a_noexec_mount() {
        if !crius_common::test_needs_root("exec_dir_on_a_noexec_mount") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        mount("tmpfs", &state, "tmpfs", libc::MS_NOEXEC, "size=1m").unwrap();
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = unmount(&self.0);
            }
        }
        let _guard = Unmount(state.clone());
        assert!(!allows_exec(&state).unwrap());

        let refused = |_: &Path| Err(io::Error::from_raw_os_error(libc::EPERM));
        let bin = state.join("bin");
        let err = prepare_exec_dir(&bin, refused).unwrap_err().to_string();
        assert!(
            err.contains(&format!("on {} mounted noexec", state.display())),
            "{err}"
        );
        assert!(err.contains("set `state`"), "{err}");
        assert!(err.contains("Operation not permitted"), "{err}");

        prepare_exec_dir(&bin, mount_exec_tmpfs).unwrap();
        assert!(allows_exec(&bin).unwrap());
        let count = || {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            crius_common::mountinfo::mounts(&info)
                .filter(|m| m.mount_point == bin)
                .count()
        };
        assert_eq!(count(), 1);
        // Found again (a restart of crius): not mounted a second time, and no mount is tried.
        prepare_exec_dir(&bin, refused).unwrap();
        assert_eq!(count(), 1);
        unmount(&bin).unwrap();
    }
}
