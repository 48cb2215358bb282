//! Start-up: detach from crius and tell it when the control socket is ready.
//!
//! crius runs `crius-shim --id <pod> --state-dir <dir>` and waits for that process to exit. The
//! process forks; the child starts a new session and forks again, so the shim is nobody's
//! session leader and not crius's child (crius can die or restart without touching it). The
//! grandchild sets itself up (log, subreaper, signalfd, control socket, pid file) and writes
//! `ready <pid>` — or `error: <why>` — into a pipe; the first process relays that, printing
//! the shim's pid on stdout and exiting 0, or the error on stderr and exiting 1. When crius's
//! `wait` returns 0 the socket accepts connections.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{fork, setsid, ForkResult};

use crate::server::{bind_control_socket, Config, Shim};
use crate::signals::Signals;

/// Failures before the shim is ready.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("create state dir {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("open shim log {path}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("bind control socket in {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn sys(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> StartError {
    move |e| StartError::Sys {
        what,
        source: e.into(),
    }
}

/// What `crius-shim` was asked to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: Config,
    /// The shim's own log file; `<state-dir>/shim.log` when absent.
    pub log: Option<PathBuf>,
}

/// Detach and serve. Returns the exit code of the calling (foreground) process.
pub fn launch(opts: Options) -> i32 {
    let state = &opts.config.state_dir;
    if let Err(source) = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(state)
    {
        eprintln!(
            "crius-shim: {}",
            crius_common::error_chain(&StartError::StateDir {
                path: state.clone(),
                source
            })
        );
        return 1;
    }
    let (ready_r, ready_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("crius-shim: create ready pipe: {e}");
            return 1;
        }
    };
    // SAFETY: nothing has started a thread in this process.
    match unsafe { fork() } {
        Err(e) => {
            eprintln!("crius-shim: fork: {e}");
            1
        }
        Ok(ForkResult::Parent { child }) => {
            drop(ready_w);
            let mut report = String::new();
            let _ = File::from(ready_r).read_to_string(&mut report);
            let _ = nix::sys::wait::waitpid(child, None);
            match report.strip_prefix("ready ") {
                Some(pid) => {
                    print!("{pid}");
                    0
                }
                None if report.is_empty() => {
                    eprintln!("crius-shim: shim exited before it was ready");
                    1
                }
                None => {
                    eprint!("crius-shim: {report}");
                    1
                }
            }
        }
        Ok(ForkResult::Child) => {
            drop(ready_r);
            if setsid().is_err() {
                // SAFETY: leaving the forked child without running the parent's destructors.
                unsafe { libc::_exit(1) };
            }
            // SAFETY: still single-threaded.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => {}
                // SAFETY: as above; the grandchild carries on alone.
                _ => unsafe { libc::_exit(0) },
            }
            let code = serve(opts, ready_w);
            // SAFETY: the shim is done; skip destructors of the forked image.
            unsafe { libc::_exit(code) }
        }
    }
}

/// Run in the detached grandchild.
fn serve(opts: Options, ready: OwnedFd) -> i32 {
    let mut ready = File::from(ready);
    let shim = match setup(&opts) {
        Ok(shim) => shim,
        Err(e) => {
            let _ = writeln!(ready, "error: {}", crius_common::error_chain(&e));
            return 1;
        }
    };
    tracing::info!(
        target: "crius_shim",
        pod = %opts.config.pod_id,
        pid = std::process::id(),
        "shim ready"
    );
    let _ = write!(ready, "ready {}", std::process::id());
    drop(ready);
    shim.run();
    0
}

fn setup(opts: &Options) -> Result<Shim, StartError> {
    let state = &opts.config.state_dir;
    nix::unistd::chdir("/").map_err(sys("chdir /"))?;
    redirect_stdio()?;
    let log_path = opts.log.clone().unwrap_or_else(|| state.join("shim.log"));
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(&log_path)
        .map_err(|source| StartError::Log {
            path: log_path.clone(),
            source,
        })?;
    crate::shim_log::init(log);
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) changes only this process's reaping role.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(StartError::Sys {
            what: "become child subreaper",
            source: std::io::Error::last_os_error(),
        });
    }
    let signals = Signals::new().map_err(|source| StartError::Sys {
        what: "set up signalfd",
        source,
    })?;
    let listener = bind_control_socket(state).map_err(|source| StartError::Bind {
        path: state.clone(),
        source,
    })?;
    write_pid_file(state).map_err(|source| StartError::Sys {
        what: "write pid file",
        source,
    })?;
    Shim::new(opts.config.clone(), listener, signals).map_err(|source| StartError::Sys {
        what: "prepare state dir",
        source,
    })
}

/// Write `shim.pid` through a temp file and a rename, so that crius never reads half of it.
///
/// Not synced (neither the file nor the directory, which cost two fsyncs on every pod start
/// where the state directory is on a disk): the file names a live process, and every reason
/// to read it is gone with a machine crash, the only thing an fsync guards against. A shim
/// that dies before it reports ready is cleaned up by crius, which waits for that report; one
/// that dies later leaves a complete file naming a dead pid, which crius checks
/// (`/proc/<pid>/cmdline`) before trusting.
fn write_pid_file(state: &Path) -> std::io::Result<()> {
    crius_common::fs::write_atomic(
        &state.join(crius_api::shim::PID_FILE),
        std::process::id().to_string().as_bytes(),
        None,
        crius_common::fs::Durability::None,
    )
}

/// Point stdin, stdout and stderr at /dev/null: crius's pipes must close when the foreground
/// process exits, and nothing of the shim's may reach a container's stdio.
fn redirect_stdio() -> Result<(), StartError> {
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|source| StartError::Sys {
            what: "open /dev/null",
            source,
        })?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard descriptors, which we own.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(StartError::Sys {
                what: "redirect stdio",
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// Write the static `crius-pause` to `dest` (mode 0755), atomically.
pub fn install_pause(dest: &Path) -> std::io::Result<()> {
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir)?;
    }
    crius_common::fs::write_atomic(
        dest,
        crate::PAUSE_STATIC,
        Some(0o755),
        crius_common::fs::Durability::Data,
    )
}
