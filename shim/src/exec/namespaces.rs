//! Joining the container: its namespaces (opened from the init, then entered in order), its
//! cgroup and its `oom_score_adj` (steps 2 to 4 of [`super`]).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::cgroup::Hierarchies;

use super::*;

/// A namespace of the init to join.
pub(super) struct Namespace {
    kind: &'static str,
    flag: libc::c_int,
    fd: OwnedFd,
}

/// Open the init's namespaces that differ from the helper's (a container sharing the node's
/// network or pid namespace has the helper's own). All are opened before any is joined: once
/// in the container's mount namespace, `/proc` is the container's.
///
/// Each is opened and compared through a descriptor of the two `ns` directories, so that
/// `/proc/<pid>` is looked up twice in all, not three times per kind (those lookups were a
/// tenth of an exec helper's CPU).
pub(super) fn open_namespaces(init_pid: i32) -> Result<Vec<Namespace>> {
    let theirs_dir = PathBuf::from(format!("/proc/{init_pid}/ns"));
    let ours_dir = PathBuf::from("/proc/self/ns");
    let error = |dir: &Path, kind: &str| {
        let path = dir.join(kind);
        move |source| ExecError::OpenNamespace { path, source }
    };
    let directory = OFlag::O_PATH | OFlag::O_DIRECTORY;
    let theirs = open_at(None, &theirs_dir, directory).map_err(error(&theirs_dir, ""))?;
    let ours = open_at(None, &ours_dir, directory).map_err(error(&ours_dir, ""))?;
    let mut out = Vec::new();
    let all = std::iter::once(&("user", libc::CLONE_NEWUSER)).chain(NAMESPACES);
    for &(kind, flag) in all {
        let fd = match open_at(Some(&theirs), Path::new(kind), OFlag::O_RDONLY) {
            Ok(fd) => fd,
            // A kernel without this kind of namespace.
            Err(e) if e.kind() == io::ErrorKind::NotFound && kind == "time" => continue,
            Err(e) => return Err(error(&theirs_dir, kind)(e)),
        };
        let file = fs::File::from(fd);
        let theirs_meta = file.metadata().map_err(error(&theirs_dir, kind))?;
        let ours_meta = open_at(Some(&ours), Path::new(kind), OFlag::O_PATH)
            .map(fs::File::from)
            .and_then(|f| f.metadata())
            .map_err(error(&ours_dir, kind))?;
        if (theirs_meta.dev(), theirs_meta.ino()) == (ours_meta.dev(), ours_meta.ino()) {
            continue;
        }
        out.push(Namespace {
            kind,
            flag,
            fd: file.into(),
        });
    }
    Ok(out)
}

/// `openat(2)` of `path` (relative to `dir`, else as it is) with `flags` and close-on-exec.
fn open_at(dir: Option<&OwnedFd>, path: &Path, flags: OFlag) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::openat(
        dir.map(AsRawFd::as_raw_fd),
        path,
        flags | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Join the namespaces: all but the user namespace, then the user namespace, then those that
/// could only be joined from inside it.
pub(super) fn enter_namespaces(namespaces: Vec<Namespace>) -> Result<()> {
    let (user, others): (Vec<_>, Vec<_>) = namespaces.into_iter().partition(|n| n.kind == "user");
    let mut later = Vec::new();
    for ns in others {
        if let Err(e) = setns(&ns) {
            if user.is_empty() || e.raw_os_error() != Some(libc::EPERM) {
                return Err(ExecError::Setns {
                    kind: ns.kind,
                    source: e,
                });
            }
            later.push(ns);
        }
    }
    for ns in user.iter().chain(&later) {
        setns(ns).map_err(|source| ExecError::Setns {
            kind: ns.kind,
            source,
        })?;
    }
    Ok(())
}

pub(super) fn setns(ns: &Namespace) -> io::Result<()> {
    // SAFETY: setns(2) on a namespace descriptor we own; the caller is single-threaded, as
    // joining a user or mount namespace requires.
    if unsafe { libc::setns(ns.fd.as_raw_fd(), ns.flag) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Move the helper (and so the process it forks) into the container's cgroup `cgroup_path`
/// (absolute, as in the spec), in each hierarchy libcontainer made it in: those mounted at
/// `mounts` when the shim named them (it reads the host's mount table once; with 60 pods
/// that table has some 200 lines, and reading it was a sixth of an exec helper's CPU), else
/// those this host's mount table shows.
pub(super) fn join_cgroup(cgroup_path: &Path, mounts: &[PathBuf]) -> Result<()> {
    let rel = relative(cgroup_path)?;
    let pid = std::process::id().to_string();
    let join = |dir: PathBuf| -> Result<bool> {
        let procs = dir.join("cgroup.procs");
        match fs::write(&procs, &pid) {
            Ok(()) => Ok(true),
            // A v1 hierarchy libcontainer did not put the container in.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(ExecError::JoinCgroup { path: dir, source }),
        }
    };
    let detected;
    let mounts = match mounts {
        [] => {
            detected = Hierarchies::detect()
                .map_err(ExecError::Hierarchies)?
                .mounts();
            &detected
        }
        named => named,
    };
    let mut joined = false;
    for mount in mounts {
        joined |= join(mount.join(&rel))?;
    }
    if !joined {
        return Err(ExecError::JoinCgroup {
            path: cgroup_path.to_path_buf(),
            source: io::ErrorKind::NotFound.into(),
        });
    }
    Ok(())
}

/// `cgroup_path` without its leading `/`, refusing anything that could leave the hierarchy.
pub(super) fn relative(cgroup_path: &Path) -> Result<PathBuf> {
    let mut components = cgroup_path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(ExecError::CgroupPath(cgroup_path.to_path_buf()));
    }
    let mut rel = PathBuf::new();
    for c in components {
        match c {
            Component::Normal(part) => rel.push(part),
            _ => return Err(ExecError::CgroupPath(cgroup_path.to_path_buf())),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(ExecError::CgroupPath(cgroup_path.to_path_buf()));
    }
    Ok(rel)
}

/// Set the helper's `oom_score_adj` (inherited by the process) when it differs.
pub(super) fn set_oom_score_adj(value: i32) -> Result<()> {
    let path = "/proc/self/oom_score_adj";
    let current = fs::read_to_string(path).ok();
    if current.as_deref().map(str::trim) == Some(value.to_string().as_str()) {
        return Ok(());
    }
    fs::write(path, value.to_string()).map_err(|source| ExecError::OomScoreAdj { value, source })
}
