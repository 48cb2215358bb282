//! Mounts: the standard filesystems, the pod's shared files and the CRI mounts, ordered so a
//! parent is always mounted before its children.

use std::path::{Component, Path, PathBuf};

use crius_api::v1::{Mount as CriMount, MountPropagation};
use oci_spec::runtime::{LinuxIdMapping, LinuxIdMappingBuilder, Mount, MountBuilder};

use super::error::{Result, SpecError};
use crate::util::excerpt;

/// The pod files a container or the pause process sees.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PodFiles<'a> {
    pub resolv_conf: Option<&'a Path>,
    pub hosts: Option<&'a Path>,
    pub hostname: Option<&'a Path>,
    pub shm: Option<&'a Path>,
}

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount> {
    Ok(MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()?)
}

fn bind(source: &Path, dest: &str, options: Vec<String>) -> Result<Mount> {
    Ok(MountBuilder::default()
        .destination(dest)
        .typ("bind")
        .source(source)
        .options(options)
        .build()?)
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The standard filesystems (containerd's defaults without `/run`). `/sys` and
/// `/sys/fs/cgroup` are read-only unless `privileged`. `/dev/shm` is a private 64 MiB tmpfs
/// here; [`pod_file_mounts`] replaces it with the pod's when the pod has one.
pub(crate) fn standard_mounts(privileged: bool) -> Result<Vec<Mount>> {
    let sys_mode = if privileged { "rw" } else { "ro" };
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", sys_mode],
        )?,
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", sys_mode],
        )?,
    ])
}

/// The pause process's filesystems under the built-in handler: `/proc` and `/dev` of
/// [`standard_mounts`] and nothing more. The pause only waits for a signal and nothing runs
/// beside it in its mount namespace, so `/sys`, the cgroup mount (on cgroup v1 a tmpfs with a
/// bind of each hierarchy, each then remounted read-only), `/dev/pts`, `/dev/shm`,
/// `/dev/mqueue` and the pod's files would be work for each pod start that nobody uses.
/// libcontainer 0.7's init needs the two kept (checked on this project's node): without
/// `/proc` it dies after preparing the root, without `/dev` preparing the root fails.
pub(crate) fn pause_mounts() -> Result<Vec<Mount>> {
    Ok(standard_mounts(false)?
        .into_iter()
        .filter(|m| [Path::new("/proc"), Path::new("/dev")].contains(&m.destination().as_path()))
        .collect())
}

/// A recursive bind of the host's cgroup v1 tree at `/sys/fs/cgroup`, read-only (`rro`)
/// unless `privileged`, to replace the `cgroup` mount of [`standard_mounts`] in a container
/// that joins an existing PID namespace (the pod's or a TARGET's).
///
/// Why: libcontainer 0.7 builds the v1 cgroup mount from `/proc/<pid>/cgroup` where `<pid>` is
/// the init's pid inside its PID namespace when its parent is outside it, read through the
/// host's `/proc`. In a joined namespace that pid names an unrelated host process, or none:
/// seen on a cgroup v1 test machine, the 8th container of a pod sharing its PID namespace
/// failed with "failed to prepare rootfs" (`/proc/9` not found). Without a cgroup namespace the paths in
/// `/proc/self/cgroup` are the host's, so tools that join them with the mount points (JVMs,
/// cAdvisor) find the container's own limits under this bind; other pods' cgroups are visible
/// read-only.
pub(crate) fn host_cgroup_bind(privileged: bool) -> Result<Mount> {
    let access = if privileged { "rw" } else { "rro" };
    mount(
        "/sys/fs/cgroup",
        "bind",
        "/sys/fs/cgroup",
        &["rbind", "rprivate", "nosuid", "noexec", "nodev", access],
    )
}

/// Bind mounts of the pod's files. `/etc/hosts`, `/etc/resolv.conf` and `/etc/hostname` are
/// writable unless `files_readonly` (containerd makes them follow the container's
/// `readonly_rootfs`); `/dev/shm` is always writable. Destinations in `skip` (the container's
/// own CRI mounts) are left out.
pub(crate) fn pod_file_mounts(
    files: &PodFiles<'_>,
    files_readonly: bool,
    shm_readonly: bool,
    skip: &[PathBuf],
) -> Result<Vec<Mount>> {
    let mode = if files_readonly { "ro" } else { "rw" };
    let mut out = Vec::new();
    for (dest, source) in [
        ("/etc/hostname", files.hostname),
        ("/etc/hosts", files.hosts),
        ("/etc/resolv.conf", files.resolv_conf),
    ] {
        if let Some(source) = source {
            if !skip.iter().any(|s| s == Path::new(dest)) {
                out.push(bind(source, dest, strings(&["rbind", "rprivate", mode]))?);
            }
        }
    }
    if let Some(shm) = files.shm {
        if !skip.iter().any(|s| s == Path::new("/dev/shm")) {
            let shm_mode = if shm_readonly { "ro" } else { "rw" };
            out.push(bind(
                shm,
                "/dev/shm",
                strings(&["rbind", "rprivate", "nosuid", "nodev", "noexec", shm_mode]),
            )?);
        }
    }
    Ok(out)
}

/// `path` without `.` components, duplicate or trailing slashes; `..` is refused (a container
/// path must not climb).
pub(crate) fn clean_container_path(path: &str, field: &str) -> Result<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(SpecError::invalid(format!(
            "{field} {path} is not absolute"
        )));
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                return Err(SpecError::invalid(format!("{field} {path} contains ..")))
            }
            _ => {}
        }
    }
    Ok(out)
}

/// How CRI mounts changed the root's propagation (`linux.rootfsPropagation`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootPropagation {
    #[default]
    Unchanged,
    /// Every CRI mount is PRIVATE: the whole tree is made private, the only way to keep a
    /// private bind of a shared host mount from receiving host mounts with libcontainer 0.7
    /// (see [`RootPropagation::as_oci`]).
    Private,
    Slave,
    Shared,
}

impl RootPropagation {
    /// The `rootfsPropagation` value: the OCI spec's `private`/`slave`/`shared` (applied
    /// recursively). libcontainer 0.7 refuses runc's `rslave`/`rshared` ("failed to prepare
    /// rootfs"), which containerd writes. It also ignores the propagation options of each bind
    /// (its binds are clones that keep the propagation the root gave them), so the root's
    /// propagation is what every bind gets: with a HOST_TO_CONTAINER or BIDIRECTIONAL mount, a
    /// PRIVATE bind of a shared host mount in the same container would receive host mounts too,
    /// unless its source is private (the container code stages a private copy for it).
    pub(crate) fn as_oci(self) -> Option<&'static str> {
        match self {
            RootPropagation::Unchanged => None,
            RootPropagation::Private => Some("private"),
            RootPropagation::Slave => Some("slave"),
            RootPropagation::Shared => Some("shared"),
        }
    }
}

/// The CRI mounts as OCI bind mounts, with the root propagation they need.
///
/// `propagation` PRIVATE → `rprivate` (root `private` when every mount is), HOST_TO_CONTAINER →
/// `rslave` (root at least `slave`), BIDIRECTIONAL → `rshared` (root `shared`); `readonly` → `ro`,
/// with `recursive_read_only` → `rro` (needs `readonly` and private propagation); `selinux_relabel`
/// is ignored with a debug log on every node (crius applies no SELinux labels). Host paths are used
/// as given: the caller creates missing ones as directories (containerd does, mode 0755) before the
/// container is created, and checks that a shared/slave mount's source really is shared/slave on
/// the host if it wants to report that early.
pub(crate) fn cri_mounts(mounts: &[CriMount]) -> Result<(Vec<Mount>, RootPropagation)> {
    let mut out = Vec::with_capacity(mounts.len());
    let mut root = RootPropagation::Unchanged;
    for m in mounts {
        let dest = clean_container_path(&m.container_path, "mount container_path")?;
        if dest == Path::new("/") {
            return Err(SpecError::invalid(format!(
                "mount container_path {}: a mount cannot replace the container's root",
                m.container_path
            )));
        }
        if m.image.as_ref().is_some_and(|i| !i.image.is_empty()) && m.host_path.is_empty() {
            return Err(SpecError::invalid(format!(
                "mount {}: image volumes are not supported",
                m.container_path
            )));
        }
        if !Path::new(&m.host_path).is_absolute() {
            return Err(SpecError::invalid(format!(
                "mount host_path {} for {} is not absolute",
                m.host_path, m.container_path
            )));
        }
        let mut options = vec!["rbind".to_string()];
        let propagation = MountPropagation::try_from(m.propagation).map_err(|_| {
            SpecError::invalid(format!(
                "mount {} propagation {} is unknown",
                m.container_path, m.propagation
            ))
        })?;
        match propagation {
            MountPropagation::PropagationPrivate => {
                options.push("rprivate".into());
                if root == RootPropagation::Unchanged {
                    root = RootPropagation::Private;
                }
            }
            MountPropagation::PropagationHostToContainer => {
                options.push("rslave".into());
                if matches!(root, RootPropagation::Unchanged | RootPropagation::Private) {
                    root = RootPropagation::Slave;
                }
            }
            MountPropagation::PropagationBidirectional => {
                options.push("rshared".into());
                root = RootPropagation::Shared;
            }
        }
        if m.readonly {
            if m.recursive_read_only {
                if propagation != MountPropagation::PropagationPrivate {
                    return Err(SpecError::invalid(format!(
                        "mount {}: recursive_read_only needs private propagation",
                        m.container_path
                    )));
                }
                options.push("rro".into());
            } else {
                options.push("ro".into());
            }
        } else if m.recursive_read_only {
            return Err(SpecError::invalid(format!(
                "mount {}: recursive_read_only needs readonly",
                m.container_path
            )));
        } else {
            options.push("rw".into());
        }
        extra_mount_options(m, &mut options)?;
        if m.selinux_relabel {
            tracing::debug!(
                host_path = %m.host_path,
                container_path = %m.container_path,
                "selinux_relabel ignored: crius applies no SELinux labels"
            );
        }
        let mut builder = MountBuilder::default()
            .destination(dest)
            .typ("bind")
            .source(&m.host_path)
            .options(options);
        // an idmapped mount, when the request asks for one
        let uids = id_mappings(&m.uid_mappings)?;
        let gids = id_mappings(&m.gid_mappings)?;
        if !uids.is_empty() {
            builder = builder.uid_mappings(uids);
        }
        if !gids.is_empty() {
            builder = builder.gid_mappings(gids);
        }
        out.push(builder.build()?);
    }
    Ok((out, root))
}

/// The per-mount flags a CRI `mount_options` entry may add to a bind mount: the security and
/// access-time flags. Everything else a bind takes (ro/rw, propagation, recursion) has its own
/// CRI field, and filesystem data options mean nothing to a bind.
const BIND_FLAGS: [&str; 14] = [
    "noexec",
    "exec",
    "nodev",
    "dev",
    "nosuid",
    "suid",
    "noatime",
    "atime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "nodiratime",
    "diratime",
];

/// Most `mount_options` one mount may carry.
const MAX_MOUNT_OPTIONS: usize = BIND_FLAGS.len();

/// Appends a mount's `mount_options` (cri-api v0.37) to its OCI options, refusing anything that
/// is not a bind flag.
fn extra_mount_options(m: &CriMount, options: &mut Vec<String>) -> Result<()> {
    if m.mount_options.len() > MAX_MOUNT_OPTIONS {
        return Err(SpecError::invalid(format!(
            "mount {}: {} mount_options, at most {MAX_MOUNT_OPTIONS}",
            excerpt(&m.container_path),
            m.mount_options.len()
        )));
    }
    for (i, option) in m.mount_options.iter().enumerate() {
        if !BIND_FLAGS.contains(&option.as_str()) {
            return Err(SpecError::invalid(format!(
                "mount {}: mount_options[{i}] {:?} is not a bind mount flag (one of {})",
                excerpt(&m.container_path),
                excerpt(option),
                BIND_FLAGS.join(", ")
            )));
        }
        if !options.contains(option) {
            options.push(option.clone());
        }
    }
    Ok(())
}

/// CRI id mappings as OCI ones.
pub(crate) fn id_mappings(list: &[crius_api::v1::IdMapping]) -> Result<Vec<LinuxIdMapping>> {
    list.iter()
        .map(|m| {
            Ok(LinuxIdMappingBuilder::default()
                .host_id(m.host_id)
                .container_id(m.container_id)
                .size(m.length)
                .build()?)
        })
        .collect()
}

/// Puts the mounts together: a later mount at the same destination replaces an earlier one, a
/// CRI mount of `/dev` drops the standard `/dev/*` mounts, and the list is stably sorted by
/// depth so that parents come before children.
pub(crate) fn assemble(standard: Vec<Mount>, overrides: Vec<Mount>) -> Vec<Mount> {
    let replaces_dev = overrides
        .iter()
        .any(|m| m.destination() == Path::new("/dev"));
    let mut all: Vec<Mount> = standard
        .into_iter()
        .filter(|m| {
            let replaced = overrides.iter().any(|o| o.destination() == m.destination());
            let under_replaced_dev = replaces_dev && m.destination().starts_with("/dev");
            !replaced && !under_replaced_dev
        })
        .collect();
    for m in overrides {
        all.retain(|e| e.destination() != m.destination());
        all.push(m);
    }
    all.sort_by_key(|m| m.destination().components().count());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cri(container: &str, host: &str, ro: bool, prop: MountPropagation) -> CriMount {
        CriMount {
            container_path: container.into(),
            host_path: host.into(),
            readonly: ro,
            propagation: prop as i32,
            ..Default::default()
        }
    }

    fn dests(mounts: &[Mount]) -> Vec<String> {
        mounts
            .iter()
            .map(|m| m.destination().display().to_string())
            .collect()
    }

    #[test]
    fn cri_mount_options_and_root_propagation() {
        let (mounts, root) = cri_mounts(&[
            cri(
                "/data",
                "/srv/data",
                true,
                MountPropagation::PropagationPrivate,
            ),
            cri(
                "/logs/",
                "/var/log",
                false,
                MountPropagation::PropagationHostToContainer,
            ),
        ])
        .unwrap();
        assert_eq!(
            mounts[0].options().clone().unwrap(),
            ["rbind", "rprivate", "ro"]
        );
        assert_eq!(
            mounts[1].options().clone().unwrap(),
            ["rbind", "rslave", "rw"]
        );
        assert_eq!(mounts[1].destination(), Path::new("/logs"));
        assert_eq!(root, RootPropagation::Slave);

        let (mounts, root) = cri_mounts(&[
            cri(
                "/a",
                "/a",
                false,
                MountPropagation::PropagationBidirectional,
            ),
            cri(
                "/b",
                "/b",
                false,
                MountPropagation::PropagationHostToContainer,
            ),
        ])
        .unwrap();
        assert_eq!(
            mounts[0].options().clone().unwrap(),
            ["rbind", "rshared", "rw"]
        );
        assert_eq!(root, RootPropagation::Shared);
    }

    #[test]
    fn only_private_mounts_make_the_root_private() {
        let (_, root) =
            cri_mounts(&[cri("/a", "/a", false, MountPropagation::PropagationPrivate)]).unwrap();
        assert_eq!(root.as_oci(), Some("private"));
        let (_, root) = cri_mounts(&[]).unwrap();
        assert_eq!(root.as_oci(), None);
    }

    #[test]
    fn recursive_read_only_rules() {
        let mut m = cri("/a", "/a", true, MountPropagation::PropagationPrivate);
        m.recursive_read_only = true;
        let (mounts, _) = cri_mounts(std::slice::from_ref(&m)).unwrap();
        assert_eq!(
            mounts[0].options().clone().unwrap(),
            ["rbind", "rprivate", "rro"]
        );
        m.readonly = false;
        assert!(cri_mounts(std::slice::from_ref(&m))
            .unwrap_err()
            .is_invalid_argument());
        m.readonly = true;
        m.propagation = MountPropagation::PropagationBidirectional as i32;
        assert!(cri_mounts(&[m]).unwrap_err().is_invalid_argument());
    }

    #[test]
    fn bad_paths_are_refused() {
        assert!(cri_mounts(&[cri(
            "rel",
            "/a",
            false,
            MountPropagation::PropagationPrivate
        )])
        .unwrap_err()
        .is_invalid_argument());
        assert!(cri_mounts(&[cri(
            "/x/../etc",
            "/a",
            false,
            MountPropagation::PropagationPrivate
        )])
        .unwrap_err()
        .is_invalid_argument());
        assert!(
            cri_mounts(&[cri("/x", "", false, MountPropagation::PropagationPrivate)])
                .unwrap_err()
                .is_invalid_argument()
        );
    }

    #[test]
    fn parents_come_before_children_and_overrides_win() {
        let (cri, _) = cri_mounts(&[
            cri(
                "/data/sub/deeper",
                "/h3",
                false,
                MountPropagation::PropagationPrivate,
            ),
            cri("/data", "/h1", false, MountPropagation::PropagationPrivate),
            cri(
                "/data/sub",
                "/h2",
                false,
                MountPropagation::PropagationPrivate,
            ),
            cri(
                "/etc/hosts",
                "/myhosts",
                true,
                MountPropagation::PropagationPrivate,
            ),
        ])
        .unwrap();
        let skip: Vec<PathBuf> = cri.iter().map(|m| m.destination().clone()).collect();
        let files = PodFiles {
            hosts: Some(Path::new("/pod/hosts")),
            resolv_conf: Some(Path::new("/pod/resolv.conf")),
            shm: Some(Path::new("/pod/shm")),
            hostname: None,
        };
        let mut overrides = pod_file_mounts(&files, false, false, &skip).unwrap();
        overrides.extend(cri);
        let all = assemble(standard_mounts(false).unwrap(), overrides);
        let d = dests(&all);
        let pos = |p: &str| d.iter().position(|x| x == p).unwrap();
        assert!(pos("/data") < pos("/data/sub"));
        assert!(pos("/data/sub") < pos("/data/sub/deeper"));
        assert!(pos("/dev") < pos("/dev/shm"));
        assert!(pos("/sys") < pos("/sys/fs/cgroup"));
        assert_eq!(d.iter().filter(|x| *x == "/dev/shm").count(), 1);
        assert_eq!(all[pos("/dev/shm")].typ().as_deref(), Some("bind"));
        assert_eq!(d.iter().filter(|x| *x == "/etc/hosts").count(), 1);
        assert_eq!(
            all[pos("/etc/hosts")].source().as_deref(),
            Some(Path::new("/myhosts"))
        );
        assert_eq!(
            all[pos("/etc/resolv.conf")].options().clone().unwrap(),
            ["rbind", "rprivate", "rw"]
        );
    }

    #[test]
    fn mounting_dev_drops_standard_dev_mounts() {
        let (cri, _) = cri_mounts(&[cri(
            "/dev",
            "/dev",
            false,
            MountPropagation::PropagationPrivate,
        )])
        .unwrap();
        let all = assemble(standard_mounts(false).unwrap(), cri);
        let d = dests(&all);
        assert!(!d.iter().any(|x| x.starts_with("/dev/")));
        assert_eq!(d.iter().filter(|x| *x == "/dev").count(), 1);
    }

    #[test]
    fn sysfs_is_read_only_unless_privileged() {
        let std = standard_mounts(false).unwrap();
        assert!(std[5]
            .options()
            .clone()
            .unwrap()
            .contains(&"ro".to_string()));
        let std = standard_mounts(true).unwrap();
        assert!(std[5]
            .options()
            .clone()
            .unwrap()
            .contains(&"rw".to_string()));
    }
}
