//! Making and removing the directories of pod and container cgroups: a container's ahead of
//! its create on v1, a pod's or container's whole tree in every hierarchy when it goes.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::systemd::own_unit;
use super::{
    container_cgroup, driver, fs_path, hierarchies, Driver, Hierarchy, Mode, CRIUS_PARENT,
};

/// How long removing a pod or container waits for its cgroup to empty (killed orphans of a
/// dead shim are zombies until init reaps them).
pub const REMOVE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Makes the directories of a container's cgroup (`container_cgroup(pod_cgroup, id)`) in the
/// v1 hierarchies libcontainer will put it in, ahead of its create: on a v1 host the helper's
/// intermediate process spent about a fifth of its time in those `mkdir`s (nine hierarchies
/// here), on the create's path, where crius can make them beside the rootfs. libcontainer
/// makes a missing one as before and takes an existing one as is; the container's removal
/// removes them in every hierarchy, and the pod's removal whatever is below the pod. Only with
/// the cgroupfs driver on v1; anything that fails is left to libcontainer.
pub fn make_container_dirs_ahead(pod_cgroup: &str, id: &str) {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    if !matches!(driver(), Driver::Cgroupfs)
        || !Hierarchy::host().is_ok_and(|h| h.mode() == Mode::V1)
    {
        return;
    }
    let roots = DIRS.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        crius_common::mountinfo::distinct_mounts(&crius_common::mountinfo::libcontainer_v1_mounts(
            &info,
        ))
    });
    let cgroup = container_cgroup(pod_cgroup, id);
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c == "..") {
        return;
    }
    for root in roots {
        let dir = root.join(rel);
        if let Err(e) = std::fs::create_dir(&dir) {
            tracing::debug!(dir = %dir.display(), "make a container's cgroup ahead: {e}");
        }
    }
}

/// Removes `cgroup` (an absolute cgroup path, or a systemd name [`fs_path`] expands) and
/// everything below it in every hierarchy, leaf first. A cgroup that still has processes cannot
/// be removed: that is reported, the rest is still removed. Missing directories are fine.
/// With the systemd driver the unit crius made for it (a container's scope, a pod slice crius
/// owns) is stopped first, on a blocking thread (a D-Bus round trip); systemd forgets a
/// transient unit once it is stopped. With cgroupfs nothing is awaited.
pub async fn remove(cgroup: &str) -> std::result::Result<(), std::io::Error> {
    let path = fs_path(cgroup)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return Ok(());
    }
    if let Some((sd, unit)) = own_unit(&path) {
        let unit = unit.to_string();
        let stop = tokio::task::spawn_blocking(move || {
            if let Err(e) = sd.stop(&unit) {
                tracing::warn!("stop {unit}: {}", crius_common::error_chain(&e));
            }
        });
        if let Err(e) = stop.await {
            tracing::warn!("stop the unit of {path}: {e}");
        }
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

fn remove_tree(dir: &Path) -> std::result::Result<(), std::io::Error> {
    crius_common::fs::remove_dir_tree(dir).map_err(|(at, e)| {
        std::io::Error::new(e.kind(), format!("remove cgroup {}: {e}", at.display()))
    })
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
    fn remove_tree_takes_nested_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir_all(a.join("b/c")).unwrap();
        remove_tree(&a).unwrap();
        assert!(!a.exists());
        remove_tree(&a).unwrap();
    }

    #[test]
    fn container_dirs_made_ahead_in_every_libcontainer_hierarchy() {
        if !crius_common::test_needs_root(
            "container_dirs_made_ahead_in_every_libcontainer_hierarchy",
        ) || !Hierarchy::host().is_ok_and(|h| h.mode() == Mode::V1)
        {
            return;
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let roots = crius_common::mountinfo::distinct_mounts(
            &crius_common::mountinfo::libcontainer_v1_mounts(&info),
        );
        assert!(!roots.is_empty());
        let pod = format!("/crius-test-ahead-{}", std::process::id());
        for root in &roots {
            std::fs::create_dir(root.join(&pod[1..])).unwrap();
        }
        make_container_dirs_ahead(&pod, "c1");
        let made: Vec<bool> = roots
            .iter()
            .map(|r| r.join(&pod[1..]).join("c1").is_dir())
            .collect();
        for root in &roots {
            let _ = std::fs::remove_dir(root.join(&pod[1..]).join("c1"));
            let _ = std::fs::remove_dir(root.join(&pod[1..]));
        }
        assert!(made.iter().all(|m| *m), "{roots:?}: {made:?}");
    }
}
