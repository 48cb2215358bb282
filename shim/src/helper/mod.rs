//! Helper processes that call libcontainer (or an OCI runtime's command line) on the shim's
//! behalf.
//!
//! libcontainer changes its calling process (it `chdir()`s, sets `PR_SET_DUMPABLE 0`, writes
//! the container's `oom_score_adj` to `/proc/self/oom_score_adj`; its container init is a
//! `CLONE_PARENT` child of the caller), and linking it makes a binary large: its relocations
//! and code would dominate the resident memory of a process that lives as long as the pod. So
//! the long-lived `crius-shim` never links it: every create and exec runs in a short-lived
//! `crius-shim-helper` process the shim spawns (`clone(CLONE_VM | CLONE_VFORK)` and `execve`, in
//! `spawn.rs`), and so do a start, a kill of the whole cgroup or a delete that the
//! shim does not do itself (see [`crate::libct_state`]), an OCI runtime's `wait` and
//! `restore`, and the `checkpoint` crius runs itself. An exec under libcontainer is the
//! helper's own code joining the container ([`crate::exec`]), not libcontainer's. The helper reports its outcome (a pid,
//! maybe a pty master fd) over a `SOCK_SEQPACKET` socket and exits; the processes it made are
//! then re-parented to the shim, a child subreaper. The libcontainer calls themselves are in
//! [`crate::libct`], an OCI runtime's command line in [`crate::oci_cli`]; this module is the
//! shim's side of a helper and the protocol both sides speak.
//!
//! Helper command line: `crius-shim-helper <op> --root <libcontainer-root> --id <container>
//! [op arguments]` ([`HelperCall`]), or `crius-shim-helper standby` ([`STANDBY`]), with these
//! descriptors:
//!
//! | fd | what |
//! |---|---|
//! | 0, 1, 2 | /dev/null |
//! | 3 | the report socket |
//! | 4, 5, 6 | the container's stdin, stdout, stderr (create and exec, when given) |
//! | 7 | the shim's log file (for libcontainer's events), when open |
//!
//! The rooms: `call` (the operation and its command line), `launcher` (the [`Launcher`] the
//! shim's loop starts helpers and signals processes through, and the real one), `spawn` (the
//! process start itself), `standby` (a helper started ahead of its call, and the hand-over of
//! that call), `report` (the helper's report and its reading in the shim).

mod call;
mod launcher;
mod report;
mod spawn;
mod standby;

use std::io;
use std::os::fd::RawFd;

pub use call::{HelperCall, HelperOp, OciCommand};
pub use launcher::{spawn, Helper, Launcher, Spawner};
pub use report::{receive, report, report_on, Outcome, REPORT_MAX};
pub use standby::{await_call, hand_over, STANDBY};

/// The helper's fd for its report socket.
pub const REPORT_FD: RawFd = 3;
/// The helper's fds for the container's stdin, stdout and stderr.
pub const STDIO_FDS: [RawFd; 3] = [4, 5, 6];
/// The helper's fd for the shim's log file.
pub const LOG_FD: RawFd = 7;
/// Set (to `1`) in the environment of a helper the shim spawned: only then are the fds above
/// the shim's. A helper run by hand (to clean up after a dead shim) may inherit
/// unrelated descriptors at those numbers, from a wrapper such as flock(1) or a service
/// manager, and must not write its report into them.
pub const SPAWNED_ENV: &str = "CRIUS_SHIM_HELPER_FDS";

/// Make `fd` non-blocking: the shim's end of a report socket, a container's pipes.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own only change its status flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
