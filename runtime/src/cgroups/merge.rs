//! An `UpdateContainerResources` request over the limits a container has.

use crius_api::v1::LinuxContainerResources;

/// `new` over `old` as `UpdateContainerResources` means it (containerd's reading): a zero or
/// empty field keeps the old value; hugepage limits replace those of the same page size;
/// unified keys are added or replaced one by one. `oom_score_adj` keeps the old value: it
/// belongs to the process and is not changed by an update.
pub fn merge_resources(
    old: &LinuxContainerResources,
    new: &LinuxContainerResources,
) -> LinuxContainerResources {
    let pick = |n: i64, o: i64| if n != 0 { n } else { o };
    let pick_str = |n: &String, o: &String| if n.is_empty() { o.clone() } else { n.clone() };
    let mut hugepage_limits = old.hugepage_limits.clone();
    for h in &new.hugepage_limits {
        match hugepage_limits
            .iter_mut()
            .find(|o| o.page_size == h.page_size)
        {
            Some(o) => o.limit = h.limit,
            None => hugepage_limits.push(h.clone()),
        }
    }
    let mut unified = old.unified.clone();
    unified.extend(new.unified.iter().map(|(k, v)| (k.clone(), v.clone())));
    LinuxContainerResources {
        cpu_period: pick(new.cpu_period, old.cpu_period),
        cpu_quota: pick(new.cpu_quota, old.cpu_quota),
        cpu_shares: pick(new.cpu_shares, old.cpu_shares),
        memory_limit_in_bytes: pick(new.memory_limit_in_bytes, old.memory_limit_in_bytes),
        memory_swap_limit_in_bytes: pick(
            new.memory_swap_limit_in_bytes,
            old.memory_swap_limit_in_bytes,
        ),
        oom_score_adj: old.oom_score_adj,
        cpuset_cpus: pick_str(&new.cpuset_cpus, &old.cpuset_cpus),
        cpuset_mems: pick_str(&new.cpuset_mems, &old.cpuset_mems),
        hugepage_limits,
        unified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::HugepageLimit;

    #[test]
    fn merge_keeps_what_the_update_leaves_unset() {
        let old = LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            oom_score_adj: 1000,
            cpuset_cpus: "0".into(),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 2 << 20,
            }],
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let new = LinuxContainerResources {
            memory_limit_in_bytes: 128 << 20,
            oom_score_adj: -5,
            hugepage_limits: vec![
                HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 << 20,
                },
                HugepageLimit {
                    page_size: "1GB".into(),
                    limit: 0,
                },
            ],
            unified: [("pids.max".to_string(), "10".to_string())].into(),
            ..Default::default()
        };
        let m = merge_resources(&old, &new);
        assert_eq!(m.memory_limit_in_bytes, 128 << 20);
        assert_eq!(
            (m.cpu_shares, m.cpu_quota, m.cpu_period),
            (512, 50_000, 100_000)
        );
        assert_eq!(m.oom_score_adj, 1000);
        assert_eq!(m.cpuset_cpus, "0");
        assert_eq!(m.hugepage_limits.len(), 2);
        assert_eq!(m.hugepage_limits[0].limit, 4 << 20);
        assert_eq!(m.unified.len(), 2);
    }
}
