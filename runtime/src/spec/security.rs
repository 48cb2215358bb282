//! Sysctls, masked and read-only paths, AppArmor and SELinux.

use std::collections::HashMap;
use std::path::Path;

use crius_api::v1::{security_profile::ProfileType, SeLinuxOption, SecurityProfile};

use super::error::{Result, SpecError};

/// Paths masked by default (containerd's and kubelet's list).
pub const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/scsi",
];

/// Paths made read-only by default.
pub const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Each of a request's masked or read-only paths (`field` names the list) is an absolute,
/// clean path below `/`: the runtime mounts over it in the container, and a relative or `..`
/// path, a NUL, or the root itself failed deep inside it or left a container nothing could
/// run in.
pub(crate) fn check_paths(field: &str, paths: &[String]) -> Result<()> {
    for (i, p) in paths.iter().enumerate() {
        let path = Path::new(p);
        let clean = path.is_absolute()
            && !p.contains('\0')
            && path
                .components()
                .skip(1)
                .all(|c| matches!(c, std::path::Component::Normal(_)))
            && path.components().count() > 1;
        if !clean {
            return Err(SpecError::invalid(format!(
                "security_context.{field}[{i}] {:?} is not an absolute path below / without \
                 `.` or `..`",
                crate::util::excerpt(p)
            )));
        }
        // The runtime's own start in the container reads /proc.
        if field == "masked_paths" && path == Path::new("/proc") {
            return Err(SpecError::invalid(format!(
                "security_context.{field}[{i}] /proc: the container cannot start without it"
            )));
        }
    }
    Ok(())
}

/// Masked and read-only paths of a container.
///
/// Explicit CRI lists are used as given. proto3 cannot tell an unset list from an empty one, so
/// an empty list means the defaults, except in a container with its own user namespace: kubelet
/// sends empty lists only for `procMount: Unmasked`, which Kubernetes allows only with
/// `hostUsers: false`. Privileged containers get none.
pub(crate) fn masked_and_readonly(
    masked: &[String],
    readonly: &[String],
    privileged: bool,
    user_namespace: bool,
) -> (Vec<String>, Vec<String>) {
    if privileged {
        return (Vec::new(), Vec::new());
    }
    let pick = |given: &[String], defaults: &[&str]| {
        if !given.is_empty() {
            given.to_vec()
        } else if user_namespace {
            Vec::new()
        } else {
            defaults.iter().map(|s| s.to_string()).collect()
        }
    };
    (
        pick(masked, &DEFAULT_MASKED_PATHS),
        pick(readonly, &DEFAULT_READONLY_PATHS),
    )
}

/// The cgroup v1 hierarchies libcontainer may bind under `/sys/fs/cgroup`.
const CGROUP_V1_HIERARCHIES: [&str; 16] = [
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
    "systemd",
    "unified",
];

/// Extra read-only paths that keep a container from writing its own cgroup v1 limits.
///
/// libcontainer 0.7 builds `/sys/fs/cgroup` on cgroup v1 as a tmpfs with each hierarchy
/// bind-mounted read-write, whatever the mount's options say: checked on this node, a root
/// container without CAP_SYS_ADMIN raised its own `memory.limit_in_bytes`. Listing every
/// hierarchy as a read-only path remounts each bind read-only; libcontainer skips paths that do
/// not exist. Added for every unprivileged container, on top of the CRI lists.
pub fn cgroup_readonly_paths() -> impl Iterator<Item = String> {
    CGROUP_V1_HIERARCHIES
        .iter()
        .map(|h| format!("/sys/fs/cgroup/{h}"))
}

/// What namespaces a pod owns, for the sysctl check.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SysctlScope {
    /// The pod has its own network namespace (not host network).
    pub own_network: bool,
    /// The pod has its own IPC namespace (not host IPC).
    pub own_ipc: bool,
    /// The pod has its own UTS namespace (not host network).
    pub own_uts: bool,
}

/// Checks that every sysctl is namespaced and that the pod owns its namespace:
/// `kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*` (IPC), `net.*` (network),
/// `kernel.hostname`/`kernel.domainname` (UTS). Keys may use `/` for `.`, as kubelet allows.
pub(crate) fn check_sysctls(
    sysctls: &HashMap<String, String>,
    scope: SysctlScope,
) -> Result<HashMap<String, String>> {
    let mut out = HashMap::with_capacity(sysctls.len());
    for (key, value) in sysctls {
        let name = key.replace('/', ".");
        // A sysctl name becomes a path under /proc/sys: plain components only, so `..`, NUL or
        // a stray separator never reach a path, and the value is one line.
        let plain = |c: &str| {
            !c.is_empty()
                && c.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'@' | b':' | b'+')
                })
        };
        if name.len() > 256 || !name.split('.').all(plain) {
            return Err(SpecError::invalid(format!(
                "sysctl {:?} is not a sysctl name",
                crate::util::excerpt(key)
            )));
        }
        if value.len() > 4096 || value.contains(['\0', '\n']) {
            return Err(SpecError::invalid(format!(
                "sysctl {key} value {:?} is not one line of at most 4096 bytes",
                crate::util::excerpt(value)
            )));
        }
        let ipc = name.starts_with("kernel.shm")
            || name.starts_with("kernel.msg")
            || name == "kernel.sem"
            || name.starts_with("fs.mqueue.");
        if ipc {
            if !scope.own_ipc {
                return Err(SpecError::invalid(format!(
                    "sysctl {key} needs the pod's own IPC namespace, but the pod uses the host's"
                )));
            }
        } else if name.starts_with("net.") {
            if !scope.own_network {
                return Err(SpecError::invalid(format!(
                    "sysctl {key} needs the pod's own network namespace, but the pod uses the host network"
                )));
            }
        } else if name == "kernel.hostname" || name == "kernel.domainname" {
            if !scope.own_uts {
                return Err(SpecError::invalid(format!(
                    "sysctl {key} needs the pod's own UTS namespace, but the pod uses the host's"
                )));
            }
        } else {
            return Err(SpecError::invalid(format!(
                "sysctl {key} is not namespaced"
            )));
        }
        check_known(Path::new(PROC_SYS), key, &name, value)?;
        out.insert(name, value.clone());
    }
    Ok(out)
}

/// The node's sysctls: the namespaced ones have the same names and kinds of value in every
/// namespace.
const PROC_SYS: &str = "/proc/sys";

/// Refuses a sysctl this kernel does not have, and a value that is not numbers where the node's
/// own value is: the kernel would refuse both when the container starts, with an error that
/// names neither. Per-device network sysctls (`net.ipv4.conf.eth0.*`) name the pod's devices,
/// not the node's, and are left to the kernel.
fn check_known(proc_sys: &Path, key: &str, name: &str, value: &str) -> Result<()> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 3
        && parts[0] == "net"
        && matches!(parts[1], "ipv4" | "ipv6")
        && matches!(parts[2], "conf" | "neigh")
    {
        return Ok(());
    }
    let path = parts.iter().fold(proc_sys.to_path_buf(), |p, c| p.join(c));
    let current = match std::fs::read_to_string(&path) {
        Ok(current) => current,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || path.is_dir() => {
            return Err(SpecError::invalid(format!(
                "sysctl {key} is not a sysctl of this node's kernel"
            )))
        }
        // Write-only or unreadable here: the kernel judges the value.
        Err(_) => return Ok(()),
    };
    let numbers = |s: &str| {
        let mut words = s.split_whitespace().peekable();
        let number = |w: &str| {
            let digits = w.strip_prefix('-').unwrap_or(w);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        };
        words.peek().is_some() && words.all(number)
    };
    if numbers(&current) && !numbers(value) {
        return Err(SpecError::invalid(format!(
            "sysctl {key} takes numbers (this node has {:?}), not {:?}",
            crate::util::excerpt(current.trim()),
            crate::util::excerpt(value)
        )));
    }
    Ok(())
}

/// Whether the kernel has AppArmor / SELinux enabled, and what became of crius's default
/// AppArmor profile.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lsm {
    pub apparmor: bool,
    pub apparmor_default: AppArmorDefault,
    pub selinux: bool,
}

/// What a container that asks for RuntimeDefault gets on an AppArmor node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AppArmorDefault {
    /// `crius-default`, loaded at start.
    Loaded,
    /// No profile: the node has no `apparmor_parser` to load it (containerd's rule).
    Unconfined,
    /// Refused, for this reason: loading it failed (or crius has not loaded it).
    Refused(String),
}

impl Default for AppArmorDefault {
    fn default() -> AppArmorDefault {
        AppArmorDefault::Refused("crius has not loaded it".to_string())
    }
}

impl Lsm {
    /// Detects AppArmor (enabled and its securityfs present) and SELinux (`/sys/fs/selinux`),
    /// and what `apparmor::load_default` made of the default profile.
    pub(crate) fn detect() -> Lsm {
        use crate::apparmor::DefaultProfile;
        Lsm {
            apparmor: crate::apparmor::enabled(),
            apparmor_default: match crate::apparmor::default_profile() {
                Some(DefaultProfile::Loaded) => AppArmorDefault::Loaded,
                Some(DefaultProfile::NoParser) => AppArmorDefault::Unconfined,
                Some(DefaultProfile::Failed(why)) => AppArmorDefault::Refused(why.clone()),
                None => AppArmorDefault::default(),
            },
            selinux: Path::new("/sys/fs/selinux/enforce").exists(),
        }
    }
}

/// What a request asks of AppArmor, from the `apparmor` field or else the deprecated
/// `apparmor_profile` string (`runtime/default`, `unconfined`, `localhost/<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum AppArmorChoice<'a> {
    Unset,
    RuntimeDefault,
    Unconfined,
    Localhost(&'a str),
}

fn apparmor_choice<'a>(
    profile: Option<&'a SecurityProfile>,
    deprecated: &'a str,
) -> Result<AppArmorChoice<'a>> {
    let localhost = |name: &'a str, field: &str| {
        if name.is_empty() {
            return Err(SpecError::invalid(format!(
                "{field}: a Localhost AppArmor profile needs a name"
            )));
        }
        Ok(AppArmorChoice::Localhost(name))
    };
    let Some(p) = profile else {
        return match deprecated {
            "" => Ok(AppArmorChoice::Unset),
            "runtime/default" => Ok(AppArmorChoice::RuntimeDefault),
            "unconfined" => Ok(AppArmorChoice::Unconfined),
            other => match other.strip_prefix("localhost/") {
                Some(name) => localhost(name, "apparmor_profile"),
                None => Err(SpecError::invalid(format!(
                    "apparmor_profile {:?} is not runtime/default, unconfined or localhost/<name>",
                    crate::util::excerpt(other)
                ))),
            },
        };
    };
    let kind = ProfileType::try_from(p.profile_type).map_err(|_| {
        SpecError::invalid(format!(
            "apparmor profile_type {} is unknown",
            p.profile_type
        ))
    })?;
    if kind != ProfileType::Localhost && !p.localhost_ref.is_empty() {
        return Err(SpecError::invalid(format!(
            "apparmor localhost_ref {:?} is set, but profile_type is {}, not Localhost",
            crate::util::excerpt(&p.localhost_ref),
            kind.as_str_name()
        )));
    }
    match kind {
        ProfileType::RuntimeDefault => Ok(AppArmorChoice::RuntimeDefault),
        ProfileType::Unconfined => Ok(AppArmorChoice::Unconfined),
        // Kubernetes sends the bare name; the prefix is taken off as containerd does.
        ProfileType::Localhost => localhost(
            p.localhost_ref
                .strip_prefix("localhost/")
                .unwrap_or(&p.localhost_ref),
            "apparmor localhost_ref",
        ),
    }
}

/// The AppArmor profile a process runs under, by containerd's rules: unset means RuntimeDefault
/// for a container (`unset_is_default`; a pod's pause runs unconfined unless the pod names a
/// profile), RuntimeDefault is crius's default profile except for privileged containers,
/// Unconfined none, Localhost the named profile, which the kernel must hold. Without AppArmor
/// on the node only a named profile is refused; the rest run without one, as before.
pub(crate) fn apparmor_profile(
    profile: Option<&SecurityProfile>,
    deprecated: &str,
    privileged: bool,
    unset_is_default: bool,
    lsm: &Lsm,
) -> Result<Option<String>> {
    let choice = apparmor_choice(profile, deprecated)?;
    if !lsm.apparmor {
        return match choice {
            AppArmorChoice::Localhost(name) => Err(SpecError::invalid(format!(
                "apparmor profile {:?} requested, but AppArmor is not enabled on this node",
                crate::util::excerpt(name)
            ))),
            _ => Ok(None),
        };
    }
    match choice {
        AppArmorChoice::Unconfined => Ok(None),
        AppArmorChoice::Unset if !unset_is_default => Ok(None),
        AppArmorChoice::Unset | AppArmorChoice::RuntimeDefault if privileged => Ok(None),
        AppArmorChoice::Unset | AppArmorChoice::RuntimeDefault => match &lsm.apparmor_default {
            AppArmorDefault::Loaded => Ok(Some(crate::apparmor::DEFAULT_PROFILE.to_string())),
            AppArmorDefault::Unconfined => Ok(None),
            AppArmorDefault::Refused(why) => Err(SpecError::Node(format!(
                "the RuntimeDefault AppArmor profile {} is not loaded: {why}",
                crate::apparmor::DEFAULT_PROFILE,
            ))),
        },
        AppArmorChoice::Localhost(name) => {
            let loaded = crate::apparmor::is_loaded(name).map_err(|e| {
                SpecError::io(
                    "read the AppArmor profiles",
                    "/sys/kernel/security/apparmor/profiles",
                    e,
                )
            })?;
            if !loaded {
                return Err(SpecError::invalid(format!(
                    "apparmor profile {:?} is not loaded on this node (load it with \
                     apparmor_parser first)",
                    crate::util::excerpt(name)
                )));
            }
            Ok(Some(name.to_string()))
        }
    }
}

/// Checks the SELinux request. On a node without SELinux a label is ignored, as containerd and
/// CRI-O do, so that ordinary manifests carrying `seLinuxOptions` run; with SELinux enabled a
/// label is refused, because crius does not apply SELinux labels yet.
pub(crate) fn check_selinux(options: Option<&SeLinuxOption>, lsm: &Lsm) -> Result<()> {
    let Some(o) = options else { return Ok(()) };
    if o.user.is_empty() && o.role.is_empty() && o.r#type.is_empty() && o.level.is_empty() {
        return Ok(());
    }
    let label = format!("{}:{}:{}:{}", o.user, o.role, o.r#type, o.level);
    if lsm.selinux {
        return Err(SpecError::invalid(format!(
            "selinux label {label} requested, but crius does not apply SELinux labels"
        )));
    }
    tracing::debug!(%label, "SELinux is not enabled on this node: label ignored");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: SysctlScope = SysctlScope {
        own_network: true,
        own_ipc: true,
        own_uts: true,
    };

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn namespaced_sysctls_pass() {
        let ok = check_sysctls(
            &map(&[
                ("kernel.shmmax", "1"),
                ("kernel.msgmax", "1"),
                ("kernel.sem", "1 2 3 4"),
                ("fs.mqueue.msg_max", "10"),
                ("net.ipv4.ip_forward", "1"),
                ("net/ipv4/conf/all/rp_filter", "0"),
            ]),
            POD,
        )
        .unwrap();
        assert_eq!(ok["net.ipv4.conf.all.rp_filter"], "0");
    }

    #[test]
    fn other_sysctls_are_refused_by_name() {
        let err = check_sysctls(&map(&[("kernel.foo", "1")]), POD).unwrap_err();
        assert!(err.is_invalid_argument());
        assert_eq!(err.to_string(), "sysctl kernel.foo is not namespaced");
        let err = check_sysctls(&map(&[("vm.swappiness", "1")]), POD).unwrap_err();
        assert_eq!(err.to_string(), "sysctl vm.swappiness is not namespaced");
    }

    #[test]
    fn net_sysctls_need_a_pod_network() {
        let host = SysctlScope {
            own_network: false,
            own_ipc: true,
            own_uts: false,
        };
        let err = check_sysctls(&map(&[("net.core.somaxconn", "1024")]), host).unwrap_err();
        assert!(err.to_string().contains("net.core.somaxconn"));
        assert!(err.to_string().contains("host network"));
        let host_ipc = SysctlScope {
            own_ipc: false,
            ..POD
        };
        assert!(check_sysctls(&map(&[("kernel.shmall", "1")]), host_ipc).is_err());
    }

    #[test]
    fn masked_paths_defaults_overrides_and_unmasked() {
        let (m, r) = masked_and_readonly(&[], &[], false, false);
        assert_eq!(m.len(), DEFAULT_MASKED_PATHS.len());
        assert_eq!(r.len(), DEFAULT_READONLY_PATHS.len());
        let (m, r) =
            masked_and_readonly(&["/proc/foo".into()], &["/proc/bar".into()], false, false);
        assert_eq!(m, ["/proc/foo"]);
        assert_eq!(r, ["/proc/bar"]);
        let (m, r) = masked_and_readonly(&[], &[], false, true);
        assert!(m.is_empty() && r.is_empty());
        let (m, r) = masked_and_readonly(&["/proc/foo".into()], &[], true, false);
        assert!(m.is_empty() && r.is_empty());
    }

    #[test]
    fn sysctl_names_and_values_that_cannot_be_paths_are_refused() {
        let scope = SysctlScope {
            own_network: true,
            own_ipc: true,
            own_uts: true,
        };
        let one = |k: &str, v: &str| check_sysctls(&[(k.to_string(), v.to_string())].into(), scope);
        assert!(one("net.ipv4.ip_forward", "1").is_ok());
        assert!(one("net/ipv4/conf/eth0/forwarding", "1").is_ok());
        for key in [
            "net..ipv4",
            "net.ipv4.ip_forward\0",
            "net.ipv4.",
            "net.a b",
            &"net.x".repeat(100),
        ] {
            let err = one(key, "1").unwrap_err();
            assert!(err.is_invalid_argument(), "{key:?}");
            assert!(err.to_string().len() < 200, "{err}");
        }
        assert!(one("net.ipv4.ip_forward", "1\n2").is_err());
        assert!(one("net.ipv4.ip_forward", "1\0").is_err());
    }

    #[test]
    fn unknown_sysctls_and_words_for_numbers_are_refused() {
        let sys = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(sys.path().join("kernel")).unwrap();
        std::fs::write(sys.path().join("kernel/shmmax"), "18446744073692774399\n").unwrap();
        std::fs::write(
            sys.path().join("kernel/sem"),
            "32000\t1024000000\t500\t32000\n",
        )
        .unwrap();
        std::fs::write(sys.path().join("kernel/hostname"), "node-1\n").unwrap();
        let check = |name: &str, value: &str| check_known(sys.path(), name, name, value);
        assert!(check("kernel.sem", "1 2 3 4").is_ok());
        assert!(check("kernel.hostname", "pod").is_ok());
        // u64 values beyond i64 are numbers too: only words are refused here
        assert!(check("kernel.shmmax", "-5").is_ok());
        let err = check("kernel.shmmax", "banana").unwrap_err();
        assert_eq!(
            err.to_string(),
            "sysctl kernel.shmmax takes numbers (this node has \"18446744073692774399\"), not \"banana\""
        );
        let err = check("kernel.shm_nosuch", "1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "sysctl kernel.shm_nosuch is not a sysctl of this node's kernel"
        );
        assert!(check("kernel", "1").is_err(), "a directory is no sysctl");
        // the pod's devices are not the node's
        assert!(check("net.ipv4.conf.eth0.forwarding", "1").is_ok());
    }

    #[test]
    fn apparmor_and_selinux_without_the_lsm() {
        let none = Lsm::default();
        let pick = |p: Option<&SecurityProfile>, d: &str, privileged: bool, lsm: &Lsm| {
            apparmor_profile(p, d, privileged, true, lsm)
        };
        assert_eq!(pick(None, "", false, &none).unwrap(), None);
        assert_eq!(pick(None, "runtime/default", false, &none).unwrap(), None);
        let rd = SecurityProfile::default();
        assert_eq!(pick(Some(&rd), "", false, &none).unwrap(), None);
        let lh = SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "my-profile".into(),
        };
        let err = pick(Some(&lh), "", false, &none).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("my-profile"));
        assert!(pick(None, "localhost/other", false, &none).is_err());
        let err = pick(None, "other", false, &none).unwrap_err().to_string();
        assert!(err.contains("apparmor_profile \"other\""), "{err}");
        let stray = SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: "x".into(),
        };
        assert!(pick(Some(&stray), "", false, &none)
            .unwrap_err()
            .is_invalid_argument());
        let nameless = SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: String::new(),
        };
        assert!(pick(Some(&nameless), "", false, &none).is_err());

        assert!(check_selinux(None, &none).is_ok());
        assert!(check_selinux(Some(&SeLinuxOption::default()), &none).is_ok());
        let label = SeLinuxOption {
            level: "s0:c1,c2".into(),
            ..Default::default()
        };
        // Ignored where SELinux is off (containerd and CRI-O do the same); refused where it is
        // on, since crius applies no labels.
        assert!(check_selinux(Some(&label), &none).is_ok());
        let on = Lsm {
            selinux: true,
            ..Lsm::default()
        };
        let err = check_selinux(Some(&label), &on).unwrap_err();
        assert!(err.to_string().contains("s0:c1,c2"));
    }

    #[test]
    fn apparmor_default_by_containerds_rules() {
        let with = |apparmor_default| Lsm {
            apparmor: true,
            apparmor_default,
            selinux: false,
        };
        let loaded = with(AppArmorDefault::Loaded);
        let default = Some(crate::apparmor::DEFAULT_PROFILE.to_string());
        let rd = SecurityProfile::default();
        let unconfined = SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        };
        // a container: unset and RuntimeDefault get the default, unless privileged
        assert_eq!(
            apparmor_profile(None, "", false, true, &loaded).unwrap(),
            default
        );
        assert_eq!(
            apparmor_profile(Some(&rd), "", false, true, &loaded).unwrap(),
            default
        );
        assert_eq!(
            apparmor_profile(None, "runtime/default", false, true, &loaded).unwrap(),
            default
        );
        assert_eq!(
            apparmor_profile(Some(&rd), "", true, true, &loaded).unwrap(),
            None
        );
        assert_eq!(
            apparmor_profile(Some(&unconfined), "", false, true, &loaded).unwrap(),
            None
        );
        assert_eq!(
            apparmor_profile(None, "unconfined", false, true, &loaded).unwrap(),
            None
        );
        // the field wins over the deprecated string
        assert_eq!(
            apparmor_profile(Some(&unconfined), "runtime/default", false, true, &loaded).unwrap(),
            None
        );
        // a pod's pause: unset stays unconfined
        assert_eq!(
            apparmor_profile(None, "", false, false, &loaded).unwrap(),
            None
        );
        assert_eq!(
            apparmor_profile(Some(&rd), "", false, false, &loaded).unwrap(),
            default
        );
        // no parser on the node: unconfined; a failed load: refused, not run unconfined
        let no_parser = with(AppArmorDefault::Unconfined);
        assert_eq!(
            apparmor_profile(Some(&rd), "", false, true, &no_parser).unwrap(),
            None
        );
        let failed = with(AppArmorDefault::Refused(
            "apparmor_parser exit status 1".into(),
        ));
        let err = apparmor_profile(Some(&rd), "", false, true, &failed).unwrap_err();
        assert!(matches!(err, SpecError::Node(_)), "{err}");
        assert!(err.to_string().contains("crius-default"), "{err}");
        assert!(err.to_string().contains("exit status 1"), "{err}");
    }
}
