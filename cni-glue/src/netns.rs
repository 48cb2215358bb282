//! Network namespaces pinned by a bind mount, as CNI plugins expect for `CNI_NETNS`.
//!
//! # How a namespace is made
//!
//! `unshare(CLONE_NEWNET)` moves the *calling thread* into a new network namespace. Doing that on
//! a thread we do not own (a tokio worker, the main thread) would leave that thread in the pod's
//! namespace for whatever task runs on it next. So [`create`] spawns a short-lived
//! `std::thread` of its own, which unshares, bind-mounts its `/proc/thread-self/ns/net` onto an
//! empty file at `<dir>/<id>`, and exits. The bind mount keeps the namespace alive after the
//! thread is gone; unmounting it (and closing every fd to it, and every process leaving it)
//! frees it. No fork is involved, so this is safe in a multi-threaded process.
//!
//! [`run_in`] uses the same trick with `setns`: a scoped thread enters the namespace, runs the
//! closure and exits. Sockets created there stay in the namespace after the thread returns.
//! [`command`] returns a `tokio::process::Command` whose child calls `setns` between fork and
//! exec (a single async-signal-safe syscall, so fine after fork in a threaded parent).
//!
//! # Mount propagation
//!
//! The pin is an ordinary bind mount in the daemon's mount namespace. A process that copies the
//! mount table (a new mount namespace) while the pin exists also holds a copy, which keeps the
//! namespace alive until that process leaves it; containers are safe because their runtime
//! detaches the old root after `pivot_root`.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use crate::error::{Error, Result};

/// `NSFS_MAGIC` from linux/magic.h: the file system type of `/proc/<pid>/ns/*` and their pins.
const NSFS_MAGIC: i64 = 0x6e73_6673;

fn netns_err(op: &'static str, path: &Path, source: impl Into<io::Error>) -> Error {
    Error::Netns {
        op,
        path: path.to_path_buf(),
        source: source.into(),
    }
}

/// Checks that `id` can be used as a single file name.
fn check_name(id: &str) -> Result<()> {
    if id.is_empty() || id == "." || id == ".." || id.contains('/') || id.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "netns name {id:?} is not a plain file name"
        )));
    }
    Ok(())
}

/// The mount point of a pin, `<dir>/<id>`: an empty file, created exclusively so that two pods
/// never share one.
fn pin_file(dir: &Path, id: &str) -> Result<PathBuf> {
    check_name(id)?;
    std::fs::create_dir_all(dir).map_err(|e| netns_err("create dir for", dir, e))?;
    let path = dir.join(id);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&path)
        .map_err(|e| netns_err("create pin file for", &path, e))?;
    Ok(path)
}

/// Creates a new network namespace and pins it at `<dir>/<id>`; returns that path.
///
/// `dir` is created if missing. Fails if `<dir>/<id>` already exists. Only the loopback device
/// exists in the new namespace, and this brings it up (one ioctl), which saves running the
/// `loopback` plugin. Blocks for well under a millisecond; it spawns and joins a thread.
pub fn create(dir: &Path, id: &str) -> Result<PathBuf> {
    let path = pin_file(dir, id)?;

    let target = path.clone();
    let pinned = std::thread::Builder::new()
        .name("crius-netns".into())
        .spawn(move || -> io::Result<()> {
            // This thread is ours and dies right after, so leaving it in the new namespace is fine.
            unshare(CloneFlags::CLONE_NEWNET)?;
            loopback_up()?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )?;
            Ok(())
        })
        .map_err(|e| netns_err("spawn thread to create", &path, e))?
        .join();
    let pinned = match pinned {
        Ok(r) => r,
        Err(_) => Err(io::Error::other("netns thread panicked")),
    };
    if let Err(e) = pinned {
        let _ = std::fs::remove_file(&path);
        return Err(netns_err("create", &path, e));
    }
    Ok(path)
}

/// Pins the network namespace behind `source` (a `/proc/<pid>/ns/net` of a process that made
/// it, say in a new user namespace) at `<dir>/<id>` and brings its loopback device up; returns
/// the pin's path. The namespace outlives the process once pinned.
pub fn pin(source: &Path, dir: &Path, id: &str) -> Result<PathBuf> {
    let path = pin_any(source, dir, id)?;
    let up = run_in(&path, loopback_up)
        .and_then(|r| r.map_err(|e| netns_err("bring up lo in", &path, e)));
    if let Err(e) = up {
        let _ = remove(&path);
        return Err(e);
    }
    Ok(path)
}

/// Pins the namespace behind `source` (any kind: `/proc/<pid>/ns/user` too) at `<dir>/<id>`
/// with a bind mount; returns the pin's path. [`remove`] unpins it.
pub fn pin_any(source: &Path, dir: &Path, id: &str) -> Result<PathBuf> {
    let path = pin_file(dir, id)?;
    if let Err(e) = mount(
        Some(source),
        &path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        let _ = remove(&path);
        return Err(netns_err("pin", &path, e));
    }
    Ok(path)
}

/// Sets `IFF_UP` on `lo` in the calling thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2); the returned fd is checked and owned right away.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write an ifreq we own, on a valid socket.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Unpins and deletes a namespace pinned at `path`: lazy unmount, then unlink.
///
/// Idempotent: a path that is missing or no longer mounted is fine. The namespace itself is
/// freed by the kernel once no process and no open fd refers to it any more.
pub fn remove(path: &Path) -> Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (already unmounted); ENOENT: already gone.
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(netns_err("unmount", path, e)),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(netns_err("remove pin of", path, e)),
    }
}

/// True if `path` exists and is a pinned (or `/proc`) network namespace file.
pub fn is_netns(path: &Path) -> bool {
    match nix::sys::statfs::statfs(path) {
        #[allow(clippy::unnecessary_cast)] // the field's type differs between libcs
        Ok(fs) => fs.filesystem_type().0 as i64 == NSFS_MAGIC,
        Err(_) => false,
    }
}

/// Opens a namespace pin, checking that it is one.
pub fn open(path: &Path) -> Result<OwnedFd> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| netns_err("open", path, e))?;
    if !is_netns(path) {
        return Err(netns_err(
            "open",
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a network namespace"),
        ));
    }
    Ok(OwnedFd::from(file))
}

/// Runs `f` on a short-lived thread that has entered the namespace at `path`, and returns its
/// value. Sockets `f` creates belong to that namespace even after it returns. Blocking: call it
/// from `spawn_blocking` in async code if `f` is slow. A panic in `f` is propagated.
pub fn run_in<F, T>(path: &Path, f: F) -> Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let fd = open(path)?;
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("crius-netns-run".into())
            .spawn_scoped(s, move || -> io::Result<T> {
                setns(fd.as_fd(), CloneFlags::CLONE_NEWNET)?;
                Ok(f())
            })
            .map_err(|e| netns_err("spawn thread to enter", path, e))?;
        match handle.join() {
            Ok(r) => r.map_err(|e| netns_err("enter", path, e)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// A `tokio::process::Command` for `program` whose process runs in the namespace at `path`.
///
/// The namespace is opened now (so a missing pin fails here) and entered in the child between
/// fork and exec.
pub fn command(
    path: &Path,
    program: impl AsRef<std::ffi::OsStr>,
) -> Result<tokio::process::Command> {
    let fd = open(path)?;
    let mut cmd = tokio::process::Command::new(program);
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and makes only the setns
    // syscall, which is async-signal-safe; `fd` is owned by the closure, which the Command keeps
    // alive until spawn, so the descriptor is valid (it is O_CLOEXEC, so exec closes it).
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &fd;
            if libc::setns(raw, libc::CLONE_NEWNET) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain() {
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("crius-abc_1.2").is_ok());
    }

    #[test]
    fn remove_of_missing_path_is_ok() {
        if !crius_common::test_needs_root("remove_of_missing_path_is_ok") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        remove(&dir.path().join("nope")).unwrap();
        // A plain file (not mounted) is removed too.
        let f = dir.path().join("plain");
        std::fs::write(&f, b"").unwrap();
        remove(&f).unwrap();
        assert!(!f.exists());
        assert!(!is_netns(&f));
    }
}
