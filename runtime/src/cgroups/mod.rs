//! Pod cgroups with the cgroupfs driver: where a pod's cgroup is, and removing it.
//!
//! kubelet names the pod cgroup in `linux.cgroup_parent` and owns it; a client that gives none
//! (crictl, critest) gets `/crius/<pod-id>`, which crius creates (through libcontainer, as the
//! parent of the pod's containers) and removes with the pod. Containers, the pause container
//! included, go one level below, named by their id, as containerd lays them out.

use std::path::{Path, PathBuf};

/// Parent of the pod cgroups crius owns itself.
pub const CRIUS_PARENT: &str = "/crius";

/// The pod cgroup: the one kubelet sent, else crius's own.
pub fn pod_cgroup(cgroup_parent: &str, pod_id: &str) -> String {
    if cgroup_parent.is_empty() {
        format!("{CRIUS_PARENT}/{pod_id}")
    } else if cgroup_parent.starts_with('/') {
        cgroup_parent.trim_end_matches('/').to_string()
    } else {
        format!("/{}", cgroup_parent.trim_end_matches('/'))
    }
}

/// A container's cgroup below its pod's.
pub fn container_cgroup(pod_cgroup: &str, container_id: &str) -> String {
    format!("{}/{}", pod_cgroup.trim_end_matches('/'), container_id)
}

/// Whether crius created this pod cgroup (and so must remove it).
pub fn owned_by_crius(pod_cgroup: &str) -> bool {
    pod_cgroup.starts_with(&format!("{CRIUS_PARENT}/"))
}

/// Every cgroup hierarchy mounted on this host (each v1 controller and the v2 tree).
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            left.split(' ').nth(4).map(PathBuf::from)
        })
        .collect()
}

/// Removes `cgroup` (an absolute cgroup path) and everything below it in every hierarchy,
/// leaf first. A cgroup that still has processes cannot be removed: that is reported, the rest
/// is still removed. Missing directories are fine.
pub fn remove(cgroup: &str) -> Result<(), std::io::Error> {
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() {
        return Ok(());
    }
    let mut first_err = None;
    for h in hierarchies() {
        if let Err(e) = remove_tree(&h.join(rel)) {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn remove_tree(dir: &Path) -> Result<(), std::io::Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("remove cgroup {}: {e}", dir.display()),
        )),
    }
}

/// Removes crius's own parent cgroup when no pod is left in it (best effort: a pod created
/// at the same moment keeps it).
pub fn remove_parent_if_empty() {
    for h in hierarchies() {
        let _ = std::fs::remove_dir(h.join(CRIUS_PARENT.trim_start_matches('/')));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroup_from_parent_or_own() {
        assert_eq!(pod_cgroup("", "abc"), "/crius/abc");
        assert_eq!(
            pod_cgroup("/kubepods/besteffort/pod1/", "abc"),
            "/kubepods/besteffort/pod1"
        );
        assert_eq!(pod_cgroup("kubepods/pod1", "abc"), "/kubepods/pod1");
        assert_eq!(container_cgroup("/crius/abc", "c1"), "/crius/abc/c1");
        assert!(owned_by_crius("/crius/abc"));
        assert!(!owned_by_crius("/kubepods/pod1"));
    }

    #[test]
    fn remove_tree_takes_nested_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir_all(a.join("b/c")).unwrap();
        remove_tree(&a).unwrap();
        assert!(!a.exists());
        remove_tree(&a).unwrap();
    }
}
