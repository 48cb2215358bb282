//! The systemd driver: unit names, the cgroup paths they stand for, which units are crius's
//! own, unit properties, and putting a new container into its scope ([`attach`]).
//!
//! With the systemd driver kubelet names pod cgroups by slice (`kubepods-besteffort-pod<uid>.slice`,
//! a dash marking each parent). crius gives each pod a transient slice of its own, below the
//! named one (`kubepods-besteffort-pod<uid>-crius<pod-id>.slice`) so the pod's limits never land
//! in a slice it did not make, or `crius-<pod-id>.slice` inside `crius.slice` for a pod that
//! came without a parent; each container (the pause container included) runs in a transient
//! scope `crius-<id>.scope` inside the pod's slice, as runc's systemd driver does for
//! containerd. The units are created over D-Bus ([`super::manager`]) with the
//! container's limits as unit properties ([`resource_properties`]), so that systemd, which owns
//! those cgroups, keeps the same values when it re-applies its own.
//!
//! Runtimes that let libcontainer's systemd manager do this give it a `linux.cgroupsPath` of the
//! form `slice:prefix:name`; [`to_fs_path`] still reads that form. libcontainer's manager only
//! works on cgroup v2, so crius gives libcontainer the scope's cgroupfs path and makes the unit
//! itself.

use crius_api::v1::LinuxContainerResources;

use crate::config::CgroupDriver;

use super::dbus::Value;
use super::{
    container_cgroups_path, driver, fs_path, hierarchies, manager, owned_by_crius, write_file,
    CgroupError, Driver, Hierarchy, Mode, Result,
};

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

/// The pod's slice, one crius makes for it: below the slice kubelet names in `cgroup_parent`
/// (the last element; an expanded path works too) `<parent>-crius<pod-id>.slice`, so the pod's
/// limits never land in a slice crius did not make (a client may name a shared one, such as
/// `system.slice`); with no parent `crius-<pod-id>.slice` (in `crius.slice`).
pub fn pod_slice(cgroup_parent: &str, pod_id: &str) -> Result<String> {
    let parent = cgroup_parent.trim_end_matches('/');
    if parent.is_empty() {
        return Ok(format!("{CRIUS_SLICE_PREFIX}{pod_id}.slice"));
    }
    let base = parent.rsplit('/').next().unwrap_or(parent);
    let Some(stem) = base.strip_suffix(".slice") else {
        return Err(bad(
            cgroup_parent,
            "the systemd cgroup driver needs a slice as cgroup_parent (is kubelet's cgroupDriver cgroupfs?)",
        ));
    };
    expand_slice(base)?;
    Ok(match stem {
        "-" => format!("{OWN_SLICE_MARK}{pod_id}.slice"),
        _ => format!("{stem}-{OWN_SLICE_MARK}{pod_id}.slice"),
    })
}

/// The last part of a slice crius makes for a pod below a client's slice: `crius<pod-id>`.
const OWN_SLICE_MARK: &str = "crius";

/// The pod id of a slice crius made for a pod ([`pod_slice`]), from its name; None for any
/// other slice. `parent` is the slice above it when known (a path's previous element).
pub fn own_slice_pod_id<'a>(slice: &'a str, parent: Option<&str>) -> Option<&'a str> {
    let stem = slice.strip_suffix(".slice")?;
    if let Some(id) = stem.strip_prefix(CRIUS_SLICE_PREFIX) {
        let in_crius_slice = parent.is_none_or(|p| p == "crius.slice");
        if !id.is_empty() && !id.contains('-') && in_crius_slice {
            return Some(id);
        }
    }
    let (above, last) = match stem.rsplit_once('-') {
        Some((above, last)) => (Some(above), last),
        None => (None, stem),
    };
    let id = last.strip_prefix(OWN_SLICE_MARK)?;
    let hex = !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit());
    // The name spells its parent: kubepods-pod1.slice/kubepods-pod1-crius<id>.slice.
    let placed = match (parent, above) {
        (None, _) => true,
        (Some(p), Some(above)) => p.strip_suffix(".slice") == Some(above),
        (Some(p), None) => p.is_empty() || p == "-.slice",
    };
    (hex && placed).then_some(id)
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

/// The scope unit of a container (or a pod's pause container): `crius-<id>.scope`.
pub fn scope_name(id: &str) -> String {
    format!("{SCOPE_PREFIX}-{id}.scope")
}

/// The unit a cgroupfs path ends in (`…/crius-<id>.scope`, `…/<name>.slice`), if it is one.
pub fn unit_of(fs_path: &str) -> Option<&str> {
    let last = fs_path.rsplit('/').next()?;
    (last.ends_with(".scope") || last.ends_with(".slice")).then_some(last)
}

/// The systemd unit crius made for this cgroup, when the driver is systemd: a container's
/// `crius-<id>.scope`, or a pod slice crius owns (kubelet's slices are kubelet's).
pub(super) fn own_unit(cgroup: &str) -> Option<(&'static manager::Systemd, &str)> {
    let Driver::Systemd(sd) = driver() else {
        return None;
    };
    let unit = unit_of(cgroup)?;
    let ours = if unit.ends_with(".scope") {
        unit.starts_with(&format!("{SCOPE_PREFIX}-"))
    } else {
        owned_by_crius(cgroup)
    };
    ours.then_some((sd, unit))
}

/// systemd's "no limit" for `t` properties (`infinity`).
pub const INFINITY: u64 = u64::MAX;

/// The CFS quota as systemd takes it: CPU time per second of wall time, in microseconds.
/// systemd keeps it as a whole percentage of one CPU, so it is rounded up to a multiple of
/// 10 ms (as runc does): the cgroup's own `cfs_quota_us`, written afterwards, stays within it.
pub fn quota_per_sec_usec(quota: i64, period: i64) -> u64 {
    if quota < 0 {
        return INFINITY;
    }
    let period = if period > 0 {
        period.unsigned_abs()
    } else {
        super::DEFAULT_CPU_PERIOD.unsigned_abs()
    };
    let per_sec = u128::from(quota.unsigned_abs()) * 1_000_000 / u128::from(period);
    let rounded = per_sec.div_ceil(10_000) * 10_000;
    u64::try_from(rounded).unwrap_or(INFINITY)
}

/// A cpuset list (`0-3,8`) as systemd's `AllowedCPUs`/`AllowedMemoryNodes` bitmask: byte
/// `n / 8`, bit `n % 8` for CPU `n`.
pub fn cpu_bits(list: &str) -> Result<Vec<u8>> {
    // Far above any machine; stops "0-4294967295" from allocating half a gigabyte.
    const MAX_CPU: u32 = 1 << 16;
    let invalid = || CgroupError::Invalid(format!("cpuset {list:?} is not a list of CPUs"));
    let mut bits = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>(), b.trim().parse::<u32>()),
            None => (part.trim().parse::<u32>(), part.trim().parse::<u32>()),
        };
        let (Ok(lo), Ok(hi)) = (lo, hi) else {
            return Err(invalid());
        };
        if lo > hi || hi >= MAX_CPU {
            return Err(invalid());
        }
        for n in lo..=hi {
            let byte = (n / 8) as usize;
            if bits.len() <= byte {
                bits.resize(byte + 1, 0);
            }
            bits[byte] |= 1 << (n % 8);
        }
    }
    Ok(bits)
}

/// The unit properties for CRI resources `r`, in the names systemd uses on this cgroup
/// version. Zero or empty fields (CRI's "not set") give no property, except `TasksMax`, which
/// is always sent (unlimited unless `unified` sets `pids.max`): left out, systemd would apply
/// its `DefaultTasksMax` to the container. What systemd cannot express (cpuset and swap on
/// v1, hugepages, other `unified` keys) is only written to cgroupfs.
pub fn resource_properties(
    r: &LinuxContainerResources,
    mode: Mode,
) -> Result<Vec<(String, Value)>> {
    let mut props: Vec<(String, Value)> = Vec::new();
    let mut put = |name: &str, v: Value| props.push((name.to_string(), v));
    if r.cpu_shares > 0 {
        let shares = r.cpu_shares.unsigned_abs();
        match mode {
            Mode::V1 => put("CPUShares", Value::U64(shares)),
            Mode::V2 => put("CPUWeight", Value::U64(super::v2::shares_to_weight(shares))),
        }
    }
    if r.cpu_period > 0 {
        put(
            "CPUQuotaPeriodUSec",
            Value::U64(r.cpu_period.unsigned_abs()),
        );
    }
    if r.cpu_quota != 0 {
        put(
            "CPUQuotaPerSecUSec",
            Value::U64(quota_per_sec_usec(r.cpu_quota, r.cpu_period)),
        );
    }
    let limit = |v: i64| if v < 0 { INFINITY } else { v.unsigned_abs() };
    if r.memory_limit_in_bytes != 0 {
        let name = match mode {
            Mode::V1 => "MemoryLimit",
            Mode::V2 => "MemoryMax",
        };
        put(name, Value::U64(limit(r.memory_limit_in_bytes)));
    }
    if mode == Mode::V2 {
        if let Some(swap) =
            super::v2::swap_max(r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes)?
        {
            let v = swap.parse::<u64>().unwrap_or(INFINITY);
            put("MemorySwapMax", Value::U64(v));
        }
        if !r.cpuset_cpus.is_empty() {
            put("AllowedCPUs", Value::Bytes(cpu_bits(&r.cpuset_cpus)?));
        }
        if !r.cpuset_mems.is_empty() {
            put(
                "AllowedMemoryNodes",
                Value::Bytes(cpu_bits(&r.cpuset_mems)?),
            );
        }
    }
    let tasks = match r.unified.get("pids.max").map(|v| v.trim()) {
        Some("max") | None => INFINITY,
        Some(n) => n.parse::<u64>().map_err(|_| {
            CgroupError::Invalid(format!("unified pids.max {n:?} is not a number or max"))
        })?,
    };
    put("TasksMax", Value::U64(tasks));
    Ok(props)
}

/// Accounting on for the controllers crius reads and limits, so that systemd creates the
/// unit's cgroup in each of their hierarchies.
fn accounting(mode: Mode) -> Vec<(String, Value)> {
    let io = match mode {
        Mode::V1 => "BlockIOAccounting",
        Mode::V2 => "IOAccounting",
    };
    ["CPUAccounting", "MemoryAccounting", "TasksAccounting", io]
        .into_iter()
        .map(|n| (n.to_string(), Value::Bool(true)))
        .collect()
}

/// The properties of the transient scope of container `id` (process `pid`) in `slice`. With
/// `Delegate` the container may manage cgroups below its own, and systemd leaves them alone.
pub fn scope_properties(
    id: &str,
    slice: &str,
    pid: u32,
    resources: &LinuxContainerResources,
    mode: Mode,
) -> Result<Vec<(String, Value)>> {
    let mut props = vec![
        (
            "Description".to_string(),
            Value::Str(format!("crius container {id}")),
        ),
        ("Slice".to_string(), Value::Str(slice.to_string())),
        ("Delegate".to_string(), Value::Bool(true)),
        ("DefaultDependencies".to_string(), Value::Bool(false)),
        ("PIDs".to_string(), Value::U32s(vec![pid])),
    ];
    props.extend(accounting(mode));
    props.extend(resource_properties(resources, mode)?);
    Ok(props)
}

/// The properties of the transient slice crius makes for a pod that has no parent.
pub fn slice_properties(pod_id: &str, mode: Mode) -> Vec<(String, Value)> {
    let mut props = vec![
        (
            "Description".to_string(),
            Value::Str(format!("crius pod {pod_id}")),
        ),
        ("DefaultDependencies".to_string(), Value::Bool(false)),
    ];
    props.extend(accounting(mode));
    props
}

/// With the systemd driver: puts the just-created container `id` (its init process `pid`,
/// not yet started) of the pod whose cgroup is `pod_cgroup` into its transient scope, made in
/// the pod's slice (and the pod's own slice first, when crius owns it) with the limits
/// libcontainer wrote. Call it right after the shim created the container, before it starts.
/// Nothing to do with cgroupfs.
pub async fn attach(pod_cgroup: &str, id: &str, pid: i32) -> Result<()> {
    let Driver::Systemd(sd) = driver() else {
        return Ok(());
    };
    let pid = u32::try_from(pid)
        .map_err(|_| CgroupError::Internal(format!("container {id}: no process (pid {pid})")))?;
    let (pod, owned_id) = (pod_cgroup.to_string(), id.to_string());
    tokio::task::spawn_blocking(move || attach_scope(sd, &pod, &owned_id, pid))
        .await
        .map_err(|e| CgroupError::Internal(format!("container {id}: attach to systemd: {e}")))?
}

fn attach_scope(sd: &manager::Systemd, pod_cgroup: &str, id: &str, pid: u32) -> Result<()> {
    let hierarchy = Hierarchy::host()?;
    let mode = hierarchy.mode();
    let cgroup = container_cgroups_path(CgroupDriver::Systemd, pod_cgroup, id);
    let slice = unit_of(pod_cgroup)
        .filter(|u| u.ends_with(".slice"))
        .ok_or_else(|| CgroupError::BadPath {
            path: pod_cgroup.to_string(),
            reason: "the systemd driver needs a pod slice",
        })?;
    if let Some(pod_id) = own_slice_pod_id(slice, None) {
        sd.start_transient(slice, &slice_properties(pod_id, mode), true)?;
    }
    // What libcontainer wrote from the spec; the scope gets the same values.
    let limits = hierarchy.read(&cgroup)?;
    let scope = scope_name(id);
    let props = scope_properties(id, slice, pid, &limits, mode)?;
    sd.start_transient(&scope, &props, false)?;
    rejoin(&cgroup, pid)?;
    // systemd wrote its values (and defaults for what it was not told) into the controllers
    // it manages: put libcontainer's back, the ones systemd cannot express included.
    hierarchy.apply_files(&cgroup, &limits)
}

/// Moves `pid` into `cgroup` in every hierarchy where that cgroup exists (libcontainer made
/// them): systemd puts a scope's processes into the scope only for the controllers it manages
/// and into the nearest ancestor it manages for the others.
fn rejoin(cgroup: &str, pid: u32) -> Result<()> {
    let rel = fs_path(cgroup)?;
    let rel = rel.trim_start_matches('/');
    for h in hierarchies() {
        let procs = h.join(rel).join("cgroup.procs");
        if !procs.exists() {
            continue;
        }
        write_file(&procs, &pid.to_string()).map_err(|source| CgroupError::Write {
            path: procs.clone(),
            value: pid.to_string(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::manager::Systemd;
    use crate::cgroups::paths::pod_cgroup_with;
    use crate::cgroups::{owned_by_crius, Driver};
    use std::path::Path;

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
                "ab12"
            )
            .unwrap(),
            "kubepods-burstable-pod0f2e-criusab12.slice"
        );
        assert_eq!(
            pod_slice(pod, "ab12").unwrap(),
            "kubepods-burstable-pod0f2e-criusab12.slice"
        );
        assert_eq!(pod_slice("-.slice", "ab12").unwrap(), "criusab12.slice");
        assert_eq!(pod_slice("", "p1").unwrap(), "crius-p1.slice");
        assert!(pod_slice("/kubepods/burstable/pod0f2e", "p1").is_err());
        assert_eq!(
            to_fs_path(&format!("{pod}:crius:c1")).unwrap(),
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
        let sd = Driver::Systemd(Systemd::with_root(Path::new("/nonexistent"), ""));
        let pod = pod_cgroup_with(&sd, "", "p1").unwrap();
        assert_eq!(pod, "/crius.slice/crius-p1.slice");
        assert!(owned_by_crius(&pod));
        assert!(owned_by_crius("crius-p1.slice"));
        assert!(!owned_by_crius("/kubepods.slice/crius-p1.slice"));
        let c = container_cgroups_path(CgroupDriver::Systemd, &pod, "c1");
        assert_eq!(c, "/crius.slice/crius-p1.slice/crius-c1.scope");
        assert_eq!(unit_of(&c), Some("crius-c1.scope"));
        assert_eq!(unit_of(&pod), Some("crius-p1.slice"));
        assert_eq!(unit_of("/crius/p1"), None);
        // crius's own slice below kubelet's, expanded; a user manager's (or a nested
        // systemd's) root in front.
        let kube = "kubepods-besteffort-pod0f2e.slice";
        let own = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f2e.slice/kubepods-besteffort-pod0f2e-criusab12.slice";
        assert_eq!(pod_cgroup_with(&sd, kube, "ab12").unwrap(), own);
        assert!(owned_by_crius(own));
        assert!(owned_by_crius(
            "kubepods-besteffort-pod0f2e-criusab12.slice"
        ));
        assert!(owned_by_crius("/criusab12.slice"));
        assert!(!owned_by_crius(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f2e.slice"
        ));
        assert!(!owned_by_crius("/a.slice/b-criusab12.slice"), "misplaced");
        assert!(!owned_by_crius("/a.slice/a-criusxyz.slice"), "no pod id");
        assert_eq!(
            own_slice_pod_id("system-criusab12.slice", Some("system.slice")),
            Some("ab12")
        );
        let nested = Driver::Systemd(Systemd::with_root(Path::new("/x"), "/crius-sd/"));
        assert_eq!(
            pod_cgroup_with(&nested, kube, "ab12").unwrap(),
            format!("/crius-sd{own}")
        );
        assert!(owned_by_crius(&pod_cgroup_with(&nested, "", "p1").unwrap()));
        // A cgroupfs parent under the systemd driver: kubelet and crius disagree.
        let err = pod_cgroup_with(&sd, "/kubepods/besteffort/pod1", "p1").unwrap_err();
        assert!(err.to_string().contains("cgroupDriver"), "{err}");
        let fs = Driver::Cgroupfs;
        let pod = pod_cgroup_with(&fs, "", "p1").unwrap();
        assert_eq!(
            container_cgroups_path(CgroupDriver::Cgroupfs, &pod, "c1"),
            "/crius/p1/c1"
        );
        assert_eq!(fs_path("/crius/p1/c1/").unwrap(), "/crius/p1/c1");
        assert!(fs_path("/kubepods/../../etc").is_err());
        assert!(!owned_by_crius("kubepods-pod1.slice"));
    }

    fn prop<'a>(props: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
        props.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    #[test]
    fn cpu_properties_per_cgroup_version() {
        let r = LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            ..Default::default()
        };
        let v1 = resource_properties(&r, Mode::V1).unwrap();
        assert_eq!(prop(&v1, "CPUShares"), Some(&Value::U64(1024)));
        assert_eq!(prop(&v1, "CPUWeight"), None);
        assert_eq!(prop(&v1, "CPUQuotaPerSecUSec"), Some(&Value::U64(500_000)));
        assert_eq!(prop(&v1, "CPUQuotaPeriodUSec"), Some(&Value::U64(100_000)));
        let v2 = resource_properties(&r, Mode::V2).unwrap();
        assert_eq!(prop(&v2, "CPUWeight"), Some(&Value::U64(100)));
        assert_eq!(prop(&v2, "CPUShares"), None);
        // A quota that is no whole percent of a CPU rounds up to the next 10 ms per second.
        assert_eq!(quota_per_sec_usec(12_345, 100_000), 130_000);
        assert_eq!(quota_per_sec_usec(10_000, 50_000), 200_000);
        assert_eq!(quota_per_sec_usec(20_000, 0), 200_000);
        assert_eq!(quota_per_sec_usec(-1, 100_000), INFINITY);
        // Unset fields give no property.
        let none = resource_properties(&LinuxContainerResources::default(), Mode::V1).unwrap();
        assert_eq!(none, vec![("TasksMax".to_string(), Value::U64(INFINITY))]);
    }

    #[test]
    fn memory_properties_per_cgroup_version() {
        let r = LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 96 << 20,
            ..Default::default()
        };
        let v1 = resource_properties(&r, Mode::V1).unwrap();
        assert_eq!(prop(&v1, "MemoryLimit"), Some(&Value::U64(64 << 20)));
        assert_eq!(prop(&v1, "MemoryMax"), None);
        // v1's memory+swap limit has no systemd property: cgroupfs only.
        assert_eq!(prop(&v1, "MemorySwapMax"), None);
        let v2 = resource_properties(&r, Mode::V2).unwrap();
        assert_eq!(prop(&v2, "MemoryMax"), Some(&Value::U64(64 << 20)));
        assert_eq!(prop(&v2, "MemorySwapMax"), Some(&Value::U64(32 << 20)));
        let unlimited = LinuxContainerResources {
            memory_limit_in_bytes: -1,
            ..Default::default()
        };
        let v2 = resource_properties(&unlimited, Mode::V2).unwrap();
        assert_eq!(prop(&v2, "MemoryMax"), Some(&Value::U64(INFINITY)));
        assert_eq!(prop(&v2, "MemorySwapMax"), Some(&Value::U64(INFINITY)));
    }

    #[test]
    fn pids_and_cpuset_properties() {
        let r = LinuxContainerResources {
            cpuset_cpus: "0-2,9".into(),
            cpuset_mems: "0".into(),
            unified: [("pids.max".to_string(), "100".to_string())].into(),
            ..Default::default()
        };
        let v2 = resource_properties(&r, Mode::V2).unwrap();
        assert_eq!(
            prop(&v2, "AllowedCPUs"),
            Some(&Value::Bytes(vec![0b0000_0111, 0b0000_0010]))
        );
        assert_eq!(
            prop(&v2, "AllowedMemoryNodes"),
            Some(&Value::Bytes(vec![1]))
        );
        assert_eq!(prop(&v2, "TasksMax"), Some(&Value::U64(100)));
        // systemd has no cpuset on v1: cgroupfs only.
        let v1 = resource_properties(
            &LinuxContainerResources {
                cpuset_cpus: "0".into(),
                ..Default::default()
            },
            Mode::V1,
        )
        .unwrap();
        assert_eq!(prop(&v1, "AllowedCPUs"), None);
        assert_eq!(prop(&v1, "TasksMax"), Some(&Value::U64(INFINITY)));
        for bad in ["a", "3-1", "0-99999999", "1-"] {
            assert!(cpu_bits(bad).is_err(), "{bad}");
        }
        assert_eq!(cpu_bits("").unwrap(), Vec::<u8>::new());
        let bad_pids = LinuxContainerResources {
            unified: [("pids.max".to_string(), "lots".to_string())].into(),
            ..Default::default()
        };
        assert!(resource_properties(&bad_pids, Mode::V2).is_err());
    }

    #[test]
    fn scope_and_slice_properties() {
        let r = LinuxContainerResources {
            cpu_shares: 2,
            ..Default::default()
        };
        let p = scope_properties("c1", "kubepods-pod1.slice", 4242, &r, Mode::V1).unwrap();
        assert_eq!(
            prop(&p, "Slice"),
            Some(&Value::Str("kubepods-pod1.slice".into()))
        );
        assert_eq!(prop(&p, "PIDs"), Some(&Value::U32s(vec![4242])));
        assert_eq!(prop(&p, "Delegate"), Some(&Value::Bool(true)));
        assert_eq!(prop(&p, "BlockIOAccounting"), Some(&Value::Bool(true)));
        assert_eq!(prop(&p, "CPUShares"), Some(&Value::U64(2)));
        assert_eq!(scope_name("c1"), "crius-c1.scope");
        let s = slice_properties("p1", Mode::V2);
        assert_eq!(prop(&s, "IOAccounting"), Some(&Value::Bool(true)));
        assert_eq!(prop(&s, "Delegate"), None);
    }
}
