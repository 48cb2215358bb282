//! Short-lived forked helpers that call libcontainer on the shim's behalf.
//!
//! libcontainer changes the calling process: it `chdir()`s, sets `PR_SET_DUMPABLE 0` and writes
//! the container's `oom_score_adj` to `/proc/self/oom_score_adj`, and its container init is a
//! `CLONE_PARENT` child of the caller. So every create and exec runs in a forked child of the
//! shim: the child calls libcontainer, reports the outcome (a pid, maybe a pty master fd) over
//! a `SOCK_SEQPACKET` socket pair and exits; the new processes are then re-parented to the shim,
//! which is a child subreaper. The shim stays single-threaded, so forking is safe at any time.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::cmsg_space;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

/// What a helper reports.
#[derive(Debug, Serialize, Deserialize)]
pub enum Outcome {
    /// The new process (a container init or an exec process).
    Ok { pid: i32 },
    /// Why it failed, with its cause chain.
    Err { message: String },
}

/// A running helper: its pid and the parent's end of its result channel (non-blocking).
#[derive(Debug)]
pub struct Helper {
    pub pid: i32,
    pub chan: OwnedFd,
}

/// Fork a helper that runs `work` with only the fds in `keep` (plus 0, 1, 2) left open, and
/// reports its result. Never returns in the child.
pub fn spawn<F>(keep: &[RawFd], work: F) -> io::Result<Helper>
where
    F: FnOnce() -> Result<(i32, Option<OwnedFd>), String>,
{
    let (parent_end, child_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    // SAFETY: the shim is single-threaded, so the child may run arbitrary code after fork.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => {
            drop(child_end);
            set_nonblocking(parent_end.as_raw_fd())?;
            Ok(Helper {
                pid: child.as_raw(),
                chan: parent_end,
            })
        }
        ForkResult::Child => {
            drop(parent_end);
            crate::signals::reset_for_child();
            let mut keep = keep.to_vec();
            keep.push(child_end.as_raw_fd());
            keep.push(crate::shim_log::fd());
            close_fds_except(&keep);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err("helper panicked".to_owned()));
            let (outcome, fd, code) = match result {
                Ok((pid, fd)) => (Outcome::Ok { pid }, fd, 0),
                Err(message) => (Outcome::Err { message }, None, 1),
            };
            let code = match send(&child_end, &outcome, fd.as_ref()) {
                Ok(()) => code,
                Err(_) => 2,
            };
            // SAFETY: _exit ends the child without running the parent's atexit handlers or
            // destructors, which belong to the shim.
            unsafe { libc::_exit(code) }
        }
    }
}

fn send(chan: &OwnedFd, outcome: &Outcome, fd: Option<&OwnedFd>) -> io::Result<()> {
    let bytes = serde_json::to_vec(outcome).map_err(io::Error::other)?;
    let iov = [IoSlice::new(&bytes)];
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    sendmsg::<()>(chan.as_raw_fd(), &iov, &cmsgs, MsgFlags::empty(), None)?;
    Ok(())
}

/// Read a helper's report. `Ok(None)`: not there yet. An error if the helper closed the
/// channel without reporting (it crashed).
pub fn receive(chan: &OwnedFd) -> io::Result<Option<(Outcome, Option<OwnedFd>)>> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut cmsg = cmsg_space!([RawFd; 1]);
    let (len, fd) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            chan.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut fd = None;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: SCM_RIGHTS handed us a new descriptor that nothing else owns.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        (msg.bytes, fd)
    };
    if len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "helper exited without a result",
        ));
    }
    let outcome = serde_json::from_slice(&buf[..len]).map_err(io::Error::other)?;
    Ok(Some((outcome, fd)))
}

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

/// Close every fd above 2 that is not in `keep`, so that a container's init does not hold the
/// shim's sockets or other containers' pipes between create and start.
fn close_fds_except(keep: &[RawFd]) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let open: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: closing fds in the freshly forked child; the read_dir handle is already
            // dropped, and nothing in the child uses the closed fds afterwards.
            unsafe { libc::close(fd) };
        }
    }
}
