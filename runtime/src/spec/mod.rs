//! OCI runtime spec generation: CRI config + image config + defaults → `config.json`.
//!
//! Pure apart from reading files a request names: inside an image rootfs (`/etc/passwd`,
//! `/etc/group`), `Localhost` seccomp profiles, CDI spec files (`/etc/cdi`, `/var/run/cdi`),
//! device nodes (`stat`, and the `/dev` scan for privileged containers), a `Localhost`
//! AppArmor profile in the kernel's list and a sysctl's `/proc/sys` file. What the node is
//! (LSMs, capabilities, hostname, cgroup version, `oom_score_adj` floor, hugetlb) comes in a
//! [`HostFacts`], probed once at start. Nothing is created or mounted.
//!
//! # API
//! - [`sandbox_spec`]`(&`[`SandboxSpecInput`]`) -> Result<Spec>`: the pause container.
//! - [`container_spec`]`(&`[`ContainerSpecInput`]`) -> Result<Spec>`: a container of a pod.
//! - [`exec_process`]`(Option<Process>, cmd, tty) -> Result<Process>`: an ExecSync/Exec
//!   process from the container's.
//! - [`process_user`]`(&Process) -> ContainerUser`: uid, gid and groups for
//!   `ContainerStatus.user`.
//! - [`stop_signal`]`(&ContainerConfig, &image_config) -> Result<i32>`.
//! - [`resources_to_oci`]`(&LinuxContainerResources) -> Result<LinuxResources>`, also for
//!   UpdateContainerResources.
//! - [`seccomp::default_profile`] and [`seccomp::for_libcontainer`].
//! - [`SpecError`] with [`SpecError::is_invalid_argument`] (else `Internal`).
//!
//! # What the caller does around it
//! - Creates missing CRI mount host paths as directories (0755) before the container is
//!   created, as containerd does: the spec only names them.
//! - Computes `cgroups_path` (absolute) and passes the pod's shared files; `shm_dir` is the pod's
//!   size-limited tmpfs, or the host's `/dev/shm` for a host-IPC pod.
//! - The seccomp filter in a returned spec is already rewritten for libcontainer 0.7 (see
//!   [`seccomp::for_libcontainer`]: it reads masked-equality arguments the other way round
//!   from runc); hand the spec to libcontainer, not to runc.
//! - `oom_score_adj` is written as requested (the pause gets -998); `layout::write_spec`
//!   clamps it to what crius may set ([`HostFacts::min_oom_score_adj`]): on a node where
//!   crius lacks CAP_SYS_RESOURCE, nothing below crius's own value, so a container asking for
//!   -500 runs with crius's score (usually 0). It also drops hugepage limits on a node without
//!   a hugetlb controller.
//!
//! # Defaults worth knowing
//! - Seccomp unset in both the `seccomp` and the deprecated `seccomp_profile_path` fields means
//!   unconfined: kubelet's default (it sends `RuntimeDefault` explicitly when asked to).
//! - Masked/read-only paths: see `security::masked_and_readonly` for how an empty list is read.
//! - On a cgroup v2 (unified) node every non-privileged container gets a private cgroup
//!   namespace (`wants_cgroup_namespace`), and libcontainer's cgroup2 mount shows its own
//!   cgroup, read-only. Pods' pauses and privileged containers keep the node's, as do
//!   containers on cgroup v1 nodes. On a cgroup v1 host a container joining an existing PID
//!   namespace gets the host's cgroup v1 tree bound read-only instead of libcontainer's cgroup
//!   mount (see `mounts::host_cgroup_bind` for the libcontainer bug).
//! - `ALL` capabilities and privileged containers get the capabilities crius holds, not every
//!   one the kernel knows; naming one crius lacks is an `InvalidArgument`.
//! - libcontainer 0.7 ignores per-mount propagation options on binds; each bind gets the
//!   root's propagation, which is chosen from the CRI mounts: all PRIVATE → `private`, any
//!   HOST_TO_CONTAINER → `slave`, any BIDIRECTIONAL → `shared`. A PRIVATE bind next to a
//!   propagating one would propagate too, so the caller binds it from a private copy (see
//!   `container::volumes`).
//!
//! # User namespaces
//! A pod with `userns_options` mode POD joins a user namespace the caller made and pinned
//! (`SandboxSpecInput::userns_path`, see `crate::userns`), and its containers the pause's; the
//! specs carry no id mappings (the namespace has them). With the node's network, PID or IPC
//! namespace the pod is refused, as Kubernetes refuses `hostUsers: false` with them. Mounts
//! with id mappings are expected already idmapped by the caller (the spec passes their
//! mappings on, which libcontainer 0.7 ignores).
//!
//! # Refused with `InvalidArgument`
//! - Image volumes (`Mount.image`) not resolved by the caller to a host path.
//! - A Localhost AppArmor profile the kernel does not hold, or any named profile on a node
//!   without AppArmor (see `security::apparmor_profile` for which profile a process gets).
//! - SELinux labels on a node with SELinux enabled (crius applies none yet); without SELinux
//!   they are ignored with a debug log (see `security::check_selinux`).

mod caps;
pub mod cdi;
mod devices;
mod error;
mod host;
mod image;
mod mounts;
mod process;
mod resources;
pub(crate) mod rootfs;
pub mod seccomp;
pub mod security;
mod signal;
mod user;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crius_api::v1::{
    ContainerConfig, LinuxContainerSecurityContext, LinuxSandboxSecurityContext, NamespaceMode,
    NamespaceOption, PodSandboxConfig,
};
use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxIdMapping, LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxResources, MountBuilder, Process, Root, RootBuilder, Spec,
};

pub use error::{Result, SpecError};
pub use host::HostFacts;
/// The arguments and working directory of the process a container config makes from an image
/// config (what the OCI spec's `process.args` and `process.cwd` will be): RestorePod checks
/// them against the checkpointed process's.
pub fn process_args_cwd(
    config: &ContainerConfig,
    image_config: &serde_json::Value,
) -> Result<(Vec<String>, std::path::PathBuf)> {
    let image = image::ImageConfig::new(image_config);
    Ok((
        process::args(config, &image)?,
        process::cwd(config, &image)?,
    ))
}

pub(crate) use mounts::id_mappings;
pub use resources::resources_to_oci;
pub use signal::{cri_signal, stop_signal};

/// Annotation keys crius sets on every spec (the ones containerd's CRI plugin sets).
pub mod annotations {
    pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    pub const CONTAINER_TYPE_SANDBOX: &str = "sandbox";
    pub const CONTAINER_TYPE_CONTAINER: &str = "container";
    pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
    pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
    pub const SANDBOX_LOG_DIRECTORY: &str = "io.kubernetes.cri.sandbox-log-directory";
    pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
    pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
}

/// The pause process's OOM score: kill it last (kubernetes#47938).
pub const SANDBOX_OOM_SCORE_ADJ: i32 = -998;

/// CPU shares of the pause container: it does nothing.
pub const SANDBOX_CPU_SHARES: u64 = 2;

/// What the sandbox (pause) container needs.
#[derive(Debug, Clone, Copy)]
pub struct SandboxSpecInput<'a> {
    pub sandbox_id: &'a str,
    pub config: &'a PodSandboxConfig,
    /// An empty directory; the root is read-only.
    pub rootfs: &'a Path,
    /// Host path of crius-pause, bind-mounted read-only at `/pause`; the process is `["/pause"]`.
    pub pause_binary: &'a Path,
    /// `Some`: join this pinned netns. `None`: the host's with NODE network, else a new, empty one.
    pub netns_path: Option<&'a Path>,
    /// Absolute, e.g. `/crius/<pod>/<sandbox-id>`.
    pub cgroups_path: &'a str,
    /// Set only when the pod has its own UTS namespace (not host network).
    pub hostname: &'a str,
    pub resolv_conf: Option<&'a Path>,
    pub hosts: Option<&'a Path>,
    pub hostname_file: Option<&'a Path>,
    /// The pod's `/dev/shm` (a size-limited tmpfs), bind-mounted read-only into the pause.
    pub shm_dir: Option<&'a Path>,
    /// The pod's pinned user namespace, required when the pod asks for one.
    pub userns_path: Option<&'a Path>,
    /// Whether crius's own path (libcontainer) runs the pause, see
    /// [`ContainerSpecInput::builtin`].
    pub builtin: bool,
    /// What the node is (probed at start).
    pub host: &'a HostFacts,
}

/// What a container in a pod needs.
#[derive(Debug, Clone, Copy)]
pub struct ContainerSpecInput<'a> {
    pub container_id: &'a str,
    pub sandbox_id: &'a str,
    pub config: &'a ContainerConfig,
    pub sandbox_config: &'a PodSandboxConfig,
    /// The OCI image config JSON (`{"config": {"Env", "Cmd", "Entrypoint", "WorkingDir",
    /// "User", "StopSignal", ...}}`), or its `config` object alone.
    pub image_config: &'a serde_json::Value,
    /// The image name for the `io.kubernetes.cri.image-name` annotation, as the container's
    /// status shows it; empty uses the request's `image.image`.
    pub image_name: &'a str,
    /// The mounted rootfs (its /etc/passwd and /etc/group are read).
    pub rootfs: &'a Path,
    /// Pid of the pause process: the container joins its IPC, UTS, PID (POD mode) and user
    /// namespaces through `/proc/<pid>/ns/*`. Required unless the pod shares every one of
    /// those with the host.
    pub sandbox_pid: Option<u32>,
    /// Pid of the target container's init, for `NamespaceMode::TARGET` PID namespaces.
    pub target_pid: Option<u32>,
    /// The pod's pinned netns; `None` with host network (or for a pod without one, when the
    /// sandbox's is joined through `sandbox_pid`).
    pub netns_path: Option<&'a Path>,
    pub cgroups_path: &'a str,
    /// The pod's hostname, for the `HOSTNAME` variable; empty means the node's.
    pub hostname: &'a str,
    pub resolv_conf: Option<&'a Path>,
    pub hosts: Option<&'a Path>,
    pub hostname_file: Option<&'a Path>,
    pub shm_dir: Option<&'a Path>,
    /// Whether a privileged container gets every device of the host (false for a runtime
    /// handler with `privileged_without_host_devices`).
    pub host_devices_for_privileged: bool,
    /// Whether crius's own path (libcontainer) runs the container, so its workarounds apply
    /// (see `mounts::host_cgroup_bind`); an OCI runtime handler builds those mounts itself.
    pub builtin: bool,
    /// What the node is (probed at start).
    pub host: &'a HostFacts,
}

fn namespace(typ: LinuxNamespaceType, path: Option<PathBuf>) -> Result<LinuxNamespace> {
    let mut b = LinuxNamespaceBuilder::default().typ(typ);
    if let Some(p) = path {
        b = b.path(p);
    }
    Ok(b.build()?)
}

fn proc_ns(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/{name}"))
}

fn mode(value: i32, field: &str) -> Result<NamespaceMode> {
    NamespaceMode::try_from(value)
        .map_err(|_| SpecError::invalid(format!("namespace_options {field} {value} is unknown")))
}

/// The user namespace mappings a pod asks for: `Some` with userns mode POD.
fn userns(
    ns: Option<&NamespaceOption>,
) -> Result<Option<(Vec<LinuxIdMapping>, Vec<LinuxIdMapping>)>> {
    let Some(u) = ns.and_then(|n| n.userns_options.as_ref()) else {
        return Ok(None);
    };
    match mode(u.mode, "userns_options mode")? {
        NamespaceMode::Node => Ok(None),
        NamespaceMode::Pod => {
            let uids = mounts::id_mappings(&u.uids)?;
            let gids = mounts::id_mappings(&u.gids)?;
            if uids.is_empty() || gids.is_empty() {
                return Err(SpecError::invalid(
                    "userns_options with mode POD needs uid and gid mappings",
                ));
            }
            check_id_mappings(&uids, "uids")?;
            check_id_mappings(&gids, "gids")?;
            Ok(Some((uids, gids)))
        }
        other => Err(SpecError::invalid(format!(
            "userns_options mode {} is not supported",
            other.as_str_name()
        ))),
    }
}

/// Most lines a `uid_map` or `gid_map` may have (user_namespaces(7)).
const MAX_ID_MAPPINGS: usize = 340;

/// Refuses what the kernel would refuse in a `uid_map`/`gid_map`: empty or overflowing ranges,
/// ranges that overlap on either side, too many lines.
fn check_id_mappings(maps: &[LinuxIdMapping], field: &str) -> Result<()> {
    if maps.len() > MAX_ID_MAPPINGS {
        return Err(SpecError::invalid(format!(
            "userns_options {field}: {} mappings, at most {MAX_ID_MAPPINGS}",
            maps.len()
        )));
    }
    let range = |start: u32, len: u32| (u64::from(start), u64::from(start) + u64::from(len));
    for (i, m) in maps.iter().enumerate() {
        let describe = |m: &LinuxIdMapping| {
            format!(
                "container_id {} host_id {} length {}",
                m.container_id(),
                m.host_id(),
                m.size()
            )
        };
        let (c, h) = (
            range(m.container_id(), m.size()),
            range(m.host_id(), m.size()),
        );
        if m.size() == 0 || c.1 > 1 << 32 || h.1 > 1 << 32 {
            return Err(SpecError::invalid(format!(
                "userns_options {field}[{i}] ({}) is empty or goes past the 32-bit ids",
                describe(m)
            )));
        }
        for (j, o) in maps.iter().enumerate().take(i) {
            let (oc, oh) = (
                range(o.container_id(), o.size()),
                range(o.host_id(), o.size()),
            );
            if c.0 < oc.1 && oc.0 < c.1 || h.0 < oh.1 && oh.0 < h.1 {
                return Err(SpecError::invalid(format!(
                    "userns_options {field}[{i}] ({}) overlaps {field}[{j}] ({})",
                    describe(m),
                    describe(o)
                )));
            }
        }
    }
    Ok(())
}

fn check_cgroups_path(path: &str) -> Result<()> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(SpecError::Input(format!(
            "cgroups_path {path:?} is not absolute"
        )))
    }
}

fn root(path: &Path, readonly: bool) -> Result<Root> {
    Ok(RootBuilder::default()
        .path(path)
        .readonly(readonly)
        .build()?)
}

fn sandbox_security(config: &PodSandboxConfig) -> Option<&LinuxSandboxSecurityContext> {
    config.linux.as_ref()?.security_context.as_ref()
}

fn container_security(config: &ContainerConfig) -> Option<&LinuxContainerSecurityContext> {
    config.linux.as_ref()?.security_context.as_ref()
}

/// Sets the pod's user namespace mappings on `spec`, which joins that namespace by path. crius's
/// own path needs none there (the namespace has them); runc refuses a user namespace without
/// mappings in the spec even when it joins one, so an OCI runtime handler's specs carry them.
pub fn set_userns_mappings(spec: &mut Spec, config: &PodSandboxConfig) -> Result<()> {
    let ns = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    if let (Some((uids, gids)), Some(linux)) = (userns(ns)?, spec.linux_mut()) {
        linux.set_uid_mappings(Some(uids));
        linux.set_gid_mappings(Some(gids));
    }
    Ok(())
}

/// The id mappings of the pod's user namespace, `None` when the pod uses the node's. A pod
/// with its own asks for its own network, PID and IPC namespaces too.
pub fn pod_id_maps(config: &PodSandboxConfig) -> Result<Option<crate::userns::IdMaps>> {
    let ns = sandbox_security(config).and_then(|s| s.namespace_options.as_ref());
    let Some((uids, gids)) = userns(ns)? else {
        return Ok(None);
    };
    for (field, value) in [
        ("network", ns.map_or(0, |n| n.network)),
        ("pid", ns.map_or(0, |n| n.pid)),
        ("ipc", ns.map_or(0, |n| n.ipc)),
    ] {
        if mode(value, field)? == NamespaceMode::Node {
            return Err(SpecError::invalid(format!(
                "userns_options mode POD cannot be combined with namespace_options {field} NODE"
            )));
        }
    }
    let maps = crate::userns::IdMaps { uids, gids };
    if maps.host_root().is_none() {
        return Err(SpecError::invalid(
            "userns_options must map container uid and gid 0",
        ));
    }
    // The pause runs as the pod's user: one the namespace lacks cannot be switched to.
    if let Some(sc) = sandbox_security(config) {
        let id = |v: &Option<crius_api::v1::Int64Value>| {
            v.as_ref().and_then(|v| u32::try_from(v.value).ok())
        };
        let gids: Vec<u32> = id(&sc.run_as_group)
            .into_iter()
            .chain(
                sc.supplemental_groups
                    .iter()
                    .filter_map(|g| u32::try_from(*g).ok()),
            )
            .collect();
        check_mapped(&maps, "security_context", id(&sc.run_as_user), &gids)?;
    }
    Ok(Some(maps))
}

/// `uid` and `gids` of a pod or container (`what` says which, for the message) are ids the
/// pod's user namespace maps.
fn check_mapped(
    maps: &crate::userns::IdMaps,
    what: &str,
    uid: Option<u32>,
    gids: &[u32],
) -> Result<()> {
    if let Some(uid) = uid.filter(|u| !maps.maps_uid(*u)) {
        return Err(SpecError::invalid(format!(
            "{what}: uid {uid} is not mapped in the pod's user namespace (userns_options uids \
             map container ids {})",
            crate::userns::IdMaps::ranges(&maps.uids)
        )));
    }
    if let Some(gid) = gids.iter().find(|g| !maps.maps_gid(**g)) {
        return Err(SpecError::invalid(format!(
            "{what}: gid {gid} is not mapped in the pod's user namespace (userns_options gids \
             map container ids {})",
            crate::userns::IdMaps::ranges(&maps.gids)
        )));
    }
    Ok(())
}

/// The pause container's spec.
pub fn sandbox_spec(input: &SandboxSpecInput<'_>) -> Result<Spec> {
    build_sandbox_spec(input)
}

fn build_sandbox_spec(input: &SandboxSpecInput<'_>) -> Result<Spec> {
    check_cgroups_path(input.cgroups_path)?;
    let config = input.config;
    let sc = sandbox_security(config);
    let ns = sc.and_then(|s| s.namespace_options.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    let lsm = &input.host.lsm;
    security::check_selinux(sc.and_then(|s| s.selinux_options.as_ref()), lsm)?;
    let apparmor = security::apparmor_profile(
        sc.and_then(|s| s.apparmor.as_ref()),
        "",
        privileged,
        false,
        lsm,
    )?;

    let network = mode(ns.map_or(0, |n| n.network), "network")?;
    let pid = mode(ns.map_or(0, |n| n.pid), "pid")?;
    let ipc = mode(ns.map_or(0, |n| n.ipc), "ipc")?;
    let host_network = network == NamespaceMode::Node;
    let userns = pod_id_maps(config)?;

    let mut namespaces = vec![namespace(LinuxNamespaceType::Mount, None)?];
    if !host_network {
        namespaces.push(namespace(
            LinuxNamespaceType::Network,
            input.netns_path.map(Path::to_path_buf),
        )?);
        namespaces.push(namespace(LinuxNamespaceType::Uts, None)?);
    }
    if ipc != NamespaceMode::Node {
        namespaces.push(namespace(LinuxNamespaceType::Ipc, None)?);
    }
    if pid != NamespaceMode::Node {
        namespaces.push(namespace(LinuxNamespaceType::Pid, None)?);
    }
    if userns.is_some() {
        let path = input.userns_path.ok_or_else(|| {
            SpecError::Input("userns_path is required for a pod with a user namespace".into())
        })?;
        namespaces.push(namespace(
            LinuxNamespaceType::User,
            Some(path.to_path_buf()),
        )?);
    }

    let sysctls = security::check_sysctls(
        &config
            .linux
            .as_ref()
            .map(|l| l.sysctls.clone())
            .unwrap_or_default(),
        security::SysctlScope {
            own_network: !host_network,
            own_ipc: ipc != NamespaceMode::Node,
            own_uts: !host_network,
        },
    )?;

    let capabilities = caps::default_caps()?;
    let seccomp = if privileged {
        None
    } else {
        #[allow(deprecated)]
        let deprecated_path = sc.map_or("", |s| s.seccomp_profile_path.as_str());
        let choice = seccomp::choice(sc.and_then(|s| s.seccomp.as_ref()), deprecated_path)?;
        let bounding = capabilities.bounding().clone().unwrap_or_default();
        seccomp::profile_for(&choice, &bounding)?.map(|mut s| {
            seccomp::for_libcontainer(&mut s);
            s
        })
    };

    let user = user::sandbox_user(
        sc.and_then(|s| s.run_as_user.as_ref()).map(|v| v.value),
        sc.and_then(|s| s.run_as_group.as_ref()).map(|v| v.value),
        sc.map_or(&[][..], |s| s.supplemental_groups.as_slice()),
    )?;

    let mut process = Process::default();
    process.set_terminal(Some(false));
    process.set_console_size(None);
    process.set_user(user);
    process.set_args(Some(vec!["/pause".to_string()]));
    process.set_env(Some(vec![process::DEFAULT_PATH.to_string()]));
    process.set_cwd(PathBuf::from("/"));
    process.set_capabilities(Some(capabilities));
    process.set_rlimits(None);
    process.set_no_new_privileges(Some(true));
    process.set_apparmor_profile(apparmor);
    process.set_selinux_label(None);
    process.set_oom_score_adj(Some(SANDBOX_OOM_SCORE_ADJ));

    // An OCI handler's runtime gets containerd's sandbox mounts: a VM or gVisor may make more
    // of the sandbox container than a waiting process.
    let (standard, mut overrides) = if input.builtin {
        (mounts::pause_mounts()?, Vec::new())
    } else {
        let files = mounts::PodFiles {
            resolv_conf: input.resolv_conf,
            hosts: input.hosts,
            hostname: input.hostname_file,
            shm: input.shm_dir,
        };
        (
            mounts::standard_mounts(false)?,
            mounts::pod_file_mounts(&files, true, true, &[])?,
        )
    };
    overrides.push(
        MountBuilder::default()
            .destination("/pause")
            .typ("bind")
            .source(input.pause_binary)
            .options(vec![
                "rbind".to_string(),
                "rprivate".to_string(),
                "ro".to_string(),
            ])
            .build()?,
    );
    let all_mounts = mounts::assemble(standard, overrides);

    let mut resources = LinuxResources::default();
    resources.set_devices(Some(devices::default_rules(input.builtin)?));
    resources.set_cpu(Some(
        LinuxCpuBuilder::default()
            .shares(SANDBOX_CPU_SHARES)
            .build()?,
    ));

    let (mut masked, mut readonly) =
        security::masked_and_readonly(&[], &[], privileged, userns.is_some());
    if input.builtin {
        // Only /proc of these is mounted. Its masks stay: a container sharing the pod's PID
        // namespace reaches the pause's root, and so this /proc, through /proc/<pid>/root.
        masked.retain(|p| p.starts_with("/proc/"));
        readonly.retain(|p| p.starts_with("/proc/"));
    } else if !privileged {
        readonly.extend(security::cgroup_readonly_paths());
    }

    let mut linux = oci_spec::runtime::Linux::default();
    linux.set_namespaces(Some(namespaces));
    // joined, not made: the namespace has its mappings
    linux.set_uid_mappings(None);
    linux.set_gid_mappings(None);
    linux.set_sysctl((!sysctls.is_empty()).then_some(sysctls));
    linux.set_resources(Some(resources));
    linux.set_cgroups_path(Some(PathBuf::from(input.cgroups_path)));
    linux.set_devices(None);
    linux.set_seccomp(seccomp);
    linux.set_rootfs_propagation(None);
    linux.set_masked_paths(Some(masked));
    linux.set_readonly_paths(Some(readonly));
    linux.set_mount_label(None);

    let metadata = config.metadata.clone().unwrap_or_default();
    let mut notes: HashMap<String, String> = config.annotations.clone();
    notes.insert(
        annotations::CONTAINER_TYPE.into(),
        annotations::CONTAINER_TYPE_SANDBOX.into(),
    );
    notes.insert(annotations::SANDBOX_ID.into(), input.sandbox_id.into());
    notes.insert(annotations::SANDBOX_NAME.into(), metadata.name);
    notes.insert(annotations::SANDBOX_NAMESPACE.into(), metadata.namespace);
    notes.insert(annotations::SANDBOX_UID.into(), metadata.uid);
    notes.insert(
        annotations::SANDBOX_LOG_DIRECTORY.into(),
        config.log_directory.clone(),
    );

    let mut spec = Spec::default();
    spec.set_root(Some(root(input.rootfs, true)?));
    spec.set_mounts(Some(all_mounts));
    spec.set_process(Some(process));
    spec.set_hostname(
        (!host_network && !input.hostname.is_empty()).then(|| input.hostname.to_string()),
    );
    spec.set_domainname(None);
    spec.set_hooks(None);
    spec.set_annotations(Some(notes));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// Whether a container gets a private cgroup namespace: every non-privileged container on the
/// unified hierarchy (cgroup v2), as containerd, CRI-O and Docker do since the cgroup v2 KEP.
/// Its `/proc/self/cgroup` then reads `0::/` and the cgroup2 mount at `/sys/fs/cgroup` shows
/// its own cgroup as the root, where JVMs, Go's runtime and .NET look for `memory.max` and
/// `cpu.max`, and no other pod's. On cgroup v1 nodes (and for privileged containers) the
/// node's namespace stays, as with those runtimes.
fn wants_cgroup_namespace(privileged: bool, unified: bool) -> bool {
    unified && !privileged
}

/// The namespaces of a container: network and UTS of the pod (host ones with host network),
/// IPC of the pod or the host, PID per `NamespaceMode` (POD: the pause's; CONTAINER: new;
/// NODE: the host's; TARGET: the target container's), a new mount namespace, and the pod's
/// user namespace when it has one.
fn container_namespaces(
    input: &ContainerSpecInput<'_>,
    pod_ns: Option<&NamespaceOption>,
    ns: Option<&NamespaceOption>,
    has_userns: bool,
) -> Result<Vec<LinuxNamespace>> {
    let need_pid = |what: &str| {
        input.sandbox_pid.ok_or_else(|| {
            SpecError::Input(format!(
                "sandbox_pid is required to join the pod's {what} namespace"
            ))
        })
    };
    let host_network = mode(pod_ns.map_or(0, |n| n.network), "network")? == NamespaceMode::Node;
    let mut out = vec![namespace(LinuxNamespaceType::Mount, None)?];
    if !host_network {
        let net = match input.netns_path {
            Some(p) => p.to_path_buf(),
            None => proc_ns(need_pid("network")?, "net"),
        };
        out.push(namespace(LinuxNamespaceType::Network, Some(net))?);
        out.push(namespace(
            LinuxNamespaceType::Uts,
            Some(proc_ns(need_pid("UTS")?, "uts")),
        )?);
    }
    if mode(ns.map_or(0, |n| n.ipc), "ipc")? != NamespaceMode::Node {
        out.push(namespace(
            LinuxNamespaceType::Ipc,
            Some(proc_ns(need_pid("IPC")?, "ipc")),
        )?);
    }
    match mode(ns.map_or(0, |n| n.pid), "pid")? {
        NamespaceMode::Pod => out.push(namespace(
            LinuxNamespaceType::Pid,
            Some(proc_ns(need_pid("PID")?, "pid")),
        )?),
        NamespaceMode::Container => out.push(namespace(LinuxNamespaceType::Pid, None)?),
        NamespaceMode::Node => {}
        NamespaceMode::Target => {
            let target = ns.map_or("", |n| n.target_id.as_str());
            if target.is_empty() {
                return Err(SpecError::invalid(
                    "namespace_options pid TARGET needs target_id",
                ));
            }
            let pid = input.target_pid.ok_or_else(|| {
                SpecError::Input(format!(
                    "target_pid is required to join the PID namespace of container {target}"
                ))
            })?;
            out.push(namespace(
                LinuxNamespaceType::Pid,
                Some(proc_ns(pid, "pid")),
            )?);
        }
    }
    if has_userns {
        out.push(namespace(
            LinuxNamespaceType::User,
            Some(proc_ns(need_pid("user")?, "user")),
        )?);
    }
    Ok(out)
}

/// A container's spec.
pub fn container_spec(input: &ContainerSpecInput<'_>) -> Result<Spec> {
    build_container_spec(input)
}

fn build_container_spec(input: &ContainerSpecInput<'_>) -> Result<Spec> {
    check_cgroups_path(input.cgroups_path)?;
    let config = input.config;
    let name = config
        .metadata
        .as_ref()
        .map_or("", |m| m.name.as_str())
        .to_string();
    let sc = container_security(config);
    let pod_sc = sandbox_security(input.sandbox_config);
    let privileged = sc.is_some_and(|s| s.privileged);
    if privileged && !pod_sc.is_some_and(|s| s.privileged) {
        return Err(SpecError::invalid(format!(
            "privileged container {name} is not allowed in a pod whose security context is not privileged"
        )));
    }
    let lsm = &input.host.lsm;
    security::check_selinux(sc.and_then(|s| s.selinux_options.as_ref()), lsm)?;
    #[allow(deprecated)]
    let apparmor_deprecated = sc.map_or("", |s| s.apparmor_profile.as_str());
    let apparmor = security::apparmor_profile(
        sc.and_then(|s| s.apparmor.as_ref()),
        apparmor_deprecated,
        privileged,
        true,
        lsm,
    )?;

    let pod_ns = pod_sc.and_then(|s| s.namespace_options.as_ref());
    let ns = sc.and_then(|s| s.namespace_options.as_ref()).or(pod_ns);
    let pod_userns = pod_id_maps(input.sandbox_config)?;
    let userns = userns(ns)?;
    if userns.as_ref().map(|(u, g)| (u, g)) != pod_userns.as_ref().map(|m| (&m.uids, &m.gids)) {
        return Err(SpecError::invalid(
            "userns_options of the container differ from the pod's",
        ));
    }
    let image = image::ImageConfig::new(input.image_config);
    let args = process::args(config, &image)?;
    // containerd's rule: a pod without a hostname (host network) sees the node's
    let hostname = if input.hostname.is_empty() {
        input.host.hostname.as_str()
    } else {
        input.hostname
    };
    let mut env = process::env(config, &image, hostname)?;
    // CDI edits come last, as containerd applies them after everything else
    let cdi_names: Vec<String> = config.cdi_devices.iter().map(|d| d.name.clone()).collect();
    let cdi = cdi::inject(&cdi_names, &cdi::CDI_DIRS.map(Path::new))?;
    process::merge_env(&mut env, cdi.env.iter().cloned());
    let cwd = process::cwd(config, &image)?;
    let mut user = user::container_user(sc, image.user(), input.rootfs)?;
    if !cdi.additional_gids.is_empty() {
        let mut gids = user.additional_gids().clone().unwrap_or_default();
        for g in &cdi.additional_gids {
            if !gids.contains(g) {
                gids.push(*g);
            }
        }
        user.set_additional_gids(Some(gids));
    }
    if let Some(maps) = &pod_userns {
        let gids: Vec<u32> = std::iter::once(user.gid())
            .chain(user.additional_gids().iter().flatten().copied())
            .collect();
        check_mapped(
            maps,
            "the container's user (run_as_user, run_as_group, the image's USER)",
            Some(user.uid()),
            &gids,
        )?;
    }
    let capabilities = caps::container_caps(
        sc.and_then(|s| s.capabilities.as_ref()),
        privileged,
        input.host,
    )?;

    let seccomp = if privileged {
        None
    } else {
        #[allow(deprecated)]
        let deprecated_path = sc.map_or("", |s| s.seccomp_profile_path.as_str());
        let choice = seccomp::choice(sc.and_then(|s| s.seccomp.as_ref()), deprecated_path)?;
        let bounding = capabilities.bounding().clone().unwrap_or_default();
        seccomp::profile_for(&choice, &bounding)?.map(|mut s| {
            seccomp::for_libcontainer(&mut s);
            s
        })
    };

    if let Some(sc) = sc {
        security::check_paths("masked_paths", &sc.masked_paths)?;
        security::check_paths("readonly_paths", &sc.readonly_paths)?;
    }
    let (masked, mut readonly_paths) = security::masked_and_readonly(
        sc.map_or(&[][..], |s| s.masked_paths.as_slice()),
        sc.map_or(&[][..], |s| s.readonly_paths.as_slice()),
        privileged,
        userns.is_some(),
    );

    if !privileged {
        readonly_paths.extend(security::cgroup_readonly_paths());
    }

    let mut namespaces = container_namespaces(input, pod_ns, ns, userns.is_some())?;
    let cgroup_v1 = input.host.cgroup_v1;
    if wants_cgroup_namespace(privileged, !cgroup_v1) {
        namespaces.push(namespace(LinuxNamespaceType::Cgroup, None)?);
    }

    // mounts
    let readonly_rootfs = sc.is_some_and(|s| s.readonly_rootfs);
    let (cri_mounts, root_propagation) = mounts::cri_mounts(&config.mounts)?;
    let cri_dests: Vec<PathBuf> = cri_mounts.iter().map(|m| m.destination().clone()).collect();
    let files = mounts::PodFiles {
        resolv_conf: input.resolv_conf,
        hosts: input.hosts,
        hostname: input.hostname_file,
        shm: input.shm_dir,
    };
    let mut overrides = mounts::pod_file_mounts(&files, readonly_rootfs, false, &cri_dests)?;
    overrides.extend(cri_mounts);
    overrides.extend(cdi.mounts);
    let mut standard = mounts::standard_mounts(privileged)?;
    let joins_pid_ns = matches!(
        mode(ns.map_or(0, |n| n.pid), "pid")?,
        NamespaceMode::Pod | NamespaceMode::Target
    );
    if input.builtin && joins_pid_ns && cgroup_v1 {
        standard.retain(|m| m.destination() != Path::new("/sys/fs/cgroup"));
        standard.push(mounts::host_cgroup_bind(privileged)?);
    }
    let all_mounts = mounts::assemble(standard, overrides);

    // devices
    let (mut device_nodes, device_rules) = devices::cri_devices(&config.devices)?;
    let mut rules = if privileged {
        devices::allow_all_rules()?
    } else {
        devices::default_rules(input.builtin)?
    };
    rules.extend(device_rules);
    if privileged && input.host_devices_for_privileged {
        for dev in devices::host_devices()? {
            if !device_nodes.iter().any(|d| d.path() == dev.path()) {
                device_nodes.push(dev);
            }
        }
    }
    for dev in cdi.devices {
        device_nodes.retain(|d| d.path() != dev.path());
        device_nodes.push(dev);
    }
    rules.extend(cdi.rules);

    let cri_resources = config.linux.as_ref().and_then(|l| l.resources.as_ref());
    let mut resources = match cri_resources {
        Some(r) => resources_to_oci(r)?,
        None => LinuxResources::default(),
    };
    resources.set_devices(Some(rules));
    if !cgroup_v1 {
        resources::carry_v2_weight(&mut resources);
    }
    let oom_score_adj = match cri_resources.map(|r| r.oom_score_adj) {
        Some(v) if v != 0 => Some(
            i32::try_from(v)
                .ok()
                .filter(|v| (-1000..=1000).contains(v))
                .ok_or_else(|| {
                    SpecError::invalid(format!(
                        "resources oom_score_adj {v} is outside -1000..1000"
                    ))
                })?,
        ),
        _ => None,
    };

    let mut process = Process::default();
    process.set_terminal(Some(config.tty));
    process.set_console_size(None);
    process.set_user(user);
    process.set_args(Some(args));
    process.set_env(Some(env));
    process.set_cwd(cwd);
    process.set_capabilities(Some(capabilities));
    process.set_rlimits(None);
    // `None`, never `Some(false)`: libcontainer 0.7 loads the seccomp filter early (while still
    // privileged) only when the field is absent; with `Some(false)` it loads it after dropping
    // capabilities, without no_new_privs, and the kernel refuses the filter.
    process.set_no_new_privileges(sc.is_some_and(|s| s.no_new_privs).then_some(true));
    process.set_apparmor_profile(apparmor);
    process.set_selinux_label(None);
    process.set_oom_score_adj(oom_score_adj);

    let mut linux = oci_spec::runtime::Linux::default();
    linux.set_namespaces(Some(namespaces));
    linux.set_uid_mappings(None);
    linux.set_gid_mappings(None);
    linux.set_sysctl(None);
    linux.set_resources(Some(resources));
    linux.set_cgroups_path(Some(PathBuf::from(input.cgroups_path)));
    linux.set_devices((!device_nodes.is_empty()).then_some(device_nodes));
    linux.set_seccomp(seccomp);
    linux.set_rootfs_propagation(root_propagation.as_oci().map(str::to_string));
    linux.set_masked_paths(Some(masked));
    linux.set_readonly_paths(Some(readonly_paths));
    linux.set_mount_label(None);

    let metadata = input.sandbox_config.metadata.clone().unwrap_or_default();
    let image_name = if !input.image_name.is_empty() {
        input.image_name.to_string()
    } else {
        config
            .image
            .as_ref()
            .map_or(String::new(), |i| i.image.clone())
    };
    let mut notes: HashMap<String, String> = config.annotations.clone();
    notes.insert(
        annotations::CONTAINER_TYPE.into(),
        annotations::CONTAINER_TYPE_CONTAINER.into(),
    );
    notes.insert(annotations::SANDBOX_ID.into(), input.sandbox_id.into());
    notes.insert(annotations::SANDBOX_NAME.into(), metadata.name);
    notes.insert(annotations::SANDBOX_NAMESPACE.into(), metadata.namespace);
    notes.insert(annotations::SANDBOX_UID.into(), metadata.uid);
    notes.insert(annotations::CONTAINER_NAME.into(), name);
    notes.insert(annotations::IMAGE_NAME.into(), image_name);

    let mut spec = Spec::default();
    spec.set_root(Some(root(input.rootfs, readonly_rootfs)?));
    spec.set_mounts(Some(all_mounts));
    spec.set_process(Some(process));
    spec.set_hostname(None);
    spec.set_domainname(None);
    spec.set_hooks(cdi.hooks);
    spec.set_annotations(Some(notes));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// The identity the container's first process starts with, for `ContainerStatus.user`
/// (kubelet reports it in the pod status; critest checks it for supplemental_groups_policy).
pub fn process_user(process: &Process) -> crius_api::v1::ContainerUser {
    let user = process.user();
    let mut groups: Vec<i64> = user
        .additional_gids()
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .map(|g| i64::from(*g))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    crius_api::v1::ContainerUser {
        linux: Some(crius_api::v1::LinuxContainerUser {
            uid: i64::from(user.uid()),
            gid: i64::from(user.gid()),
            supplemental_groups: groups,
        }),
    }
}

/// The process for ExecSync/Exec in a running container: `cmd` and `tty` from the request,
/// everything else (env, cwd, user, capabilities, no_new_privileges, AppArmor, SELinux label,
/// rlimits, OOM score) from the container's process, as containerd does.
pub fn exec_process(container: Option<Process>, cmd: &[String], tty: bool) -> Result<Process> {
    if cmd.is_empty() || cmd[0].is_empty() {
        return Err(SpecError::invalid("exec cmd is empty"));
    }
    let mut process =
        container.ok_or_else(|| SpecError::Input("the container spec has no process".into()))?;
    process.set_args(Some(cmd.to_vec()));
    process.set_terminal(Some(tty));
    process.set_console_size(None);
    if tty {
        let mut env = process.env().clone().unwrap_or_default();
        if !env.iter().any(|e| e.starts_with("TERM=")) {
            env.push("TERM=xterm".into());
        }
        process.set_env(Some(env));
    }
    Ok(process)
}

#[cfg(test)]
mod tests;
