//! The systemd driver's cgroup names.
//!
//! With the systemd driver kubelet names pod cgroups by slice (`kubepods-besteffort-pod<uid>.slice`,
//! a dash marking each parent) and runtimes give libcontainer's systemd manager a
//! `linux.cgroupsPath` of the form `slice:prefix:name`, which becomes the scope unit
//! `<prefix>-<name>.scope` inside that slice. containerd derives it from the pod's parent as
//! `<last path element of cgroup_parent>:cri-containerd:<id>`; crius does the same with the
//! prefix `crius`.
//!
//! Only the names are handled here. Creating those units needs libcontainer's `systemd`
//! feature (it talks to systemd over D-Bus), which crius does not enable; with
//! `[cgroup] driver = "systemd"` the daemon refuses to start (see [`super::check_driver`]).

use super::{CgroupError, Result};

/// The scope prefix of crius's containers: `crius-<id>.scope`.
pub const SCOPE_PREFIX: &str = "crius";

/// Slice names of pods that came without a parent: `crius-<pod-id>.slice`, inside `crius.slice`.
pub const CRIUS_SLICE_PREFIX: &str = "crius-";

fn bad(path: &str, reason: &'static str) -> CgroupError {
    CgroupError::BadPath {
        path: path.to_string(),
        reason,
    }
}

/// The filesystem path of a slice: `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`, and the
/// root slice `-.slice` → `/`.
pub fn expand_slice(slice: &str) -> Result<String> {
    let Some(name) = slice.strip_suffix(".slice") else {
        return Err(bad(slice, "a slice name must end in .slice"));
    };
    if name == "-" {
        return Ok("/".to_string());
    }
    if name.is_empty() || slice.contains('/') {
        return Err(bad(slice, "not a slice name"));
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if part.is_empty() {
            return Err(bad(slice, "a slice name has no empty part between dashes"));
        }
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Ok(path)
}

/// The pod's slice: the last element of kubelet's `cgroup_parent` (kubelet sends the slice
/// name; an expanded path works too), or `crius-<pod-id>.slice` when there is none.
pub fn pod_slice(cgroup_parent: &str, pod_id: &str) -> Result<String> {
    let parent = cgroup_parent.trim_end_matches('/');
    if parent.is_empty() {
        return Ok(format!("{CRIUS_SLICE_PREFIX}{pod_id}.slice"));
    }
    let base = parent.rsplit('/').next().unwrap_or(parent);
    if !base.ends_with(".slice") {
        return Err(bad(
            cgroup_parent,
            "the systemd cgroup driver needs a slice as cgroup_parent (is kubelet's cgroupDriver cgroupfs?)",
        ));
    }
    expand_slice(base)?;
    Ok(base.to_string())
}

/// `linux.cgroupsPath` of a container in the pod slice `pod_slice`: `<slice>:crius:<id>`.
pub fn container_path(pod_slice: &str, id: &str) -> String {
    format!("{pod_slice}:{SCOPE_PREFIX}:{id}")
}

/// The cgroupfs path of a `slice:prefix:name` cgroups path, where libcontainer's systemd
/// manager (like runc's) puts it: the expanded slice (`system.slice` when empty), then the unit
/// `<prefix>-<name>.scope`, or `<name>` itself when that is a slice.
pub fn to_fs_path(cgroups_path: &str) -> Result<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let [slice, prefix, name] = parts[..] else {
        return Err(bad(cgroups_path, "expected slice:prefix:name"));
    };
    if name.is_empty() || name.contains('/') {
        return Err(bad(cgroups_path, "the name part must be a plain name"));
    }
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let parent = expand_slice(slice)?;
    let unit = if name.ends_with(".slice") {
        name.to_string()
    } else if prefix.is_empty() {
        format!("{name}.scope")
    } else {
        format!("{prefix}-{name}.scope")
    };
    Ok(format!("{}/{unit}", parent.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::{container_cgroups_path, fs_path, owned_by_crius, pod_cgroup_for};
    use crate::config::CgroupDriver;

    #[test]
    fn slices_expand_to_their_parents() {
        assert_eq!(
            expand_slice("kubepods-besteffort-pod1234.slice").unwrap(),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice"
        );
        assert_eq!(expand_slice("a.slice").unwrap(), "/a.slice");
        assert_eq!(expand_slice("-.slice").unwrap(), "/");
        for bad in [
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            "a.scope",
            ".slice",
            "a/b.slice",
        ] {
            assert!(expand_slice(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn container_paths_as_containerd_writes_them() {
        let pod = "kubepods-burstable-pod0f2e.slice";
        assert_eq!(
            pod_slice(
                &format!("/kubepods.slice/kubepods-burstable.slice/{pod}"),
                "p1"
            )
            .unwrap(),
            pod
        );
        assert_eq!(pod_slice(pod, "p1").unwrap(), pod);
        assert_eq!(pod_slice("", "p1").unwrap(), "crius-p1.slice");
        assert!(pod_slice("/kubepods/burstable/pod0f2e", "p1").is_err());
        assert_eq!(container_path(pod, "c1"), format!("{pod}:crius:c1"));
        assert_eq!(
            to_fs_path(&container_path(pod, "c1")).unwrap(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2e.slice/crius-c1.scope"
        );
        assert_eq!(
            to_fs_path(":crius:c1").unwrap(),
            "/system.slice/crius-c1.scope"
        );
        assert_eq!(to_fs_path("a.slice::x").unwrap(), "/a.slice/x.scope");
        assert_eq!(to_fs_path("a.slice:p:b.slice").unwrap(), "/a.slice/b.slice");
        assert!(to_fs_path("a.slice:c1").is_err());
        assert!(to_fs_path("a.slice:p:../x").is_err());
    }

    #[test]
    fn driver_aware_paths() {
        let sd = CgroupDriver::Systemd;
        let fs = CgroupDriver::Cgroupfs;
        let pod = pod_cgroup_for(sd, "", "p1").unwrap();
        assert_eq!(pod, "crius-p1.slice");
        assert!(owned_by_crius(&pod));
        assert_eq!(fs_path(&pod).unwrap(), "/crius.slice/crius-p1.slice");
        let c = container_cgroups_path(sd, &pod, "c1");
        assert_eq!(
            fs_path(&c).unwrap(),
            "/crius.slice/crius-p1.slice/crius-c1.scope"
        );
        let pod = pod_cgroup_for(fs, "", "p1").unwrap();
        assert_eq!(container_cgroups_path(fs, &pod, "c1"), "/crius/p1/c1");
        assert_eq!(fs_path("/crius/p1/c1/").unwrap(), "/crius/p1/c1");
        assert!(fs_path("/kubepods/../../etc").is_err());
        assert!(!owned_by_crius("kubepods-pod1.slice"));
    }
}
