//! Cgroups: where pod and container cgroups are, and reading and changing their limits.
//!
//! kubelet names the pod's cgroup in `linux.cgroup_parent` and owns it; crius puts the pod in a
//! cgroup of its own below it, `<cgroup_parent>/crius-<pod-id>` (a slice with systemd, see
//! [`systemd`]), so the pod's limits never land in a cgroup it did not make (a client may name
//! a shared one). A client that gives none (crictl, critest) gets `/crius/<pod-id>`. crius
//! creates either (through libcontainer, as the parent of the pod's containers) and removes it
//! with the pod. Containers, the pause container included, go one level below, named by their
//! id, as containerd lays them out.
//!
//! libcontainer creates the container cgroups from the OCI spec; this module changes them
//! afterwards (`UpdateContainerResources`, pod-level resources) and reads their usage. The
//! kernel interface differs between cgroup v1 ([`v1`], one hierarchy per controller) and v2
//! ([`v2`], one unified tree); [`Hierarchy`] is whichever this host has, found at start from
//! the mount table: v2 when `/sys/fs/cgroup` itself is cgroup2, else v1 (a hybrid host's
//! `/sys/fs/cgroup/unified` carries no controllers).
//!
//! With the `systemd` driver ([`init`] connects to systemd at start) the pod cgroup is the
//! pod's slice and each container, the pause container included, runs in a transient scope
//! `crius-<id>.scope` in it ([`systemd`]). libcontainer still creates the container's cgroup
//! directories, under the scope's path, and writes its limits; [`attach`] then makes the scope
//! over D-Bus with that process and the same limits, and moves the process back into the
//! directories of the controllers systemd does not manage (on v1 it moves a new scope's
//! processes to its parent's cgroup there: devices, cpuset, …). Limits are written to cgroupfs
//! as with cgroupfs, and also set as unit properties, so systemd keeps them when it re-applies
//! its own. Records hold cgroupfs paths with either driver; [`fs_path`] still reads systemd's
//! `slice:prefix:name` and slice names. systemd removes a scope, and its cgroup in every
//! hierarchy, as soon as its last process has exited.

pub mod dbus;
pub mod manager;
pub mod reap;
pub mod root_options;
pub mod systemd;
pub mod v1;
pub mod v2;

/// How long removing a pod or container waits for its cgroup to empty (killed orphans of a
/// dead shim are zombies until init reaps them).
pub const REMOVE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crius_api::v1::{LinuxContainerResources, PodSandboxConfig};

use crate::config::{CgroupConfig, CgroupDriver};

/// Parent of the pod cgroups crius owns itself.
pub const CRIUS_PARENT: &str = "/crius";

/// Why reading or changing a cgroup failed. Messages name the file and the value.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The kernel refused a value (or the file could not be written).
    #[error("write {value:?} to {}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: unexpected content {value:?}", path.display())]
    Parse { path: PathBuf, value: String },
    /// A requested value that no cgroup could take, found before anything is written.
    #[error("{0}")]
    Invalid(String),
    /// A request's resources that [`check_resources`] refused: `field` is where they sit in
    /// the request (`config.linux.resources`), `reason` starts with the name of the value
    /// below it that is at fault.
    #[error("{field}.{reason}")]
    Request { field: String, reason: String },
    #[error("cgroup controller {0} is not mounted on this host")]
    NoController(&'static str),
    #[error("cgroup {0} does not exist")]
    NotFound(String),
    #[error("no cgroup hierarchy is mounted: {0}")]
    Detect(String),
    #[error("cgroup path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error(
        "cgroup driver \"systemd\": systemd does not answer at {} (is systemd the init \
         system? if not, set [cgroup] driver = \"cgroupfs\", and kubelet's cgroupDriver to match)",
        socket.display()
    )]
    SystemdUnreachable {
        socket: PathBuf,
        #[source]
        source: dbus::DbusError,
    },
    #[error("systemd unit {unit}")]
    Systemd {
        unit: String,
        #[source]
        source: dbus::DbusError,
    },
    #[error("systemd unit {unit}: start job ended {result:?}")]
    UnitStart { unit: String, result: String },
    /// Something of crius's own went wrong (not the request, not the host).
    #[error("{0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, CgroupError>;

impl CgroupError {
    /// Whether the request's values are at fault (the kernel refused them or they cannot fit a
    /// cgroup at all) rather than the host.
    pub fn is_invalid_value(&self) -> bool {
        match self {
            CgroupError::Invalid(_) | CgroupError::Request { .. } => true,
            CgroupError::Write { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::EINVAL | libc::ERANGE | libc::EBUSY | libc::ENOSPC | libc::EOVERFLOW)
            ),
            _ => false,
        }
    }
}

/// Who manages pod and container cgroups in this process, set once at start by [`init`];
/// cgroupfs until then (and in unit tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd(manager::Systemd),
}

static DRIVER: OnceLock<Driver> = OnceLock::new();

/// The driver [`init`] set up.
pub fn driver() -> &'static Driver {
    DRIVER.get_or_init(|| Driver::Cgroupfs)
}

/// Sets up the configured driver; call once at start, before any pod. With `systemd` this
/// connects to systemd's manager at `[cgroup] systemd_socket`: when nothing answers there
/// crius refuses to start, naming the socket, rather than fail on every pod.
pub fn init(config: &CgroupConfig) -> Result<()> {
    let d = match config.driver {
        CgroupDriver::Cgroupfs => Driver::Cgroupfs,
        CgroupDriver::Systemd => {
            let sd = manager::Systemd::connect(&config.systemd_socket)?;
            tracing::info!(
                socket = %config.systemd_socket.display(),
                root = %sd.root(),
                "cgroup driver systemd"
            );
            Driver::Systemd(sd)
        }
    };
    match DRIVER.set(d.clone()) {
        Ok(()) => Ok(()),
        Err(_) if *driver() == d => Ok(()),
        Err(_) => Err(CgroupError::Invalid(
            "the cgroup driver was already set up differently in this process".to_string(),
        )),
    }
}

/// The pod cgroup (a cgroupfs path) for kubelet's `cgroup_parent`: with cgroupfs crius's own
/// `crius-<pod-id>` below the parent, else `/crius/<pod-id>`; with systemd crius's own slice
/// below the parent's (kubelet sends `kubepods-besteffort-pod<uid>.slice`), else
/// `crius-<pod-id>.slice` in `crius.slice`, expanded below systemd's root cgroup. A parent that
/// is no slice is refused under systemd.
///
/// The pod's limits go on a cgroup crius makes and removes with the pod, never on the parent
/// the client named: that one may be shared (`/system.slice`, kubelet's QoS level) and would
/// keep the pod's memory and CPU limits after the pod is gone.
pub fn pod_cgroup(cgroup_parent: &str, pod_id: &str) -> Result<String> {
    pod_cgroup_with(driver(), cgroup_parent, pod_id)
}

pub(crate) fn pod_cgroup_with(
    driver: &Driver,
    cgroup_parent: &str,
    pod_id: &str,
) -> Result<String> {
    match driver {
        Driver::Cgroupfs if cgroup_parent.is_empty() => Ok(format!("{CRIUS_PARENT}/{pod_id}")),
        Driver::Cgroupfs => {
            let parent = cgroup_parent.trim_matches('/');
            if parent.split('/').any(|c| c == "..") {
                return Err(CgroupError::BadPath {
                    path: crate::util::excerpt(cgroup_parent).into_owned(),
                    reason: "`..` is not allowed",
                });
            }
            Ok(match parent {
                "" => format!("/{}", own_pod_cgroup_name(pod_id)),
                _ => format!("/{parent}/{}", own_pod_cgroup_name(pod_id)),
            })
        }
        Driver::Systemd(sd) => {
            let slice = systemd::pod_slice(cgroup_parent, pod_id)?;
            Ok(format!("{}{}", sd.root(), systemd::expand_slice(&slice)?))
        }
    }
}

/// The name of the cgroup crius makes for a pod below a client's `cgroup_parent`.
fn own_pod_cgroup_name(pod_id: &str) -> String {
    format!("crius-{pod_id}")
}

/// Whether `pod_cgroup`, the cgroup of pod `pod_id`, is one crius made for it (and so removes
/// with it): `/crius/<pod-id>`, crius's own slice, or `crius-<pod-id>` below a client's parent.
pub fn pod_cgroup_is_own(pod_cgroup: &str, pod_id: &str) -> bool {
    owned_by_crius(pod_cgroup)
        || pod_cgroup.trim_end_matches('/').rsplit('/').next() == Some(&own_pod_cgroup_name(pod_id))
}

/// The longest `cgroup_parent` taken: far more than any real hierarchy needs, and short enough
/// that a cgroup path below it stays within `PATH_MAX` under `/sys/fs/cgroup/<controller>`.
pub const MAX_CGROUP_PARENT_BYTES: usize = 2048;

/// Checks a request's `cgroup_parent` before anything is made: no NUL or line break, no `.`
/// or `..` component (it must not leave the hierarchy), no component longer than a file name
/// may be, at most [`MAX_CGROUP_PARENT_BYTES`]. The error names `field`.
pub fn check_cgroup_parent(field: &str, value: &str) -> std::result::Result<(), String> {
    let bad = |why: &str| Err(format!("{field} {:?} {why}", crate::util::excerpt(value)));
    if value.len() > MAX_CGROUP_PARENT_BYTES {
        return bad(&format!("is longer than {MAX_CGROUP_PARENT_BYTES} bytes"));
    }
    if value.contains(['\0', '\n', '\r']) {
        return bad("contains a NUL byte or a line break");
    }
    for part in value.split('/') {
        if part == "." || part == ".." {
            return bad("has a `.` or `..` component");
        }
        if part.len() > 255 {
            return bad("has a component longer than 255 bytes");
        }
    }
    Ok(())
}

/// A container's cgroup below its pod's: `<pod>/<id>` with cgroupfs, as containerd lays them
/// out; `<pod slice>/crius-<id>.scope` with systemd.
pub fn container_cgroup(pod_cgroup: &str, container_id: &str) -> String {
    let driver = match driver() {
        Driver::Cgroupfs => CgroupDriver::Cgroupfs,
        Driver::Systemd(_) => CgroupDriver::Systemd,
    };
    container_cgroups_path(driver, pod_cgroup, container_id)
}

/// [`container_cgroup`] under `driver`: the OCI `linux.cgroupsPath` of a container (or the pause
/// container) of a pod whose cgroup is `pod_cgroup`, a cgroupfs path with either driver.
pub fn container_cgroups_path(
    driver: CgroupDriver,
    pod_cgroup: &str,
    container_id: &str,
) -> String {
    let pod = pod_cgroup.trim_end_matches('/');
    match driver {
        CgroupDriver::Cgroupfs => format!("{pod}/{container_id}"),
        CgroupDriver::Systemd => format!("{pod}/{}", systemd::scope_name(container_id)),
    }
}

/// The cgroupfs path (absolute, relative to a hierarchy's root) of a cgroup named in any of
/// the forms above: a cgroupfs path as is, a systemd slice name or `slice:prefix:name` expanded.
/// Refuses `..` components, which would leave the hierarchy.
pub fn fs_path(cgroup: &str) -> Result<String> {
    let path = if cgroup.starts_with('/') {
        cgroup.trim_end_matches('/').to_string()
    } else if cgroup.contains(':') {
        systemd::to_fs_path(cgroup)?
    } else if cgroup.ends_with(".slice") {
        systemd::expand_slice(cgroup)?
    } else {
        format!("/{}", cgroup.trim_end_matches('/'))
    };
    if path.split('/').any(|c| c == "..") {
        return Err(CgroupError::BadPath {
            path: cgroup.to_string(),
            reason: "`..` is not allowed",
        });
    }
    Ok(if path.is_empty() {
        "/".to_string()
    } else {
        path
    })
}

/// Whether crius created this pod cgroup (and so must remove it): `/crius/<pod-id>`, a
/// `crius-<pod-id>.slice` (by name or path) inside `crius.slice`, or the slice crius makes for a
/// pod below a client's slice (`<parent>-crius<pod-id>.slice`).
pub fn owned_by_crius(pod_cgroup: &str) -> bool {
    if pod_cgroup.starts_with(&format!("{CRIUS_PARENT}/")) {
        return true;
    }
    let mut parts = pod_cgroup.trim_end_matches('/').rsplit('/');
    let last = parts.next().unwrap_or("");
    systemd::own_slice_pod_id(last, parts.next()).is_some()
}

/// The systemd unit crius made for this cgroup, when the driver is systemd: a container's
/// `crius-<id>.scope`, or a pod slice crius owns (kubelet's slices are kubelet's).
fn own_unit(cgroup: &str) -> Option<(&'static manager::Systemd, &str)> {
    let Driver::Systemd(sd) = driver() else {
        return None;
    };
    let unit = systemd::unit_of(cgroup)?;
    let ours = if unit.ends_with(".scope") {
        unit.starts_with(&format!("{}-", systemd::SCOPE_PREFIX))
    } else {
        owned_by_crius(cgroup)
    };
    ours.then_some((sd, unit))
}

/// With the systemd driver: puts the just-created container `id` (its init process `pid`,
/// not yet started) of the pod whose cgroup is `pod_cgroup` into its transient scope, made in
/// the pod's slice (and the pod's own slice first, when crius owns it) with the limits
/// libcontainer wrote. Call it right after the shim created the container, before it starts.
/// Nothing to do with cgroupfs.
pub async fn attach(pod_cgroup: &str, id: &str, pid: i32) -> Result<()> {
    let Driver::Systemd(sd) = driver() else {
        return Ok(());
    };
    let pid = u32::try_from(pid)
        .map_err(|_| CgroupError::Internal(format!("container {id}: no process (pid {pid})")))?;
    let (pod, owned_id) = (pod_cgroup.to_string(), id.to_string());
    tokio::task::spawn_blocking(move || attach_scope(sd, &pod, &owned_id, pid))
        .await
        .map_err(|e| CgroupError::Internal(format!("container {id}: attach to systemd: {e}")))?
}

fn attach_scope(sd: &manager::Systemd, pod_cgroup: &str, id: &str, pid: u32) -> Result<()> {
    let hierarchy = Hierarchy::host()?;
    let mode = hierarchy.mode();
    let cgroup = container_cgroups_path(CgroupDriver::Systemd, pod_cgroup, id);
    let slice = systemd::unit_of(pod_cgroup)
        .filter(|u| u.ends_with(".slice"))
        .ok_or_else(|| CgroupError::BadPath {
            path: pod_cgroup.to_string(),
            reason: "the systemd driver needs a pod slice",
        })?;
    if let Some(pod_id) = systemd::own_slice_pod_id(slice, None) {
        sd.start_transient(slice, &systemd::slice_properties(pod_id, mode), true)?;
    }
    // What libcontainer wrote from the spec; the scope gets the same values.
    let limits = hierarchy.read(&cgroup)?;
    let scope = systemd::scope_name(id);
    let props = systemd::scope_properties(id, slice, pid, &limits, mode)?;
    sd.start_transient(&scope, &props, false)?;
    rejoin(&cgroup, pid)?;
    // systemd wrote its values (and defaults for what it was not told) into the controllers
    // it manages: put libcontainer's back, the ones systemd cannot express included.
    hierarchy.apply_files(&cgroup, &limits)
}

/// Moves `pid` into `cgroup` in every hierarchy where that cgroup exists (libcontainer made
/// them): systemd puts a scope's processes into the scope only for the controllers it manages
/// and into the nearest ancestor it manages for the others.
fn rejoin(cgroup: &str, pid: u32) -> Result<()> {
    let rel = fs_path(cgroup)?;
    let rel = rel.trim_start_matches('/');
    for h in hierarchies() {
        let procs = h.join(rel).join("cgroup.procs");
        if !procs.exists() {
            continue;
        }
        write_file(&procs, &pid.to_string()).map_err(|source| CgroupError::Write {
            path: procs.clone(),
            value: pid.to_string(),
            source,
        })?;
    }
    Ok(())
}

/// Makes the directories of a container's cgroup (`container_cgroup(pod_cgroup, id)`) in the
/// v1 hierarchies libcontainer will put it in, ahead of its create: on a v1 host the helper's
/// intermediate process spent about a fifth of its time in those `mkdir`s (nine hierarchies
/// here), on the create's path, where crius can make them beside the rootfs. libcontainer
/// makes a missing one as before and takes an existing one as is; the container's removal
/// removes them in every hierarchy, and the pod's removal whatever is below the pod. Only with
/// the cgroupfs driver on v1; anything that fails is left to libcontainer.
pub fn make_container_dirs_ahead(pod_cgroup: &str, id: &str) {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    if !matches!(driver(), Driver::Cgroupfs)
        || !Hierarchy::host().is_ok_and(|h| h.mode() == Mode::V1)
    {
        return;
    }
    let roots = DIRS.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        crius_common::mountinfo::distinct_mounts(&crius_common::mountinfo::libcontainer_v1_mounts(
            &info,
        ))
    });
    let cgroup = container_cgroup(pod_cgroup, id);
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c == "..") {
        return;
    }
    for root in roots {
        let dir = root.join(rel);
        if let Err(e) = std::fs::create_dir(&dir) {
            tracing::debug!(dir = %dir.display(), "make a container's cgroup ahead: {e}");
        }
    }
}

/// Every cgroup hierarchy mounted on this host (each v1 controller and the v2 tree).
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    cgroup_mounts(&info)
        .into_iter()
        .map(|m| m.mount_point)
        .collect()
}

/// One cgroup filesystem in the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    mount_point: PathBuf,
    /// `cgroup2`, or `cgroup` (v1).
    fstype: String,
    /// v1 controllers of the hierarchy (from the super options), e.g. `["cpu", "cpuacct"]`.
    controllers: Vec<String>,
}

/// The cgroup mounts listed in the text of `/proc/self/mountinfo`.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    crius_common::mountinfo::mounts(mountinfo)
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| {
            let controllers = if m.fs_type == "cgroup" {
                m.super_options
                    .split(',')
                    .filter(|o| v1::CONTROLLERS.contains(o))
                    .map(str::to_string)
                    .collect()
            } else {
                Vec::new()
            };
            CgroupMount {
                mount_point: m.mount_point,
                fstype: m.fs_type.to_string(),
                controllers,
            }
        })
        .collect()
}

/// Removes `cgroup` (an absolute cgroup path, or a systemd name [`fs_path`] expands) and
/// everything below it in every hierarchy, leaf first. A cgroup that still has processes cannot
/// be removed: that is reported, the rest is still removed. Missing directories are fine.
/// With the systemd driver the unit crius made for it (a container's scope, a pod slice crius
/// owns) is stopped first, on a blocking thread (a D-Bus round trip); systemd forgets a
/// transient unit once it is stopped. With cgroupfs nothing is awaited.
pub async fn remove(cgroup: &str) -> std::result::Result<(), std::io::Error> {
    let path = fs_path(cgroup)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return Ok(());
    }
    if let Some((sd, unit)) = own_unit(&path) {
        let unit = unit.to_string();
        let stop = tokio::task::spawn_blocking(move || {
            if let Err(e) = sd.stop(&unit) {
                tracing::warn!("stop {unit}: {}", crius_common::error_chain(&e));
            }
        });
        if let Err(e) = stop.await {
            tracing::warn!("stop the unit of {path}: {e}");
        }
    }
    let mut first_err = None;
    for h in hierarchies() {
        if let Err(e) = remove_tree(&h.join(rel)) {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn remove_tree(dir: &Path) -> std::result::Result<(), std::io::Error> {
    crius_common::fs::remove_dir_tree(dir).map_err(|(at, e)| {
        std::io::Error::new(e.kind(), format!("remove cgroup {}: {e}", at.display()))
    })
}

/// Removes crius's own parent cgroup when no pod is left in it (best effort: a pod created
/// at the same moment keeps it).
pub fn remove_parent_if_empty() {
    for h in hierarchies() {
        let _ = std::fs::remove_dir(h.join(CRIUS_PARENT.trim_start_matches('/')));
    }
}

/// Which cgroup version a [`Hierarchy`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One hierarchy per controller (also a hybrid host, whose v2 tree has no controllers).
    V1,
    /// The unified hierarchy.
    V2,
}

/// The cgroup filesystems of a host, able to apply limits to a cgroup, read them back and read
/// its usage. Cgroups are named by their cgroupfs path (see [`fs_path`]).
#[derive(Debug, Clone)]
pub enum Hierarchy {
    V1(v1::V1),
    V2(v2::V2),
}

impl Hierarchy {
    /// This host's cgroups, detected once from the mount table.
    pub fn host() -> Result<&'static Hierarchy> {
        static HOST: OnceLock<std::result::Result<Hierarchy, String>> = OnceLock::new();
        HOST.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/self/mountinfo")
                .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
            Hierarchy::from_mountinfo(&info).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CgroupError::Detect(e.clone()))
    }

    /// The hierarchy described by the text of `/proc/self/mountinfo`: v2 when
    /// `/sys/fs/cgroup` is cgroup2, else the v1 controllers, else a cgroup2 mounted elsewhere.
    pub fn from_mountinfo(mountinfo: &str) -> Result<Hierarchy> {
        let mounts = cgroup_mounts(mountinfo);
        let unified = |m: &&CgroupMount| m.fstype == "cgroup2";
        if let Some(m) = mounts
            .iter()
            .filter(unified)
            .find(|m| m.mount_point == Path::new("/sys/fs/cgroup"))
        {
            return Ok(Hierarchy::V2(v2::V2::new(&m.mount_point)));
        }
        // A controller can be mounted more than once: CRIU mounts the hierarchies again in a
        // directory of its own while it restores (`.criu.cgyard.*`). The host's mount (below
        // /sys/fs/cgroup) wins, else the first one listed.
        let mut controllers: HashMap<String, PathBuf> = HashMap::new();
        for m in mounts.iter().filter(|m| m.fstype == "cgroup") {
            let host = m.mount_point.parent() == Some(Path::new("/sys/fs/cgroup"));
            for c in &m.controllers {
                let known = controllers
                    .get(c)
                    .is_some_and(|p| p.parent() == Some(Path::new("/sys/fs/cgroup")));
                if !controllers.contains_key(c) || (host && !known) {
                    controllers.insert(c.clone(), m.mount_point.clone());
                }
            }
        }
        if !controllers.is_empty() {
            return Ok(Hierarchy::V1(v1::V1::new(controllers)));
        }
        match mounts.iter().find(unified) {
            Some(m) => Ok(Hierarchy::V2(v2::V2::new(&m.mount_point))),
            None => Err(CgroupError::Detect(
                "no cgroup or cgroup2 filesystem in /proc/self/mountinfo".to_string(),
            )),
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            Hierarchy::V1(_) => Mode::V1,
            Hierarchy::V2(_) => Mode::V2,
        }
    }

    /// Whether this host has `controller` (`hugetlb`, `cpuset`, …): mounted on v1, listed in
    /// the root's `cgroup.controllers` on v2. libcontainer refuses to create a container whose
    /// spec sets limits of a missing controller (e.g. hugepage limits without hugetlb).
    pub fn has_controller(&self, controller: &str) -> bool {
        match self {
            Hierarchy::V1(h) => h.mount(controller).is_some(),
            Hierarchy::V2(h) => h.has_controller(controller),
        }
    }

    /// The text of `cgroup`'s file `name`, which on v1 lives in `controller`'s hierarchy;
    /// None when that is not mounted or the file cannot be read.
    pub fn file(&self, controller: &str, cgroup: &str, name: &str) -> Option<String> {
        let dir = match self {
            Hierarchy::V1(h) => h.dir(controller, cgroup)?,
            Hierarchy::V2(h) => h.dir(cgroup),
        };
        std::fs::read_to_string(dir.join(name)).ok()
    }

    /// Whether the cgroup exists (in the memory hierarchy on v1).
    pub fn exists(&self, cgroup: &str) -> bool {
        match self {
            Hierarchy::V1(h) => h.exists(cgroup),
            Hierarchy::V2(h) => h.exists(cgroup),
        }
    }

    /// Writes every set field of `r` into the existing cgroup, all or nothing: the values are
    /// checked first, each file's old value is read before it is written, and when the kernel
    /// refuses a value the files already written get their old values back. Zero and empty
    /// fields are left as they are (CRI's "not set"); `oom_score_adj` is a process setting and
    /// is ignored here.
    ///
    /// With the systemd driver the unit crius made for the cgroup (a container's scope, a pod
    /// slice crius owns) gets the same values as properties afterwards, so that systemd keeps
    /// them; the files hold them already, so a refusal there is only logged.
    pub fn apply(&self, cgroup: &str, r: &LinuxContainerResources) -> Result<()> {
        self.apply_files(cgroup, r)?;
        if let Some((sd, unit)) = own_unit(cgroup) {
            let synced = systemd::resource_properties(r, self.mode())
                .and_then(|props| sd.set_properties(unit, &props));
            if let Err(e) = synced {
                tracing::warn!(
                    "set the properties of {unit}: {}",
                    crius_common::error_chain(&e)
                );
            }
        }
        Ok(())
    }

    /// [`Hierarchy::apply`] to the cgroup files only.
    pub fn apply_files(&self, cgroup: &str, r: &LinuxContainerResources) -> Result<()> {
        validate(r, self.mode())?;
        if !self.exists(cgroup) {
            return Err(CgroupError::NotFound(cgroup.to_string()));
        }
        let mut tx = Transaction::default();
        let result = match self {
            Hierarchy::V1(h) => h.apply(&mut tx, cgroup, r),
            Hierarchy::V2(h) => h.apply(&mut tx, cgroup, r),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                tx.rollback();
                Err(e)
            }
        }
    }

    /// The limits in force in the cgroup, in CRI terms (unlimited reads as 0, "not set";
    /// an unlimited CPU quota as -1). `unified` stays empty.
    pub fn read(&self, cgroup: &str) -> Result<LinuxContainerResources> {
        if !self.exists(cgroup) {
            return Err(CgroupError::NotFound(cgroup.to_string()));
        }
        match self {
            Hierarchy::V1(h) => h.read(cgroup),
            Hierarchy::V2(h) => h.read(cgroup),
        }
    }

    /// Usage of the cgroup and everything below it.
    pub fn stats(&self, cgroup: &str) -> Result<CgroupStats> {
        if !self.exists(cgroup) {
            return Err(CgroupError::NotFound(cgroup.to_string()));
        }
        match self {
            Hierarchy::V1(h) => h.stats(cgroup),
            Hierarchy::V2(h) => h.stats(cgroup),
        }
    }
}

/// Where the freezer is with a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezerState {
    Thawed,
    /// Asked to freeze, some task not stopped yet.
    Freezing,
    Frozen,
}

impl Hierarchy {
    /// Asks the freezer to freeze or thaw the cgroup (and everything below it); see
    /// [`Hierarchy::freeze`] to wait for the freeze.
    pub fn set_frozen(&self, cgroup: &str, frozen: bool) -> Result<()> {
        match self {
            Hierarchy::V1(h) => h.set_frozen(cgroup, frozen),
            Hierarchy::V2(h) => h.set_frozen(cgroup, frozen),
        }
    }

    /// The directory of the cgroup that holds its freezer's files (what CRIU's
    /// `freeze-cgroup` names); `None` on a v1 host without the freezer.
    pub fn freezer_dir(&self, cgroup: &str) -> Option<PathBuf> {
        match self {
            Hierarchy::V1(h) => h.dir("freezer", cgroup),
            Hierarchy::V2(h) => Some(h.dir(cgroup)),
        }
    }

    pub fn freezer_state(&self, cgroup: &str) -> Result<FreezerState> {
        match self {
            Hierarchy::V1(h) => h.freezer_state(cgroup),
            Hierarchy::V2(h) => h.freezer_state(cgroup),
        }
    }

    /// Freezes the cgroup and waits until every task in it is frozen, at most until `until`:
    /// true once frozen; false (and the cgroup thawed again) if it was not by then. A v1
    /// cgroup can stay `FREEZING` while a task sleeps where the freezer cannot reach it, so
    /// the freeze is asked again every 100 ms, as CRIU does.
    pub async fn freeze(&self, cgroup: &str, until: std::time::Instant) -> Result<bool> {
        const POLL: std::time::Duration = std::time::Duration::from_millis(5);
        self.set_frozen(cgroup, true)?;
        let mut round = 0u32;
        loop {
            if self.freezer_state(cgroup)? == FreezerState::Frozen {
                return Ok(true);
            }
            if std::time::Instant::now() >= until {
                self.set_frozen(cgroup, false)?;
                return Ok(false);
            }
            round += 1;
            if round.is_multiple_of(20) && self.mode() == Mode::V1 {
                self.set_frozen(cgroup, true)?;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// What a cgroup has used. A field is `None` when this host cannot tell (controller not
/// mounted or not enabled, an old kernel without the file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// CPU time of all its tasks, nanoseconds (v1 `cpuacct.usage`, v2 `cpu.stat` usage_usec).
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemoryStats>,
    /// Tasks (threads) in it (`pids.current`).
    pub pids: Option<u64>,
}

/// Memory of a cgroup, in bytes unless said otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub usage: u64,
    /// `usage - inactive_file` (not below 0), as kubelet and cAdvisor define it.
    pub working_set: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub rss: u64,
    /// Page fault counts.
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// `None` when unlimited.
    pub limit: Option<u64>,
    pub swap_usage: Option<u64>,
    /// Swap the cgroup may use (v2 `memory.swap.max`; v1 memsw limit minus memory limit);
    /// `None` when unlimited or unknown.
    pub swap_limit: Option<u64>,
    /// Times the OOM killer was invoked for the cgroup (v2 `memory.events` oom; v1 has no such
    /// counter: same as `oom_kills`).
    pub oom_events: Option<u64>,
    /// Processes the OOM killer killed in it (`oom_kill`, kernels from 4.13 on v1).
    pub oom_kills: Option<u64>,
}

impl MemoryStats {
    /// Limit minus working set, when there is a limit.
    pub fn available(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.working_set))
    }
}

/// Values at or above this are "no limit" (the kernel reports its page-counter maximum, e.g.
/// 9223372036854771712 on v1).
const UNLIMITED: u64 = 1 << 62;

pub(crate) fn limit_or_none(v: u64) -> Option<u64> {
    (v < UNLIMITED).then_some(v)
}

/// The smallest memory limit accepted (Docker's floor): a container below it cannot even start
/// its first process, and the failure would come from deep inside the kernel or the runtime.
pub const MIN_MEMORY_LIMIT: i64 = 6 << 20;

/// Checks the resources of a request (RunPodSandbox's resources and overhead, CreateContainer,
/// UpdateContainerResources) before anything is created: one set of rules for every RPC, the
/// error ([`CgroupError::Request`]) naming the field (`field` is where `r` sits in the request).
pub fn check_resources(field: &str, r: &LinuxContainerResources) -> Result<()> {
    let refused = |reason: String| CgroupError::Request {
        field: field.to_string(),
        reason,
    };
    let mode = Hierarchy::host().map(Hierarchy::mode).unwrap_or(Mode::V2);
    validate(r, mode).map_err(|e| refused(e.to_string()))?;
    for (name, set, online) in [
        ("cpuset_cpus", &r.cpuset_cpus, ONLINE_CPUS),
        ("cpuset_mems", &r.cpuset_mems, ONLINE_NODES),
    ] {
        if let Some(missing) = not_online(set, online) {
            return Err(refused(format!(
                "{name} {:?} names {missing}, which this node does not have online",
                crate::util::excerpt(set)
            )));
        }
    }
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return Err(refused(format!(
            "oom_score_adj {} is out of range (-1000 to 1000)",
            r.oom_score_adj
        )));
    }
    if !r.hugepage_limits.is_empty() {
        check_hugepage_sizes(&r.hugepage_limits, &node_hugepage_sizes()).map_err(refused)?;
    }
    check_swap(r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes).map_err(refused)
}

/// Memory and swap together: the kernel refuses a swap limit without a memory limit or below
/// it (v1's `memsw`; v2's `memory.swap.max` is the difference). Checked at the door only: the
/// cgroup layers meet it as the kernel's refusal, which they undo.
fn check_swap(memory: i64, swap: i64) -> std::result::Result<(), String> {
    if swap > 0 && memory <= 0 {
        return Err(format!(
            "memory_swap_limit_in_bytes {swap} needs memory_limit_in_bytes: it limits memory \
             and swap together"
        ));
    }
    if swap > 0 && swap < memory {
        return Err(format!(
            "memory_swap_limit_in_bytes {swap} is below memory_limit_in_bytes {memory}: it \
             limits memory and swap together"
        ));
    }
    Ok(())
}

/// This node's huge page sizes as the hugetlb controller names them (`2MB`, `1GB`), from
/// `/sys/kernel/mm/hugepages`; none when the kernel has no huge pages.
pub fn node_hugepage_sizes() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") else {
        return Vec::new();
    };
    let mut sizes: Vec<u64> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    sizes.sort_unstable();
    sizes.into_iter().map(hugetlb_name).collect()
}

/// The kernel's name of a huge page size of `kib` KiB in hugetlb's files.
fn hugetlb_name(kib: u64) -> String {
    if kib >= 1 << 20 {
        format!("{}GB", kib >> 20)
    } else if kib >= 1 << 10 {
        format!("{}MB", kib >> 10)
    } else {
        format!("{kib}KB")
    }
}

/// Each hugepage limit names a huge page size the node has (kubelet sends one per size of
/// the node's capacity).
fn check_hugepage_sizes(
    limits: &[crius_api::v1::HugepageLimit],
    node: &[String],
) -> std::result::Result<(), String> {
    for (i, h) in limits.iter().enumerate() {
        if !node.contains(&h.page_size) {
            return Err(format!(
                "hugepage_limits[{i}].page_size {:?} is not a huge page size of this node ({})",
                crate::util::excerpt(&h.page_size),
                if node.is_empty() {
                    "it has none".to_owned()
                } else {
                    node.join(", ")
                }
            ));
        }
    }
    Ok(())
}

/// Checks what no cgroup could take before anything is written.
fn validate(r: &LinuxContainerResources, mode: Mode) -> Result<()> {
    let invalid = |m: String| Err(CgroupError::Invalid(m));
    if r.cpu_shares < 0 {
        return invalid(format!("cpu_shares {} is negative", r.cpu_shares));
    }
    if r.cpu_period < 0 {
        return invalid(format!("cpu_period {} is negative", r.cpu_period));
    }
    // The kernel's CFS bounds: a period of 1 ms to 1 s, a quota of at least 1 ms.
    if r.cpu_period != 0 && !(1000..=1_000_000).contains(&r.cpu_period) {
        return invalid(format!(
            "cpu_period {} is out of range (1000 to 1000000 microseconds)",
            r.cpu_period
        ));
    }
    if r.cpu_quota < -1 {
        return invalid(format!(
            "cpu_quota {} is negative (only -1, unlimited, is allowed)",
            r.cpu_quota
        ));
    }
    if r.cpu_quota > 0 && !(1000..=(1 << 44)).contains(&r.cpu_quota) {
        return invalid(format!(
            "cpu_quota {} is out of range (at least 1000 microseconds)",
            r.cpu_quota
        ));
    }
    if r.memory_limit_in_bytes > 0 && r.memory_limit_in_bytes < MIN_MEMORY_LIMIT {
        return invalid(format!(
            "memory_limit_in_bytes {} is below the minimum of {MIN_MEMORY_LIMIT}",
            r.memory_limit_in_bytes
        ));
    }
    if r.memory_limit_in_bytes < -1 {
        return invalid(format!(
            "memory_limit_in_bytes {} is negative (only -1, unlimited, is allowed)",
            r.memory_limit_in_bytes
        ));
    }
    if r.memory_swap_limit_in_bytes < -1 {
        return invalid(format!(
            "memory_swap_limit_in_bytes {} is negative (only -1, unlimited, is allowed)",
            r.memory_swap_limit_in_bytes
        ));
    }
    for h in &r.hugepage_limits {
        if h.page_size.is_empty()
            || h.page_size.len() > 16
            || !h.page_size.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return invalid(format!(
                "hugepage_limits: invalid page size {:?}",
                crate::util::excerpt(&h.page_size)
            ));
        }
    }
    // cpuset syntax: comma-separated numbers and ranges, bounded.
    for (name, set) in [
        ("cpuset_cpus", &r.cpuset_cpus),
        ("cpuset_mems", &r.cpuset_mems),
    ] {
        if !set.is_empty() && !is_cpu_list(set) {
            return invalid(format!(
                "{name} {:?} is not a list of numbers and ranges such as 0-3,5",
                crate::util::excerpt(set)
            ));
        }
    }
    if !r.unified.is_empty() && mode == Mode::V1 {
        let mut keys: Vec<&String> = r.unified.keys().collect();
        keys.sort();
        return invalid(format!(
            "unified {keys:?}: cgroup v2 settings cannot be applied on this cgroup v1 host"
        ));
    }
    for key in r.unified.keys() {
        if key.is_empty()
            || key.contains('/')
            || key.starts_with('.')
            || !key.contains('.')
            || matches!(
                key.as_str(),
                "cgroup.procs" | "cgroup.threads" | "cgroup.subtree_control" | "cgroup.kill"
            )
        {
            return invalid(format!(
                "unified key {:?} is not a cgroup setting",
                crate::util::excerpt(key)
            ));
        }
    }
    Ok(())
}

/// Whether `set` is a Linux cpu list (`0-3,5,7-8`) of at most 1,024 bytes and numbers below
/// 65,536, in increasing ranges.
/// The node's online CPUs and memory nodes, as cpuset lists. A node without NUMA support has
/// no node directory and one memory node, 0.
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";
const ONLINE_NODES: &str = "/sys/devices/system/node/online";

/// The ranges of a list such as `0-3,5` (already checked by [`is_cpu_list`]).
fn cpu_ranges(set: &str) -> Vec<(u32, u32)> {
    set.split(',')
        .filter_map(|part| match part.trim().split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => part.trim().parse().ok().map(|n| (n, n)),
        })
        .collect()
}

/// The first CPU (or memory node) of `set` that is not in the list the file `online` holds, as
/// text; None when all are there, `set` is empty, or the file cannot be read.
fn not_online(set: &str, online: &str) -> Option<String> {
    if set.is_empty() {
        return None;
    }
    let have = match std::fs::read_to_string(online) {
        Ok(text) => cpu_ranges(text.trim()),
        Err(_) if online == ONLINE_NODES => vec![(0, 0)],
        Err(_) => return None,
    };
    first_missing(&cpu_ranges(set), &have).map(|n| n.to_string())
}

fn first_missing(want: &[(u32, u32)], have: &[(u32, u32)]) -> Option<u32> {
    want.iter()
        .flat_map(|&(a, b)| a..=b)
        .find(|n| !have.iter().any(|&(lo, hi)| (lo..=hi).contains(n)))
}

fn is_cpu_list(set: &str) -> bool {
    let num = |t: &str| -> Option<u32> {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u32>().ok())
            .flatten()
            .filter(|n| *n < 65_536)
    };
    set.len() <= 1024
        && set.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => matches!((num(a), num(b)), (Some(a), Some(b)) if a <= b),
            None => num(part).is_some(),
        })
}

/// Writes to cgroup files that can be undone: each file's old content is read before its
/// first write, and [`Transaction::rollback`] writes those back, newest first (so a v1 memory
/// limit and memsw limit are restored in an order the kernel accepts).
#[derive(Debug, Default)]
pub(crate) struct Transaction {
    undo: Vec<(PathBuf, String)>,
}

impl Transaction {
    /// Writes `value` to `path`; the error names both.
    pub(crate) fn write(&mut self, path: PathBuf, value: &str) -> Result<()> {
        // A file that cannot be read (write-only, e.g. memory.reclaim) has nothing to restore.
        let old = std::fs::read_to_string(&path).ok();
        write_file(&path, value).map_err(|source| CgroupError::Write {
            path: path.clone(),
            value: value.to_string(),
            source,
        })?;
        if let Some(old) = old {
            self.undo
                .push((path, old.trim_end_matches('\n').to_string()));
        }
        Ok(())
    }

    /// Puts the old values back, newest first; failures are logged, the rest still restored.
    pub(crate) fn rollback(self) {
        for (path, old) in self.undo.into_iter().rev() {
            if let Err(e) = write_file(&path, &old) {
                tracing::error!(
                    "restore {} to {old:?} after a failed update: {e}",
                    path.display()
                );
            }
        }
    }
}

/// One write(2) of `value` to an existing cgroup file (O_TRUNC as runc opens them, which also
/// makes the fake trees of the tests behave). An empty value is written as a newline (an empty
/// write would not reach the kernel handler).
pub(crate) fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    let data = if value.is_empty() { "\n" } else { value };
    f.write_all(data.as_bytes())
}

pub(crate) fn read_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| CgroupError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// The content of a file that may be missing (a controller the kernel lacks).
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(crate) fn parse<T: std::str::FromStr>(path: &Path, text: &str) -> Result<T> {
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        value: text.to_string(),
    })
}

pub(crate) fn read_u64(path: &Path) -> Result<u64> {
    parse(path, &read_string(path)?)
}

pub(crate) fn read_u64_optional(path: &Path) -> Result<Option<u64>> {
    read_optional(path)?.map(|t| parse(path, &t)).transpose()
}

/// A "flat keyed" file (`memory.stat`, `cpu.stat`, `memory.events`): `key value` per line.
/// Lines whose value is not a number are skipped.
pub(crate) fn flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// `new` over `old` as `UpdateContainerResources` means it (containerd's reading): a zero or
/// empty field keeps the old value; hugepage limits replace those of the same page size;
/// unified keys are added or replaced one by one. `oom_score_adj` keeps the old value: it
/// belongs to the process and is not changed by an update.
pub fn merge_resources(
    old: &LinuxContainerResources,
    new: &LinuxContainerResources,
) -> LinuxContainerResources {
    let pick = |n: i64, o: i64| if n != 0 { n } else { o };
    let pick_str = |n: &String, o: &String| if n.is_empty() { o.clone() } else { n.clone() };
    let mut hugepage_limits = old.hugepage_limits.clone();
    for h in &new.hugepage_limits {
        match hugepage_limits
            .iter_mut()
            .find(|o| o.page_size == h.page_size)
        {
            Some(o) => o.limit = h.limit,
            None => hugepage_limits.push(h.clone()),
        }
    }
    let mut unified = old.unified.clone();
    unified.extend(new.unified.iter().map(|(k, v)| (k.clone(), v.clone())));
    LinuxContainerResources {
        cpu_period: pick(new.cpu_period, old.cpu_period),
        cpu_quota: pick(new.cpu_quota, old.cpu_quota),
        cpu_shares: pick(new.cpu_shares, old.cpu_shares),
        memory_limit_in_bytes: pick(new.memory_limit_in_bytes, old.memory_limit_in_bytes),
        memory_swap_limit_in_bytes: pick(
            new.memory_swap_limit_in_bytes,
            old.memory_swap_limit_in_bytes,
        ),
        oom_score_adj: old.oom_score_adj,
        cpuset_cpus: pick_str(&new.cpuset_cpus, &old.cpuset_cpus),
        cpuset_mems: pick_str(&new.cpuset_mems, &old.cpuset_mems),
        hugepage_limits,
        unified,
    }
}

/// The CFS period assumed when a quota comes without one (the kernel's default).
pub const DEFAULT_CPU_PERIOD: i64 = 100_000;

/// The limits of a pod cgroup from `PodSandboxConfig.linux`: `resources` (the sum of the
/// containers' resources, as kubelet computes it) plus `overhead` (what the sandbox itself
/// costs). A limit the containers leave unlimited stays unlimited: the overhead only raises
/// existing limits; shares and hugepage limits add up; an overhead quota is converted to the
/// resources' period. cpuset and unified come from `resources`.
pub fn pod_limits(
    resources: Option<&LinuxContainerResources>,
    overhead: Option<&LinuxContainerResources>,
) -> LinuxContainerResources {
    let zero = LinuxContainerResources::default();
    let r = resources.unwrap_or(&zero);
    let o = overhead.unwrap_or(&zero);
    let mut out = LinuxContainerResources {
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        unified: r.unified.clone(),
        ..Default::default()
    };
    if r.cpu_shares > 0 || o.cpu_shares > 0 {
        out.cpu_shares = r.cpu_shares.max(0) + o.cpu_shares.max(0);
    }
    if r.cpu_quota > 0 {
        let period = if r.cpu_period > 0 {
            r.cpu_period
        } else {
            DEFAULT_CPU_PERIOD
        };
        let o_period = if o.cpu_period > 0 {
            o.cpu_period
        } else {
            DEFAULT_CPU_PERIOD
        };
        let extra = if o.cpu_quota > 0 {
            // i128: quota * period can exceed i64 for absurd inputs.
            i64::try_from(i128::from(o.cpu_quota) * i128::from(period) / i128::from(o_period))
                .unwrap_or(i64::MAX)
        } else {
            0
        };
        out.cpu_quota = r.cpu_quota.saturating_add(extra);
        out.cpu_period = period;
    } else if r.cpu_quota == -1 {
        out.cpu_quota = -1;
    }
    if r.memory_limit_in_bytes > 0 {
        out.memory_limit_in_bytes = r
            .memory_limit_in_bytes
            .saturating_add(o.memory_limit_in_bytes.max(0));
    } else if r.memory_limit_in_bytes == -1 {
        out.memory_limit_in_bytes = -1;
    }
    if r.memory_swap_limit_in_bytes > 0 {
        out.memory_swap_limit_in_bytes = r
            .memory_swap_limit_in_bytes
            .saturating_add(o.memory_limit_in_bytes.max(0));
    } else if r.memory_swap_limit_in_bytes == -1 {
        out.memory_swap_limit_in_bytes = -1;
    }
    out.hugepage_limits = r.hugepage_limits.clone();
    for h in &o.hugepage_limits {
        if let Some(x) = out
            .hugepage_limits
            .iter_mut()
            .find(|x| x.page_size == h.page_size)
        {
            x.limit = x.limit.saturating_add(h.limit);
        }
    }
    out
}

/// Applies a pod's `linux.resources` + `linux.overhead` (see [`pod_limits`]) to its cgroup
/// (`pod_cgroup` as the pod record holds it). Nothing is written when neither is set. Call it
/// once the pod cgroup exists: in `RunPodSandbox` after the shim has created the pause
/// container (libcontainer makes the pod cgroup as its parent) and before starting it.
pub fn apply_pod_resources(pod_cgroup: &str, config: &PodSandboxConfig) -> Result<()> {
    let linux = config.linux.as_ref();
    let resources = linux.and_then(|l| l.resources.as_ref());
    let overhead = linux.and_then(|l| l.overhead.as_ref());
    if resources.is_none() && overhead.is_none() {
        return Ok(());
    }
    let limits = pod_limits(resources, overhead);
    if limits == LinuxContainerResources::default() {
        return Ok(());
    }
    Hierarchy::host()?.apply(&fs_path(pod_cgroup)?, &limits)
}

#[cfg(test)]
mod tests {
    #[test]
    fn swap_limits_memory_and_swap_together() {
        let r = |memory: i64, swap: i64| LinuxContainerResources {
            memory_limit_in_bytes: memory,
            memory_swap_limit_in_bytes: swap,
            ..Default::default()
        };
        let mib = 1 << 20;
        for ok in [
            r(0, -1),
            r(64 * mib, 64 * mib),
            r(64 * mib, 128 * mib),
            r(0, 0),
        ] {
            check_resources("r", &ok).unwrap();
        }
        for (bad, why) in [
            (r(0, 128 * mib), "needs memory_limit_in_bytes"),
            (r(-1, 128 * mib), "needs memory_limit_in_bytes"),
            (
                r(128 * mib, 64 * mib),
                "is below memory_limit_in_bytes 134217728",
            ),
            (r(64 * mib, -5), "is negative"),
        ] {
            let err = check_resources("r", &bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn hugepage_sizes_are_the_nodes() {
        assert_eq!(hugetlb_name(64), "64KB");
        assert_eq!(hugetlb_name(2048), "2MB");
        assert_eq!(hugetlb_name(1 << 20), "1GB");
        assert_eq!(hugetlb_name(16 << 20), "16GB");
        let node = ["2MB".to_owned(), "1GB".to_owned()];
        let limit = |size: &str| crius_api::v1::HugepageLimit {
            page_size: size.into(),
            limit: 1 << 21,
        };
        assert!(check_hugepage_sizes(&[limit("2MB"), limit("1GB")], &node).is_ok());
        for bad in ["2mb", "2048kB", "bogus", "", "4MB"] {
            let err = check_hugepage_sizes(&[limit(bad)], &node).unwrap_err();
            assert!(err.contains("(2MB, 1GB)"), "{err}");
        }
        let err = check_hugepage_sizes(&[limit("2MB")], &[]).unwrap_err();
        assert!(err.contains("it has none"), "{err}");
    }

    #[test]
    fn cpus_a_node_lacks_are_found() {
        use super::{cpu_ranges, first_missing};
        let have = cpu_ranges("0-3,8");
        assert_eq!(first_missing(&cpu_ranges("0-2,8"), &have), None);
        assert_eq!(first_missing(&cpu_ranges("2-5"), &have), Some(4));
        assert_eq!(first_missing(&cpu_ranges("999"), &have), Some(999));
        assert_eq!(super::not_online("", super::ONLINE_CPUS), None);
        assert_eq!(super::not_online("0", super::ONLINE_CPUS), None);
        assert_eq!(
            super::not_online("65535", super::ONLINE_CPUS).as_deref(),
            Some("65535")
        );
    }

    use super::*;
    use crius_api::v1::{HugepageLimit, LinuxPodSandboxConfig};

    #[test]
    fn pod_cgroup_from_parent_or_own() {
        let fs = Driver::Cgroupfs;
        assert_eq!(pod_cgroup_with(&fs, "", "abc").unwrap(), "/crius/abc");
        // A client's parent keeps its limits: the pod gets its own cgroup below it.
        assert_eq!(
            pod_cgroup_with(&fs, "/kubepods/besteffort/pod1/", "abc").unwrap(),
            "/kubepods/besteffort/pod1/crius-abc"
        );
        assert_eq!(
            pod_cgroup_with(&fs, "kubepods/pod1", "abc").unwrap(),
            "/kubepods/pod1/crius-abc"
        );
        assert_eq!(pod_cgroup_with(&fs, "/", "abc").unwrap(), "/crius-abc");
        assert!(pod_cgroup_with(&fs, "/kubepods/../etc", "abc").is_err());
        assert_eq!(container_cgroup("/crius/abc", "c1"), "/crius/abc/c1");
        assert!(owned_by_crius("/crius/abc"));
        assert!(!owned_by_crius("/kubepods/pod1"));
        assert!(pod_cgroup_is_own("/crius/abc", "abc"));
        assert!(pod_cgroup_is_own("/system.slice/crius-abc", "abc"));
        assert!(!pod_cgroup_is_own("/system.slice", "abc"));
        assert!(!pod_cgroup_is_own("/system.slice/crius-abd", "abc"));
    }

    #[test]
    fn cgroup_parent_checks() {
        for ok in [
            "",
            "/",
            "/kubepods/burstable/pod1",
            "kubepods-pod1.slice",
            "a/b.c/",
        ] {
            assert!(check_cgroup_parent("f", ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("/a/../b".to_string(), "`..`"),
            ("..".to_string(), "`..`"),
            ("/a/./b".to_string(), "`.`"),
            ("/a\0b".to_string(), "NUL"),
            ("/a\nb".to_string(), "line break"),
            (format!("/{}", "x".repeat(256)), "255 bytes"),
            (format!("/{}", "x/".repeat(1 << 19)), "longer than 2048"),
        ] {
            let err = check_cgroup_parent("config.linux.cgroup_parent", &bad).unwrap_err();
            assert!(
                err.contains("config.linux.cgroup_parent") && err.contains(why),
                "{err}"
            );
            assert!(err.len() < 200, "{} bytes", err.len());
        }
    }

    #[test]
    fn remove_tree_takes_nested_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir_all(a.join("b/c")).unwrap();
        remove_tree(&a).unwrap();
        assert!(!a.exists());
        remove_tree(&a).unwrap();
    }

    #[tokio::test]
    async fn the_freezer_is_asked_and_read_on_v1_and_v2() {
        let dir = tempfile::tempdir().unwrap();
        let freezer = dir.path().join("freezer");
        std::fs::create_dir_all(freezer.join("crius/p/c")).unwrap();
        let state = freezer.join("crius/p/c/freezer.state");
        std::fs::write(&state, "THAWED\n").unwrap();
        let v1 = Hierarchy::V1(v1::V1::new(HashMap::from([(
            "freezer".to_string(),
            freezer.clone(),
        )])));
        assert_eq!(
            v1.freezer_dir("/crius/p/c"),
            Some(freezer.join("crius/p/c"))
        );
        assert_eq!(
            v1.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Thawed
        );
        // A plain file echoes what was asked: FROZEN at once.
        let soon = std::time::Instant::now() + std::time::Duration::from_secs(1);
        assert!(v1.freeze("/crius/p/c", soon).await.unwrap());
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "FROZEN");
        v1.set_frozen("/crius/p/c", false).unwrap();
        assert_eq!(
            v1.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Thawed
        );
        std::fs::write(&state, "FREEZING").unwrap();
        assert_eq!(
            v1.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Freezing
        );
        let none = Hierarchy::V1(v1::V1::new(HashMap::new()));
        assert!(matches!(
            none.set_frozen("/crius/p/c", true),
            Err(CgroupError::NoController("freezer"))
        ));

        let root = dir.path().join("unified");
        let c = root.join("crius/p/c");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("cgroup.freeze"), "0\n").unwrap();
        std::fs::write(c.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        let v2 = Hierarchy::V2(v2::V2::new(&root));
        assert_eq!(
            v2.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Thawed
        );
        v2.set_frozen("/crius/p/c", true).unwrap();
        assert_eq!(
            v2.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Freezing
        );
        // Never frozen (nothing updates cgroup.events here): given up, and thawed again.
        let now = std::time::Instant::now() + std::time::Duration::from_millis(30);
        assert!(!v2.freeze("/crius/p/c", now).await.unwrap());
        assert_eq!(
            std::fs::read_to_string(c.join("cgroup.freeze")).unwrap(),
            "0"
        );
        std::fs::write(c.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        assert_eq!(
            v2.freezer_state("/crius/p/c").unwrap(),
            FreezerState::Frozen
        );
    }

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_hosts_mount_of_a_controller_wins_over_criu_s() {
        let yard = "\
99 23 0:50 / /run/x/.criu.cgyard.a/freezer rw,relatime - cgroup cgroup rw,freezer
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
98 23 0:51 / /run/x/.criu.cgyard.a/memory rw,relatime - cgroup cgroup rw,memory
";
        let after = format!("{HYBRID}{yard}");
        for info in [after.as_str(), yard] {
            let Hierarchy::V1(v1) = Hierarchy::from_mountinfo(info).unwrap() else {
                unreachable!()
            };
            assert_eq!(
                v1.mount("freezer"),
                Some(Path::new("/sys/fs/cgroup/freezer"))
            );
        }
        let Hierarchy::V1(v1) = Hierarchy::from_mountinfo(&after).unwrap() else {
            unreachable!()
        };
        assert_eq!(v1.mount("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
    }

    #[test]
    fn hybrid_host_is_v1_with_each_controller() {
        let h = Hierarchy::from_mountinfo(HYBRID).unwrap();
        assert_eq!(h.mode(), Mode::V1);
        let Hierarchy::V1(v1) = h else { unreachable!() };
        assert_eq!(
            v1.mount("cpuacct"),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(v1.mount("cpu"), v1.mount("cpuacct"));
        assert_eq!(v1.mount("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
        assert_eq!(v1.mount("hugetlb"), None);
        assert_eq!(
            v1.dir("memory", "/crius/p/c"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/crius/p/c"))
        );
        assert_eq!(cgroup_mounts(HYBRID).len(), 5);
    }

    #[test]
    fn unified_host_is_v2() {
        let info = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let h = Hierarchy::from_mountinfo(info).unwrap();
        assert_eq!(h.mode(), Mode::V2);
        let Hierarchy::V2(v2) = h else { unreachable!() };
        assert_eq!(v2.dir("/crius/p"), PathBuf::from("/sys/fs/cgroup/crius/p"));
        assert!(Hierarchy::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n").is_err());
    }

    #[test]
    fn request_resources_are_checked_alike_for_every_rpc() {
        let ok = LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0".into(),
            oom_score_adj: -999,
            ..Default::default()
        };
        check_resources("config.linux.resources", &ok).unwrap();
        let bad = [
            (
                "memory_limit_in_bytes",
                LinuxContainerResources {
                    memory_limit_in_bytes: 1,
                    ..ok.clone()
                },
            ),
            (
                "memory_limit_in_bytes",
                LinuxContainerResources {
                    memory_limit_in_bytes: -5,
                    ..ok.clone()
                },
            ),
            (
                "memory_swap_limit_in_bytes",
                LinuxContainerResources {
                    memory_swap_limit_in_bytes: -2,
                    ..ok.clone()
                },
            ),
            (
                "cpuset_cpus",
                LinuxContainerResources {
                    cpuset_cpus: "banana".into(),
                    ..ok.clone()
                },
            ),
            (
                "cpuset_cpus",
                LinuxContainerResources {
                    cpuset_cpus: "999999".into(),
                    ..ok.clone()
                },
            ),
            (
                "cpuset_cpus",
                LinuxContainerResources {
                    cpuset_cpus: "0,".repeat(2500),
                    ..ok.clone()
                },
            ),
            (
                "cpu_quota",
                LinuxContainerResources {
                    cpu_quota: 1 << 62,
                    ..ok.clone()
                },
            ),
            (
                "cpu_period",
                LinuxContainerResources {
                    cpu_period: 1 << 62,
                    ..ok.clone()
                },
            ),
            (
                "cpu_shares",
                LinuxContainerResources {
                    cpu_shares: -1,
                    ..ok.clone()
                },
            ),
            (
                "oom_score_adj",
                LinuxContainerResources {
                    oom_score_adj: 5000,
                    ..ok.clone()
                },
            ),
            (
                "page size",
                LinuxContainerResources {
                    hugepage_limits: vec![crius_api::v1::HugepageLimit {
                        page_size: "../2MB".into(),
                        limit: 1,
                    }],
                    ..ok.clone()
                },
            ),
        ];
        for (field, r) in bad {
            let err = check_resources("config.linux.resources", &r).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, CgroupError::Request { .. }) && msg.contains(field),
                "{field}: {msg}"
            );
            assert!(msg.starts_with("config.linux.resources."), "{msg}");
            assert!(msg.len() < 300, "{msg}");
        }
    }

    #[test]
    fn unified_is_refused_on_v1_before_any_write() {
        let r = LinuxContainerResources {
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let err = validate(&r, Mode::V1).unwrap_err();
        assert!(err.is_invalid_value());
        assert!(err.to_string().contains("cgroup v1"), "{err}");
        validate(&r, Mode::V2).unwrap();
        let neg = LinuxContainerResources {
            cpu_quota: -5,
            ..Default::default()
        };
        assert!(validate(&neg, Mode::V2).is_err());
    }

    #[test]
    fn merge_keeps_what_the_update_leaves_unset() {
        let old = LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            oom_score_adj: 1000,
            cpuset_cpus: "0".into(),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 2 << 20,
            }],
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let new = LinuxContainerResources {
            memory_limit_in_bytes: 128 << 20,
            oom_score_adj: -5,
            hugepage_limits: vec![
                HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 << 20,
                },
                HugepageLimit {
                    page_size: "1GB".into(),
                    limit: 0,
                },
            ],
            unified: [("pids.max".to_string(), "10".to_string())].into(),
            ..Default::default()
        };
        let m = merge_resources(&old, &new);
        assert_eq!(m.memory_limit_in_bytes, 128 << 20);
        assert_eq!(
            (m.cpu_shares, m.cpu_quota, m.cpu_period),
            (512, 50_000, 100_000)
        );
        assert_eq!(m.oom_score_adj, 1000);
        assert_eq!(m.cpuset_cpus, "0");
        assert_eq!(m.hugepage_limits.len(), 2);
        assert_eq!(m.hugepage_limits[0].limit, 4 << 20);
        assert_eq!(m.unified.len(), 2);
    }

    #[test]
    fn pod_limits_add_the_overhead_to_set_limits() {
        let resources = LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 100_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 256 << 20,
            ..Default::default()
        };
        let overhead = LinuxContainerResources {
            cpu_shares: 100,
            cpu_quota: 5_000,
            cpu_period: 50_000,
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        };
        let p = pod_limits(Some(&resources), Some(&overhead));
        assert_eq!(p.cpu_shares, 1124);
        assert_eq!((p.cpu_quota, p.cpu_period), (110_000, 100_000));
        assert_eq!(p.memory_limit_in_bytes, 288 << 20);
        // Unlimited containers: the overhead does not invent a limit.
        let p = pod_limits(None, Some(&overhead));
        assert_eq!((p.cpu_quota, p.memory_limit_in_bytes), (0, 0));
        assert_eq!(p.cpu_shares, 100);
        assert_eq!(pod_limits(None, None), LinuxContainerResources::default());
    }

    #[test]
    fn pod_without_resources_writes_nothing() {
        let config = PodSandboxConfig {
            linux: Some(LinuxPodSandboxConfig::default()),
            ..Default::default()
        };
        // No hierarchy is touched: the cgroup does not even exist.
        apply_pod_resources("/crius/none-such-pod", &config).unwrap();
    }

    #[test]
    fn container_dirs_made_ahead_in_every_libcontainer_hierarchy() {
        if !crius_common::test_needs_root(
            "container_dirs_made_ahead_in_every_libcontainer_hierarchy",
        ) || !Hierarchy::host().is_ok_and(|h| h.mode() == Mode::V1)
        {
            return;
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let roots = crius_common::mountinfo::distinct_mounts(
            &crius_common::mountinfo::libcontainer_v1_mounts(&info),
        );
        assert!(!roots.is_empty());
        let pod = format!("/crius-test-ahead-{}", std::process::id());
        for root in &roots {
            std::fs::create_dir(root.join(&pod[1..])).unwrap();
        }
        make_container_dirs_ahead(&pod, "c1");
        let made: Vec<bool> = roots
            .iter()
            .map(|r| r.join(&pod[1..]).join("c1").is_dir())
            .collect();
        for root in &roots {
            let _ = std::fs::remove_dir(root.join(&pod[1..]).join("c1"));
            let _ = std::fs::remove_dir(root.join(&pod[1..]));
        }
        assert!(made.iter().all(|m| *m), "{roots:?}: {made:?}");
    }
}
