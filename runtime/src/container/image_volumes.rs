//! Volumes an image declares (`VOLUME /data` in a Dockerfile: `config.Volumes` of the image
//! config), as containerd gives them to a container.
//!
//! Each declared path that no CRI mount already covers gets a directory of the container's own,
//! `<root>/containers/<id>/volumes/<n>`, filled from what the image has at that path (owner,
//! mode, times, files, symlinks, devices and FIFOs; not extended attributes), and bound
//! read-write at that path. The directory goes with the container's other files when it is
//! removed. A path the image lacks gets an empty directory owned by the container's root; a
//! path that is no directory in the image is left alone (Docker could not mount it either).
//!
//! The image's content is read through the container's mounted rootfs with openat2's
//! `RESOLVE_IN_ROOT`, and every entry below is opened relative to its parent without following
//! symlinks, so nothing in an image can make crius copy the node's own files.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crius_api::v1::{ContainerConfig, Mount};

use crate::error::{Error, Result};

/// Directories nested deeper than this in a declared volume are not copied (the copy is
/// recursive; an image could otherwise nest directories until crius's stack runs out).
const MAX_DEPTH: usize = 128;

/// The declared volumes of an image config (`config.Volumes`), as clean absolute paths, in
/// order; keys that are not plain paths (`..`, NUL, empty) are skipped with a warning.
pub(crate) fn declared(image_config: &serde_json::Value) -> Vec<PathBuf> {
    let Some(volumes) = image_config
        .get("config")
        .and_then(|c| c.get("Volumes"))
        .and_then(|v| v.as_object())
    else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for key in volumes.keys() {
        match clean(key) {
            Some(path) if !out.contains(&path) => out.push(path),
            Some(_) => {}
            None => {
                tracing::warn!(volume = %crate::util::excerpt(key), "image declares a volume that is no plain path; ignored")
            }
        }
    }
    out.sort();
    out
}

/// `key` as an absolute path without `.`, empty or trailing parts (Docker treats a relative
/// volume as relative to `/`); None for `..`, NUL or the root itself.
fn clean(key: &str) -> Option<PathBuf> {
    if key.contains('\0') {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in Path::new(key).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => return None,
            _ => {}
        }
    }
    (out != Path::new("/")).then_some(out)
}

/// Makes the directory of each declared volume that `config`'s mounts leave uncovered, fills it
/// from `rootfs`, and returns the binds to add to the container's mounts. `owner` is the
/// container's root on the node (a user-namespaced pod's mapped root), for volumes the image
/// lacks.
pub(crate) fn stage(
    declared: &[PathBuf],
    config: &ContainerConfig,
    rootfs: &Path,
    dir: &Path,
    owner: (u32, u32),
) -> Result<Vec<Mount>> {
    let covered: Vec<PathBuf> = config
        .mounts
        .iter()
        .filter_map(|m| clean(&m.container_path))
        .collect();
    let mut mounts = Vec::new();
    for (n, path) in declared.iter().enumerate() {
        if covered.contains(path) {
            continue;
        }
        let target = dir.join(n.to_string());
        let copied = copy_up(rootfs, path, &target, owner).map_err(|e| {
            Error::internal(
                format!(
                    "fill the directory of image volume {} at {}",
                    path.display(),
                    target.display()
                ),
                e,
            )
        })?;
        if !copied {
            tracing::warn!(volume = %path.display(), "image declares a volume where it has no directory; not mounted");
            continue;
        }
        mounts.push(Mount {
            container_path: path.to_string_lossy().into_owned(),
            host_path: target.to_string_lossy().into_owned(),
            readonly: false,
            ..Default::default()
        });
    }
    Ok(mounts)
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens `name` in directory `dir` without following a symlink.
fn open_at(
    dir: RawFd,
    name: &CString,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: openat with a NUL-terminated name; the descriptor it returns is ours alone.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    };
    check(fd)?;
    // SAFETY: fd was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_at(dir: RawFd, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat with a NUL-terminated name writes into the stat we own.
    check(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// Owner, mode and times of the entry `name` in `dir` from `st`, without following a symlink.
/// The mode goes after the owner: chown clears set-id bits.
fn set_attrs(dir: RawFd, name: &CString, st: &libc::stat, symlink: bool) -> io::Result<()> {
    // SAFETY: an *at call on a directory descriptor we own with a NUL-terminated name; it
    // reads only the values passed.
    check(unsafe {
        libc::fchownat(
            dir,
            name.as_ptr(),
            st.st_uid,
            st.st_gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    if !symlink {
        // SAFETY: as fchownat above.
        check(unsafe { libc::fchmodat(dir, name.as_ptr(), st.st_mode & 0o7777, 0) })?;
    }
    let times = [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ];
    // SAFETY: as fchownat above; `times` is an array of the two timespecs utimensat reads.
    check(unsafe {
        libc::utimensat(
            dir,
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Fills `target` (made here) from `path` in the image; false if the image has something
/// other than a directory there.
fn copy_up(rootfs: &Path, path: &Path, target: &Path, owner: (u32, u32)) -> io::Result<bool> {
    let parent = target
        .parent()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    std::fs::create_dir_all(parent)?;
    let parent_dir = File::open(parent)?;
    let name = cstr(target.file_name().unwrap_or_default())?;
    let source = match crate::util::open_in_root(
        rootfs,
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    ) {
        Ok(fd) => Some(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(false),
        Err(e) => return Err(e),
    };
    // SAFETY: mkdirat with a NUL-terminated name under a directory we own.
    check(unsafe { libc::mkdirat(parent_dir.as_raw_fd(), name.as_ptr(), 0o700) })?;
    match source {
        None => {
            let mut st = stat_at(parent_dir.as_raw_fd(), &name)?;
            st.st_uid = owner.0;
            st.st_gid = owner.1;
            st.st_mode = libc::S_IFDIR | 0o755;
            set_attrs(parent_dir.as_raw_fd(), &name, &st, false)?;
        }
        Some(source) => {
            // SAFETY: an all-zero stat is a valid value of this plain C struct.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat writes only into `st`, on a descriptor we own.
            check(unsafe { libc::fstat(source.as_raw_fd(), &mut st) })?;
            let dest = open_at(
                parent_dir.as_raw_fd(),
                &name,
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            )?;
            copy_dir(&source, &dest, 0)?;
            set_attrs(parent_dir.as_raw_fd(), &name, &st, false)?;
        }
    }
    Ok(true)
}

/// Copies the entries of directory `src` into the empty directory `dst`.
fn copy_dir(src: &OwnedFd, dst: &OwnedFd, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "directories nest deeper than {MAX_DEPTH}"
        )));
    }
    // Reading the entries takes a descriptor of its own (readdir moves its offset).
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", src.as_raw_fd()))?;
    for entry in listing {
        let entry = entry?;
        let name = cstr(&entry.file_name())?;
        let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
        let st = stat_at(s, &name)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                // SAFETY: mkdirat with a NUL-terminated name under a directory we own.
                check(unsafe { libc::mkdirat(d, name.as_ptr(), 0o700) })?;
                let from = open_at(s, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                let to = open_at(d, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                copy_dir(&from, &to, depth + 1)?;
                set_attrs(d, &name, &st, false)?;
            }
            libc::S_IFREG => {
                let mut from = File::from(open_at(s, &name, libc::O_RDONLY, 0)?);
                let mut to = File::from(open_at(
                    d,
                    &name,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )?);
                io::copy(&mut from, &mut to)?;
                set_attrs(d, &name, &st, false)?;
            }
            libc::S_IFLNK => {
                let link = cstr(read_link_at(s, &name)?.as_os_str())?;
                // SAFETY: symlinkat with NUL-terminated strings under a directory we own.
                check(unsafe { libc::symlinkat(link.as_ptr(), d, name.as_ptr()) })?;
                set_attrs(d, &name, &st, true)?;
            }
            libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK => {
                // SAFETY: mknodat with a NUL-terminated name under a directory we own.
                check(unsafe { libc::mknodat(d, name.as_ptr(), st.st_mode, st.st_rdev) })?;
                set_attrs(d, &name, &st, false)?;
            }
            // A socket in an image is meaningless once copied: nobody listens on it.
            _ => {}
        }
    }
    Ok(())
}

/// The target of symlink `name` in `dir`.
fn read_link_at(dir: RawFd, name: &CString) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: readlinkat writes at most buf.len() bytes into the buffer we own.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(OsStr::from_bytes(&buf)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn declared_volumes_are_clean_paths() {
        let config = json!({"config": {"Volumes": {
            "/data/": {}, "logs": {}, "/a/./b//": {}, "/x/../etc": {}, "/": {}, "/data": {}
        }}});
        let got = declared(&config);
        assert_eq!(
            got,
            [
                PathBuf::from("/a/b"),
                PathBuf::from("/data"),
                PathBuf::from("/logs")
            ]
        );
        assert!(declared(&json!({"config": {}})).is_empty());
        assert!(declared(&json!({})).is_empty());
    }

    #[test]
    fn copy_up_keeps_owner_mode_links_and_stays_in_the_rootfs() {
        if !crius_common::test_needs_root("copy_up_keeps_owner_mode_links_and_stays_in_the_rootfs")
        {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let rootfs = root.path().join("rootfs");
        let data = rootfs.join("data");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        std::fs::write(data.join("sub/file"), b"content").unwrap();
        std::fs::set_permissions(
            data.join("sub/file"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::os::unix::fs::chown(data.join("sub/file"), Some(1000), Some(1001)).unwrap();
        std::os::unix::fs::symlink("sub/file", data.join("link")).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::chown(&data, Some(1000), Some(1000)).unwrap();
        // a volume path that is a symlink out of the rootfs resolves inside it
        std::os::unix::fs::symlink("/etc", rootfs.join("escape")).unwrap();
        std::fs::write(rootfs.join("plain"), b"").unwrap();

        let out = root.path().join("volumes");
        assert!(copy_up(&rootfs, Path::new("/data"), &out.join("0"), (0, 0)).unwrap());
        let vol = out.join("0");
        let meta = std::fs::metadata(&vol).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (1000, 1000, 0o750)
        );
        let file = std::fs::metadata(vol.join("sub/file")).unwrap();
        assert_eq!(
            (file.uid(), file.gid(), file.mode() & 0o7777),
            (1000, 1001, 0o640)
        );
        assert_eq!(std::fs::read(vol.join("sub/file")).unwrap(), b"content");
        assert_eq!(
            std::fs::read_link(vol.join("link")).unwrap(),
            Path::new("sub/file")
        );

        // /escape -> /etc is the rootfs's /etc, which does not exist: an empty volume
        assert!(copy_up(&rootfs, Path::new("/escape"), &out.join("1"), (7, 8)).unwrap());
        assert_eq!(std::fs::read_dir(out.join("1")).unwrap().count(), 0);
        let meta = std::fs::metadata(out.join("1")).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (7, 8, 0o755)
        );

        // a file is no volume
        assert!(!copy_up(&rootfs, Path::new("/plain"), &out.join("2"), (0, 0)).unwrap());
        assert!(!out.join("2").exists());
    }

    #[test]
    fn covered_paths_get_no_volume() {
        if !crius_common::test_needs_root("covered_paths_get_no_volume") {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let rootfs = root.path().join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        let config = ContainerConfig {
            mounts: vec![Mount {
                container_path: "/data/".into(),
                host_path: "/somewhere".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let declared = [PathBuf::from("/data"), PathBuf::from("/cache")];
        let mounts = stage(&declared, &config, &rootfs, &root.path().join("v"), (0, 0)).unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].container_path, "/cache");
        assert_eq!(
            mounts[0].host_path,
            root.path().join("v/1").to_string_lossy()
        );
        assert!(!mounts[0].readonly);
    }
}
