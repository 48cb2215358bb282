//! What the node is, as far as a spec depends on it: probed once when crius starts
//! ([`HostFacts::probe`], held on the daemon) and passed to the spec builders and
//! `layout::write_spec`, which read nothing of the host themselves. Tests build one by hand.

use std::path::Path;

use super::security::Lsm;

/// The node's facts a spec follows.
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// The highest capability number the running kernel knows
    /// (`/proc/sys/kernel/cap_last_cap`; `u32::MAX` when unreadable).
    pub cap_last_cap: u32,
    /// The capabilities crius holds (`CapEff` of `/proc/self/status`) as a mask; every bit
    /// when unreadable.
    pub held_caps: u64,
    /// AppArmor and SELinux, and what became of crius's default AppArmor profile.
    pub(crate) lsm: Lsm,
    /// The node's hostname, the `HOSTNAME` of a container whose pod has none (host network).
    pub hostname: String,
    /// The lowest `oom_score_adj` crius may give a process: -1000 with CAP_SYS_RESOURCE, else
    /// crius's own (lowering it below the creator's needs that capability).
    pub min_oom_score_adj: i32,
    /// Whether the node has a hugetlb cgroup controller (without one, hugepage limits are
    /// dropped: kubelet sends a zero limit for every page size, and libcontainer refuses
    /// limits of a missing controller).
    pub hugetlb: bool,
    /// Whether the node runs cgroup v1 (`/sys/fs/cgroup` is not the unified hierarchy).
    pub cgroup_v1: bool,
}

impl HostFacts {
    /// Reads the facts from this node. Call after the default AppArmor profile was loaded
    /// (`apparmor::load_default`), which `Lsm::detect` reports.
    pub fn probe() -> HostFacts {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let cap_eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
        HostFacts {
            cap_last_cap: std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(u32::MAX),
            held_caps: cap_eff.unwrap_or(u64::MAX),
            lsm: Lsm::detect(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            min_oom_score_adj: min_oom_score_adj(cap_eff.unwrap_or(0)),
            hugetlb: crate::cgroups::Hierarchy::host()
                .map_or(true, |h| h.has_controller("hugetlb")),
            cgroup_v1: !Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        }
    }

    /// A node for tests: cgroup v2 with hugetlb, every capability of kernel 5.9+ held, no
    /// AppArmor or SELinux, hostname `node-1`.
    #[cfg(test)]
    pub fn for_tests() -> HostFacts {
        HostFacts {
            cap_last_cap: 40,
            held_caps: u64::MAX,
            lsm: Lsm::default(),
            hostname: "node-1".to_string(),
            min_oom_score_adj: -1000,
            hugetlb: true,
            cgroup_v1: false,
        }
    }
}

/// The lowest `oom_score_adj` a container may be given here. Lowering it below the creator's
/// own value needs CAP_SYS_RESOURCE; without it (some VMs and nested containers) the value
/// is clamped to crius's own instead of failing the create, as containerd does with
/// `restrict_oom_score_adj`.
fn min_oom_score_adj(cap_eff: u64) -> i32 {
    const CAP_SYS_RESOURCE: u32 = 24;
    if cap_eff & (1 << CAP_SYS_RESOURCE) != 0 {
        return -1000;
    }
    std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
