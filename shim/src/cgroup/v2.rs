//! cgroup v2 (unified hosts): one tree, with `cgroup.kill` (Linux 5.14) and `cgroup.freeze`
//! (Linux 5.2) in every non-root cgroup.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::{procs_recursive, signal_all, write, CgroupError, Result, FREEZE_ROUNDS};

/// Signal everything in the cgroup `dir` and below: SIGKILL through `cgroup.kill` where the
/// kernel has it (atomic by itself), otherwise list and signal under a freeze.
pub fn kill_all(dir: &Path, signal: i32) -> Result<usize> {
    if !dir.is_dir() {
        return Ok(0);
    }
    let kill_file = dir.join("cgroup.kill");
    if signal == libc::SIGKILL && kill_file.exists() {
        let pids = procs_recursive(dir)?.len();
        write(&kill_file, "1")?;
        return Ok(pids);
    }
    let freeze_file = dir.join("cgroup.freeze");
    let frozen = freeze_file.exists()
        && match freeze(dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "crius_shim", cgroup = %dir.display(), error = %e, "signalling without a freeze");
                false
            }
        };
    let result = procs_recursive(dir).and_then(|pids| signal_all(&pids, signal, dir));
    if frozen {
        write(&freeze_file, "0")?;
    }
    result
}

/// Ask for a freeze and wait until `cgroup.events` says `frozen 1`, for a bounded time.
fn freeze(dir: &Path) -> Result<()> {
    let freeze_file = dir.join("cgroup.freeze");
    let events = dir.join("cgroup.events");
    write(&freeze_file, "1")?;
    for round in 0..FREEZE_ROUNDS {
        let text = fs::read_to_string(&events).map_err(|source| CgroupError::Read {
            path: events.clone(),
            source,
        })?;
        if text.lines().any(|l| l.trim() == "frozen 1") {
            return Ok(());
        }
        if round >= 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    write(&freeze_file, "0")?;
    Err(CgroupError::Busy(dir.to_path_buf()))
}
