//! cgroup v2: one unified tree, interface files named `<controller>.<setting>`.
//!
//! CRI speaks v1 units; here they are converted as kubelet and runc convert them: shares to
//! `cpu.weight` ([`shares_to_weight`], runc's quadratic), quota and period into `cpu.max`
//! (`<quota|max> <period>`), and the memory+swap limit into `memory.swap.max` = swap - memory.
//! `unified` keys are written as given, last, so they override the converted values.

use std::path::{Path, PathBuf};

use crius_api::v1::{HugepageLimit, LinuxContainerResources};

use super::{
    flat_keyed, limit_or_none, read_optional, read_string, read_u64_optional, CgroupError,
    CgroupStats, MemoryStats, Result, Transaction,
};

/// The unified hierarchy mounted at a root (normally `/sys/fs/cgroup`; any directory in tests).
#[derive(Debug, Clone)]
pub struct V2 {
    root: PathBuf,
}

/// cpu.weight for v1 cpu.shares (0 stays 0, "not set"): shares 2..262144 map onto weight
/// 1..10000 by the quadratic of `log2(shares)` that runc (since its PR 4785), crun and
/// opencontainers/cgroups use, which keeps the default: 1024 shares are weight 100, as an
/// unlimited cgroup's (the linear formula before it gave 39, so a pod with a CPU request of
/// one core weighed less than a process outside any pod; kubernetes issue 131216).
pub fn shares_to_weight(shares: u64) -> u64 {
    match shares {
        0 => 0,
        1..=2 => 1,
        262_144.. => 10_000,
        _ => {
            let l = (shares as f64).log2();
            let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
            10f64.powf(exponent).ceil() as u64
        }
    }
}

/// The inverse of [`shares_to_weight`]: the smallest shares that give `weight`, so that a
/// weight read back and converted again stays the same (the mapping is lossy: near the
/// default, about ten shares share one weight). Every weight 1..10000 has shares.
pub fn weight_to_shares(weight: u64) -> u64 {
    if weight == 0 {
        return 0;
    }
    let weight = weight.clamp(1, 10_000);
    let (mut low, mut high) = (2u64, 262_144u64);
    while low < high {
        let mid = low + (high - low) / 2;
        if shares_to_weight(mid) >= weight {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// `memory.swap.max` for a CRI memory limit and memory+swap limit (0 = not set, -1 =
/// unlimited); `None` when nothing is to be written.
pub fn swap_max(memory: i64, swap: i64) -> Result<Option<String>> {
    match (memory, swap) {
        (_, 0) if memory == -1 => Ok(Some("max".to_string())),
        (_, 0) => Ok(None),
        (_, -1) => Ok(Some("max".to_string())),
        (0 | -1, _) => Err(CgroupError::Invalid(format!(
            "memory_swap_limit_in_bytes {swap} needs a memory_limit_in_bytes on cgroup v2"
        ))),
        (m, s) if s < m => Err(CgroupError::Invalid(format!(
            "memory_swap_limit_in_bytes {s} is below memory_limit_in_bytes {m}"
        ))),
        (m, s) => Ok(Some((s - m).to_string())),
    }
}

fn max_or(v: i64) -> String {
    if v < 0 {
        "max".to_string()
    } else {
        v.to_string()
    }
}

impl V2 {
    pub fn new(root: &Path) -> V2 {
        V2 {
            root: root.to_path_buf(),
        }
    }

    /// The cgroup's directory.
    pub fn dir(&self, cgroup: &str) -> PathBuf {
        self.root.join(cgroup.trim_start_matches('/'))
    }

    /// Whether the root's `cgroup.controllers` lists `controller`.
    pub fn has_controller(&self, controller: &str) -> bool {
        std::fs::read_to_string(self.root.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == controller))
    }

    pub fn exists(&self, cgroup: &str) -> bool {
        self.dir(cgroup).is_dir()
    }

    /// Asks for the cgroup and everything below it to freeze (`cgroup.freeze` 1) or thaw (0).
    pub(super) fn set_frozen(&self, cgroup: &str, frozen: bool) -> Result<()> {
        let path = self.dir(cgroup).join("cgroup.freeze");
        let value = if frozen { "1" } else { "0" };
        super::write_file(&path, value).map_err(|source| CgroupError::Write {
            path,
            value: value.to_string(),
            source,
        })
    }

    /// Where the freezer is with the cgroup: asked to freeze (`cgroup.freeze`) and done
    /// (`frozen` of `cgroup.events`, which also counts an ancestor's freeze).
    pub(super) fn freezer_state(&self, cgroup: &str) -> Result<super::FreezerState> {
        let dir = self.dir(cgroup);
        let events = dir.join("cgroup.events");
        let text = read_optional(&events)?.ok_or_else(|| CgroupError::NotFound(cgroup.into()))?;
        let frozen = flat_keyed(&text).get("frozen").copied() == Some(1);
        let asked = read_string(&dir.join("cgroup.freeze"))? == "1";
        Ok(match (asked, frozen) {
            (_, true) => super::FreezerState::Frozen,
            (true, false) => super::FreezerState::Freezing,
            (false, false) => super::FreezerState::Thawed,
        })
    }

    /// Writes the set fields of `r` (already validated): cpuset, memory, cpu, hugetlb, then
    /// unified. A controller not enabled for the cgroup shows as its file missing (ENOENT),
    /// named in the error.
    pub(super) fn apply(
        &self,
        tx: &mut Transaction,
        cgroup: &str,
        r: &LinuxContainerResources,
    ) -> Result<()> {
        let dir = self.dir(cgroup);
        if !r.cpuset_cpus.is_empty() {
            tx.write(dir.join("cpuset.cpus"), &r.cpuset_cpus)?;
        }
        if !r.cpuset_mems.is_empty() {
            tx.write(dir.join("cpuset.mems"), &r.cpuset_mems)?;
        }
        // Checked before memory.max is touched, so an impossible swap writes nothing.
        let swap = swap_max(r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes)?;
        if let Some(swap) = swap {
            let file = dir.join("memory.swap.max");
            if file.exists() {
                tx.write(file, &swap)?;
            } else {
                tracing::debug!("{} is missing (no swap): not applied", file.display());
            }
        }
        if r.memory_limit_in_bytes != 0 {
            tx.write(dir.join("memory.max"), &max_or(r.memory_limit_in_bytes))?;
        }
        if r.cpu_shares != 0 {
            let weight = shares_to_weight(r.cpu_shares.unsigned_abs());
            tx.write(dir.join("cpu.weight"), &weight.to_string())?;
        }
        if r.cpu_quota != 0 || r.cpu_period != 0 {
            let file = dir.join("cpu.max");
            let quota = if r.cpu_quota != 0 {
                max_or(r.cpu_quota)
            } else {
                // A period alone keeps the quota in force.
                let current = read_string(&file)?;
                current.split(' ').next().unwrap_or("max").to_string()
            };
            let value = if r.cpu_period != 0 {
                format!("{quota} {}", r.cpu_period)
            } else {
                quota
            };
            tx.write(file, &value)?;
        }
        for h in &r.hugepage_limits {
            let file = dir.join(format!("hugetlb.{}.max", h.page_size));
            if h.limit == 0 && !file.exists() {
                // No hugetlb controller for this cgroup: a zero limit (kubelet sends one for
                // every page size) cannot be enforced and is skipped, as on v1.
                continue;
            }
            tx.write(file, &h.limit.to_string())?;
        }
        let mut unified: Vec<(&String, &String)> = r.unified.iter().collect();
        unified.sort();
        for (key, value) in unified {
            let file = dir.join(key);
            if !file.exists() {
                return Err(CgroupError::Invalid(format!(
                    "unified key {key:?}: no such file in cgroup {} (is its controller enabled?)",
                    dir.display()
                )));
            }
            tx.write(file, value)?;
        }
        Ok(())
    }

    /// The limits in force, in CRI terms.
    pub(super) fn read(&self, cgroup: &str) -> Result<LinuxContainerResources> {
        let dir = self.dir(cgroup);
        let mut r = LinuxContainerResources::default();
        if let Some(w) = read_u64_optional(&dir.join("cpu.weight"))? {
            r.cpu_shares = i64::try_from(weight_to_shares(w)).unwrap_or(i64::MAX);
        }
        if let Some(max) = read_optional(&dir.join("cpu.max"))? {
            let path = dir.join("cpu.max");
            let mut parts = max.split_whitespace();
            r.cpu_quota = match parts.next() {
                Some("max") | None => -1,
                Some(q) => super::parse(&path, q)?,
            };
            if let Some(p) = parts.next() {
                r.cpu_period = super::parse(&path, p)?;
            }
        }
        r.cpuset_cpus = read_optional(&dir.join("cpuset.cpus"))?.unwrap_or_default();
        r.cpuset_mems = read_optional(&dir.join("cpuset.mems"))?.unwrap_or_default();
        let memory = read_max(&dir.join("memory.max"))?;
        r.memory_limit_in_bytes = memory.map_or(0, |m| i64::try_from(m).unwrap_or(0));
        if let (Some(m), Some(s)) = (memory, read_max(&dir.join("memory.swap.max"))?) {
            r.memory_swap_limit_in_bytes = i64::try_from(m.saturating_add(s)).unwrap_or(0);
        }
        r.hugepage_limits = read_hugetlb(&dir)?;
        Ok(r)
    }

    /// Usage of the cgroup and its descendants.
    pub(super) fn stats(&self, cgroup: &str) -> Result<CgroupStats> {
        let dir = self.dir(cgroup);
        let cpu_usage_ns = read_optional(&dir.join("cpu.stat"))?
            .and_then(|t| flat_keyed(&t).get("usage_usec").copied())
            .map(|us| us.saturating_mul(1000));
        Ok(CgroupStats {
            cpu_usage_ns,
            memory: memory_stats(&dir)?,
            pids: read_u64_optional(&dir.join("pids.current"))?,
        })
    }
}

/// A `max`-or-number file; `None` for `max`, a missing file or a number that means no limit.
fn read_max(path: &Path) -> Result<Option<u64>> {
    match read_optional(path)? {
        None => Ok(None),
        Some(t) if t == "max" => Ok(None),
        Some(t) => Ok(limit_or_none(super::parse(path, &t)?)),
    }
}

/// `hugetlb.<size>.max` of each page size; `max` reads as 0 (not set).
fn read_hugetlb(dir: &Path) -> Result<Vec<HugepageLimit>> {
    let entries = std::fs::read_dir(dir).map_err(|source| CgroupError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(size) = name
            .strip_prefix("hugetlb.")
            .and_then(|n| n.strip_suffix(".max"))
            .filter(|s| !s.contains('.'))
        else {
            continue;
        };
        out.push(HugepageLimit {
            page_size: size.to_string(),
            limit: read_max(&e.path())?.unwrap_or(0),
        });
    }
    out.sort_by(|a, b| a.page_size.cmp(&b.page_size));
    Ok(out)
}

fn memory_stats(dir: &Path) -> Result<Option<MemoryStats>> {
    let Some(usage) = read_u64_optional(&dir.join("memory.current"))? else {
        return Ok(None);
    };
    let stat_text = read_optional(&dir.join("memory.stat"))?.unwrap_or_default();
    let stat = flat_keyed(&stat_text);
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    let events = read_optional(&dir.join("memory.events"))?;
    let events = events.as_deref().map(flat_keyed);
    Ok(Some(MemoryStats {
        usage,
        working_set: usage.saturating_sub(get("inactive_file")),
        rss: get("anon"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        limit: read_max(&dir.join("memory.max"))?,
        swap_usage: read_u64_optional(&dir.join("memory.swap.current"))?,
        swap_limit: read_max(&dir.join("memory.swap.max"))?,
        oom_events: events.as_ref().and_then(|e| e.get("oom").copied()),
        oom_kills: events.as_ref().and_then(|e| e.get("oom_kill").copied()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::{Hierarchy, Mode};

    /// A fake unified tree with the cgroup `/pod/c` and the files a kernel would show.
    fn fake() -> (tempfile::TempDir, Hierarchy) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("pod/c");
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in [
            ("cgroup.controllers", "cpuset cpu memory hugetlb pids"),
            ("cpu.weight", "100"),
            ("cpu.max", "max 100000"),
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            ("memory.max", "max"),
            ("memory.swap.max", "max"),
            ("memory.high", "max"),
            ("hugetlb.2MB.max", "max"),
            ("hugetlb.1GB.max", "max"),
            ("memory.current", "10485760"),
            ("memory.swap.current", "4096"),
            (
                "memory.stat",
                "anon 4194304\nfile 5242880\ninactive_file 3145728\npgfault 250\npgmajfault 7\n",
            ),
            ("memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\n"),
            (
                "cpu.stat",
                "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
            ),
            ("pids.current", "4"),
        ] {
            std::fs::write(dir.join(f), v).unwrap();
        }
        let h = Hierarchy::V2(V2::new(root.path()));
        (root, h)
    }

    fn file(root: &tempfile::TempDir, name: &str) -> String {
        std::fs::read_to_string(root.path().join("pod/c").join(name)).unwrap()
    }

    #[test]
    fn weight_formula_matches_kubelet_and_runc() {
        assert_eq!(shares_to_weight(0), 0);
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 100);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1), 1);
        // Values of the quadratic (opencontainers/cgroups' ConvertCPUSharesToCgroupV2Value).
        for (shares, weight) in [
            (3, 2),
            (6, 3),
            (10, 4),
            (102, 17),
            (512, 59),
            (2048, 174),
            (100_000, 4340),
            (262_143, 10_000),
        ] {
            assert_eq!(shares_to_weight(shares), weight, "shares {shares}");
        }
        assert_eq!(weight_to_shares(1), 2);
        assert!(weight_to_shares(10_000) <= 262_144);
        assert!(weight_to_shares(100) <= 1024 && shares_to_weight(weight_to_shares(100) - 1) < 100);
        for w in 1..=10_000 {
            assert_eq!(shares_to_weight(weight_to_shares(w)), w, "weight {w}");
        }
    }

    #[test]
    fn swap_is_converted_to_swap_max() {
        assert_eq!(swap_max(0, 0).unwrap(), None);
        assert_eq!(swap_max(64, 0).unwrap(), None);
        assert_eq!(swap_max(-1, 0).unwrap().as_deref(), Some("max"));
        assert_eq!(swap_max(64, -1).unwrap().as_deref(), Some("max"));
        assert_eq!(swap_max(64, 64).unwrap().as_deref(), Some("0"));
        assert_eq!(swap_max(64, 100).unwrap().as_deref(), Some("36"));
        assert!(swap_max(64, 32).is_err());
        assert!(swap_max(0, 32).is_err());
    }

    #[test]
    fn apply_writes_every_field_in_v2_units() {
        let (root, h) = fake();
        assert_eq!(h.mode(), Mode::V2);
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory hugetlb").unwrap();
        assert!(h.has_controller("hugetlb"));
        assert!(!h.has_controller("cpuset"));
        let r = LinuxContainerResources {
            cpu_period: 50_000,
            cpu_quota: 25_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 96 << 20,
            cpuset_cpus: "0".into(),
            cpuset_mems: "0".into(),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 20,
            }],
            unified: [("memory.high".to_string(), "50331648".to_string())].into(),
            ..Default::default()
        };
        h.apply("/pod/c", &r).unwrap();
        assert_eq!(file(&root, "cpu.max"), "25000 50000");
        assert_eq!(file(&root, "cpu.weight"), "59");
        assert_eq!(file(&root, "memory.max"), (64u64 << 20).to_string());
        assert_eq!(file(&root, "memory.swap.max"), (32u64 << 20).to_string());
        assert_eq!(file(&root, "cpuset.cpus"), "0");
        assert_eq!(file(&root, "hugetlb.2MB.max"), (4u64 << 20).to_string());
        assert_eq!(file(&root, "memory.high"), "50331648");

        let back = h.read("/pod/c").unwrap();
        assert_eq!(back.cpu_quota, 25_000);
        assert_eq!(back.cpu_period, 50_000);
        assert_eq!(back.memory_limit_in_bytes, 64 << 20);
        assert_eq!(back.memory_swap_limit_in_bytes, 96 << 20);
        assert_eq!(back.cpuset_cpus, "0");
        assert_eq!(back.hugepage_limits.len(), 2);
        assert_eq!(back.hugepage_limits[1].page_size, "2MB");
        assert_eq!(back.hugepage_limits[1].limit, 4 << 20);
        // weight 20 comes back as roughly the shares asked for
        assert!((back.cpu_shares - 512).abs() < 30, "{}", back.cpu_shares);
    }

    #[test]
    fn quota_alone_and_period_alone_keep_the_other() {
        let (root, h) = fake();
        let quota = LinuxContainerResources {
            cpu_quota: 20_000,
            ..Default::default()
        };
        h.apply("/pod/c", &quota).unwrap();
        // The kernel keeps the period when only the quota is written; the fake file cannot.
        assert_eq!(file(&root, "cpu.max"), "20000");
        std::fs::write(root.path().join("pod/c/cpu.max"), "20000 100000").unwrap();
        let period = LinuxContainerResources {
            cpu_period: 200_000,
            ..Default::default()
        };
        h.apply("/pod/c", &period).unwrap();
        assert_eq!(file(&root, "cpu.max"), "20000 200000");
        let unlimited = LinuxContainerResources {
            cpu_quota: -1,
            memory_limit_in_bytes: -1,
            ..Default::default()
        };
        h.apply("/pod/c", &unlimited).unwrap();
        assert_eq!(file(&root, "cpu.max"), "max");
        assert_eq!(file(&root, "memory.max"), "max");
        assert_eq!(file(&root, "memory.swap.max"), "max");
    }

    #[test]
    fn a_refused_write_restores_what_was_written() {
        let (root, h) = fake();
        // A directory where the kernel file would be: the write fails like a refused value.
        let high = root.path().join("pod/c/memory.high");
        std::fs::remove_file(&high).unwrap();
        std::fs::create_dir(&high).unwrap();
        let r = LinuxContainerResources {
            cpu_quota: 30_000,
            memory_limit_in_bytes: 32 << 20,
            cpuset_cpus: "1".into(),
            unified: [("memory.high".to_string(), "1000".to_string())].into(),
            ..Default::default()
        };
        let err = h.apply("/pod/c", &r).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("memory.high") && msg.contains("\"1000\""),
            "{msg}"
        );
        assert_eq!(file(&root, "cpu.max"), "max 100000");
        assert_eq!(file(&root, "memory.max"), "max");
        assert_eq!(file(&root, "cpuset.cpus"), "\n");
    }

    #[test]
    fn invalid_values_write_nothing() {
        let (root, h) = fake();
        let r = LinuxContainerResources {
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 32 << 20,
            ..Default::default()
        };
        let err = h.apply("/pod/c", &r).unwrap_err();
        assert!(err.is_invalid_value(), "{err}");
        assert_eq!(file(&root, "cpu.weight"), "100");
        let bad_key = LinuxContainerResources {
            unified: [("../../etc/passwd".to_string(), "x".to_string())].into(),
            ..Default::default()
        };
        assert!(h.apply("/pod/c", &bad_key).unwrap_err().is_invalid_value());
        let missing = LinuxContainerResources {
            unified: [("io.max".to_string(), "8:0 rbps=1".to_string())].into(),
            ..Default::default()
        };
        let msg = h.apply("/pod/c", &missing).unwrap_err().to_string();
        assert!(msg.contains("io.max"), "{msg}");
        assert!(matches!(
            h.apply("/pod/none", &r).unwrap_err(),
            CgroupError::NotFound(_)
        ));
    }

    #[test]
    fn zero_hugepage_limits_need_no_hugetlb_controller() {
        let (root, h) = fake();
        let mut r = LinuxContainerResources {
            hugepage_limits: vec![
                HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 0,
                },
                HugepageLimit {
                    page_size: "64KB".into(),
                    limit: 0,
                },
            ],
            ..Default::default()
        };
        h.apply("/pod/c", &r).unwrap();
        assert_eq!(file(&root, "hugetlb.2MB.max"), "0");
        r.hugepage_limits[1].limit = 1 << 16;
        let msg = h.apply("/pod/c", &r).unwrap_err().to_string();
        assert!(msg.contains("hugetlb.64KB.max"), "{msg}");
    }

    #[test]
    fn stats_from_the_v2_files() {
        let (_root, h) = fake();
        let s = h.stats("/pod/c").unwrap();
        assert_eq!(s.cpu_usage_ns, Some(1_500_000));
        assert_eq!(s.pids, Some(4));
        let m = s.memory.unwrap();
        assert_eq!(m.usage, 10 << 20);
        assert_eq!(m.working_set, 7 << 20);
        assert_eq!(m.rss, 4 << 20);
        assert_eq!((m.page_faults, m.major_page_faults), (250, 7));
        assert_eq!((m.oom_events, m.oom_kills), (Some(2), Some(1)));
        assert_eq!(m.swap_usage, Some(4096));
        assert_eq!(m.limit, None);
    }

    #[test]
    fn stats_without_controllers_are_none() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("bare")).unwrap();
        let h = Hierarchy::V2(V2::new(root.path()));
        assert_eq!(h.stats("/bare").unwrap(), CgroupStats::default());
    }

    #[test]
    fn available_is_limit_minus_working_set() {
        let (root, h) = fake();
        std::fs::write(root.path().join("pod/c/memory.max"), "16777216").unwrap();
        let m = h.stats("/pod/c").unwrap().memory.unwrap();
        assert_eq!(m.available(), Some((16 << 20) - (7 << 20)));
    }
}
