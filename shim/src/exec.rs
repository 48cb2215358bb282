//! Exec processes in a running container, done by `crius-shim-helper` itself rather than by
//! libcontainer's tenant builder.
//!
//! Why not the tenant builder: libcontainer 0.7 (`TenantContainerBuilder::adapt_spec_for_tenant`)
//! rebuilds the spec's `linux` section for the exec'd process from the namespaces, the cgroup
//! path, the personality and the time offsets only, so the container's `linux.seccomp` never
//! reaches it: every ExecSync ran without the container's seccomp filter (`Seccomp: 0` in its
//! `/proc/self/status`, while the container's init has `Seccomp: 2`). The builder has no option
//! to keep it, and runc and containerd do apply the container's filter to exec processes. What an
//! exec needs is small enough to do here, with libcontainer's public pieces for the parts that
//! are easy to get wrong (capability sets, the seccomp filter, the uid/gid switch that keeps
//! capabilities); it also saves the tenant builder's clone of an intermediate process, its
//! notify socket and its reload of the container's state.
//!
//! How, in the short-lived, single-threaded helper ([`exec`]):
//! 1. Read libcontainer's `state.json` (status `running`, the init's pid, the bundle), the
//!    bundle's `config.json` as written (its `linux.seccomp` and `linux.cgroupsPath`) and the
//!    exec process the shim wrote.
//! 2. Open `/proc/<init>/ns/*` for each namespace the init does not share with the helper.
//! 3. Join the container's cgroup (the helper's pid into `cgroup.procs` of `linux.cgroupsPath`
//!    in every hierarchy libcontainer uses), and set the process's `oom_score_adj`.
//! 4. `setns` into the namespaces: all but the user namespace first (host root may join
//!    namespaces owned by the host's user namespace only before it enters the container's),
//!    then the user namespace, then any that needed it. The mount namespace comes last among
//!    the first group: from then on paths are the container's.
//! 5. Find the executable in the container (`PATH` of the process) and its `HOME` if unset,
//!    then fork: the pid namespace applies to children only.
//! 6. In the child, in runc's order for a process joining a container: new session, stdio on
//!    the shim's pipes, every other descriptor close-on-exec, rlimits, personality,
//!    `no_new_privs`, AppArmor, umask; then, if `no_new_privs` is not set, the seccomp filter
//!    (loading it needs CAP_SYS_ADMIN then, so before capabilities are dropped; it may deny what
//!    follows only as it would for runc); working directory, supplementary groups, uid/gid,
//!    capabilities; with `no_new_privs`, the seccomp filter last; `execve`.
//! 7. The parent waits on a close-on-exec pipe: end of file means the child exec'd (or died),
//!    bytes are the child's error. It reports the child's pid and exits; the child is
//!    re-parented to the shim (a child subreaper), which reaps it.
//!
//! With `process.terminal` the helper opens a pty in the container's own devpts (`/dev/ptmx`
//! once inside its mount namespace, the slave through `TIOCGPTPEER`), so `tty` in the container
//! names it; the slave is the process's stdio and controlling terminal, and the master goes
//! back to the shim with the helper's report.
//!
//! Not handled (crius never sets them on a process; an exec asking for them is refused rather
//! than run without): SELinux labels, I/O priority, scheduler, CPU affinity and seccomp user
//! notification.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use libcontainer::oci_spec::runtime::{
    LinuxCapabilities, LinuxPersonalityDomain, LinuxSeccomp, Process, Spec,
};
use libcontainer::syscall::syscall::create_syscall;
use nix::unistd::{Gid, Uid};
use serde_json::Value;

use crate::cgroup::Hierarchies;

/// `PATH` when the process has none (runc's and containerd's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Namespaces in the order they are joined (the user namespace is handled apart).
const NAMESPACES: &[(&str, libc::c_int)] = &[
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("net", libc::CLONE_NEWNET),
    ("pid", libc::CLONE_NEWPID),
    ("cgroup", libc::CLONE_NEWCGROUP),
    ("time", libc::CLONE_NEWTIME),
    ("mnt", libc::CLONE_NEWNS),
];

/// Why an exec could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parse {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {what}")]
    State { path: PathBuf, what: String },
    #[error("load the container's spec {path}")]
    Spec {
        path: PathBuf,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error("container is {0}, not running")]
    NotRunning(String),
    #[error("exec process: {0}")]
    Process(String),
    #[error("exec process: {0} is not supported")]
    Unsupported(&'static str),
    #[error("open namespace {path}")]
    OpenNamespace {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("join the container's {kind} namespace")]
    Setns {
        kind: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cgroup path {0:?} is not an absolute path without `..`")]
    CgroupPath(PathBuf),
    #[error("find the cgroup hierarchies")]
    Hierarchies(#[source] crate::cgroup::CgroupError),
    #[error("join cgroup {path}")]
    JoinCgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("set oom_score_adj {value}")]
    OomScoreAdj {
        value: i32,
        #[source]
        source: io::Error,
    },
    #[error("executable {0:?} not found in $PATH of the container")]
    NotFound(String),
    #[error("{what}")]
    Sys {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The child failed before it exec'd; its message says where.
    #[error("{0}")]
    Child(String),
}

pub type Result<T> = std::result::Result<T, ExecError>;

/// What the child needs, prepared before the fork.
struct Prepared {
    executable: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    process: Process,
    seccomp: Option<LinuxSeccomp>,
    capabilities: LinuxCapabilities,
    personality: Option<LinuxPersonalityDomain>,
}

/// Start `process_json` (an OCI process) in the running container `id` whose libcontainer
/// state is under `root`. Its stdio is `stdio` (stdin, stdout, stderr; stdout and stderr are
/// required, stdin defaults to the helper's own, `/dev/null`), or with `process.terminal` the
/// slave of a new pty in the container's devpts, whose master is returned.
/// Returns the new process's pid once it has exec'd its command.
///
/// Call only from a single-threaded, short-lived process: it moves the caller into the
/// container's namespaces and cgroup.
pub fn exec(
    root: &Path,
    id: &str,
    process_json: &Path,
    stdio: [Option<OwnedFd>; 3],
) -> Result<(i32, Option<OwnedFd>)> {
    let (init_pid, bundle) = read_state(&root.join(id))?;
    let spec_path = bundle.join("config.json");
    let spec = Spec::load(&spec_path).map_err(|source| ExecError::Spec {
        path: spec_path.clone(),
        source,
    })?;
    let process = read_process(process_json)?;
    check_supported(&process)?;
    let linux = spec.linux().clone().unwrap_or_default();
    let seccomp = linux.seccomp().clone();
    if seccomp
        .as_ref()
        .is_some_and(libcontainer::seccomp::is_notify)
    {
        return Err(ExecError::Unsupported(
            "a seccomp profile with SCMP_ACT_NOTIFY",
        ));
    }
    // The shim copies the container's process, capabilities included; without any, none.
    let capabilities = process
        .capabilities()
        .clone()
        .or_else(|| spec.process().as_ref()?.capabilities().clone())
        .unwrap_or_else(no_capabilities);
    let args = process
        .args()
        .clone()
        .filter(|a| a.first().is_some_and(|a0| !a0.is_empty()))
        .ok_or_else(|| ExecError::Process("no command".to_owned()))?;

    let namespaces = open_namespaces(init_pid)?;
    if let Some(cgroup) = linux.cgroups_path() {
        join_cgroup(cgroup)?;
    }
    if let Some(value) = process.oom_score_adj() {
        set_oom_score_adj(value)?;
    }
    enter_namespaces(namespaces)?;

    // From here on, paths are the container's.
    let mut env = process.env().clone().unwrap_or_default();
    let path_var = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH)
        .to_owned();
    let executable = find_executable(&args[0], &path_var)?;
    if !env.iter().any(|e| e.len() > 5 && e.starts_with("HOME=")) {
        env.retain(|e| !e.starts_with("HOME="));
        if let Some(home) = home_of(process.user().uid()) {
            env.push(format!("HOME={home}"));
        }
    }
    let prepared = Prepared {
        executable: cstring(executable.as_os_str().as_bytes(), "executable")?,
        argv: args
            .iter()
            .map(|a| cstring(a.as_bytes(), "argument"))
            .collect::<Result<_>>()?,
        envp: env
            .iter()
            .map(|e| cstring(e.as_bytes(), "environment variable"))
            .collect::<Result<_>>()?,
        personality: linux.personality().as_ref().map(|p| p.domain()),
        process,
        seccomp,
        capabilities,
    };
    let [stdin, stdout, stderr] = stdio;
    if prepared.process.terminal() == Some(true) {
        let (master, slave) = open_pty(prepared.process.user().uid())?;
        let dup = |fd: &OwnedFd| {
            fd.try_clone().map_err(|source| ExecError::Sys {
                what: "dup the pty slave",
                source,
            })
        };
        let (slave_in, slave_out) = (dup(&slave)?, dup(&slave)?);
        let pid = spawn(&prepared, Some(slave_in), slave_out, slave)?;
        return Ok((pid, Some(master)));
    }
    let missing = |what: &str| ExecError::Process(format!("no {what} descriptor was given"));
    let stdout = stdout.ok_or_else(|| missing("stdout"))?;
    let stderr = stderr.ok_or_else(|| missing("stderr"))?;
    spawn(&prepared, stdin, stdout, stderr).map(|pid| (pid, None))
}

/// A new pty in the devpts of the mount namespace the caller is in: (master, slave), both
/// close-on-exec, the slave owned by `uid` so the process may reopen it as `/dev/tty`.
fn open_pty(uid: u32) -> Result<(OwnedFd, OwnedFd)> {
    let sys = |what: &'static str| {
        let source = io::Error::last_os_error();
        ExecError::Sys { what, source }
    };
    // SAFETY: open(2) of a constant NUL-terminated path; the result is checked.
    let master = unsafe {
        libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if master < 0 {
        return Err(sys("open the container's /dev/ptmx"));
    }
    // SAFETY: open just returned this descriptor; nothing else owns it.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: unlockpt and the TIOCGPTPEER ioctl act on the master we own.
    let slave = unsafe {
        if libc::unlockpt(master.as_raw_fd()) < 0 {
            return Err(sys("unlock the pty"));
        }
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(sys("open the pty slave"));
    }
    // SAFETY: the ioctl just returned this descriptor; nothing else owns it.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    // SAFETY: fchown of a descriptor we own; -1 keeps the group (devpts's tty group).
    if unsafe { libc::fchown(slave.as_raw_fd(), uid, u32::MAX) } < 0 {
        return Err(sys("give the pty slave to the process's user"));
    }
    Ok((master, slave))
}

/// The init's pid and the bundle, from libcontainer's `state.json`; refused unless running.
fn read_state(dir: &Path) -> Result<(i32, PathBuf)> {
    let path = dir.join(crate::libct_state::STATE_FILE);
    let bytes = fs::read(&path).map_err(|source| ExecError::Read {
        path: path.clone(),
        source,
    })?;
    let state: Value = serde_json::from_slice(&bytes).map_err(|source| ExecError::Parse {
        path: path.clone(),
        source,
    })?;
    let status = state.get("status").and_then(Value::as_str).unwrap_or("");
    if status != "running" {
        return Err(ExecError::NotRunning(status.to_owned()));
    }
    let unexpected = |what: &str| ExecError::State {
        path: path.clone(),
        what: what.to_owned(),
    };
    let pid = state
        .get("pid")
        .and_then(Value::as_i64)
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| unexpected("no init pid"))?;
    let bundle = state
        .get("bundle")
        .and_then(Value::as_str)
        .filter(|b| b.starts_with('/'))
        .ok_or_else(|| unexpected("no absolute bundle path"))?;
    Ok((pid, PathBuf::from(bundle)))
}

fn read_process(path: &Path) -> Result<Process> {
    let bytes = fs::read(path).map_err(|source| ExecError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| ExecError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Refuse what this exec does not set up, rather than run the process without it.
fn check_supported(process: &Process) -> Result<()> {
    if process
        .selinux_label()
        .as_ref()
        .is_some_and(|l| !l.is_empty())
    {
        return Err(ExecError::Unsupported("an SELinux label"));
    }
    if process.io_priority().is_some() {
        return Err(ExecError::Unsupported("an I/O priority"));
    }
    if process.scheduler().is_some() {
        return Err(ExecError::Unsupported("a scheduler"));
    }
    if process.exec_cpu_affinity().is_some() {
        return Err(ExecError::Unsupported("a CPU affinity"));
    }
    Ok(())
}

fn no_capabilities() -> LinuxCapabilities {
    let none = Default::default;
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(none()));
    caps.set_effective(Some(none()));
    caps.set_permitted(Some(none()));
    caps.set_inheritable(Some(none()));
    caps.set_ambient(Some(none()));
    caps
}

fn cstring(bytes: &[u8], what: &str) -> Result<CString> {
    CString::new(bytes).map_err(|_| ExecError::Process(format!("{what} contains a NUL byte")))
}

/// A namespace of the init to join.
struct Namespace {
    kind: &'static str,
    flag: libc::c_int,
    fd: OwnedFd,
}

/// Open the init's namespaces that differ from the helper's (a container sharing the node's
/// network or pid namespace has the helper's own). All are opened before any is joined: once
/// in the container's mount namespace, `/proc` is the container's.
fn open_namespaces(init_pid: i32) -> Result<Vec<Namespace>> {
    let mut out = Vec::new();
    let all = std::iter::once(&("user", libc::CLONE_NEWUSER)).chain(NAMESPACES);
    for &(kind, flag) in all {
        let path = PathBuf::from(format!("/proc/{init_pid}/ns/{kind}"));
        let theirs = match fs::metadata(&path) {
            Ok(m) => m,
            // A kernel without this kind of namespace.
            Err(e) if e.kind() == io::ErrorKind::NotFound && kind == "time" => continue,
            Err(source) => return Err(ExecError::OpenNamespace { path, source }),
        };
        let ours_path = format!("/proc/self/ns/{kind}");
        let ours = fs::metadata(&ours_path).map_err(|source| ExecError::OpenNamespace {
            path: ours_path.into(),
            source,
        })?;
        if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
            continue;
        }
        let file = fs::File::open(&path).map_err(|source| ExecError::OpenNamespace {
            path: path.clone(),
            source,
        })?;
        out.push(Namespace {
            kind,
            flag,
            fd: file.into(),
        });
    }
    Ok(out)
}

/// Join the namespaces: all but the user namespace, then the user namespace, then those that
/// could only be joined from inside it.
fn enter_namespaces(namespaces: Vec<Namespace>) -> Result<()> {
    let (user, others): (Vec<_>, Vec<_>) = namespaces.into_iter().partition(|n| n.kind == "user");
    let mut later = Vec::new();
    for ns in others {
        if let Err(e) = setns(&ns) {
            if user.is_empty() || e.raw_os_error() != Some(libc::EPERM) {
                return Err(ExecError::Setns {
                    kind: ns.kind,
                    source: e,
                });
            }
            later.push(ns);
        }
    }
    for ns in user.iter().chain(&later) {
        setns(ns).map_err(|source| ExecError::Setns {
            kind: ns.kind,
            source,
        })?;
    }
    Ok(())
}

fn setns(ns: &Namespace) -> io::Result<()> {
    // SAFETY: setns(2) on a namespace descriptor we own; the caller is single-threaded, as
    // joining a user or mount namespace requires.
    if unsafe { libc::setns(ns.fd.as_raw_fd(), ns.flag) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Move the helper (and so the process it forks) into the container's cgroup `cgroup_path`
/// (absolute, as in the spec), in each hierarchy libcontainer made it in.
fn join_cgroup(cgroup_path: &Path) -> Result<()> {
    let rel = relative(cgroup_path)?;
    let pid = std::process::id().to_string();
    let join = |dir: PathBuf| -> Result<bool> {
        let procs = dir.join("cgroup.procs");
        match fs::write(&procs, &pid) {
            Ok(()) => Ok(true),
            // A v1 hierarchy libcontainer did not put the container in.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(ExecError::JoinCgroup { path: dir, source }),
        }
    };
    match Hierarchies::detect().map_err(ExecError::Hierarchies)? {
        Hierarchies::V1(layout) => {
            let mut joined = false;
            for mount in &layout.mounts {
                joined |= join(mount.join(&rel))?;
            }
            if !joined {
                return Err(ExecError::JoinCgroup {
                    path: cgroup_path.to_path_buf(),
                    source: io::ErrorKind::NotFound.into(),
                });
            }
        }
        Hierarchies::V2(root) => {
            let dir = root.join(&rel);
            if !join(dir.clone())? {
                return Err(ExecError::JoinCgroup {
                    path: dir,
                    source: io::ErrorKind::NotFound.into(),
                });
            }
        }
    }
    Ok(())
}

/// `cgroup_path` without its leading `/`, refusing anything that could leave the hierarchy.
fn relative(cgroup_path: &Path) -> Result<PathBuf> {
    let mut components = cgroup_path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(ExecError::CgroupPath(cgroup_path.to_path_buf()));
    }
    let mut rel = PathBuf::new();
    for c in components {
        match c {
            Component::Normal(part) => rel.push(part),
            _ => return Err(ExecError::CgroupPath(cgroup_path.to_path_buf())),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(ExecError::CgroupPath(cgroup_path.to_path_buf()));
    }
    Ok(rel)
}

/// Set the helper's `oom_score_adj` (inherited by the process) when it differs.
fn set_oom_score_adj(value: i32) -> Result<()> {
    let path = "/proc/self/oom_score_adj";
    let current = fs::read_to_string(path).ok();
    if current.as_deref().map(str::trim) == Some(value.to_string().as_str()) {
        return Ok(());
    }
    fs::write(path, value.to_string()).map_err(|source| ExecError::OomScoreAdj { value, source })
}

/// The path to exec for `arg0`: itself if it names a path, else the first executable file of
/// that name in `path_var`'s directories (in the container's mount namespace).
fn find_executable(arg0: &str, path_var: &str) -> Result<PathBuf> {
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
fn home_of(uid: u32) -> Option<String> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 6 && fields[2].parse::<u32>().ok()? == uid && !fields[5].is_empty())
            .then(|| fields[5].to_owned())
    })
}

/// Fork the process; in the parent, wait until it has exec'd or failed.
fn spawn(
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
fn child(
    p: &Prepared,
    stdin: Option<RawFd>,
    stdout: RawFd,
    stderr: RawFd,
) -> std::result::Result<std::convert::Infallible, String> {
    let syscall = create_syscall();
    let os = |what: &str| format!("{what}: {}", io::Error::last_os_error());
    let sys = |what: &str, e: &dyn std::error::Error| crate::libct::chain(what, e);
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
    Err(format!(
        "exec {}: {}",
        OsStr::from_bytes(p.executable.as_bytes()).to_string_lossy(),
        io::Error::last_os_error()
    ))
}

fn load_seccomp(seccomp: Option<&LinuxSeccomp>) -> std::result::Result<(), String> {
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
        Err(e) => Err(crate::libct::chain("load the seccomp filter", &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_stay_inside_the_hierarchy() {
        assert_eq!(
            relative(Path::new("/kubepods/pod1/c1")).unwrap(),
            PathBuf::from("kubepods/pod1/c1")
        );
        for bad in ["relative/c1", "/", "/a/../b", ""] {
            assert!(relative(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn finds_executables_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        fs::write(a.join("tool"), "").unwrap();
        fs::write(b.join("tool"), "").unwrap();
        fs::set_permissions(b.join("tool"), fs::Permissions::from_mode(0o755)).unwrap();
        let path_var = format!("{}:{}", a.display(), b.display());
        // Not executable in `a`: the one in `b`.
        assert_eq!(find_executable("tool", &path_var).unwrap(), b.join("tool"));
        assert_eq!(
            find_executable("/x/y", &path_var).unwrap(),
            PathBuf::from("/x/y")
        );
        assert!(matches!(
            find_executable("missing", &path_var),
            Err(ExecError::NotFound(_))
        ));
    }

    #[test]
    fn reads_the_init_and_bundle_of_a_running_container_only() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        fs::write(&state, r#"{"status":"running","pid":42,"bundle":"/b/c1"}"#).unwrap();
        assert_eq!(
            read_state(dir.path()).unwrap(),
            (42, PathBuf::from("/b/c1"))
        );
        fs::write(&state, r#"{"status":"stopped","pid":42,"bundle":"/b/c1"}"#).unwrap();
        assert!(matches!(
            read_state(dir.path()),
            Err(ExecError::NotRunning(s)) if s == "stopped"
        ));
        fs::write(&state, r#"{"status":"running","bundle":"/b/c1"}"#).unwrap();
        assert!(matches!(
            read_state(dir.path()),
            Err(ExecError::State { .. })
        ));
    }
}
