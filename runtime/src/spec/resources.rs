//! CRI `LinuxContainerResources` as OCI `linux.resources`.

use crius_api::v1::LinuxContainerResources;
use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxHugepageLimitBuilder, LinuxMemoryBuilder, LinuxResources,
    LinuxResourcesBuilder,
};

use super::error::{Result, SpecError};

/// Converts CRI resources to OCI ones; zero and empty fields stay unset (CRI's "not set").
///
/// `cpu_shares` stays in cgroup v1 units (the cgroup layer converts to a v2 weight);
/// `memory_swap_limit_in_bytes` is passed only when set: kubelet sends it when swap matters,
/// and a v1 node without `memory.memsw.*` cannot apply it anyway. `oom_score_adj` is a process
/// setting, not a cgroup one: see `Process::oom_score_adj`. The result has no device rules,
/// so it can also be used for `UpdateContainerResources`.
pub fn resources_to_oci(r: &LinuxContainerResources) -> Result<LinuxResources> {
    let negative =
        |field: &str, v: i64| SpecError::invalid(format!("resources {field} {v} is negative"));
    let mut cpu = LinuxCpuBuilder::default();
    let mut has_cpu = false;
    if r.cpu_shares != 0 {
        cpu = cpu
            .shares(u64::try_from(r.cpu_shares).map_err(|_| negative("cpu_shares", r.cpu_shares))?);
        has_cpu = true;
    }
    if r.cpu_period != 0 {
        cpu = cpu
            .period(u64::try_from(r.cpu_period).map_err(|_| negative("cpu_period", r.cpu_period))?);
        has_cpu = true;
    }
    if r.cpu_quota != 0 {
        // -1 is a valid quota: unlimited
        cpu = cpu.quota(r.cpu_quota);
        has_cpu = true;
    }
    if !r.cpuset_cpus.is_empty() {
        cpu = cpu.cpus(r.cpuset_cpus.clone());
        has_cpu = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpu = cpu.mems(r.cpuset_mems.clone());
        has_cpu = true;
    }

    let mut memory = LinuxMemoryBuilder::default();
    let mut has_memory = false;
    if r.memory_limit_in_bytes != 0 {
        memory = memory.limit(r.memory_limit_in_bytes);
        has_memory = true;
    }
    if r.memory_swap_limit_in_bytes != 0 {
        memory = memory.swap(r.memory_swap_limit_in_bytes);
        has_memory = true;
    }

    let mut builder = LinuxResourcesBuilder::default();
    if has_cpu {
        builder = builder.cpu(cpu.build()?);
    }
    if has_memory {
        builder = builder.memory(memory.build()?);
    }
    if !r.hugepage_limits.is_empty() {
        let limits = r
            .hugepage_limits
            .iter()
            .map(|h| {
                let limit = i64::try_from(h.limit).map_err(|_| {
                    SpecError::invalid(format!(
                        "hugepage limit {} for {} is too large",
                        h.limit, h.page_size
                    ))
                })?;
                Ok(LinuxHugepageLimitBuilder::default()
                    .page_size(h.page_size.clone())
                    .limit(limit)
                    .build()?)
            })
            .collect::<Result<Vec<_>>>()?;
        builder = builder.hugepage_limits(limits);
    }
    if !r.unified.is_empty() {
        builder = builder.unified(r.unified.clone());
    }
    Ok(builder.build()?)
}

/// On the unified hierarchy, `cpu.weight` for the spec's CPU shares in `unified`, unless the
/// request set it there itself: libcontainer 0.7 (and Debian's runc and crun) turn shares into
/// a weight with the old linear formula at create, and `unified` is written after it, so the
/// container starts with the weight crius's cgroup layer and runc 1.5 give the same shares
/// ([`crate::cgroups::v2::shares_to_weight`]).
pub(crate) fn carry_v2_weight(resources: &mut LinuxResources) {
    let Some(shares) = resources
        .cpu()
        .as_ref()
        .and_then(|c| c.shares())
        .filter(|s| *s != 0)
    else {
        return;
    };
    let mut unified = resources.unified().clone().unwrap_or_default();
    unified
        .entry("cpu.weight".to_string())
        .or_insert_with(|| crate::cgroups::v2::shares_to_weight(shares).to_string());
    resources.set_unified(Some(unified));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_weight_rides_in_unified_unless_the_request_set_it() {
        let mut r = resources_to_oci(&LinuxContainerResources {
            cpu_shares: 1024,
            ..Default::default()
        })
        .unwrap();
        carry_v2_weight(&mut r);
        assert_eq!(r.unified().clone().unwrap()["cpu.weight"], "100");
        let mut own = resources_to_oci(&LinuxContainerResources {
            cpu_shares: 1024,
            unified: [("cpu.weight".to_string(), "7".to_string())].into(),
            ..Default::default()
        })
        .unwrap();
        carry_v2_weight(&mut own);
        assert_eq!(own.unified().clone().unwrap()["cpu.weight"], "7");
        let mut none = resources_to_oci(&LinuxContainerResources::default()).unwrap();
        carry_v2_weight(&mut none);
        assert!(none.unified().is_none());
    }
    use crius_api::v1::HugepageLimit;

    #[test]
    fn all_fields_convert() {
        let r = LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 128 << 20,
            oom_score_adj: 500,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            hugepage_limits: crate::cgroups::node_hugepage_sizes()
                .into_iter()
                .take(1)
                .map(|page_size| HugepageLimit {
                    page_size,
                    limit: 4 << 21,
                })
                .collect(),
            unified: [("memory.high".to_string(), "50000000".to_string())].into(),
        };
        let o = resources_to_oci(&r).unwrap();
        let cpu = o.cpu().clone().unwrap();
        assert_eq!(cpu.shares(), Some(512));
        assert_eq!(cpu.period(), Some(100_000));
        assert_eq!(cpu.quota(), Some(50_000));
        assert_eq!(cpu.cpus().as_deref(), Some("0-1"));
        assert_eq!(cpu.mems().as_deref(), Some("0"));
        let mem = o.memory().unwrap();
        assert_eq!(mem.limit(), Some(64 << 20));
        assert_eq!(mem.swap(), Some(128 << 20));
        if let Some(h) = r.hugepage_limits.first() {
            let huge = o.hugepage_limits().clone().unwrap();
            assert_eq!(huge[0].page_size(), &h.page_size);
            assert_eq!(huge[0].limit(), 4 << 21);
        }
        assert_eq!(o.unified().clone().unwrap()["memory.high"], "50000000");
        assert!(o.devices().is_none());
    }

    #[test]
    fn zero_means_unset() {
        let o = resources_to_oci(&LinuxContainerResources::default()).unwrap();
        assert!(o.cpu().is_none());
        assert!(o.memory().is_none());
        assert!(o.hugepage_limits().is_none());
        assert!(o.unified().is_none());
    }

    #[test]
    fn negative_shares_are_invalid() {
        let r = LinuxContainerResources {
            cpu_shares: -2,
            ..Default::default()
        };
        assert!(resources_to_oci(&r).unwrap_err().is_invalid_argument());
    }
}
