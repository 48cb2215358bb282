//! Helper processes that call libcontainer on the shim's behalf.
//!
//! libcontainer changes its calling process (it `chdir()`s, sets `PR_SET_DUMPABLE 0`, writes
//! the container's `oom_score_adj` to `/proc/self/oom_score_adj`; its container init is a
//! `CLONE_PARENT` child of the caller), and linking it makes a binary large: its relocations
//! and code would dominate the resident memory of a process that lives as long as the pod. So
//! the long-lived `crius-shim` never links it: every create and exec runs in a short-lived
//! `crius-shim-helper` process the shim spawns (fork + exec), and so do a start, a kill of the
//! whole cgroup or a delete that the shim does not do itself (see [`crate::libct_state`]). The helper
//! reports its outcome (a pid, maybe a pty master fd) over a `SOCK_SEQPACKET` socket and exits;
//! the processes it made are then re-parented to the shim, a child subreaper.
//!
//! Helper command line: `crius-shim-helper <op> --root <libcontainer-root> --id <container>
//! [op arguments]`, with these descriptors:
//!
//! | fd | what |
//! |---|---|
//! | 0, 1, 2 | /dev/null |
//! | 3 | the report socket |
//! | 4, 5, 6 | the container's stdin, stdout, stderr (create and exec, when given) |
//! | 7 | the shim's log file (for libcontainer's events), when open |

use std::ffi::{CString, OsString};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::cmsg_space;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use serde::{Deserialize, Serialize};

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

/// One libcontainer operation for a helper: what the shim asks and the helper parses, in one
/// place, so the command line is written and read by the same code (and stays usable by hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCall {
    /// The state root: libcontainer's (`<shim state>/runc`), or the OCI runtime's `--root`.
    pub root: PathBuf,
    /// The container.
    pub id: String,
    pub op: HelperOp,
    /// Run the operation with this OCI runtime's command line instead of libcontainer.
    pub runtime: Option<OciCommand>,
}

/// An OCI runtime's executable and the global flags it gets before every operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciCommand {
    pub binary: PathBuf,
    pub options: Vec<String>,
}

/// The operations a helper runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperOp {
    /// Create the container from `bundle`; with `console_dir`, on a terminal whose master is
    /// received on a socket in that directory and reported back.
    Create {
        bundle: PathBuf,
        console_dir: Option<PathBuf>,
    },
    /// Let a created container's init run (hooks and the unusual cases; see
    /// [`crate::libct_state`]).
    Start,
    /// Signal every process of the container's cgroup.
    Kill { signal: i32 },
    /// Remove the container's cgroup and libcontainer state.
    Delete,
    /// Run the OCI process in `process` (a JSON file) in the running container.
    /// `cgroup_mounts`: the mount points of the cgroup hierarchies the container is in, as
    /// the shim found them once; empty, the helper reads the host's mount table itself.
    Exec {
        process: PathBuf,
        cgroup_mounts: Vec<PathBuf>,
    },
    /// Wait until the container's process exits and report its exit code (OCI runtimes whose
    /// containers share the sandbox's pid, as gVisor's do: `<rt> wait`).
    Wait,
    /// Dump the running container's processes with CRIU into `image_path` (CRIU's logs in
    /// `work_path`), leaving them running. Run by crius itself, not by the shim: it makes no
    /// process the shim must reap.
    Checkpoint {
        image_path: PathBuf,
        work_path: PathBuf,
    },
    /// Make the container from `bundle` by restoring the CRIU images in `image_path` instead
    /// of running its process; the restored processes are left stopped (SIGSTOP) until the
    /// start, which continues them. OCI runtimes only: libcontainer 0.7 has no restore.
    Restore {
        bundle: PathBuf,
        image_path: PathBuf,
        work_path: PathBuf,
        console_dir: Option<PathBuf>,
        /// The criu binary, when not `criu` in `$PATH`.
        criu: Option<PathBuf>,
    },
}

impl HelperOp {
    /// The operation's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Start => "start",
            Self::Kill { .. } => "kill",
            Self::Delete => "delete",
            Self::Exec { .. } => "exec",
            Self::Wait => "wait",
            Self::Checkpoint { .. } => "checkpoint",
            Self::Restore { .. } => "restore",
        }
    }
}

impl HelperCall {
    /// The helper's command line: `<op> --root <root> --id <id> [--runtime <binary>
    /// [--runtime-option <flag>]...] [op arguments]`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            self.op.name().into(),
            "--root".into(),
            self.root.clone().into(),
            "--id".into(),
            self.id.clone().into(),
        ];
        if let Some(rt) = &self.runtime {
            args.push("--runtime".into());
            args.push(rt.binary.clone().into());
            for o in &rt.options {
                args.push("--runtime-option".into());
                args.push(o.into());
            }
        }
        match &self.op {
            HelperOp::Create {
                bundle,
                console_dir,
            } => {
                args.push("--bundle".into());
                args.push(bundle.clone().into());
                if let Some(dir) = console_dir {
                    args.push("--console-dir".into());
                    args.push(dir.clone().into());
                }
            }
            HelperOp::Kill { signal } => {
                args.push("--signal".into());
                args.push(signal.to_string().into());
            }
            HelperOp::Exec {
                process,
                cgroup_mounts,
            } => {
                args.push("--process".into());
                args.push(process.clone().into());
                for mount in cgroup_mounts {
                    args.push("--cgroup-mount".into());
                    args.push(mount.clone().into());
                }
            }
            HelperOp::Checkpoint {
                image_path,
                work_path,
            } => {
                args.push("--image-path".into());
                args.push(image_path.clone().into());
                args.push("--work-path".into());
                args.push(work_path.clone().into());
            }
            HelperOp::Restore {
                bundle,
                image_path,
                work_path,
                console_dir,
                criu,
            } => {
                if let Some(criu) = criu {
                    args.push("--criu".into());
                    args.push(criu.clone().into());
                }
                args.push("--bundle".into());
                args.push(bundle.clone().into());
                args.push("--image-path".into());
                args.push(image_path.clone().into());
                args.push("--work-path".into());
                args.push(work_path.clone().into());
                if let Some(dir) = console_dir {
                    args.push("--console-dir".into());
                    args.push(dir.clone().into());
                }
            }
            HelperOp::Start | HelperOp::Delete | HelperOp::Wait => {}
        }
        args
    }

    /// Read a command line written by [`Self::to_args`] (or typed by hand), without the
    /// program name.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut it = args.into_iter();
        let op = it.next().ok_or("missing operation")?;
        let mut root = None;
        let mut id = None;
        let mut bundle = None;
        let mut console_dir = None;
        let mut process = None;
        let mut cgroup_mounts = Vec::new();
        let mut signal = None;
        let mut image_path = None;
        let mut work_path = None;
        let mut criu = None;
        let mut runtime: Option<OciCommand> = None;
        let mut options = Vec::new();
        while let Some(flag) = it.next() {
            let flag = flag.to_string_lossy().into_owned();
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--root" => root = Some(PathBuf::from(value)),
                "--id" => {
                    id = Some(
                        value
                            .into_string()
                            .map_err(|v| format!("--id: not UTF-8: {}", v.to_string_lossy()))?,
                    )
                }
                "--bundle" => bundle = Some(PathBuf::from(value)),
                "--console-dir" => console_dir = Some(PathBuf::from(value)),
                "--process" => process = Some(PathBuf::from(value)),
                "--cgroup-mount" => cgroup_mounts.push(PathBuf::from(value)),
                "--image-path" => image_path = Some(PathBuf::from(value)),
                "--work-path" => work_path = Some(PathBuf::from(value)),
                "--criu" => criu = Some(PathBuf::from(value)),
                "--runtime" => {
                    runtime = Some(OciCommand {
                        binary: PathBuf::from(value),
                        options: Vec::new(),
                    })
                }
                "--runtime-option" => options.push(value.to_string_lossy().into_owned()),
                "--signal" => {
                    let text = value.to_string_lossy();
                    signal = Some(
                        text.parse::<i32>()
                            .map_err(|e| format!("--signal {text:?}: {e}"))?,
                    )
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        let (Some(root), Some(id)) = (root, id) else {
            return Err("--root and --id are required".to_owned());
        };
        if id.is_empty() {
            return Err("--id is empty".to_owned());
        }
        match &mut runtime {
            Some(rt) => rt.options = options,
            None if !options.is_empty() => {
                return Err("--runtime-option needs --runtime".to_owned())
            }
            None => {}
        }
        let op = match op.to_string_lossy().as_ref() {
            "create" => HelperOp::Create {
                bundle: bundle.ok_or("create needs --bundle")?,
                console_dir,
            },
            "start" => HelperOp::Start,
            "kill" => HelperOp::Kill {
                signal: signal.ok_or("kill needs --signal")?,
            },
            "delete" => HelperOp::Delete,
            "wait" => HelperOp::Wait,
            "exec" => HelperOp::Exec {
                process: process.ok_or("exec needs --process")?,
                cgroup_mounts,
            },
            "checkpoint" => HelperOp::Checkpoint {
                image_path: image_path.ok_or("checkpoint needs --image-path")?,
                work_path: work_path.ok_or("checkpoint needs --work-path")?,
            },
            "restore" => HelperOp::Restore {
                bundle: bundle.ok_or("restore needs --bundle")?,
                image_path: image_path.ok_or("restore needs --image-path")?,
                work_path: work_path.ok_or("restore needs --work-path")?,
                console_dir,
                criu,
            },
            other => return Err(format!("unknown operation {other}")),
        };
        Ok(Self {
            root,
            id,
            op,
            runtime,
        })
    }
}

/// How the shim starts helpers and signals the processes it owns: the one place the shim's
/// state machine touches other processes, so it can be driven without root by a fake (see
/// `shim/tests/state_machine.rs`).
pub trait Launcher {
    /// Start a helper for `call`; `stdio` (the container's stdin, stdout, stderr) land on the
    /// helper's [`STDIO_FDS`].
    fn spawn(&mut self, call: &HelperCall, stdio: [Option<RawFd>; 3]) -> io::Result<Helper>;

    /// Send `signal` to `pid`, a child of the shim that is not reaped yet (so the pid cannot
    /// have been reused).
    fn signal(&mut self, pid: i32, signal: i32) -> io::Result<()>;

    /// Start a helper ahead of its operation: it waits on its report socket for the call that
    /// [`hand_over`] sends. `None` from a launcher that does not do this (then every helper is
    /// spawned with its call).
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

/// The operation of a helper started ahead of its call ([`Launcher::prepare`]): it waits for
/// [`hand_over`]'s message on its report socket and then runs like one spawned with the call.
/// Its exec, loader and start (about a millisecond) are then done while crius is still making
/// the container's rootfs and spec.
pub const STANDBY: &str = "standby";

/// Give a helper started by [`Launcher::prepare`] its call and the container's `stdio`: one
/// message on its report socket, `stdio`'s descriptors as `SCM_RIGHTS`. Its payload: a byte
/// whose bit `i` says `stdio[i]` is among them, then the command line, each argument ended by
/// a NUL. Fails when the helper is gone (its socket's peer is closed).
pub fn hand_over(helper: &Helper, call: &HelperCall, stdio: [Option<RawFd>; 3]) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut mask = 0u8;
    let mut fds = Vec::new();
    for (i, fd) in stdio.iter().enumerate() {
        if let Some(fd) = fd {
            mask |= 1 << i;
            fds.push(*fd);
        }
    }
    let mut payload = vec![mask];
    for arg in call.to_args() {
        if arg.as_bytes().contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "helper argument with a NUL byte",
            ));
        }
        payload.extend_from_slice(arg.as_bytes());
        payload.push(0);
    }
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
    use std::os::unix::ffi::OsStringExt;
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
    let mask = buf[0];
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
    drop(high);
    let args = buf[1..len]
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect();
    Ok(Some(args))
}

/// What a helper reports.
#[derive(Debug, Serialize, Deserialize)]
pub enum Outcome {
    /// Done; `pid` is the new process (container init or exec process), 0 when none.
    Ok { pid: i32 },
    /// Why it failed, with its cause chain.
    Err { message: String },
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
/// The child is made by `clone(CLONE_VM | CLONE_VFORK)` and runs on the shim's memory until it
/// execs, the shim waiting: a fork copied the shim's page tables and made its pages
/// copy-on-write for a process that replaces itself at once. Not `posix_spawn`: glibc checks
/// each of its file actions with `sysconf`, whose jump table would keep a page of read-only
/// data (and 64 KiB of fault-around) resident in every shim. The child touches nothing but
/// [`spawned_child`], the plan and its stack.
fn spawn_process(program: &Path, args: &[OsString], moves: &[(RawFd, RawFd)]) -> io::Result<i32> {
    use std::os::unix::ffi::OsStrExt;
    let c_string = |s: &std::ffi::OsStr| {
        CString::new(s.as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument"))
    };
    let program = c_string(program.as_os_str())?;
    let args = args
        .iter()
        .map(|a| c_string(a))
        .collect::<io::Result<Vec<_>>>()?;
    let argv: Vec<*const libc::c_char> = std::iter::once(&program)
        .chain(&args)
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = helper_environment()
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
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
            (&mut plan as *mut ChildPlan).cast(),
        )
    };
    let clone_error = io::Error::last_os_error();
    // Cannot fail (a valid `how` and sets of ours), and a child made must not go untracked by
    // an early return.
    let _ = sigprocmask(libc::SIG_SETMASK, &old, None);
    if pid < 0 {
        return Err(clone_error);
    }
    // SAFETY: the child wrote this, if at all, before clone returned.
    let errno = unsafe { std::ptr::read_volatile(&plan.errno) };
    if errno != 0 {
        // It exited: ours to reap, before the shim's reaper meets a pid it never heard of.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(io::Error::from_raw_os_error(errno));
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
        // The real-time signals too (an ignored signal is inherited from whoever started
        // crius). The raw system call, because glibc's sigaction refuses the two signals it
        // keeps for itself (32 and 33). A zeroed kernel sigaction is SIG_DFL, no flags, and an
        // empty mask; the kernel reads 8 bytes of mask.
        let default: [libc::c_ulong; 4] = [0; 4];
        let mut signal = 1;
        while signal <= 64 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<libc::c_void>(),
                    8usize,
                );
            }
            signal += 1;
        }
        let none: libc::c_ulong = 0;
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            8usize,
        );
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

// The two calls below are raw system calls, as in the child: each libc function the spawn
// calls is more of the binary mapped in every shim (fault-around maps 64 KiB around a page).

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
    use std::os::unix::ffi::OsStrExt;
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{SigSet, SigmaskHow};

    fn round_trip(op: HelperOp) {
        let runtimes = [
            None,
            Some(OciCommand {
                binary: PathBuf::from("/usr/bin/runsc"),
                options: vec!["--platform=ptrace".to_owned(), "--debug".to_owned()],
            }),
        ];
        for runtime in runtimes {
            let call = HelperCall {
                root: PathBuf::from("/run/crius/shims/p/runc"),
                id: "c-1".to_owned(),
                op: op.clone(),
                runtime,
            };
            let args = call.to_args();
            assert_eq!(
                HelperCall::parse(args.clone()),
                Ok(call.clone()),
                "{args:?}"
            );
        }
    }

    #[test]
    fn a_helper_that_cannot_be_executed_is_an_error() {
        let missing = Path::new("/nonexistent/crius-shim-helper");
        let err = spawn(missing, &[], [None; 3]).err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::NotFound));
    }

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

    #[test]
    fn every_operation_round_trips_through_the_command_line() {
        round_trip(HelperOp::Create {
            bundle: PathBuf::from("/b"),
            console_dir: None,
        });
        round_trip(HelperOp::Create {
            bundle: PathBuf::from("/b"),
            console_dir: Some(PathBuf::from("/c d")),
        });
        round_trip(HelperOp::Start);
        round_trip(HelperOp::Kill { signal: 15 });
        round_trip(HelperOp::Wait);
        round_trip(HelperOp::Delete);
        round_trip(HelperOp::Exec {
            process: PathBuf::from("/e/1.json"),
            cgroup_mounts: Vec::new(),
        });
        round_trip(HelperOp::Exec {
            process: PathBuf::from("/e/1.json"),
            cgroup_mounts: vec![
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                PathBuf::from("/sys/fs/cgroup/memory"),
            ],
        });
        round_trip(HelperOp::Checkpoint {
            image_path: PathBuf::from("/c/checkpoint"),
            work_path: PathBuf::from("/c/work"),
        });
        round_trip(HelperOp::Restore {
            bundle: PathBuf::from("/b"),
            image_path: PathBuf::from("/c/checkpoint"),
            work_path: PathBuf::from("/c/work"),
            console_dir: Some(PathBuf::from("/c d")),
            criu: Some(PathBuf::from("/opt/criu/bin/criu")),
        });
    }

    #[test]
    fn a_hand_written_command_line_is_checked() {
        let parse = |line: &str| HelperCall::parse(line.split(' ').map(OsString::from));
        assert!(parse("delete --root /r --id c").is_ok());
        assert!(parse("kill --root /r --id c")
            .unwrap_err()
            .contains("--signal"));
        assert!(parse("create --root /r --id c")
            .unwrap_err()
            .contains("--bundle"));
        assert!(parse("start --id c").unwrap_err().contains("--root"));
        assert!(parse("frob --root /r --id c")
            .unwrap_err()
            .contains("unknown operation"));
        assert!(parse("kill --root /r --id c --signal x").is_err());
        assert!(parse("checkpoint --root /r --id c --image-path /i")
            .unwrap_err()
            .contains("--work-path"));
        assert!(parse("start --root /r --id c --runtime-option --debug")
            .unwrap_err()
            .contains("--runtime"));
    }
}
