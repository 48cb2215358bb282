//! How the shim's loop starts helpers and signals the processes it owns: the [`Launcher`]
//! trait, the one place the state machine touches other processes (so a fake drives it
//! without root, `shim/tests/state_machine.rs`), and [`Spawner`], the real one, which runs the
//! `crius-shim-helper` binary.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use super::spawn::spawn_process;
use super::{set_nonblocking, HelperCall, LOG_FD, REPORT_FD, STANDBY, STDIO_FDS};

/// How the shim starts helpers and signals the processes it owns.
pub trait Launcher {
    /// Start a helper for `call`; `stdio` (the container's stdin, stdout, stderr) land on the
    /// helper's [`STDIO_FDS`].
    fn spawn(&mut self, call: &HelperCall, stdio: [Option<RawFd>; 3]) -> io::Result<Helper>;

    /// Send `signal` to `pid`, a child of the shim that is not reaped yet (so the pid cannot
    /// have been reused).
    fn signal(&mut self, pid: i32, signal: i32) -> io::Result<()>;

    /// Start a helper ahead of its operation: it waits on its report socket for the call that
    /// [`hand_over`](super::hand_over) sends. `None` from a launcher that does not do this
    /// (then every helper is spawned with its call).
    fn prepare(&mut self) -> io::Result<Option<Helper>> {
        Ok(None)
    }
}

/// The real [`Launcher`]: runs the `crius-shim-helper` binary.
#[derive(Debug, Clone)]
pub struct Spawner {
    pub helper: PathBuf,
}

impl Launcher for Spawner {
    fn spawn(&mut self, call: &HelperCall, stdio: [Option<RawFd>; 3]) -> io::Result<Helper> {
        spawn(&self.helper, &call.to_args(), stdio)
    }

    fn prepare(&mut self) -> io::Result<Option<Helper>> {
        spawn(&self.helper, &[STANDBY.into()], [None; 3]).map(Some)
    }

    fn signal(&mut self, pid: i32, signal: i32) -> io::Result<()> {
        // SAFETY: kill(2) with a pid the caller owns and a signal number it validated.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// A running helper: its pid and the shim's end of its report socket (non-blocking).
#[derive(Debug)]
pub struct Helper {
    pub pid: i32,
    pub chan: OwnedFd,
}

/// Spawn `helper` with `args`; `stdio` fds (container stdin, stdout, stderr) land on 4, 5, 6.
pub fn spawn(helper: &Path, args: &[OsString], stdio: [Option<RawFd>; 3]) -> io::Result<Helper> {
    let (parent_end, child_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let log = crate::shim_log::fd();
    let mut moves: Vec<(RawFd, RawFd)> = vec![(child_end.as_raw_fd(), REPORT_FD)];
    for (fd, target) in stdio.iter().zip(STDIO_FDS) {
        if let Some(fd) = fd {
            moves.push((*fd, target));
        }
    }
    if log >= 0 {
        moves.push((log, LOG_FD));
    }
    let pid = spawn_process(helper, args, &moves)?;
    drop(child_end);
    set_nonblocking(parent_end.as_raw_fd())?;
    // The shim reaps every child itself (waitpid(-1)).
    Ok(Helper {
        pid,
        chan: parent_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_that_cannot_be_executed_is_an_error() {
        let missing = Path::new("/nonexistent/crius-shim-helper");
        let err = spawn(missing, &[], [None; 3]).err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::NotFound));
    }
}
