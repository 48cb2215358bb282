//! The exec'd process: its executable and `HOME` found in the container, the fork, and the
//! child's set-up in runc's order up to `execve` (steps 5 to 7 of [`super`]).

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxPersonalityDomain, LinuxSeccomp};
use libcontainer::syscall::syscall::create_syscall;
use nix::unistd::{Gid, Uid};

use super::*;

/// The path to exec for `arg0`: itself if it names a path, else the first executable file of
/// that name in `path_var`'s directories (in the container's mount namespace).
pub(crate) fn find_executable(arg0: &str, path_var: &str) -> Result<PathBuf> {
    if arg0.contains('/') {
        return Ok(PathBuf::from(arg0));
    }
    path_var
        .split(':')
        .map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(arg0))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| ExecError::NotFound(arg0.to_owned()))
}

/// The home directory of `uid` in the container's `/etc/passwd`.
pub(super) fn home_of(uid: u32) -> Option<String> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 6 && fields[2].parse::<u32>().ok()? == uid && !fields[5].is_empty())
            .then(|| fields[5].to_owned())
    })
}

/// Fork the process; in the parent, wait until it has exec'd or failed.
pub(super) fn spawn(
    prepared: &Prepared,
    stdin: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<i32> {
    let (err_r, err_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ExecError::Sys {
            what: "error pipe",
            source: e.into(),
        })?;
    // SAFETY: the helper is single-threaded, so the child may run ordinary code (allocate,
    // call libcontainer) until it execs or exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ExecError::Sys {
            what: "fork",
            source: io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        drop(err_r);
        let stdin_fd = stdin.as_ref().map(|f| f.as_raw_fd());
        let message = match child(prepared, stdin_fd, stdout.as_raw_fd(), stderr.as_raw_fd()) {
            Err(message) => message,
            Ok(never) => match never {},
        };
        let mut pipe = fs::File::from(err_w);
        let _ = io::Write::write_all(&mut pipe, message.as_bytes());
        // SAFETY: _exit ends the child without running the parent's destructors or atexit
        // handlers twice.
        unsafe { libc::_exit(127) };
    }
    drop(err_w);
    drop((stdin, stdout, stderr));
    let mut message = String::new();
    let read = fs::File::from(err_r).read_to_string(&mut message);
    if read.is_err() || !message.is_empty() {
        let mut status = 0;
        // SAFETY: waitpid on our own child, which has failed and exits.
        unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        let message = match read {
            Ok(_) => message,
            Err(e) => format!("read the child's error: {e}"),
        };
        return Err(ExecError::Child(message));
    }
    Ok(pid)
}

/// The child's setup up to `execve`; returns only on failure, with the reason.
pub(super) fn child(
    p: &Prepared,
    stdin: Option<RawFd>,
    stdout: RawFd,
    stderr: RawFd,
) -> std::result::Result<std::convert::Infallible, String> {
    let syscall = create_syscall();
    let os = |what: &str| format!("{what}: {}", io::Error::last_os_error());
    let sys =
        |what: &str, e: &dyn std::error::Error| format!("{what}: {}", crius_common::error_chain(e));
    let process = &p.process;

    // SAFETY: setsid, dup2 and ioctl(TIOCSCTTY) only change this process's attributes.
    unsafe {
        if libc::setsid() < 0 {
            return Err(os("setsid"));
        }
        if stdin.is_some_and(|fd| libc::dup2(fd, 0) < 0) {
            return Err(os("stdin"));
        }
        if libc::dup2(stdout, 1) < 0 || libc::dup2(stderr, 2) < 0 {
            return Err(os("stdio"));
        }
        // A pty slave on stdin becomes the new session's controlling terminal, so the shell
        // gets job control and ^C reaches the foreground process group.
        if process.terminal() == Some(true) && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return Err(os("set the controlling terminal"));
        }
    }
    // Nothing of the helper's (report socket, log file, namespace descriptors) may reach the
    // command; the error pipe is close-on-exec already.
    syscall
        .close_range(0)
        .map_err(|e| sys("mark descriptors close-on-exec", &e))?;
    for rlimit in process.rlimits().iter().flatten() {
        syscall
            .set_rlimit(rlimit)
            .map_err(|e| sys(&format!("set rlimit {:?}", rlimit.typ()), &e))?;
    }
    if let Some(domain) = p.personality {
        let persona = match domain {
            LinuxPersonalityDomain::PerLinux => 0x0000,
            LinuxPersonalityDomain::PerLinux32 => 0x0008,
        };
        // SAFETY: personality(2) only sets this process's execution domain.
        if unsafe { libc::personality(persona) } < 0 {
            return Err(os("personality"));
        }
    }
    let no_new_privs = process.no_new_privileges() == Some(true);
    if no_new_privs {
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) only sets a flag of this process.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
            return Err(os("set no_new_privs"));
        }
    }
    if let Some(profile) = process.apparmor_profile() {
        libcontainer::apparmor::apply_profile(profile)
            .map_err(|e| sys(&format!("apply AppArmor profile {profile}"), &e))?;
    }
    if let Some(umask) = process.user().umask() {
        // SAFETY: umask(2) cannot fail.
        unsafe { libc::umask(umask as libc::mode_t) };
    }
    if !no_new_privs {
        load_seccomp(p.seccomp.as_ref())?;
    }
    // As root first: the user may not be allowed to reach its own working directory's parents.
    let cwd = process.cwd();
    let chdir_later = !cwd.as_os_str().is_empty() && std::env::set_current_dir(cwd).is_err();
    let gids: Vec<Gid> = process
        .user()
        .additional_gids()
        .iter()
        .flatten()
        .map(|g| Gid::from_raw(*g))
        .collect();
    if let Err(e) = syscall.set_groups(&gids) {
        // A user namespace with setgroups denied: fine when there are none to set.
        if !gids.is_empty() {
            return Err(sys("set supplementary groups", &e));
        }
    }
    let (uid, gid) = (process.user().uid(), process.user().gid());
    syscall
        .set_id(Uid::from_raw(uid), Gid::from_raw(gid))
        .map_err(|e| sys(&format!("set uid {uid} gid {gid}"), &e))?;
    libcontainer::capabilities::drop_privileges(&p.capabilities, syscall.as_ref())
        .map_err(|e| sys("set capabilities", &e))?;
    if chdir_later {
        std::env::set_current_dir(cwd)
            .map_err(|e| format!("enter working directory {}: {e}", cwd.display()))?;
    }
    if no_new_privs {
        load_seccomp(p.seccomp.as_ref())?;
    }
    let mut argv: Vec<*const libc::c_char> = p.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = p.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and NULL-terminated arrays that outlive the call.
    unsafe { libc::execve(p.executable.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    let e = io::Error::last_os_error();
    let cause = match e.raw_os_error() {
        Some(
            libc::ENOENT
            | libc::EACCES
            | libc::ENOEXEC
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::ELOOP
            | libc::ENAMETOOLONG
            | libc::E2BIG,
        ) => COMMAND_CANNOT_RUN,
        _ => "",
    };
    Err(format!(
        "{cause}exec {}: {e}",
        OsStr::from_bytes(p.executable.as_bytes()).to_string_lossy(),
    ))
}

pub(super) fn load_seccomp(seccomp: Option<&LinuxSeccomp>) -> std::result::Result<(), String> {
    let Some(seccomp) = seccomp else {
        return Ok(());
    };
    match libcontainer::seccomp::initialize_seccomp(seccomp) {
        Ok(None) => Ok(()),
        // Refused before the fork: a notify profile never gets here.
        Ok(Some(fd)) => {
            // SAFETY: initialize_seccomp handed us the listener descriptor it created.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            Err("seccomp: an unexpected notify listener".to_owned())
        }
        Err(e) => Err(format!(
            "load the seccomp filter: {}",
            crius_common::error_chain(&e)
        )),
    }
}
