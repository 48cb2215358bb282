//! A pod cgroup's limits: the containers' resources plus the sandbox's overhead.

use crius_api::v1::{LinuxContainerResources, PodSandboxConfig};

use super::{fs_path, Hierarchy, Result};

/// The CFS period assumed when a quota comes without one (the kernel's default).
pub const DEFAULT_CPU_PERIOD: i64 = 100_000;

/// The limits of a pod cgroup from `PodSandboxConfig.linux`: `resources` (the sum of the
/// containers' resources, as kubelet computes it) plus `overhead` (what the sandbox itself
/// costs). A limit the containers leave unlimited stays unlimited: the overhead only raises
/// existing limits; shares and hugepage limits add up; an overhead quota is converted to the
/// resources' period. cpuset and unified come from `resources`.
pub fn pod_limits(
    resources: Option<&LinuxContainerResources>,
    overhead: Option<&LinuxContainerResources>,
) -> LinuxContainerResources {
    let zero = LinuxContainerResources::default();
    let r = resources.unwrap_or(&zero);
    let o = overhead.unwrap_or(&zero);
    let mut out = LinuxContainerResources {
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        unified: r.unified.clone(),
        ..Default::default()
    };
    if r.cpu_shares > 0 || o.cpu_shares > 0 {
        out.cpu_shares = r.cpu_shares.max(0) + o.cpu_shares.max(0);
    }
    if r.cpu_quota > 0 {
        let period = if r.cpu_period > 0 {
            r.cpu_period
        } else {
            DEFAULT_CPU_PERIOD
        };
        let o_period = if o.cpu_period > 0 {
            o.cpu_period
        } else {
            DEFAULT_CPU_PERIOD
        };
        let extra = if o.cpu_quota > 0 {
            // i128: quota * period can exceed i64 for absurd inputs.
            i64::try_from(i128::from(o.cpu_quota) * i128::from(period) / i128::from(o_period))
                .unwrap_or(i64::MAX)
        } else {
            0
        };
        out.cpu_quota = r.cpu_quota.saturating_add(extra);
        out.cpu_period = period;
    } else if r.cpu_quota == -1 {
        out.cpu_quota = -1;
    }
    if r.memory_limit_in_bytes > 0 {
        out.memory_limit_in_bytes = r
            .memory_limit_in_bytes
            .saturating_add(o.memory_limit_in_bytes.max(0));
    } else if r.memory_limit_in_bytes == -1 {
        out.memory_limit_in_bytes = -1;
    }
    if r.memory_swap_limit_in_bytes > 0 {
        out.memory_swap_limit_in_bytes = r
            .memory_swap_limit_in_bytes
            .saturating_add(o.memory_limit_in_bytes.max(0));
    } else if r.memory_swap_limit_in_bytes == -1 {
        out.memory_swap_limit_in_bytes = -1;
    }
    out.hugepage_limits = r.hugepage_limits.clone();
    for h in &o.hugepage_limits {
        if let Some(x) = out
            .hugepage_limits
            .iter_mut()
            .find(|x| x.page_size == h.page_size)
        {
            x.limit = x.limit.saturating_add(h.limit);
        }
    }
    out
}

/// Applies a pod's `linux.resources` + `linux.overhead` (see [`pod_limits`]) to its cgroup
/// (`pod_cgroup` as the pod record holds it). Nothing is written when neither is set. Call it
/// once the pod cgroup exists: in `RunPodSandbox` after the shim has created the pause
/// container (libcontainer makes the pod cgroup as its parent) and before starting it.
pub fn apply_pod_resources(pod_cgroup: &str, config: &PodSandboxConfig) -> Result<()> {
    let linux = config.linux.as_ref();
    let resources = linux.and_then(|l| l.resources.as_ref());
    let overhead = linux.and_then(|l| l.overhead.as_ref());
    if resources.is_none() && overhead.is_none() {
        return Ok(());
    }
    let limits = pod_limits(resources, overhead);
    if limits == LinuxContainerResources::default() {
        return Ok(());
    }
    Hierarchy::host()?.apply(&fs_path(pod_cgroup)?, &limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::LinuxPodSandboxConfig;

    #[test]
    fn pod_limits_add_the_overhead_to_set_limits() {
        let resources = LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 100_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 256 << 20,
            ..Default::default()
        };
        let overhead = LinuxContainerResources {
            cpu_shares: 100,
            cpu_quota: 5_000,
            cpu_period: 50_000,
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        };
        let p = pod_limits(Some(&resources), Some(&overhead));
        assert_eq!(p.cpu_shares, 1124);
        assert_eq!((p.cpu_quota, p.cpu_period), (110_000, 100_000));
        assert_eq!(p.memory_limit_in_bytes, 288 << 20);
        // Unlimited containers: the overhead does not invent a limit.
        let p = pod_limits(None, Some(&overhead));
        assert_eq!((p.cpu_quota, p.memory_limit_in_bytes), (0, 0));
        assert_eq!(p.cpu_shares, 100);
        assert_eq!(pod_limits(None, None), LinuxContainerResources::default());
    }

    #[test]
    fn pod_without_resources_writes_nothing() {
        let config = PodSandboxConfig {
            linux: Some(LinuxPodSandboxConfig::default()),
            ..Default::default()
        };
        // No hierarchy is touched: the cgroup does not even exist.
        apply_pod_resources("/crius/none-such-pod", &config).unwrap();
    }
}
