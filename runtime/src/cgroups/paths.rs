//! Where pod and container cgroups are: their names under either driver, the cgroupfs path of
//! any of those names, and which pod cgroups crius made itself.

use crate::config::CgroupDriver;

use super::{driver, systemd, CgroupError, Driver, Result};

/// Parent of the pod cgroups crius owns itself.
pub const CRIUS_PARENT: &str = "/crius";

/// The pod cgroup (a cgroupfs path) for kubelet's `cgroup_parent`: with cgroupfs crius's own
/// `crius-<pod-id>` below the parent, else `/crius/<pod-id>`; with systemd crius's own slice
/// below the parent's (kubelet sends `kubepods-besteffort-pod<uid>.slice`), else
/// `crius-<pod-id>.slice` in `crius.slice`, expanded below systemd's root cgroup. A parent that
/// is no slice is refused under systemd.
///
/// The pod's limits go on a cgroup crius makes and removes with the pod, never on the parent
/// the client named: that one may be shared (`/system.slice`, kubelet's QoS level) and would
/// keep the pod's memory and CPU limits after the pod is gone.
pub fn pod_cgroup(cgroup_parent: &str, pod_id: &str) -> Result<String> {
    pod_cgroup_with(driver(), cgroup_parent, pod_id)
}

pub(crate) fn pod_cgroup_with(
    driver: &Driver,
    cgroup_parent: &str,
    pod_id: &str,
) -> Result<String> {
    match driver {
        Driver::Cgroupfs if cgroup_parent.is_empty() => Ok(format!("{CRIUS_PARENT}/{pod_id}")),
        Driver::Cgroupfs => {
            let parent = cgroup_parent.trim_matches('/');
            if parent.split('/').any(|c| c == "..") {
                return Err(CgroupError::BadPath {
                    path: crate::util::excerpt(cgroup_parent).into_owned(),
                    reason: "`..` is not allowed",
                });
            }
            Ok(match parent {
                "" => format!("/{}", own_pod_cgroup_name(pod_id)),
                _ => format!("/{parent}/{}", own_pod_cgroup_name(pod_id)),
            })
        }
        Driver::Systemd(sd) => {
            let slice = systemd::pod_slice(cgroup_parent, pod_id)?;
            Ok(format!("{}{}", sd.root(), systemd::expand_slice(&slice)?))
        }
    }
}

/// The name of the cgroup crius makes for a pod below a client's `cgroup_parent`.
fn own_pod_cgroup_name(pod_id: &str) -> String {
    format!("crius-{pod_id}")
}

/// Whether `pod_cgroup`, the cgroup of pod `pod_id`, is one crius made for it (and so removes
/// with it): `/crius/<pod-id>`, crius's own slice, or `crius-<pod-id>` below a client's parent.
pub fn pod_cgroup_is_own(pod_cgroup: &str, pod_id: &str) -> bool {
    owned_by_crius(pod_cgroup)
        || pod_cgroup.trim_end_matches('/').rsplit('/').next() == Some(&own_pod_cgroup_name(pod_id))
}

/// A container's cgroup below its pod's: `<pod>/<id>` with cgroupfs, as containerd lays them
/// out; `<pod slice>/crius-<id>.scope` with systemd.
pub fn container_cgroup(pod_cgroup: &str, container_id: &str) -> String {
    let driver = match driver() {
        Driver::Cgroupfs => CgroupDriver::Cgroupfs,
        Driver::Systemd(_) => CgroupDriver::Systemd,
    };
    container_cgroups_path(driver, pod_cgroup, container_id)
}

/// [`container_cgroup`] under `driver`: the OCI `linux.cgroupsPath` of a container (or the pause
/// container) of a pod whose cgroup is `pod_cgroup`, a cgroupfs path with either driver.
pub fn container_cgroups_path(
    driver: CgroupDriver,
    pod_cgroup: &str,
    container_id: &str,
) -> String {
    let pod = pod_cgroup.trim_end_matches('/');
    match driver {
        CgroupDriver::Cgroupfs => format!("{pod}/{container_id}"),
        CgroupDriver::Systemd => format!("{pod}/{}", systemd::scope_name(container_id)),
    }
}

/// The cgroupfs path (absolute, relative to a hierarchy's root) of a cgroup named in any of
/// the forms above: a cgroupfs path as is, a systemd slice name or `slice:prefix:name` expanded.
/// Refuses `..` components, which would leave the hierarchy.
pub fn fs_path(cgroup: &str) -> Result<String> {
    let path = if cgroup.starts_with('/') {
        cgroup.trim_end_matches('/').to_string()
    } else if cgroup.contains(':') {
        systemd::to_fs_path(cgroup)?
    } else if cgroup.ends_with(".slice") {
        systemd::expand_slice(cgroup)?
    } else {
        format!("/{}", cgroup.trim_end_matches('/'))
    };
    if path.split('/').any(|c| c == "..") {
        return Err(CgroupError::BadPath {
            path: cgroup.to_string(),
            reason: "`..` is not allowed",
        });
    }
    Ok(if path.is_empty() {
        "/".to_string()
    } else {
        path
    })
}

/// Whether crius created this pod cgroup (and so must remove it): `/crius/<pod-id>`, a
/// `crius-<pod-id>.slice` (by name or path) inside `crius.slice`, or the slice crius makes for a
/// pod below a client's slice (`<parent>-crius<pod-id>.slice`).
pub fn owned_by_crius(pod_cgroup: &str) -> bool {
    if pod_cgroup.starts_with(&format!("{CRIUS_PARENT}/")) {
        return true;
    }
    let mut parts = pod_cgroup.trim_end_matches('/').rsplit('/');
    let last = parts.next().unwrap_or("");
    systemd::own_slice_pod_id(last, parts.next()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroup_from_parent_or_own() {
        let fs = Driver::Cgroupfs;
        assert_eq!(pod_cgroup_with(&fs, "", "abc").unwrap(), "/crius/abc");
        // A client's parent keeps its limits: the pod gets its own cgroup below it.
        assert_eq!(
            pod_cgroup_with(&fs, "/kubepods/besteffort/pod1/", "abc").unwrap(),
            "/kubepods/besteffort/pod1/crius-abc"
        );
        assert_eq!(
            pod_cgroup_with(&fs, "kubepods/pod1", "abc").unwrap(),
            "/kubepods/pod1/crius-abc"
        );
        assert_eq!(pod_cgroup_with(&fs, "/", "abc").unwrap(), "/crius-abc");
        assert!(pod_cgroup_with(&fs, "/kubepods/../etc", "abc").is_err());
        assert_eq!(container_cgroup("/crius/abc", "c1"), "/crius/abc/c1");
        assert!(owned_by_crius("/crius/abc"));
        assert!(!owned_by_crius("/kubepods/pod1"));
        assert!(pod_cgroup_is_own("/crius/abc", "abc"));
        assert!(pod_cgroup_is_own("/system.slice/crius-abc", "abc"));
        assert!(!pod_cgroup_is_own("/system.slice", "abc"));
        assert!(!pod_cgroup_is_own("/system.slice/crius-abd", "abc"));
    }
}
