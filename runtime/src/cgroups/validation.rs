//! The checks of a request's cgroup values before anything is made: its `cgroup_parent`, and
//! its resources, by one set of rules for every RPC that carries them. Also what the cgroup
//! writes check again themselves ([`Hierarchy::apply`] refuses what no cgroup could take).

use crius_api::v1::LinuxContainerResources;

use super::{CgroupError, Hierarchy, Mode, Result};

/// The longest `cgroup_parent` taken: far more than any real hierarchy needs, and short enough
/// that a cgroup path below it stays within `PATH_MAX` under `/sys/fs/cgroup/<controller>`.
pub const MAX_CGROUP_PARENT_BYTES: usize = 2048;

/// Checks a request's `cgroup_parent` before anything is made: no NUL or line break, no `.`
/// or `..` component (it must not leave the hierarchy), no component longer than a file name
/// may be, at most [`MAX_CGROUP_PARENT_BYTES`]. The error names `field`.
pub fn check_cgroup_parent(field: &str, value: &str) -> std::result::Result<(), String> {
    let bad = |why: &str| Err(format!("{field} {:?} {why}", crate::util::excerpt(value)));
    if value.len() > MAX_CGROUP_PARENT_BYTES {
        return bad(&format!("is longer than {MAX_CGROUP_PARENT_BYTES} bytes"));
    }
    if value.contains(['\0', '\n', '\r']) {
        return bad("contains a NUL byte or a line break");
    }
    for part in value.split('/') {
        if part == "." || part == ".." {
            return bad("has a `.` or `..` component");
        }
        if part.len() > 255 {
            return bad("has a component longer than 255 bytes");
        }
    }
    Ok(())
}

/// The smallest memory limit accepted (Docker's floor): a container below it cannot even start
/// its first process, and the failure would come from deep inside the kernel or the runtime.
pub const MIN_MEMORY_LIMIT: i64 = 6 << 20;

/// Checks the resources of a request (RunPodSandbox's resources and overhead, CreateContainer,
/// UpdateContainerResources) before anything is created: one set of rules for every RPC, the
/// error ([`CgroupError::Request`]) naming the field (`field` is where `r` sits in the request).
pub fn check_resources(field: &str, r: &LinuxContainerResources) -> Result<()> {
    let refused = |reason: String| CgroupError::Request {
        field: field.to_string(),
        reason,
    };
    let mode = Hierarchy::host().map(Hierarchy::mode).unwrap_or(Mode::V2);
    validate(r, mode).map_err(|e| refused(e.to_string()))?;
    for (name, set, online) in [
        ("cpuset_cpus", &r.cpuset_cpus, ONLINE_CPUS),
        ("cpuset_mems", &r.cpuset_mems, ONLINE_NODES),
    ] {
        if let Some(missing) = not_online(set, online) {
            return Err(refused(format!(
                "{name} {:?} names {missing}, which this node does not have online",
                crate::util::excerpt(set)
            )));
        }
    }
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return Err(refused(format!(
            "oom_score_adj {} is out of range (-1000 to 1000)",
            r.oom_score_adj
        )));
    }
    if !r.hugepage_limits.is_empty() {
        check_hugepage_sizes(&r.hugepage_limits, &node_hugepage_sizes()).map_err(refused)?;
    }
    check_swap(r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes).map_err(refused)
}

/// Memory and swap together: the kernel refuses a swap limit without a memory limit or below
/// it (v1's `memsw`; v2's `memory.swap.max` is the difference). Checked at the door only: the
/// cgroup layers meet it as the kernel's refusal, which they undo.
fn check_swap(memory: i64, swap: i64) -> std::result::Result<(), String> {
    if swap > 0 && memory <= 0 {
        return Err(format!(
            "memory_swap_limit_in_bytes {swap} needs memory_limit_in_bytes: it limits memory \
             and swap together"
        ));
    }
    if swap > 0 && swap < memory {
        return Err(format!(
            "memory_swap_limit_in_bytes {swap} is below memory_limit_in_bytes {memory}: it \
             limits memory and swap together"
        ));
    }
    Ok(())
}

/// This node's huge page sizes as the hugetlb controller names them (`2MB`, `1GB`), from
/// `/sys/kernel/mm/hugepages`; none when the kernel has no huge pages.
pub fn node_hugepage_sizes() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") else {
        return Vec::new();
    };
    let mut sizes: Vec<u64> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    sizes.sort_unstable();
    sizes.into_iter().map(hugetlb_name).collect()
}

/// The kernel's name of a huge page size of `kib` KiB in hugetlb's files.
fn hugetlb_name(kib: u64) -> String {
    if kib >= 1 << 20 {
        format!("{}GB", kib >> 20)
    } else if kib >= 1 << 10 {
        format!("{}MB", kib >> 10)
    } else {
        format!("{kib}KB")
    }
}

/// Each hugepage limit names a huge page size the node has (kubelet sends one per size of
/// the node's capacity).
fn check_hugepage_sizes(
    limits: &[crius_api::v1::HugepageLimit],
    node: &[String],
) -> std::result::Result<(), String> {
    for (i, h) in limits.iter().enumerate() {
        if !node.contains(&h.page_size) {
            return Err(format!(
                "hugepage_limits[{i}].page_size {:?} is not a huge page size of this node ({})",
                crate::util::excerpt(&h.page_size),
                if node.is_empty() {
                    "it has none".to_owned()
                } else {
                    node.join(", ")
                }
            ));
        }
    }
    Ok(())
}

/// Checks what no cgroup could take before anything is written.
pub(super) fn validate(r: &LinuxContainerResources, mode: Mode) -> Result<()> {
    let invalid = |m: String| Err(CgroupError::Invalid(m));
    if r.cpu_shares < 0 {
        return invalid(format!("cpu_shares {} is negative", r.cpu_shares));
    }
    if r.cpu_period < 0 {
        return invalid(format!("cpu_period {} is negative", r.cpu_period));
    }
    // The kernel's CFS bounds: a period of 1 ms to 1 s, a quota of at least 1 ms.
    if r.cpu_period != 0 && !(1000..=1_000_000).contains(&r.cpu_period) {
        return invalid(format!(
            "cpu_period {} is out of range (1000 to 1000000 microseconds)",
            r.cpu_period
        ));
    }
    if r.cpu_quota < -1 {
        return invalid(format!(
            "cpu_quota {} is negative (only -1, unlimited, is allowed)",
            r.cpu_quota
        ));
    }
    if r.cpu_quota > 0 && !(1000..=(1 << 44)).contains(&r.cpu_quota) {
        return invalid(format!(
            "cpu_quota {} is out of range (at least 1000 microseconds)",
            r.cpu_quota
        ));
    }
    if r.memory_limit_in_bytes > 0 && r.memory_limit_in_bytes < MIN_MEMORY_LIMIT {
        return invalid(format!(
            "memory_limit_in_bytes {} is below the minimum of {MIN_MEMORY_LIMIT}",
            r.memory_limit_in_bytes
        ));
    }
    if r.memory_limit_in_bytes < -1 {
        return invalid(format!(
            "memory_limit_in_bytes {} is negative (only -1, unlimited, is allowed)",
            r.memory_limit_in_bytes
        ));
    }
    if r.memory_swap_limit_in_bytes < -1 {
        return invalid(format!(
            "memory_swap_limit_in_bytes {} is negative (only -1, unlimited, is allowed)",
            r.memory_swap_limit_in_bytes
        ));
    }
    for h in &r.hugepage_limits {
        if h.page_size.is_empty()
            || h.page_size.len() > 16
            || !h.page_size.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return invalid(format!(
                "hugepage_limits: invalid page size {:?}",
                crate::util::excerpt(&h.page_size)
            ));
        }
    }
    // cpuset syntax: comma-separated numbers and ranges, bounded.
    for (name, set) in [
        ("cpuset_cpus", &r.cpuset_cpus),
        ("cpuset_mems", &r.cpuset_mems),
    ] {
        if !set.is_empty() && !is_cpu_list(set) {
            return invalid(format!(
                "{name} {:?} is not a list of numbers and ranges such as 0-3,5",
                crate::util::excerpt(set)
            ));
        }
    }
    if !r.unified.is_empty() && mode == Mode::V1 {
        let mut keys: Vec<&String> = r.unified.keys().collect();
        keys.sort();
        return invalid(format!(
            "unified {keys:?}: cgroup v2 settings cannot be applied on this cgroup v1 host"
        ));
    }
    for key in r.unified.keys() {
        if key.is_empty()
            || key.contains('/')
            || key.starts_with('.')
            || !key.contains('.')
            || matches!(
                key.as_str(),
                "cgroup.procs" | "cgroup.threads" | "cgroup.subtree_control" | "cgroup.kill"
            )
        {
            return invalid(format!(
                "unified key {:?} is not a cgroup setting",
                crate::util::excerpt(key)
            ));
        }
    }
    Ok(())
}

/// The node's online CPUs and memory nodes, as cpuset lists. A node without NUMA support has
/// no node directory and one memory node, 0.
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";
const ONLINE_NODES: &str = "/sys/devices/system/node/online";

/// The ranges of a list such as `0-3,5` (already checked by [`is_cpu_list`]).
fn cpu_ranges(set: &str) -> Vec<(u32, u32)> {
    set.split(',')
        .filter_map(|part| match part.trim().split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => part.trim().parse().ok().map(|n| (n, n)),
        })
        .collect()
}

/// The first CPU (or memory node) of `set` that is not in the list the file `online` holds, as
/// text; None when all are there, `set` is empty, or the file cannot be read.
fn not_online(set: &str, online: &str) -> Option<String> {
    if set.is_empty() {
        return None;
    }
    let have = match std::fs::read_to_string(online) {
        Ok(text) => cpu_ranges(text.trim()),
        Err(_) if online == ONLINE_NODES => vec![(0, 0)],
        Err(_) => return None,
    };
    first_missing(&cpu_ranges(set), &have).map(|n| n.to_string())
}

fn first_missing(want: &[(u32, u32)], have: &[(u32, u32)]) -> Option<u32> {
    want.iter()
        .flat_map(|&(a, b)| a..=b)
        .find(|n| !have.iter().any(|&(lo, hi)| (lo..=hi).contains(n)))
}

/// Whether `set` is a Linux cpu list (`0-3,5,7-8`) of at most 1,024 bytes and numbers below
/// 65,536, in increasing ranges.
fn is_cpu_list(set: &str) -> bool {
    let num = |t: &str| -> Option<u32> {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u32>().ok())
            .flatten()
            .filter(|n| *n < 65_536)
    };
    set.len() <= 1024
        && set.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => matches!((num(a), num(b)), (Some(a), Some(b)) if a <= b),
            None => num(part).is_some(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_limits_memory_and_swap_together() {
        let r = |memory: i64, swap: i64| LinuxContainerResources {
            memory_limit_in_bytes: memory,
            memory_swap_limit_in_bytes: swap,
            ..Default::default()
        };
        let mib = 1 << 20;
        for ok in [
            r(0, -1),
            r(64 * mib, 64 * mib),
            r(64 * mib, 128 * mib),
            r(0, 0),
        ] {
            check_resources("r", &ok).unwrap();
        }
        for (bad, why) in [
            (r(0, 128 * mib), "needs memory_limit_in_bytes"),
            (r(-1, 128 * mib), "needs memory_limit_in_bytes"),
            (
                r(128 * mib, 64 * mib),
                "is below memory_limit_in_bytes 134217728",
            ),
            (r(64 * mib, -5), "is negative"),
        ] {
            let err = check_resources("r", &bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn hugepage_sizes_are_the_nodes() {
        assert_eq!(hugetlb_name(64), "64KB");
        assert_eq!(hugetlb_name(2048), "2MB");
        assert_eq!(hugetlb_name(1 << 20), "1GB");
        assert_eq!(hugetlb_name(16 << 20), "16GB");
        let node = ["2MB".to_owned(), "1GB".to_owned()];
        let limit = |size: &str| crius_api::v1::HugepageLimit {
            page_size: size.into(),
            limit: 1 << 21,
        };
        assert!(check_hugepage_sizes(&[limit("2MB"), limit("1GB")], &node).is_ok());
        for bad in ["2mb", "2048kB", "bogus", "", "4MB"] {
            let err = check_hugepage_sizes(&[limit(bad)], &node).unwrap_err();
            assert!(err.contains("(2MB, 1GB)"), "{err}");
        }
        let err = check_hugepage_sizes(&[limit("2MB")], &[]).unwrap_err();
        assert!(err.contains("it has none"), "{err}");
    }

    #[test]
    fn cpus_a_node_lacks_are_found() {
        use super::{cpu_ranges, first_missing};
        let have = cpu_ranges("0-3,8");
        assert_eq!(first_missing(&cpu_ranges("0-2,8"), &have), None);
        assert_eq!(first_missing(&cpu_ranges("2-5"), &have), Some(4));
        assert_eq!(first_missing(&cpu_ranges("999"), &have), Some(999));
        assert_eq!(super::not_online("", super::ONLINE_CPUS), None);
        assert_eq!(super::not_online("0", super::ONLINE_CPUS), None);
        assert_eq!(
            super::not_online("65535", super::ONLINE_CPUS).as_deref(),
            Some("65535")
        );
    }

    #[test]
    fn cgroup_parent_checks() {
        for ok in [
            "",
            "/",
            "/kubepods/burstable/pod1",
            "kubepods-pod1.slice",
            "a/b.c/",
        ] {
            assert!(check_cgroup_parent("f", ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("/a/../b".to_string(), "`..`"),
            ("..".to_string(), "`..`"),
            ("/a/./b".to_string(), "`.`"),
            ("/a\0b".to_string(), "NUL"),
            ("/a\nb".to_string(), "line break"),
            (format!("/{}", "x".repeat(256)), "255 bytes"),
            (format!("/{}", "x/".repeat(1 << 19)), "longer than 2048"),
        ] {
            let err = check_cgroup_parent("config.linux.cgroup_parent", &bad).unwrap_err();
            assert!(
                err.contains("config.linux.cgroup_parent") && err.contains(why),
                "{err}"
            );
            assert!(err.len() < 200, "{} bytes", err.len());
        }
    }

    #[test]
    fn request_resources_are_checked_alike_for_every_rpc() {
        let ok = LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0".into(),
            oom_score_adj: -999,
            ..Default::default()
        };
        check_resources("config.linux.resources", &ok).unwrap();
        let bad = [
            (
                "memory_limit_in_bytes",
                LinuxContainerResources {
                    memory_limit_in_bytes: 1,
                    ..ok.clone()
                },
            ),
            (
                "memory_limit_in_bytes",
                LinuxContainerResources {
                    memory_limit_in_bytes: -5,
                    ..ok.clone()
                },
            ),
            (
                "memory_swap_limit_in_bytes",
                LinuxContainerResources {
                    memory_swap_limit_in_bytes: -2,
                    ..ok.clone()
                },
            ),
            (
                "cpuset_cpus",
                LinuxContainerResources {
                    cpuset_cpus: "banana".into(),
                    ..ok.clone()
                },
            ),
            (
                "cpuset_cpus",
                LinuxContainerResources {
                    cpuset_cpus: "999999".into(),
                    ..ok.clone()
                },
            ),
            (
                "cpuset_cpus",
                LinuxContainerResources {
                    cpuset_cpus: "0,".repeat(2500),
                    ..ok.clone()
                },
            ),
            (
                "cpu_quota",
                LinuxContainerResources {
                    cpu_quota: 1 << 62,
                    ..ok.clone()
                },
            ),
            (
                "cpu_period",
                LinuxContainerResources {
                    cpu_period: 1 << 62,
                    ..ok.clone()
                },
            ),
            (
                "cpu_shares",
                LinuxContainerResources {
                    cpu_shares: -1,
                    ..ok.clone()
                },
            ),
            (
                "oom_score_adj",
                LinuxContainerResources {
                    oom_score_adj: 5000,
                    ..ok.clone()
                },
            ),
            (
                "page size",
                LinuxContainerResources {
                    hugepage_limits: vec![crius_api::v1::HugepageLimit {
                        page_size: "../2MB".into(),
                        limit: 1,
                    }],
                    ..ok.clone()
                },
            ),
        ];
        for (field, r) in bad {
            let err = check_resources("config.linux.resources", &r).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, CgroupError::Request { .. }) && msg.contains(field),
                "{field}: {msg}"
            );
            assert!(msg.starts_with("config.linux.resources."), "{msg}");
            assert!(msg.len() < 300, "{msg}");
        }
    }

    #[test]
    fn unified_is_refused_on_v1_before_any_write() {
        let r = LinuxContainerResources {
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let err = validate(&r, Mode::V1).unwrap_err();
        assert!(err.is_invalid_value());
        assert!(err.to_string().contains("cgroup v1"), "{err}");
        validate(&r, Mode::V2).unwrap();
        let neg = LinuxContainerResources {
            cpu_quota: -5,
            ..Default::default()
        };
        assert!(validate(&neg, Mode::V2).is_err());
    }
}
