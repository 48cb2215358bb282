//! Signals: the shim takes SIGCHLD, SIGTERM and SIGINT through a signalfd in its event loop.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// The shim's signalfd; creating it blocks the signals it reports.
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    pub fn new() -> io::Result<Self> {
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        mask.add(Signal::SIGTERM);
        mask.add(Signal::SIGINT);
        mask.thread_block()?;
        let fd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Self { fd })
    }

    /// The signals received since the last call.
    pub fn drain(&mut self) -> Vec<i32> {
        let mut out = Vec::new();
        while let Ok(Some(info)) = self.fd.read_signal() {
            out.push(info.ssi_signo as i32);
        }
        out
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
