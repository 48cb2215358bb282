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
//!    in every hierarchy libcontainer uses, at the mount points the shim passes, found once
//!    per shim), and set the process's `oom_score_adj`.
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

use std::ffi::CString;
use std::fs;
use std::io::{self};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{
    LinuxCapabilities, LinuxPersonalityDomain, LinuxSeccomp, Process, Spec,
};
use serde_json::Value;

mod child;
mod namespaces;

pub(crate) use child::find_executable;

use child::*;
use namespaces::*;

/// `PATH` when the process has none (runc's and containerd's default).
pub(super) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Namespaces in the order they are joined (the user namespace is handled apart).
pub(super) const NAMESPACES: &[(&str, libc::c_int)] = &[
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
    #[error("the command cannot run: executable {0:?} not found in $PATH of the container")]
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

/// Begins the part of an exec's error that says the command itself cannot run in the
/// container (not found, not executable, not a format the kernel runs, arguments longer than
/// the kernel takes): the request's fault, which the shim reports as InvalidArgument.
pub const COMMAND_CANNOT_RUN: &str = "the command cannot run: ";

/// What the child needs, prepared before the fork.
pub(super) struct Prepared {
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
    cgroup_mounts: &[PathBuf],
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
        join_cgroup(cgroup, cgroup_mounts)?;
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
pub(super) fn open_pty(uid: u32) -> Result<(OwnedFd, OwnedFd)> {
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
pub(super) fn read_state(dir: &Path) -> Result<(i32, PathBuf)> {
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

pub(super) fn read_process(path: &Path) -> Result<Process> {
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
pub(super) fn check_supported(process: &Process) -> Result<()> {
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

pub(super) fn no_capabilities() -> LinuxCapabilities {
    let none = Default::default;
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(none()));
    caps.set_effective(Some(none()));
    caps.set_permitted(Some(none()));
    caps.set_inheritable(Some(none()));
    caps.set_ambient(Some(none()));
    caps
}

pub(super) fn cstring(bytes: &[u8], what: &str) -> Result<CString> {
    CString::new(bytes).map_err(|_| ExecError::Process(format!("{what} contains a NUL byte")))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

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
        // the shim tells the request's fault by this mark
        assert!(ExecError::NotFound("missing".into())
            .to_string()
            .starts_with(COMMAND_CANNOT_RUN));
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
