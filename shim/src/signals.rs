//! Signals: the shim takes SIGCHLD, SIGTERM and SIGINT through a signalfd in its event loop.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
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

/// Undo the shim's signal setup in a forked child: a blocked mask and ignored dispositions
/// survive `execve`, and libcontainer does not reset them, so a container would otherwise
/// start with SIGTERM blocked and SIGPIPE ignored.
pub fn reset_for_child() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // Every disposition back to the default, the real-time ones included (an ignored signal
    // is inherited from whoever started crius). The raw syscall, because glibc's sigaction
    // refuses the two signals it reserves for itself (32 and 33).
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: a zeroed kernel sigaction is SIG_DFL with no flags and an empty mask; the
        // kernel reads 8 bytes of mask (the size passed) and writes nothing (old is NULL).
        unsafe {
            let act: [libc::c_ulong; 4] = [0; 4];
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                act.as_ptr(),
                std::ptr::null_mut::<libc::c_void>(),
                8usize,
            );
        }
    }
}
