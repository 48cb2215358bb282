//! The cgroup filesystems in the mount table.

use std::path::PathBuf;

use super::v1;

/// Every cgroup hierarchy mounted on this host (each v1 controller and the v2 tree), read from
/// the mount table once, as [`super::Hierarchy::host`] is: the cgroup mounts do not move under
/// a running crius, and the table holds every pod's mounts (about 2,000 lines at 500 pods),
/// which every removal and reap loop read again before.
pub fn hierarchies() -> &'static [PathBuf] {
    static FOUND: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    if let Some(found) = FOUND.get() {
        return found;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return &[];
    };
    let found: Vec<PathBuf> = cgroup_mounts(&info)
        .into_iter()
        .map(|m| m.mount_point)
        .collect();
    if found.is_empty() {
        // not remembered: a table without cgroups is a failure to read it, not the host
        return &[];
    }
    FOUND.get_or_init(|| found)
}

/// One cgroup filesystem in the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CgroupMount {
    pub(super) mount_point: PathBuf,
    /// `cgroup2`, or `cgroup` (v1).
    pub(super) fstype: String,
    /// v1 controllers of the hierarchy (from the super options), e.g. `["cpu", "cpuacct"]`.
    pub(super) controllers: Vec<String>,
}

/// The cgroup mounts listed in the text of `/proc/self/mountinfo`.
pub(super) fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    crius_common::mountinfo::mounts(mountinfo)
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| {
            let controllers = if m.fs_type == "cgroup" {
                m.super_options
                    .split(',')
                    .filter(|o| v1::CONTROLLERS.contains(o))
                    .map(str::to_string)
                    .collect()
            } else {
                Vec::new()
            };
            CgroupMount {
                mount_point: m.mount_point,
                fstype: m.fs_type.to_string(),
                controllers,
            }
        })
        .collect()
}
