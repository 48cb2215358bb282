//! cgroup v1: one hierarchy per controller (`/sys/fs/cgroup/<controller>`), the same cgroup
//! path in each.
//!
//! Kernel rules this file follows: `memory.memsw.limit_in_bytes` (memory + swap) may never be
//! below `memory.limit_in_bytes`, so when both change the one that keeps that true is written
//! first; a CFS period and quota are each checked against the other (and the parent's), so if
//! the period is refused first the quota goes first. Unlimited reads back as a huge number
//! (9223372036854771712), and -1 writes it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crius_api::v1::{HugepageLimit, LinuxContainerResources};

use super::{
    flat_keyed, limit_or_none, read_optional, read_string, read_u64, read_u64_optional,
    CgroupError, CgroupStats, MemoryStats, Result, Transaction,
};

/// The v1 controllers crius reads or writes (the freezer for CheckpointPod).
pub const CONTROLLERS: &[&str] = &[
    "cpu", "cpuacct", "cpuset", "memory", "hugetlb", "pids", "freezer",
];

const MEMORY_LIMIT: &str = "memory.limit_in_bytes";
const MEMSW_LIMIT: &str = "memory.memsw.limit_in_bytes";

/// The v1 hierarchies of a host: where each controller is mounted.
#[derive(Debug, Clone)]
pub struct V1 {
    mounts: HashMap<String, PathBuf>,
}

impl V1 {
    /// `mounts`: controller name (`cpu`, `memory`, …) → its hierarchy's mount point. Several
    /// controllers may share one (`cpu,cpuacct`).
    pub fn new(mounts: HashMap<String, PathBuf>) -> V1 {
        V1 { mounts }
    }

    /// Where `controller` is mounted, if it is.
    pub fn mount(&self, controller: &str) -> Option<&Path> {
        self.mounts.get(controller).map(PathBuf::as_path)
    }

    /// The cgroup's directory in `controller`'s hierarchy, if that is mounted.
    pub fn dir(&self, controller: &str, cgroup: &str) -> Option<PathBuf> {
        self.mount(controller)
            .map(|m| m.join(cgroup.trim_start_matches('/')))
    }

    fn required_dir(&self, controller: &'static str, cgroup: &str) -> Result<PathBuf> {
        self.dir(controller, cgroup)
            .ok_or(CgroupError::NoController(controller))
    }

    /// Whether the cgroup exists: in the memory hierarchy, else in any mounted one.
    pub fn exists(&self, cgroup: &str) -> bool {
        match self.dir("memory", cgroup) {
            Some(d) => d.is_dir(),
            None => CONTROLLERS
                .iter()
                .filter_map(|c| self.dir(c, cgroup))
                .any(|d| d.is_dir()),
        }
    }

    /// Asks the freezer to freeze (`FROZEN`) or thaw (`THAWED`) the cgroup and everything
    /// below it.
    pub(super) fn set_frozen(&self, cgroup: &str, frozen: bool) -> Result<()> {
        let path = self.required_dir("freezer", cgroup)?.join("freezer.state");
        let value = if frozen { "FROZEN" } else { "THAWED" };
        super::write_file(&path, value).map_err(|source| CgroupError::Write {
            path,
            value: value.to_string(),
            source,
        })
    }

    /// Where the freezer is with the cgroup: `freezer.state` reads `THAWED`, `FREEZING` (some
    /// task has not stopped yet, or a parent is freezing) or `FROZEN`.
    pub(super) fn freezer_state(&self, cgroup: &str) -> Result<super::FreezerState> {
        let path = self.required_dir("freezer", cgroup)?.join("freezer.state");
        match read_string(&path)?.as_str() {
            "THAWED" => Ok(super::FreezerState::Thawed),
            "FREEZING" => Ok(super::FreezerState::Freezing),
            "FROZEN" => Ok(super::FreezerState::Frozen),
            other => Err(CgroupError::Parse {
                path,
                value: other.to_string(),
            }),
        }
    }

    /// Writes the set fields of `r` (already validated): cpuset, memory and swap, cpu,
    /// hugetlb. `unified` is refused before this is reached.
    pub(super) fn apply(
        &self,
        tx: &mut Transaction,
        cgroup: &str,
        r: &LinuxContainerResources,
    ) -> Result<()> {
        if !r.cpuset_cpus.is_empty() || !r.cpuset_mems.is_empty() {
            let dir = self.required_dir("cpuset", cgroup)?;
            if !r.cpuset_cpus.is_empty() {
                tx.write(dir.join("cpuset.cpus"), &r.cpuset_cpus)?;
            }
            if !r.cpuset_mems.is_empty() {
                tx.write(dir.join("cpuset.mems"), &r.cpuset_mems)?;
            }
        }
        if r.memory_limit_in_bytes != 0 || r.memory_swap_limit_in_bytes != 0 {
            let dir = self.required_dir("memory", cgroup)?;
            apply_memory(
                tx,
                &dir,
                r.memory_limit_in_bytes,
                r.memory_swap_limit_in_bytes,
            )?;
        }
        if r.cpu_shares != 0 || r.cpu_period != 0 || r.cpu_quota != 0 {
            let dir = self.required_dir("cpu", cgroup)?;
            if r.cpu_shares != 0 {
                tx.write(dir.join("cpu.shares"), &r.cpu_shares.to_string())?;
            }
            apply_cfs(tx, &dir, r.cpu_period, r.cpu_quota)?;
        }
        if !r.hugepage_limits.is_empty() {
            match self.dir("hugetlb", cgroup) {
                Some(dir) => {
                    for h in &r.hugepage_limits {
                        tx.write(
                            dir.join(format!("hugetlb.{}.limit_in_bytes", h.page_size)),
                            &h.limit.to_string(),
                        )?;
                    }
                }
                // kubelet sends a zero limit for every page size the node has, hugetlb
                // controller or not: nothing can be enforced, and refusing would fail every
                // update. A non-zero limit is a request that cannot be honoured.
                None if r.hugepage_limits.iter().all(|h| h.limit == 0) => {
                    tracing::debug!("no hugetlb controller: zero hugepage limits not applied");
                }
                None => return Err(CgroupError::NoController("hugetlb")),
            }
        }
        Ok(())
    }

    /// The limits in force, in CRI terms.
    pub(super) fn read(&self, cgroup: &str) -> Result<LinuxContainerResources> {
        let mut r = LinuxContainerResources::default();
        if let Some(dir) = self.dir("cpu", cgroup) {
            r.cpu_shares = read_i64(&dir.join("cpu.shares"))?;
            r.cpu_period = read_i64(&dir.join("cpu.cfs_period_us"))?;
            r.cpu_quota = read_i64(&dir.join("cpu.cfs_quota_us"))?;
        }
        if let Some(dir) = self.dir("cpuset", cgroup) {
            r.cpuset_cpus = read_string(&dir.join("cpuset.cpus"))?;
            r.cpuset_mems = read_string(&dir.join("cpuset.mems"))?;
        }
        if let Some(dir) = self.dir("memory", cgroup) {
            let limit = limit_or_none(read_u64(&dir.join(MEMORY_LIMIT))?);
            r.memory_limit_in_bytes = limit.map_or(0, saturating_i64);
            if let Some(memsw) = read_u64_optional(&dir.join(MEMSW_LIMIT))? {
                r.memory_swap_limit_in_bytes = limit_or_none(memsw).map_or(0, saturating_i64);
            }
        }
        if let Some(dir) = self.dir("hugetlb", cgroup) {
            r.hugepage_limits = read_hugetlb(&dir)?;
        }
        Ok(r)
    }

    /// Usage of the cgroup and its descendants.
    pub(super) fn stats(&self, cgroup: &str) -> Result<CgroupStats> {
        let mut s = CgroupStats::default();
        if let Some(dir) = self.dir("cpuacct", cgroup) {
            s.cpu_usage_ns = read_u64_optional(&dir.join("cpuacct.usage"))?;
        }
        if let Some(dir) = self.dir("memory", cgroup) {
            s.memory = memory_stats(&dir)?;
        }
        if let Some(dir) = self.dir("pids", cgroup) {
            s.pids = read_u64_optional(&dir.join("pids.current"))?;
        }
        Ok(s)
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn read_i64(path: &Path) -> Result<i64> {
    super::parse(path, &read_string(path)?)
}

/// Memory limit `limit` and memory+swap limit `swap` (0 = leave as is, -1 = unlimited) in an
/// order the kernel accepts. Without swap accounting (no memsw file) the swap limit cannot be
/// applied and is skipped, as runc does.
fn apply_memory(tx: &mut Transaction, dir: &Path, limit: i64, swap: i64) -> Result<()> {
    let memsw = dir.join(MEMSW_LIMIT);
    let memory = dir.join(MEMORY_LIMIT);
    let has_memsw = memsw.exists();
    // An unlimited memory limit needs memsw lifted too, else memsw < memory.
    let swap = if limit == -1 && swap == 0 && has_memsw {
        -1
    } else {
        swap
    };
    if swap != 0 && !has_memsw {
        tracing::debug!(
            "{} is missing (no swap accounting): swap limit {swap} not applied",
            memsw.display()
        );
    }
    let swap = if has_memsw { swap } else { 0 };
    match (limit != 0, swap != 0) {
        (true, true) => {
            let current = read_u64(&memory)?;
            // Raising memsw above the current memory limit is always allowed; lowering it below
            // the current memory limit is not, so then memory goes first.
            let swap_first = swap == -1 || u64::try_from(swap).is_ok_and(|s| s >= current);
            if swap_first {
                tx.write(memsw, &swap.to_string())?;
                tx.write(memory, &limit.to_string())?;
            } else {
                tx.write(memory, &limit.to_string())?;
                tx.write(memsw, &swap.to_string())?;
            }
        }
        (true, false) => tx.write(memory, &limit.to_string())?,
        (false, true) => tx.write(memsw, &swap.to_string())?,
        (false, false) => {}
    }
    Ok(())
}

/// CFS period and quota (0 = leave as is, quota -1 = unlimited).
fn apply_cfs(tx: &mut Transaction, dir: &Path, period: i64, quota: i64) -> Result<()> {
    let period_file = dir.join("cpu.cfs_period_us");
    let quota_file = dir.join("cpu.cfs_quota_us");
    match (period != 0, quota != 0) {
        (true, true) => {
            if tx.write(period_file.clone(), &period.to_string()).is_err() {
                // The new period does not fit the current quota: quota first.
                tx.write(quota_file, &quota.to_string())?;
                tx.write(period_file, &period.to_string())?;
            } else {
                tx.write(quota_file, &quota.to_string())?;
            }
        }
        (true, false) => tx.write(period_file, &period.to_string())?,
        (false, true) => tx.write(quota_file, &quota.to_string())?,
        (false, false) => {}
    }
    Ok(())
}

/// `hugetlb.<size>.limit_in_bytes` of each page size; unlimited reads as 0.
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
            .and_then(|n| n.strip_suffix(".limit_in_bytes"))
            .filter(|s| !s.contains('.'))
        else {
            continue;
        };
        let limit = limit_or_none(read_u64(&e.path())?).unwrap_or(0);
        out.push(HugepageLimit {
            page_size: size.to_string(),
            limit,
        });
    }
    out.sort_by(|a, b| a.page_size.cmp(&b.page_size));
    Ok(out)
}

fn memory_stats(dir: &Path) -> Result<Option<MemoryStats>> {
    let Some(usage) = read_u64_optional(&dir.join("memory.usage_in_bytes"))? else {
        return Ok(None);
    };
    let stat_text = read_optional(&dir.join("memory.stat"))?.unwrap_or_default();
    let stat = flat_keyed(&stat_text);
    // The total_* keys include descendants (a pod cgroup's containers).
    let get = |k: &str| {
        stat.get(format!("total_{k}").as_str())
            .or_else(|| stat.get(k))
            .copied()
            .unwrap_or(0)
    };
    let limit = read_u64_optional(&dir.join(MEMORY_LIMIT))?.and_then(limit_or_none);
    let memsw_usage = read_u64_optional(&dir.join("memory.memsw.usage_in_bytes"))?;
    let memsw_limit = read_u64_optional(&dir.join(MEMSW_LIMIT))?.and_then(limit_or_none);
    let oom_kills = read_optional(&dir.join("memory.oom_control"))?
        .and_then(|t| flat_keyed(&t).get("oom_kill").copied());
    Ok(Some(MemoryStats {
        usage,
        working_set: usage.saturating_sub(get("inactive_file")),
        rss: get("rss"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        limit,
        swap_usage: memsw_usage.map(|m| m.saturating_sub(usage)),
        swap_limit: match (memsw_limit, limit) {
            (Some(sw), Some(l)) => Some(sw.saturating_sub(l)),
            _ => None,
        },
        oom_events: oom_kills,
        oom_kills,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v1 layout: one directory per controller holding the cgroup `/pod/c`.
    fn fake() -> (tempfile::TempDir, V1) {
        let root = tempfile::tempdir().unwrap();
        let mut mounts = HashMap::new();
        for (c, files) in [
            (
                "cpu",
                &[
                    ("cpu.shares", "1024"),
                    ("cpu.cfs_period_us", "100000"),
                    ("cpu.cfs_quota_us", "-1"),
                ][..],
            ),
            ("cpuacct", &[("cpuacct.usage", "123456789")][..]),
            (
                "cpuset",
                &[("cpuset.cpus", "0-1"), ("cpuset.mems", "0")][..],
            ),
            (
                "memory",
                &[
                    (MEMORY_LIMIT, "9223372036854771712"),
                    (MEMSW_LIMIT, "9223372036854771712"),
                    ("memory.usage_in_bytes", "10485760"),
                    ("memory.memsw.usage_in_bytes", "11534336"),
                    (
                        "memory.stat",
                        "cache 1\nrss 2\ntotal_rss 4194304\ntotal_inactive_file 2097152\n\
                         total_pgfault 100\ntotal_pgmajfault 3\n",
                    ),
                    (
                        "memory.oom_control",
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
                    ),
                ][..],
            ),
            ("pids", &[("pids.current", "3")][..]),
        ] {
            let dir = root.path().join(c).join("pod/c");
            std::fs::create_dir_all(&dir).unwrap();
            for (f, v) in files {
                std::fs::write(dir.join(f), v).unwrap();
            }
            mounts.insert(c.to_string(), root.path().join(c));
        }
        (root, V1::new(mounts))
    }

    #[test]
    fn stats_from_the_v1_files() {
        let (_root, h) = fake();
        let s = h.stats("/pod/c").unwrap();
        assert_eq!(s.cpu_usage_ns, Some(123456789));
        assert_eq!(s.pids, Some(3));
        let m = s.memory.unwrap();
        assert_eq!(m.usage, 10 << 20);
        assert_eq!(m.working_set, 8 << 20);
        assert_eq!(m.rss, 4 << 20);
        assert_eq!((m.page_faults, m.major_page_faults), (100, 3));
        assert_eq!(m.limit, None);
        assert_eq!(m.available(), None);
        assert_eq!(m.swap_usage, Some(1 << 20));
        assert_eq!(m.oom_kills, Some(2));
    }

    #[test]
    fn memory_order_follows_the_memsw_rule() {
        let (root, h) = fake();
        let dir = root.path().join("memory/pod/c");
        // From unlimited: memory first (memsw, unlimited, is above anything).
        let mut tx = Transaction::default();
        apply_memory(&mut tx, &dir, 64 << 20, 128 << 20).unwrap();
        assert_eq!(tx.undo[0].0, dir.join(MEMORY_LIMIT));
        assert_eq!(tx.undo[1].0, dir.join(MEMSW_LIMIT));
        // Lowering below the current memory limit: memory first.
        let mut tx = Transaction::default();
        apply_memory(&mut tx, &dir, 16 << 20, 32 << 20).unwrap();
        assert_eq!(tx.undo[0].0, dir.join(MEMORY_LIMIT));
        // Raising above the current memory limit: memsw first.
        let mut tx = Transaction::default();
        apply_memory(&mut tx, &dir, 64 << 20, 128 << 20).unwrap();
        assert_eq!(tx.undo[0].0, dir.join(MEMSW_LIMIT));
        assert_eq!(tx.undo[0].1, (32u64 << 20).to_string());
        assert_eq!(tx.undo[1].0, dir.join(MEMORY_LIMIT));
        // Unlimited memory lifts memsw too.
        let mut tx = Transaction::default();
        apply_memory(&mut tx, &dir, -1, 0).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join(MEMSW_LIMIT)).unwrap(),
            "-1"
        );
        // The kernel reads -1 back as its maximum.
        for f in [MEMORY_LIMIT, MEMSW_LIMIT] {
            std::fs::write(dir.join(f), "9223372036854771712").unwrap();
        }
        let r = h.read("/pod/c").unwrap();
        assert_eq!(
            (r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes),
            (0, 0)
        );
        assert_eq!(r.cpu_quota, -1);
        assert_eq!(r.cpuset_cpus, "0-1");
    }

    #[test]
    fn missing_controller_is_named() {
        let (_root, h) = fake();
        let r = LinuxContainerResources {
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 2 << 20,
            }],
            ..Default::default()
        };
        let mut tx = Transaction::default();
        let err = h.apply(&mut tx, "/pod/c", &r).unwrap_err();
        assert!(matches!(err, CgroupError::NoController("hugetlb")), "{err}");
        // Zero limits (kubelet's default for every page size) cannot matter without it.
        let zero = LinuxContainerResources {
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 0,
            }],
            ..Default::default()
        };
        h.apply(&mut tx, "/pod/c", &zero).unwrap();
    }
}
