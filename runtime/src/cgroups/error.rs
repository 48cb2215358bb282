//! What can go wrong reading or changing cgroups, and whether the request or the host is at
//! fault. The daemon's error module maps these to gRPC statuses; cgroups know nothing of gRPC
//! (the `lib.rs` test `cgroups_use_no_upper_layer` keeps it so).

use std::path::PathBuf;

use super::dbus;

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
    /// A request's resources that [`check_resources`](super::check_resources) refused:
    /// `field` is where they sit in the request (`config.linux.resources`), `reason` starts
    /// with the name of the value below it that is at fault.
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
