//! What a cgroup has used, as the stats RPCs report it.

/// What a cgroup has used. A field is `None` when this host cannot tell (controller not
/// mounted or not enabled, an old kernel without the file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// CPU time of all its tasks, nanoseconds (v1 `cpuacct.usage`, v2 `cpu.stat` usage_usec).
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemoryStats>,
    /// Tasks (threads) in it (`pids.current`).
    pub pids: Option<u64>,
}

/// Memory of a cgroup, in bytes unless said otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub usage: u64,
    /// `usage - inactive_file` (not below 0), as kubelet and cAdvisor define it.
    pub working_set: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub rss: u64,
    /// Page fault counts.
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// `None` when unlimited.
    pub limit: Option<u64>,
    pub swap_usage: Option<u64>,
    /// Swap the cgroup may use (v2 `memory.swap.max`; v1 memsw limit minus memory limit);
    /// `None` when unlimited or unknown.
    pub swap_limit: Option<u64>,
    /// Times the OOM killer was invoked for the cgroup (v2 `memory.events` oom; v1 has no such
    /// counter: same as `oom_kills`).
    pub oom_events: Option<u64>,
    /// Processes the OOM killer killed in it (`oom_kill`, kernels from 4.13 on v1).
    pub oom_kills: Option<u64>,
}

impl MemoryStats {
    /// Limit minus working set, when there is a limit.
    pub fn available(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.working_set))
    }
}

/// Values at or above this are "no limit" (the kernel reports its page-counter maximum, e.g.
/// 9223372036854771712 on v1).
const UNLIMITED: u64 = 1 << 62;

pub(crate) fn limit_or_none(v: u64) -> Option<u64> {
    (v < UNLIMITED).then_some(v)
}
