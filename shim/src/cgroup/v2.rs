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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigkill_goes_through_cgroup_kill() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.kill"), "").unwrap();
        fs::write(dir.path().join("cgroup.procs"), "4000000\n4000001\n").unwrap();
        // Nothing is signalled by pid (those pids do not exist): the kernel file does it.
        assert_eq!(kill_all(dir.path(), libc::SIGKILL).unwrap(), 2);
        assert_eq!(
            fs::read_to_string(dir.path().join("cgroup.kill")).unwrap(),
            "1"
        );
    }

    #[test]
    fn other_signals_are_sent_frozen() {
        // A fake cgroup whose events already say frozen.
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.freeze"), "0").unwrap();
        fs::write(dir.path().join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        fs::write(
            dir.path().join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(kill_all(dir.path(), 0).unwrap(), 1);
        assert_eq!(
            fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap(),
            "0"
        );
        assert_eq!(kill_all(&dir.path().join("gone"), 0).unwrap(), 0);
    }
}
