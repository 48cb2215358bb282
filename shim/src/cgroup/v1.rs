//! cgroup v1 (legacy and hybrid hosts): one hierarchy per mounted controller (or group of
//! co-mounted controllers), the container's cgroup at the same path in each.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{procs_recursive, signal_all, write, CgroupError, Result, FREEZE_ROUNDS};

/// The v1 hierarchies of this host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// One mount point per hierarchy libcontainer uses, each once.
    pub mounts: Vec<PathBuf>,
    /// The freezer hierarchy's mount point, if the controller is mounted.
    pub freezer: Option<PathBuf>,
}

impl Layout {
    /// From the text of `/proc/self/mountinfo`: the hierarchies libcontainer uses
    /// ([`crius_common::mountinfo::libcontainer_v1_mounts`]).
    pub fn from_mountinfo(text: &str) -> Self {
        let all = crius_common::mountinfo::libcontainer_v1_mounts(text);
        Layout {
            mounts: crius_common::mountinfo::distinct_mounts(&all),
            freezer: all
                .into_iter()
                .find_map(|(controller, mount)| (controller == "freezer").then_some(mount)),
        }
    }
}

/// Freeze the cgroup (if the freezer is mounted), signal what is in it, thaw it.
pub fn kill_all(layout: &Layout, rel: &Path, signal: i32) -> Result<usize> {
    let freezer_dir = layout.freezer.as_ref().map(|m| m.join(rel));
    // List from the freezer hierarchy when there is one: that is the set the freeze holds.
    let mut candidates = freezer_dir
        .iter()
        .cloned()
        .chain(layout.mounts.iter().map(|m| m.join(rel)));
    let Some(list_dir) = candidates.find(|d| d.is_dir()) else {
        return Ok(0);
    };
    let frozen = match &freezer_dir {
        Some(dir) if dir.is_dir() => match freeze(dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "crius_shim", cgroup = %dir.display(), error = %e, "signalling without a freeze");
                false
            }
        },
        _ => false,
    };
    let result = procs_recursive(&list_dir).and_then(|pids| signal_all(&pids, signal, &list_dir));
    if frozen {
        if let Some(dir) = &freezer_dir {
            thaw(dir)?;
        }
    }
    result
}

const STATE: &str = "freezer.state";

/// Write FROZEN until the kernel reports the cgroup FROZEN, for at most [`FREEZE_ROUNDS`]
/// rounds (the later ones with a millisecond's pause); thawed again when that fails.
fn freeze(dir: &Path) -> Result<()> {
    let state = dir.join(STATE);
    for round in 0..FREEZE_ROUNDS {
        write(&state, "FROZEN")?;
        let now = fs::read_to_string(&state).map_err(|source| CgroupError::Read {
            path: state.clone(),
            source,
        })?;
        if now.trim() == "FROZEN" {
            return Ok(());
        }
        if round >= 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    thaw(dir)?;
    Err(CgroupError::Busy(dir.to_path_buf()))
}

fn thaw(dir: &Path) -> Result<()> {
    write(&dir.join(STATE), "THAWED")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 31 0:32 / /mnt/other\\040memory rw,relatime - cgroup cgroup rw,memory
";

    #[test]
    fn finds_the_controller_hierarchies_once_each() {
        let layout = Layout::from_mountinfo(HYBRID);
        let base = Path::new("/sys/fs/cgroup");
        assert_eq!(
            layout.mounts,
            vec![
                base.join("cpu,cpuacct"),
                base.join("cpuset"),
                base.join("memory"),
                base.join("freezer"),
            ]
        );
        assert_eq!(layout.freezer, Some(base.join("freezer")));
    }

    #[test]
    fn signals_nothing_in_a_missing_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            mounts: vec![dir.path().join("pids")],
            freezer: None,
        };
        assert_eq!(kill_all(&layout, Path::new("crius-x"), 0).unwrap(), 0);
    }

    #[test]
    fn freezes_lists_signals_and_thaws() {
        // A fake freezer hierarchy: the state file reads back what was written.
        let dir = tempfile::tempdir().unwrap();
        let freezer = dir.path().join("freezer");
        let cg = freezer.join("pod/c1");
        fs::create_dir_all(&cg).unwrap();
        fs::write(cg.join(STATE), "THAWED").unwrap();
        // Our own pid, signalled with 0 (existence check only).
        fs::write(cg.join("cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        let layout = Layout {
            mounts: vec![freezer.clone()],
            freezer: Some(freezer),
        };
        assert_eq!(kill_all(&layout, Path::new("pod/c1"), 0).unwrap(), 1);
        assert_eq!(fs::read_to_string(cg.join(STATE)).unwrap(), "THAWED");
    }
}
