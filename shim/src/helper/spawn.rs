//! Starting a helper process: `clone(CLONE_VM | CLONE_VFORK)` and `execve`, with the child's
//! signals reset and its descriptors moved into place by raw system calls.
//!
//! The child runs on the shim's memory until it execs, the shim waiting: a fork copied the
//! shim's page tables and made its pages copy-on-write for a process that replaces itself at
//! once. Not `posix_spawn`: glibc checks each of its file actions with `sysconf`, whose jump
//! table would keep a page of read-only data (and 64 KiB of fault-around) resident in every
//! shim. The same reason keeps the shim's side to raw system calls where it can: each libc
//! function the spawn calls is more of the binary mapped in every shim.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::SPAWNED_ENV;

/// What the child of [`spawn_process`] works from, all prepared by the shim: the child shares
/// the shim's memory until it execs, so it only reads this and makes system calls.
struct ChildPlan {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// `(source, target)`: each source a high copy of its own (see [`spawn_process`]).
    moves: *const (RawFd, RawFd),
    moves_len: usize,
    dev_null: RawFd,
    /// Set by the child when it could not exec.
    errno: libc::c_int,
}

/// Start `program` with `args`: stdin, stdout and stderr on `/dev/null`, each `(source,
/// target)` of `moves` on its target, no signal blocked and every one at its default
/// disposition (the shim blocks SIGCHLD, SIGTERM and SIGINT for its signalfd, and a blocked
/// mask and ignored signals survive `execve`; libcontainer does not reset them, so a container
/// would start with SIGTERM blocked and StopContainer always wait for SIGKILL). Returns the
/// child's pid; the shim reaps it.
///
/// The child touches nothing but [`spawned_child`], the plan and its stack.
pub(super) fn spawn_process(
    program: &Path,
    args: &[OsString],
    moves: &[(RawFd, RawFd)],
) -> io::Result<i32> {
    let program = c_string(program.as_os_str())?;
    let args = args
        .iter()
        .map(|a| c_string(a))
        .collect::<io::Result<Vec<_>>>()?;
    let argv = null_terminated(std::iter::once(&program).chain(&args));
    let envp = null_terminated(helper_environment());
    // Each source goes to a high number of its own first, and from there onto its target: no
    // target then closes another's source before it is moved. The copies are closed on exec
    // and here when they drop.
    let high = moves
        .iter()
        .map(|&(source, _)| dup_high(source))
        .collect::<io::Result<Vec<_>>>()?;
    let high_moves: Vec<(RawFd, RawFd)> = high
        .iter()
        .zip(moves)
        .map(|(fd, &(_, target))| (fd.as_raw_fd(), target))
        .collect();
    let mut plan = ChildPlan {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        moves: high_moves.as_ptr(),
        moves_len: high_moves.len(),
        dev_null: dev_null()?.as_raw_fd(),
        errno: 0,
    };
    let pid = clone_child(&mut plan)?;
    // SAFETY: the child wrote this, if at all, before clone returned.
    let errno = unsafe { std::ptr::read_volatile(&plan.errno) };
    if errno != 0 {
        // It exited: ours to reap, before the shim's reaper meets a pid it never heard of.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(pid)
}

fn c_string(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument"))
}

/// The pointers of `strings` followed by a null one, as `execve` takes them.
fn null_terminated<'a>(strings: impl IntoIterator<Item = &'a CString>) -> Vec<*const libc::c_char> {
    strings
        .into_iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Clone the child that runs [`spawned_child`] with `plan`, on a stack of its own, and return
/// once it has exec'd or exited.
fn clone_child(plan: &mut ChildPlan) -> io::Result<i32> {
    // The child's stack: it uses a few hundred bytes of its top; the rest is never touched.
    const STACK: usize = 32 * 1024;
    let mut stack: Vec<std::mem::MaybeUninit<u8>> = Vec::with_capacity(STACK);
    // The top of the stack (it grows down), 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + STACK) & !15;
    // No signal reaches the child before it has reset its copy of the dispositions (a handler
    // of the shim's would run on the child's stack): all are blocked around the clone, and the
    // child unblocks them after the reset.
    let all: libc::c_ulong = !0;
    let mut old: libc::c_ulong = 0;
    sigprocmask(libc::SIG_SETMASK, &all, Some(&mut old))?;
    // SAFETY: CLONE_VM | CLONE_VFORK: the child runs `spawned_child` on `stack` with `plan`,
    // both alive until clone returns, which is when the child has exec'd or exited; it
    // touches no other memory of the shim's and takes no lock (see `spawned_child`).
    let pid = unsafe {
        libc::clone(
            spawned_child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (plan as *mut ChildPlan).cast(),
        )
    };
    let clone_error = io::Error::last_os_error();
    // Cannot fail (a valid `how` and sets of ours), and a child made must not go untracked by
    // an early return.
    let _ = sigprocmask(libc::SIG_SETMASK, &old, None);
    if pid < 0 {
        return Err(clone_error);
    }
    Ok(pid)
}

/// The child of [`spawn_process`]: every signal disposition back to its default, then no
/// signal blocked, `/dev/null` on 0 to 2, the descriptors in place, `execve`. It runs on the
/// shim's memory, so it makes system calls only: no allocation, no lock, nothing that panics.
extern "C" fn spawned_child(plan: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `spawn_process` passes its ChildPlan, alive until this process execs or exits;
    // every call below is a raw system call on values it prepared.
    unsafe {
        let plan = &mut *plan.cast::<ChildPlan>();
        reset_signals();
        let mut failed = false;
        // dup3 without flags (dup2 is not a system call everywhere); every source is 64 or
        // more and every target below, so none is its own target. The copy on the target is
        // not closed on exec.
        for target in 0..3 {
            failed |= libc::syscall(libc::SYS_dup3, plan.dev_null, target, 0) < 0;
        }
        let mut i = 0;
        while i < plan.moves_len {
            let (source, target) = *plan.moves.add(i);
            failed |= libc::syscall(libc::SYS_dup3, source, target, 0) < 0;
            i += 1;
        }
        if !failed {
            libc::syscall(libc::SYS_execve, plan.program, plan.argv, plan.envp);
        }
        plan.errno = match *libc::__errno_location() {
            0 => libc::EIO,
            e => e,
        };
        libc::syscall(libc::SYS_exit, 127);
    }
    127
}

/// In the child of [`spawn_process`]: every signal's disposition to its default, then none
/// blocked.
///
/// # Safety
///
/// Only for that child: it changes the calling process's signal state by raw system calls.
unsafe fn reset_signals() {
    // The real-time signals too (an ignored signal is inherited from whoever started
    // crius). The raw system call, because glibc's sigaction refuses the two signals it
    // keeps for itself (32 and 33). A zeroed kernel sigaction is SIG_DFL, no flags, and an
    // empty mask; the kernel reads 8 bytes of mask.
    let default: [libc::c_ulong; 4] = [0; 4];
    let mut signal = 1;
    while signal <= 64 {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            // SAFETY: rt_sigaction with a zeroed kernel sigaction of ours and no old action.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<libc::c_void>(),
                    8usize,
                )
            };
        }
        signal += 1;
    }
    let none: libc::c_ulong = 0;
    // SAFETY: rt_sigprocmask with an empty 8-byte set of ours and no old set.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            8usize,
        )
    };
}

// The two calls below are raw system calls, as in the child (see the module's documentation).

/// A copy of `fd` at a free number of 64 or more, closed on exec.
fn dup_high(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: duplicating a descriptor the caller holds open.
    let dup = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 64) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is new and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as RawFd) })
}

/// The calling thread's signal mask (signals 1 to 64) set to `mask`, the old one in `old`.
fn sigprocmask(
    how: libc::c_int,
    mask: &libc::c_ulong,
    old: Option<&mut libc::c_ulong>,
) -> io::Result<()> {
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut libc::c_ulong);
    // SAFETY: rt_sigprocmask with 8-byte sets we own. The kernel leaves SIGKILL and SIGSTOP
    // out of any blocked set itself.
    if unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            how,
            mask as *const libc::c_ulong,
            old,
            8usize,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `/dev/null`, opened once for every helper's stdio, at 64 or more like the other sources
/// (closed on exec).
fn dev_null() -> io::Result<&'static OwnedFd> {
    static DEV_NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = DEV_NULL.get() {
        return Ok(fd);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let high = dup_high(file.as_raw_fd())?;
    Ok(DEV_NULL.get_or_init(|| high))
}

/// The shim's environment with [`SPAWNED_ENV`] set, made once: the shim never changes its own.
fn helper_environment() -> &'static [CString] {
    static ENV: std::sync::OnceLock<Vec<CString>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        std::env::vars_os()
            .filter(|(key, _)| key != SPAWNED_ENV)
            .map(|(key, value)| [key.as_bytes(), b"=", value.as_bytes()].concat())
            .chain(std::iter::once(format!("{SPAWNED_ENV}=1").into_bytes()))
            .filter_map(|entry| CString::new(entry).ok())
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{SigSet, SigmaskHow};

    #[test]
    fn a_helper_starts_with_its_descriptors_in_place_and_no_signal_blocked_or_ignored() {
        // As in the shim, SIGTERM blocked (and SIGPIPE ignored, as in every Rust program):
        // neither may reach the helper. `cat` itself changes neither.
        let mut term = SigSet::empty();
        term.add(nix::sys::signal::Signal::SIGTERM);
        let old = term
            .thread_swap_mask(SigmaskHow::SIG_BLOCK)
            .expect("block SIGTERM");
        let (read, write) = nix::unistd::pipe().expect("pipe");
        let pid = spawn_process(
            Path::new("/bin/cat"),
            &["/proc/self/status".into()],
            &[(write.as_raw_fd(), 1)],
        )
        .expect("spawn cat");
        old.thread_set_mask().expect("restore the mask");
        drop(write);
        let mut status = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut status).expect("read");
        let exit = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        assert!(matches!(exit, Ok(nix::sys::wait::WaitStatus::Exited(_, 0))));
        let line = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(str::trim)
                .map(str::to_owned)
        };
        assert_eq!(line("SigBlk:").as_deref(), Some("0000000000000000"));
        assert_eq!(line("SigIgn:").as_deref(), Some("0000000000000000"));
    }
}
