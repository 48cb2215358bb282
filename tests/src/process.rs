//! Server processes of the fixtures: spawn with the output in a log file, stop by PID, reap.

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{Error, Result};

/// How much of a log a failure message or a panicking drop prints: the tail is what matters.
const LOG_TAIL_BYTES: usize = 64 * 1024;

/// Spawns `command` with stdout and stderr appended to `log`.
///
/// The child gets `PR_SET_PDEATHSIG(SIGKILL)`, so a test binary that dies without running its
/// destructors (abort, timeout kill) does not leave the server running. The signal fires when the
/// *thread* that spawned the child exits: start fixtures from the test's own thread or its
/// runtime, not from a short-lived `spawn_blocking` thread.
pub(crate) fn spawn_logged(mut command: Command, name: &'static str, log: &Path) -> Result<Child> {
    let out = open_log(log)?;
    let err = out
        .try_clone()
        .map_err(|source| Error::io("duplicate log file handle", log, source))?;
    command.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: the closure runs in the forked child before exec and only makes the prctl system
    // call, which is async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    command
        .spawn()
        .map_err(|source| Error::io(format!("spawn {name}"), command.get_program(), source))
}

fn open_log(log: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| Error::io("open log file", log, source))
}

/// Appends a marker line to a log the fixture shares with its process (e.g. between restarts).
pub(crate) fn log_marker(log: &Path, text: &str) {
    use std::io::Write;
    if let Ok(mut file) = open_log(log) {
        let _ = writeln!(file, "----- crius-tests: {text} -----");
    }
}

/// The last [`LOG_TAIL_BYTES`] of a log file, or a note saying why it could not be read.
pub(crate) fn log_tail(log: &Path) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(LOG_TAIL_BYTES);
            let prefix = if start > 0 {
                "[... earlier lines cut ...]\n"
            } else {
                ""
            };
            format!("{prefix}{}", String::from_utf8_lossy(&bytes[start..]))
        }
        Err(err) => format!("(cannot read {}: {err})", log.display()),
    }
}

/// Sends `signal` to the child (unless it has already exited and been reaped).
pub(crate) fn signal(child: &mut Child, name: &'static str, signal: Signal) -> Result<()> {
    // Reaped children must not be signalled: their PID may belong to someone else by now.
    if let Ok(Some(_)) = child.try_wait() {
        return Ok(());
    }
    let pid = child.id();
    let raw = i32::try_from(pid).unwrap_or(i32::MAX);
    match kill(Pid::from_raw(raw), signal) {
        Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
        Err(source) => Err(Error::Signal {
            name,
            pid,
            signal: signal.as_str(),
            source,
        }),
    }
}

/// Waits up to `bound` for the child to exit and reaps it; `None` if it is still running.
pub(crate) fn wait_bounded(
    child: &mut Child,
    name: &'static str,
    bound: Duration,
) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + bound;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) if Instant::now() >= deadline => return Ok(None),
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(source) => {
                return Err(Error::io(
                    format!("wait for {name} (pid {})", child.id()),
                    "",
                    source,
                ))
            }
        }
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL and reap. Returns the exit status.
pub(crate) fn terminate(
    child: &mut Child,
    name: &'static str,
    grace: Duration,
) -> Result<ExitStatus> {
    signal(child, name, Signal::SIGTERM)?;
    if let Some(status) = wait_bounded(child, name, grace)? {
        return Ok(status);
    }
    kill_and_reap(child, name)
}

/// SIGKILL and reap.
pub(crate) fn kill_and_reap(child: &mut Child, name: &'static str) -> Result<ExitStatus> {
    signal(child, name, Signal::SIGKILL)?;
    child
        .wait()
        .map_err(|source| Error::io(format!("reap {name} (pid {})", child.id()), "", source))
}
