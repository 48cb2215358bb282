//! Seccomp: the `RuntimeDefault` profile, `Localhost` profile files and the choice between them.
//!
//! The default profile is an allow list with `ERRNO(EPERM)` for everything else, equivalent to
//! containerd's (and Docker's): the plain allow list, `socket` for every family but `AF_ALG` and
//! `AF_VSOCK`, a few `personality` values, architecture-specific calls, calls that come with a
//! capability in the bounding set, and without `CAP_SYS_ADMIN` a `clone` that may not create
//! namespaces plus `clone3` failing with `ENOSYS` (so libc falls back to `clone`).

use std::path::Path;

use crius_api::v1::{security_profile::ProfileType, SecurityProfile};
use oci_spec::runtime::{
    Arch, Capabilities, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg,
    LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompFilterFlag, LinuxSeccompOperator,
    LinuxSyscall, LinuxSyscallBuilder,
};
use serde::Deserialize;

use super::error::{Result, SpecError};

/// Syscalls the default profile allows unconditionally.
const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "getxattrat",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listmount",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lsm_get_self_attr",
    "lsm_list_modules",
    "lsm_set_self_attr",
    "lstat",
    "lstat64",
    "madvise",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "map_shadow_stack",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "mseal",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "removexattrat",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "setxattrat",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statmount",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "uretprobe",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
    // allowed on kernels >= 4.8, where seccomp runs after ptrace checks; crius needs newer ones
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
];

/// `personality(2)` values the default profile allows: PER_LINUX, PER_LINUX32,
/// UNAME26|PER_LINUX, UNAME26|PER_LINUX32 and the query value 0xffffffff.
const PERSONALITIES: [u64; 5] = [0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// Namespace flags `clone` may not use without CAP_SYS_ADMIN.
const CLONE_NS_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

const AF_ALG: u64 = 38;
const AF_VSOCK: u64 = 40;

/// The architectures a filter covers on this build's architecture (native plus its compat ABIs).
fn arches() -> Vec<Arch> {
    if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchArm, Arch::ScmpArchAarch64]
    } else {
        Vec::new()
    }
}

/// Syscalls only some architectures have, allowed there.
fn arch_specific() -> &'static [&'static str] {
    if cfg!(target_arch = "x86_64") {
        &["arch_prctl", "modify_ldt"]
    } else if cfg!(target_arch = "aarch64") {
        &[
            "arm_fadvise64_64",
            "arm_sync_file_range",
            "sync_file_range2",
            "breakpoint",
            "cacheflush",
            "set_tls",
        ]
    } else {
        &[]
    }
}

/// Syscalls a capability in the bounding set unlocks.
fn for_capability(cap: Capability) -> &'static [&'static str] {
    match cap {
        Capability::DacReadSearch => &["open_by_handle_at"],
        Capability::SysAdmin => &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
        Capability::SysBoot => &["reboot"],
        Capability::SysChroot => &["chroot"],
        Capability::SysModule => &["delete_module", "init_module", "finit_module"],
        Capability::SysPacct => &["acct"],
        Capability::SysPtrace => &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
        Capability::SysRawio => &["iopl", "ioperm"],
        Capability::SysTime => &["settimeofday", "stime", "clock_settime", "clock_settime64"],
        Capability::SysTtyConfig => &["vhangup"],
        Capability::SysNice => &[
            "get_mempolicy",
            "mbind",
            "set_mempolicy",
            "set_mempolicy_home_node",
        ],
        Capability::Syslog => &["syslog"],
        Capability::Bpf => &["bpf"],
        Capability::Perfmon => &["perf_event_open"],
        _ => &[],
    }
}

fn rule(names: &[&str], action: LinuxSeccompAction, args: Vec<LinuxSeccompArg>) -> LinuxSyscall {
    let mut builder = LinuxSyscallBuilder::default()
        .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .action(action);
    if !args.is_empty() {
        builder = builder.args(args);
    }
    // every field is set or defaulted: building cannot fail
    builder.build().unwrap_or_default()
}

fn arg(
    index: usize,
    op: LinuxSeccompOperator,
    value: u64,
    value_two: Option<u64>,
) -> LinuxSeccompArg {
    let mut builder = LinuxSeccompArgBuilder::default()
        .index(index)
        .op(op)
        .value(value);
    if let Some(two) = value_two {
        builder = builder.value_two(two);
    }
    builder.build().unwrap_or_default()
}

/// The `RuntimeDefault` profile for a process whose bounding set is `bounding`.
///
/// Argument conditions use the OCI/runc convention: for `SCMP_CMP_MASKED_EQ`, `value` is the
/// mask and `valueTwo` the datum. See [`for_libcontainer`] for the runtime crius feeds.
pub fn default_profile(bounding: &Capabilities) -> LinuxSeccomp {
    let allow = LinuxSeccompAction::ScmpActAllow;
    let mut syscalls = vec![rule(ALLOWED, allow, Vec::new())];
    // Three single-condition rules, not one rule with two `!=`: several conditions on one
    // argument are split into separate rules (an OR) by runc and libcontainer.
    syscalls.push(rule(
        &["socket"],
        allow,
        vec![arg(0, LinuxSeccompOperator::ScmpCmpLt, AF_ALG, None)],
    ));
    syscalls.push(rule(
        &["socket"],
        allow,
        vec![arg(0, LinuxSeccompOperator::ScmpCmpEq, AF_ALG + 1, None)],
    ));
    syscalls.push(rule(
        &["socket"],
        allow,
        vec![arg(0, LinuxSeccompOperator::ScmpCmpGt, AF_VSOCK, None)],
    ));
    for value in PERSONALITIES {
        syscalls.push(rule(
            &["personality"],
            allow,
            vec![arg(0, LinuxSeccompOperator::ScmpCmpEq, value, None)],
        ));
    }
    let arch = arch_specific();
    if !arch.is_empty() {
        syscalls.push(rule(arch, allow, Vec::new()));
    }
    // a stable order, so the same request gives the same spec
    let mut caps: Vec<Capability> = bounding.iter().copied().collect();
    caps.sort_by_key(|c| c.to_string());
    for cap in caps {
        let names = for_capability(cap);
        if !names.is_empty() {
            syscalls.push(rule(names, allow, Vec::new()));
        }
    }
    if !bounding.contains(&Capability::SysAdmin) {
        syscalls.push(rule(
            &["clone"],
            allow,
            vec![arg(
                0,
                LinuxSeccompOperator::ScmpCmpMaskedEq,
                CLONE_NS_FLAGS,
                Some(0),
            )],
        ));
        // ENOSYS, not the default EPERM: libc then falls back to clone(2)
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone3".to_string()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(libc::ENOSYS as u32)
                .build()
                .unwrap_or_default(),
        );
    }
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(libc::EPERM as u32)
        .architectures(arches())
        .syscalls(syscalls)
        .build()
        .unwrap_or_default()
}

/// Rewrites masked-equality conditions for youki's libcontainer 0.7, which the shim uses.
///
/// runc and the OCI convention read `SCMP_CMP_MASKED_EQ` as `(arg & value) == valueTwo`;
/// libcontainer 0.7 (`seccomp::translate_op`) passes `valueTwo` as the mask and `value` as the
/// datum. Unswapped, the default profile's `clone` rule becomes `(arg & 0) == 0` after
/// libseccomp masks the datum: `clone` may then create namespaces without CAP_SYS_ADMIN.
/// Checked on this node by loading the default profile through
/// `libcontainer::seccomp::initialize_seccomp`: unswapped, `clone(CLONE_NEWUTS)` succeeded;
/// swapped, it failed with EPERM and a plain `fork()` still worked. Apply this to the spec
/// handed to libcontainer only; remove it when libcontainer follows runc.
pub fn for_libcontainer(seccomp: &mut LinuxSeccomp) {
    let Some(syscalls) = seccomp.syscalls().clone() else {
        return;
    };
    let fixed: Vec<LinuxSyscall> = syscalls
        .into_iter()
        .map(|mut call| {
            if let Some(args) = call.args().clone() {
                let args = args
                    .into_iter()
                    .map(|a| {
                        if a.op() == LinuxSeccompOperator::ScmpCmpMaskedEq {
                            arg(
                                a.index(),
                                a.op(),
                                a.value_two().unwrap_or(0),
                                Some(a.value()),
                            )
                        } else {
                            a
                        }
                    })
                    .collect::<Vec<_>>();
                call.set_args(Some(args));
            }
            call
        })
        .collect();
    seccomp.set_syscalls(Some(fixed));
}

/// What a security context asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice {
    Unconfined,
    RuntimeDefault,
    Localhost(String),
}

/// Reads the seccomp choice from the `seccomp` field, else the deprecated
/// `seccomp_profile_path` (`""`/`unconfined`, `runtime/default`, `docker/default`,
/// `localhost/<path>`). Neither set means unconfined: kubelet's default, which sends an
/// explicit `RuntimeDefault` when the pod (or `--seccomp-default`) asks for it.
pub(crate) fn choice(profile: Option<&SecurityProfile>, deprecated_path: &str) -> Result<Choice> {
    if let Some(p) = profile {
        return match ProfileType::try_from(p.profile_type) {
            Ok(ProfileType::RuntimeDefault) => Ok(Choice::RuntimeDefault),
            Ok(ProfileType::Unconfined) => Ok(Choice::Unconfined),
            Ok(ProfileType::Localhost) => Ok(Choice::Localhost(p.localhost_ref.clone())),
            Err(_) => Err(SpecError::invalid(format!(
                "seccomp profile_type {} is unknown",
                p.profile_type
            ))),
        };
    }
    match deprecated_path {
        "" | "unconfined" => Ok(Choice::Unconfined),
        "runtime/default" | "docker/default" => Ok(Choice::RuntimeDefault),
        other => match other.strip_prefix("localhost/") {
            Some(path) => Ok(Choice::Localhost(path.to_string())),
            None => Err(SpecError::invalid(format!(
                "seccomp_profile_path {other} is not unconfined, runtime/default or localhost/<path>"
            ))),
        },
    }
}

/// The filter for a choice; `None` runs unconfined.
pub(crate) fn profile_for(
    choice: &Choice,
    bounding: &Capabilities,
) -> Result<Option<LinuxSeccomp>> {
    match choice {
        Choice::Unconfined => Ok(None),
        Choice::RuntimeDefault => Ok(Some(default_profile(bounding))),
        Choice::Localhost(path) => load_profile(Path::new(path), bounding).map(Some),
    }
}

/// A seccomp profile file in the OCI (`LinuxSeccomp`) or Docker JSON format: `names` or `name`,
/// `includes`/`excludes` on capabilities and architectures, `archMap`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProfileFile {
    default_action: LinuxSeccompAction,
    #[serde(default)]
    default_errno_ret: Option<u32>,
    #[serde(default)]
    architectures: Option<Vec<Arch>>,
    #[serde(default)]
    arch_map: Option<Vec<ArchMap>>,
    #[serde(default)]
    flags: Option<Vec<LinuxSeccompFilterFlag>>,
    #[serde(default)]
    syscalls: Option<Vec<SyscallEntry>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArchMap {
    architecture: Arch,
    #[serde(default)]
    sub_architectures: Vec<Arch>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SyscallEntry {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    name: Option<String>,
    action: LinuxSeccompAction,
    #[serde(default)]
    errno_ret: Option<u32>,
    #[serde(default)]
    args: Option<Vec<ArgEntry>>,
    #[serde(default)]
    includes: Filter,
    #[serde(default)]
    excludes: Filter,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArgEntry {
    index: usize,
    value: u64,
    #[serde(default)]
    value_two: Option<u64>,
    op: LinuxSeccompOperator,
}

#[derive(Deserialize, Default)]
struct Filter {
    #[serde(default)]
    caps: Vec<String>,
    #[serde(default)]
    arches: Vec<String>,
}

/// Docker's short architecture names (`amd64`, `arm64`, ...) of this build.
fn native_arch_names() -> &'static [&'static str] {
    if cfg!(target_arch = "x86_64") {
        &["amd64", "x86_64", "x32", "386"]
    } else if cfg!(target_arch = "aarch64") {
        &["arm64", "aarch64", "arm"]
    } else {
        &[]
    }
}

impl Filter {
    fn matches(&self, bounding: &Capabilities) -> bool {
        let caps_ok = self.caps.iter().all(|c| {
            super::caps::parse_cap(c)
                .map(|cap| bounding.contains(&cap))
                .unwrap_or(false)
        });
        let arches_ok = self.arches.is_empty()
            || self
                .arches
                .iter()
                .any(|a| native_arch_names().contains(&a.as_str()));
        caps_ok && arches_ok
    }

    fn excludes(&self, bounding: &Capabilities) -> bool {
        let by_cap = self.caps.iter().any(|c| {
            super::caps::parse_cap(c)
                .map(|cap| bounding.contains(&cap))
                .unwrap_or(false)
        });
        let by_arch = self
            .arches
            .iter()
            .any(|a| native_arch_names().contains(&a.as_str()));
        by_cap || by_arch
    }
}

/// Largest `Localhost` profile read (Docker's default profile is about 25 KiB).
const MAX_PROFILE: u64 = 4 << 20;

/// Reads a `Localhost` profile. A missing, unreadable or invalid file is an error naming it.
pub(crate) fn load_profile(path: &Path, bounding: &Capabilities) -> Result<LinuxSeccomp> {
    let bad = |reason: String| SpecError::SeccompProfile {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_absolute() {
        return Err(bad("the path is not absolute".into()));
    }
    let bytes = crate::util::read_regular(path, MAX_PROFILE)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    let file: ProfileFile =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a seccomp profile: {e}")))?;

    let mut architectures = file.architectures.unwrap_or_default();
    for map in file.arch_map.unwrap_or_default() {
        architectures.push(map.architecture);
        architectures.extend(map.sub_architectures);
    }
    let mut syscalls = Vec::new();
    for entry in file.syscalls.unwrap_or_default() {
        if !entry.includes.matches(bounding) || entry.excludes.excludes(bounding) {
            continue;
        }
        let mut names = entry.names;
        names.extend(entry.name);
        if names.is_empty() {
            return Err(bad("a syscalls entry names no syscall".into()));
        }
        let mut builder = LinuxSyscallBuilder::default()
            .names(names)
            .action(entry.action);
        if let Some(errno) = entry.errno_ret {
            builder = builder.errno_ret(errno);
        }
        if let Some(args) = entry.args {
            builder = builder.args(
                args.into_iter()
                    .map(|a| arg(a.index, a.op, a.value, a.value_two))
                    .collect::<Vec<_>>(),
            );
        }
        syscalls.push(builder.build()?);
    }
    let mut builder = LinuxSeccompBuilder::default()
        .default_action(file.default_action)
        .syscalls(syscalls);
    if !architectures.is_empty() {
        builder = builder.architectures(architectures);
    }
    if let Some(errno) = file.default_errno_ret {
        builder = builder.default_errno_ret(errno);
    }
    if let Some(flags) = file.flags {
        builder = builder.flags(flags);
    }
    Ok(builder.build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(list: &[Capability]) -> Capabilities {
        list.iter().copied().collect()
    }

    fn rules_for<'a>(profile: &'a LinuxSeccomp, name: &str) -> Vec<&'a LinuxSyscall> {
        profile
            .syscalls()
            .as_ref()
            .unwrap()
            .iter()
            .filter(|s| s.names().iter().any(|n| n == name))
            .collect()
    }

    #[test]
    fn default_profile_allows_common_calls_and_denies_the_rest() {
        let p = default_profile(&caps(&super::super::caps::DEFAULT_CAPS));
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(libc::EPERM as u32));
        for name in [
            "read",
            "write",
            "execve",
            "openat",
            "futex",
            "exit_group",
            "chroot",
        ] {
            let rules = rules_for(&p, name);
            assert_eq!(rules.len(), 1, "{name}");
            assert_eq!(rules[0].action(), LinuxSeccompAction::ScmpActAllow);
            assert!(rules[0].args().is_none());
        }
        for name in [
            "mount",
            "unshare",
            "setns",
            "reboot",
            "kexec_load",
            "bpf",
            "init_module",
        ] {
            assert!(rules_for(&p, name).is_empty(), "{name} must not be allowed");
        }
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                p.architectures().clone().unwrap(),
                vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
            );
            assert_eq!(rules_for(&p, "arch_prctl").len(), 1);
        }
    }

    #[test]
    fn clone_is_restricted_without_sys_admin() {
        let p = default_profile(&caps(&super::super::caps::DEFAULT_CAPS));
        let clone = rules_for(&p, "clone");
        assert_eq!(clone.len(), 1);
        let args = clone[0].args().clone().unwrap();
        assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        assert_eq!(args[0].value(), 0x7e02_0000);
        assert_eq!(args[0].value_two(), Some(0));
        let clone3 = rules_for(&p, "clone3");
        assert_eq!(clone3[0].action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(clone3[0].errno_ret(), Some(libc::ENOSYS as u32));

        let admin = default_profile(&caps(&[Capability::SysAdmin, Capability::SysPtrace]));
        let clone = rules_for(&admin, "clone");
        assert_eq!(clone.len(), 1);
        assert!(clone[0].args().is_none());
        assert_eq!(rules_for(&admin, "mount").len(), 1);
        assert_eq!(rules_for(&admin, "kcmp").len(), 1);
        assert_eq!(
            rules_for(&admin, "clone3")[0].action(),
            LinuxSeccompAction::ScmpActAllow
        );
    }

    #[test]
    fn socket_excludes_alg_and_vsock() {
        let p = default_profile(&Capabilities::new());
        let socket = rules_for(&p, "socket");
        assert_eq!(socket.len(), 3);
        let allows = |family: u64| {
            socket.iter().any(|r| {
                let a = r.args().clone().unwrap()[0];
                match a.op() {
                    LinuxSeccompOperator::ScmpCmpLt => family < a.value(),
                    LinuxSeccompOperator::ScmpCmpEq => family == a.value(),
                    LinuxSeccompOperator::ScmpCmpGt => family > a.value(),
                    _ => false,
                }
            })
        };
        assert!(allows(libc::AF_INET as u64));
        assert!(allows(libc::AF_UNIX as u64));
        assert!(allows(libc::AF_NETLINK as u64));
        assert!(allows(39));
        assert!(!allows(libc::AF_ALG as u64));
        assert!(!allows(libc::AF_VSOCK as u64));
    }

    #[test]
    fn libcontainer_gets_mask_and_datum_swapped() {
        let mut p = default_profile(&Capabilities::new());
        for_libcontainer(&mut p);
        let clone = rules_for(&p, "clone");
        let a = clone[0].args().clone().unwrap()[0];
        assert_eq!(a.value(), 0);
        assert_eq!(a.value_two(), Some(CLONE_NS_FLAGS));
        // other operators are untouched
        let socket = rules_for(&p, "socket");
        assert_eq!(socket[0].args().clone().unwrap()[0].value(), AF_ALG);
    }

    #[test]
    fn choice_from_new_and_deprecated_fields() {
        let lh = SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "/p.json".into(),
        };
        assert_eq!(
            choice(Some(&lh), "").unwrap(),
            Choice::Localhost("/p.json".into())
        );
        assert_eq!(choice(None, "").unwrap(), Choice::Unconfined);
        assert_eq!(
            choice(None, "runtime/default").unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(None, "docker/default").unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(None, "localhost//x/y.json").unwrap(),
            Choice::Localhost("/x/y.json".into())
        );
        assert!(choice(None, "bogus").unwrap_err().is_invalid_argument());
        let rd = SecurityProfile::default();
        assert_eq!(
            choice(Some(&rd), "unconfined").unwrap(),
            Choice::RuntimeDefault
        );
    }

    #[test]
    fn localhost_profile_in_docker_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        std::fs::write(
            &path,
            r#"{
              "defaultAction": "SCMP_ACT_ERRNO",
              "defaultErrnoRet": 38,
              "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
              "syscalls": [
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                {"name": "mkdir", "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
                {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]}
              ]
            }"#,
        )
        .unwrap();
        let p = load_profile(&path, &Capabilities::new()).unwrap();
        assert_eq!(p.default_errno_ret(), Some(38));
        assert_eq!(
            p.architectures().clone().unwrap(),
            vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86]
        );
        assert_eq!(
            rules_for(&p, "write")[0].action(),
            LinuxSeccompAction::ScmpActAllow
        );
        assert_eq!(rules_for(&p, "mkdir")[0].errno_ret(), Some(1));
        assert!(rules_for(&p, "mount").is_empty());
        assert_eq!(
            rules_for(&p, "personality")[0].args().clone().unwrap()[0].value(),
            8
        );

        let with_admin = load_profile(&path, &caps(&[Capability::SysAdmin])).unwrap();
        assert_eq!(rules_for(&with_admin, "mount").len(), 1);
    }

    #[test]
    fn bad_localhost_profiles_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let err = load_profile(&missing, &Capabilities::new()).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("missing.json"), "{err}");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"defaultAction": "SCMP_ACT_NOPE"}"#).unwrap();
        let err = load_profile(&bad, &Capabilities::new()).unwrap_err();
        assert!(err.to_string().contains("bad.json"), "{err}");
        assert!(err.to_string().contains("not a seccomp profile"), "{err}");

        let err = load_profile(Path::new("relative.json"), &Capabilities::new()).unwrap_err();
        assert!(err.to_string().contains("not absolute"));
    }
}
