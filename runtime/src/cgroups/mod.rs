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
//!
//! One concept per file; callers use the names this module re-exports.
//!
//! | file | what it holds |
//! |---|---|
//! | `error.rs` | [`CgroupError`]: what failed, and whether the request or the host is at fault |
//! | `driver.rs` | [`init`], [`driver`]: cgroupfs or systemd, set once at start |
//! | `paths.rs` | pod and container cgroup names under either driver, [`fs_path`], ownership |
//! | `validation.rs` | the checks at the door: [`check_cgroup_parent`], [`check_resources`] |
//! | `mounts.rs` | the cgroup filesystems in the mount table, [`hierarchies`] |
//! | `hierarchy.rs` | [`Hierarchy`], v1 or v2: apply limits, read them back, read usage |
//! | `freezer.rs` | [`Hierarchy::freeze`] and the freezer's state |
//! | `stats.rs` | [`CgroupStats`], [`MemoryStats`] |
//! | `files.rs`, `transaction.rs` | reading and writing a cgroup file; undoable writes |
//! | `merge.rs` | [`merge_resources`]: an update over the old limits |
//! | `pod_limits.rs` | [`pod_limits`], [`apply_pod_resources`]: resources plus overhead |
//! | `dirs.rs` | making a container's directories ahead, [`remove`] |
//! | [`systemd`], [`manager`], [`dbus`] | units, their properties, [`attach`]; systemd's D-Bus |
//! | [`v1`], [`v2`] | the two kernel interfaces |
//! | [`reap`] | killing what a lost shim left in its cgroups |
//! | [`root_options`] | the cgroup2 mount's options kept across CRIU's runs |

pub mod dbus;
mod dirs;
mod driver;
mod error;
mod files;
mod freezer;
mod hierarchy;
pub mod manager;
mod merge;
mod mounts;
mod paths;
mod pod_limits;
pub mod reap;
pub mod root_options;
mod stats;
pub mod systemd;
mod transaction;
pub mod v1;
pub mod v2;
mod validation;

pub use dirs::{make_container_dirs_ahead, remove, remove_parent_if_empty, REMOVE_PATIENCE};
pub use driver::{driver, init, Driver};
pub use error::{CgroupError, Result};
pub(crate) use files::{
    flat_keyed, parse, read_optional, read_string, read_u64, read_u64_optional, write_file,
};
pub use freezer::FreezerState;
pub use hierarchy::{Hierarchy, Mode};
pub use merge::merge_resources;
pub use mounts::hierarchies;
pub use paths::{
    container_cgroup, container_cgroups_path, fs_path, owned_by_crius, pod_cgroup,
    pod_cgroup_is_own, CRIUS_PARENT,
};
pub use pod_limits::{apply_pod_resources, pod_limits, DEFAULT_CPU_PERIOD};
pub(crate) use stats::limit_or_none;
pub use stats::{CgroupStats, MemoryStats};
pub use systemd::attach;
pub(crate) use transaction::Transaction;
pub use validation::{
    check_cgroup_parent, check_resources, node_hugepage_sizes, MAX_CGROUP_PARENT_BYTES,
    MIN_MEMORY_LIMIT,
};
