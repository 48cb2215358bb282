//! A helper started ahead of its call ([`STANDBY`]), and the hand-over of that call: the shim
//! sends the command line and the container's stdio in one message on the helper's report
//! socket ([`hand_over`]), the helper waits for it and puts the descriptors in place
//! ([`await_call`]), then runs like a helper spawned with its call.

use std::ffi::OsString;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::cmsg_space;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::{Helper, HelperCall, REPORT_FD, STDIO_FDS};

/// The operation of a helper started ahead of its call
/// ([`Launcher::prepare`](super::Launcher::prepare)): it waits for [`hand_over`]'s message on
/// its report socket and then runs like one spawned with the call. Its exec, loader and start
/// (about a millisecond) are then done while crius is still making the container's rootfs and
/// spec.
pub const STANDBY: &str = "standby";

/// Give a helper started by [`Launcher::prepare`](super::Launcher::prepare) its call and the
/// container's `stdio`: one message on its report socket, `stdio`'s descriptors as
/// `SCM_RIGHTS`. Its payload: a byte whose bit `i` says `stdio[i]` is among them, then the
/// command line, each argument ended by a NUL. Fails when the helper is gone (its socket's
/// peer is closed).
pub fn hand_over(helper: &Helper, call: &HelperCall, stdio: [Option<RawFd>; 3]) -> io::Result<()> {
    let mut mask = 0u8;
    let mut fds = Vec::new();
    for (i, fd) in stdio.iter().enumerate() {
        if let Some(fd) = fd {
            mask |= 1 << i;
            fds.push(*fd);
        }
    }
    let payload = encode(mask, &call.to_args())?;
    let iov = [IoSlice::new(&payload)];
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    let sent = sendmsg::<()>(
        helper.chan.as_raw_fd(),
        &iov,
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent != payload.len() {
        return Err(io::Error::other("helper call sent in part"));
    }
    Ok(())
}

/// In a helper started as [`STANDBY`]: wait for the call [`hand_over`] sends on
/// [`REPORT_FD`], put the descriptors that came with it on [`STDIO_FDS`], and return its command
/// line. `None` when the shim closed the socket instead (it did not need the helper).
pub fn await_call() -> io::Result<Option<Vec<OsString>>> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut cmsg = cmsg_space!([RawFd; 3]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        REPORT_FD,
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: SCM_RIGHTS handed us new descriptors that nothing else owns.
            received.extend(
                fds.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let len = msg.bytes;
    if len == 0 {
        return Ok(None);
    }
    place_stdio(buf[0], received)?;
    Ok(Some(decode(&buf[1..len])))
}

/// The payload of [`hand_over`]'s message: `mask`, then each argument ended by a NUL.
fn encode(mask: u8, args: &[OsString]) -> io::Result<Vec<u8>> {
    let mut payload = vec![mask];
    for arg in args {
        if arg.as_bytes().contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "helper argument with a NUL byte",
            ));
        }
        payload.extend_from_slice(arg.as_bytes());
        payload.push(0);
    }
    Ok(payload)
}

/// The command line in a payload after its mask byte.
fn decode(args: &[u8]) -> Vec<OsString> {
    args.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect()
}

/// Put the `received` descriptors, in order, on the [`STDIO_FDS`] whose bits `mask` sets.
fn place_stdio(mask: u8, received: Vec<OwnedFd>) -> io::Result<()> {
    // The received descriptors may have landed on each other's targets: each goes up high
    // first, the received ones are closed, then the high copies go down into place.
    let mut received = received.into_iter();
    let mut high = Vec::new();
    for (i, target) in STDIO_FDS.iter().enumerate() {
        if mask & (1 << i) != 0 {
            let fd = received
                .next()
                .ok_or_else(|| io::Error::other("helper call: a descriptor is missing"))?;
            // SAFETY: duplicating a valid fd to a free number at or above 64.
            let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 64) };
            if dup < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the new descriptor is ours alone.
            high.push((unsafe { OwnedFd::from_raw_fd(dup) }, *target));
        }
    }
    drop(received);
    for (dup, target) in &high {
        // SAFETY: dup2 onto a fixed number nothing else of ours holds; it clears close-on-exec.
        if unsafe { libc::dup2(dup.as_raw_fd(), *target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_survives_its_payload_and_a_nul_in_it_is_refused() {
        let args: Vec<OsString> = ["create", "--root", "/r", "--id", "c", "--bundle", "/b c"]
            .iter()
            .map(OsString::from)
            .collect();
        let payload = encode(0b101, &args).expect("no NUL in the arguments");
        assert_eq!(payload[0], 0b101);
        assert_eq!(decode(&payload[1..]), args);
        let nul = encode(0, &[OsString::from("a\0b")]).map_err(|e| e.kind());
        assert_eq!(nul, Err(io::ErrorKind::InvalidInput));
    }
}
