//! A helper's report: what it sends on its report socket when its operation is done, and the
//! shim's non-blocking read of it.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::cmsg_space;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

use super::REPORT_FD;

/// What a helper reports.
#[derive(Debug, Serialize, Deserialize)]
pub enum Outcome {
    /// Done; `pid` is the new process (container init or exec process), 0 when none.
    Ok { pid: i32 },
    /// Why it failed, with its cause chain.
    Err { message: String },
}

/// The largest report a helper sends (an error message and its causes, as JSON).
pub const REPORT_MAX: usize = 64 * 1024;

/// Read a helper's report into `buf` (at least [`REPORT_MAX`] long: the shim's read buffer,
/// so that no report costs a fresh 64 KiB). `Ok(None)`: not there yet. An error if the helper
/// closed the socket without reporting (it crashed or could not be executed).
pub fn receive(chan: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<(Outcome, Option<OwnedFd>)>> {
    let mut cmsg = cmsg_space!([RawFd; 1]);
    let (len, fd) = {
        let mut iov = [IoSliceMut::new(buf)];
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
            "helper exited without a report",
        ));
    }
    let outcome = serde_json::from_slice(&buf[..len]).map_err(io::Error::other)?;
    Ok(Some((outcome, fd)))
}

/// Send the helper's report on [`REPORT_FD`] (in the helper).
pub fn report(outcome: &Outcome, fd: Option<&OwnedFd>) -> io::Result<()> {
    report_on(REPORT_FD, outcome, fd)
}

/// Send a helper's report on `chan` (a test's fake helper uses this too).
pub fn report_on(chan: RawFd, outcome: &Outcome, fd: Option<&OwnedFd>) -> io::Result<()> {
    let bytes = serde_json::to_vec(outcome).map_err(io::Error::other)?;
    let iov = [IoSlice::new(&bytes)];
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    sendmsg::<()>(chan, &iov, &cmsgs, MsgFlags::empty(), None)?;
    Ok(())
}
