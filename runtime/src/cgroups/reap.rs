//! Killing what a lost shim left behind.
//!
//! A shim is the subreaper of its pod's processes; when it dies (SIGKILL, OOM, a bug) the pause
//! process and the containers are reparented to init and keep running with nobody to stop
//! them. The pod's cgroup still holds every one of them, so crius finds them there.

use std::path::Path;
use std::time::Duration;

use crate::cgroups;

/// Sends SIGKILL to every process in `cgroup` and the cgroups below it, in every hierarchy.
/// Returns how many processes were signalled.
pub fn kill_cgroup_tree(cgroup: &str) -> usize {
    let Ok(path) = cgroups::fs_path(cgroup) else {
        return 0;
    };
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        // Never the root cgroup: that would be every process of the host.
        return 0;
    }
    let mut pids = Vec::new();
    for h in cgroups::hierarchies() {
        collect_pids(&h.join(rel), &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    for &pid in &pids {
        // SAFETY: kill(2) with SIGKILL on a pid listed in this pod's own cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    pids.len()
}

/// Kills every process in `cgroup`'s tree until none is left, for at most `limit`. Returns
/// whether the tree is empty.
pub async fn empty_cgroup_tree(cgroup: &str, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if kill_cgroup_tree(cgroup) == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn collect_pids(dir: &Path, pids: &mut Vec<i32>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&e.path(), pids);
        }
    }
}

/// Removes `cgroup` (and what is below it) once its processes are gone, for at most `limit`.
///
/// A process killed after its shim died is reparented to init and stays a zombie until init
/// reaps it, which some inits do only every few seconds; meanwhile the kernel refuses to remove
/// its cgroup (`EBUSY`) although `cgroup.procs` no longer lists it. So: kill, try, wait, retry.
pub async fn remove_cgroup(cgroup: &str, limit: Duration) -> std::io::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        kill_cgroup_tree(cgroup);
        match cgroups::remove(cgroup).await {
            Ok(()) => return Ok(()),
            Err(e)
                if e.kind() == std::io::ErrorKind::ResourceBusy
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
