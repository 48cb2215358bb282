//! The few cgroup operations the shim does itself, without a `crius-shim-helper`: signal every
//! process of a container's cgroup, and remove the cgroup of a container that has exited.
//!
//! They act on the cgroup libcontainer made for the container, named by the `cgroup_path` it
//! recorded in `youki_config.json` ([`crate::libct_state`]), in the hierarchies libcontainer
//! uses: on a legacy or hybrid host every mounted v1 controller it knows ([`v1`]), on a unified
//! host the cgroup2 tree ([`v2`]). libcontainer picks between them the same way (`statfs` of
//! `/sys/fs/cgroup`).

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

pub mod v1;
pub mod v2;

/// Where cgroupfs is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long the shim's event loop may wait for a cgroup to freeze before it signals without
/// the freeze (a task stuck in uninterruptible sleep or a vfork can keep a cgroup FREEZING).
pub const FREEZE_ROUNDS: u32 = 50;

/// Failures of the shim's own cgroup operations.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("detect cgroup hierarchies: {what}")]
    Detect {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cgroup path {0:?} is not an absolute path without `..`")]
    BadPath(PathBuf),
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("remove cgroup {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Processes are still in the cgroup (killed ones take a moment to leave it).
    #[error("cgroup {0} still has processes")]
    Busy(PathBuf),
    #[error("signal pid {pid} in cgroup {path}")]
    Signal {
        pid: i32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, CgroupError>;

/// The cgroup hierarchies libcontainer puts containers in on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchies {
    /// Legacy or hybrid host: the mount point of each v1 hierarchy that holds one of
    /// libcontainer's controllers.
    V1(v1::Layout),
    /// Unified host: the cgroup2 root.
    V2(PathBuf),
}

impl Hierarchies {
    /// Look at this host's `/sys/fs/cgroup` and mount table.
    pub fn detect() -> Result<Self> {
        let root = Path::new(CGROUP_ROOT);
        let stat = nix::sys::statfs::statfs(root).map_err(|e| CgroupError::Detect {
            what: "statfs /sys/fs/cgroup",
            source: e.into(),
        })?;
        if stat.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC {
            return Ok(Self::V2(root.to_path_buf()));
        }
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Detect {
                what: "read /proc/self/mountinfo",
                source,
            })?;
        Ok(Self::V1(v1::Layout::from_mountinfo(&mountinfo)))
    }

    /// The mount point of each hierarchy a container's cgroup is in: the v1 hierarchies
    /// libcontainer uses, or the cgroup2 root.
    pub fn mounts(&self) -> Vec<PathBuf> {
        match self {
            Self::V1(layout) => layout.mounts.clone(),
            Self::V2(root) => vec![root.clone()],
        }
    }

    /// Send `signal` to every process in the cgroup `cgroup_path` (absolute, as in the spec)
    /// and its descendants. The cgroup is frozen while its processes are listed and signalled,
    /// so none can fork a child that escapes the signal; if it does not freeze in time it is
    /// signalled anyway. Returns how many processes were signalled; a cgroup that does not
    /// exist has none.
    pub fn kill_all(&self, cgroup_path: &Path, signal: i32) -> Result<usize> {
        let rel = relative(cgroup_path)?;
        match self {
            Self::V1(layout) => v1::kill_all(layout, &rel, signal),
            Self::V2(root) => v2::kill_all(&root.join(&rel), signal),
        }
    }

    /// Remove the cgroup `cgroup_path` (and any cgroups made below it) in every hierarchy,
    /// leaf first. [`CgroupError::Busy`] if a process is still in one; nothing is killed.
    pub fn remove(&self, cgroup_path: &Path) -> Result<()> {
        let rel = relative(cgroup_path)?;
        match self {
            Self::V1(layout) => {
                for mount in &layout.mounts {
                    remove_tree(&mount.join(&rel))?;
                }
                Ok(())
            }
            Self::V2(root) => remove_tree(&root.join(&rel)),
        }
    }
}

/// `cgroup_path` without its leading `/`, refusing anything that could leave the hierarchy.
fn relative(cgroup_path: &Path) -> Result<PathBuf> {
    let mut rel = PathBuf::new();
    let mut components = cgroup_path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(CgroupError::BadPath(cgroup_path.to_path_buf()));
    }
    for c in components {
        match c {
            Component::Normal(part) => rel.push(part),
            _ => return Err(CgroupError::BadPath(cgroup_path.to_path_buf())),
        }
    }
    if rel.as_os_str().is_empty() {
        // The root cgroup of a hierarchy is never a container's.
        return Err(CgroupError::BadPath(cgroup_path.to_path_buf()));
    }
    Ok(rel)
}

/// The pids in `cgroup.procs` of `dir` and of every cgroup below it; none if `dir` is gone.
pub fn procs_recursive(dir: &Path) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let procs = dir.join("cgroup.procs");
        match fs::read_to_string(&procs) {
            Ok(text) => pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(CgroupError::Read {
                    path: procs,
                    source,
                })
            }
        }
        stack.extend(subdirs(&dir)?);
    }
    Ok(pids)
}

/// Signal each pid; one that is already gone is fine.
fn signal_all(pids: &[i32], signal: i32, dir: &Path) -> Result<usize> {
    let mut sent = 0;
    for &pid in pids {
        if pid <= 0 {
            continue;
        }
        // SAFETY: kill(2) with a positive pid read from the container's cgroup. The cgroup is
        // frozen (or, failing that, the pid was listed a moment ago): a frozen task cannot
        // exit, so the pid still names it.
        if unsafe { libc::kill(pid, signal) } == 0 {
            sent += 1;
            continue;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(CgroupError::Signal {
                pid,
                path: dir.to_path_buf(),
                source: e,
            });
        }
    }
    Ok(sent)
}

/// The cgroup directories directly below `dir` (cgroupfs holds only directories and files).
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| CgroupError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// `rmdir` `dir` and every directory below it, deepest first; a missing `dir` is fine.
fn remove_tree(dir: &Path) -> Result<()> {
    crius_common::fs::remove_dir_tree(dir).map_err(|(path, source)| {
        // cgroupfs answers EBUSY while tasks (or child cgroups) remain.
        if source.raw_os_error() == Some(libc::EBUSY) {
            CgroupError::Busy(path)
        } else {
            CgroupError::Remove { path, source }
        }
    })
}

/// Write a cgroup control file.
fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_hierarchy() {
        assert_eq!(
            relative(Path::new("/kubepods/pod1/c1")).unwrap(),
            PathBuf::from("kubepods/pod1/c1")
        );
        for bad in ["relative/c1", "/", "/a/../b", ""] {
            assert!(relative(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn removes_nested_cgroups_leaf_first() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("pod/c1");
        fs::create_dir_all(cg.join("nested/deeper")).unwrap();
        fs::create_dir_all(cg.join("other")).unwrap();
        remove_tree(&cg).unwrap();
        assert!(!cg.exists());
        assert!(dir.path().join("pod").exists());
        // Gone already: fine.
        remove_tree(&cg).unwrap();
    }

    #[test]
    fn lists_procs_of_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("c1");
        fs::create_dir_all(cg.join("nested")).unwrap();
        fs::write(cg.join("cgroup.procs"), "10\n11\n").unwrap();
        fs::write(cg.join("nested/cgroup.procs"), "12\n").unwrap();
        let mut pids = procs_recursive(&cg).unwrap();
        pids.sort();
        assert_eq!(pids, vec![10, 11, 12]);
        assert!(procs_recursive(&dir.path().join("missing"))
            .unwrap()
            .is_empty());
    }
}
