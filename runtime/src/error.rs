//! The daemon's error type and the one place where errors become gRPC statuses.

use tonic::{Code, Status};

/// An error an RPC handler returns. The variant picks the gRPC code; the message names the
/// field or object at fault and the value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0} is not implemented by crius yet")]
    Unimplemented(&'static str),
    /// An RPC crius serves, asked of something that cannot do it (a checkpoint under a runtime
    /// handler without CRIU support): also `Unimplemented`, with a message saying why.
    #[error("{0}")]
    Unsupported(String),
    #[error("{context}")]
    Internal {
        context: String,
        #[source]
        source: Option<BoxError>,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Any cause an internal error wraps.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// An internal failure with what was being done and its cause.
    pub fn internal(context: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Internal {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// The gRPC code this error is reported with.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::Unavailable(_) => Code::Unavailable,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::Unimplemented(_) | Error::Unsupported(_) => Code::Unimplemented,
            Error::Internal { .. } => Code::Internal,
        }
    }
}

impl From<crate::cgroups::CgroupError> for Error {
    /// A missing cgroup or controller is the node's state; a bad path, resources the checks at
    /// the door refuse or a value the kernel refuses is the request's fault.
    fn from(e: crate::cgroups::CgroupError) -> Error {
        use crate::cgroups::CgroupError;
        match &e {
            CgroupError::NotFound(_) | CgroupError::NoController(_) => {
                Error::FailedPrecondition(chain(&e))
            }
            CgroupError::BadPath { .. } | CgroupError::Request { .. } => {
                Error::InvalidArgument(chain(&e))
            }
            _ if e.is_invalid_value() => Error::InvalidArgument(chain(&e)),
            _ => Error::internal("cgroup", e),
        }
    }
}

impl From<crate::userns::UsernsError> for Error {
    /// A filesystem that cannot be idmapped is the node's setup (FailedPrecondition); a
    /// mapping the kernel refuses came from the request (InvalidArgument).
    fn from(e: crate::userns::UsernsError) -> Error {
        if let Some(path) = e.idmap_unsupported() {
            return Error::FailedPrecondition(format!(
                "{} is on a filesystem that does not support idmapped mounts, which a \
                 user-namespaced pod needs to see it with the pod's ids",
                path.display()
            ));
        }
        if e.refused_mapping() {
            return Error::InvalidArgument(format!("userns_options: {}", chain(&e)));
        }
        Error::internal("user namespace", e)
    }
}

impl From<crate::stream::StreamError> for Error {
    /// The streaming server not (yet) listening is transient; anything else is crius's.
    fn from(e: crate::stream::StreamError) -> Error {
        match e {
            crate::stream::StreamError::NotRunning => Error::Unavailable(chain(&e)),
            _ => Error::internal("prepare the stream", e),
        }
    }
}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Error {
        Error::internal("database", e)
    }
}

impl From<crate::mounts::MountError> for Error {
    fn from(e: crate::mounts::MountError) -> Error {
        Error::internal("mount", e)
    }
}

impl From<crate::spec::SpecError> for Error {
    fn from(e: crate::spec::SpecError) -> Error {
        if e.is_invalid_argument() {
            Error::InvalidArgument(chain(&e))
        } else if matches!(e, crate::spec::SpecError::Node(_)) {
            Error::FailedPrecondition(chain(&e))
        } else {
            Error::internal("build the OCI spec", e)
        }
    }
}

impl From<crius_image::Error> for Error {
    fn from(e: crius_image::Error) -> Error {
        use crius_image::ErrorKind as K;
        let msg = chain(&e);
        match e.kind() {
            K::InvalidArgument => Error::InvalidArgument(msg),
            K::NotFound => Error::NotFound(msg),
            K::Unavailable => Error::Unavailable(msg),
            K::Unauthenticated | K::PermissionDenied => Error::Unauthenticated(msg),
            K::DeadlineExceeded => Error::DeadlineExceeded(msg),
            K::FailedPrecondition => Error::FailedPrecondition(msg),
            K::Internal => Error::internal("image", e),
        }
    }
}

/// CNI's "try again later" error code (spec, "Error").
const CNI_TRY_AGAIN_LATER: u32 = 11;

impl From<crius_cni::Error> for Error {
    /// A network plugin that is missing, misconfigured, failing or printing nonsense is the
    /// node's network setup to fix (FailedPrecondition), one that is too slow or asks to be
    /// asked later is DeadlineExceeded or Unavailable; only crius's own steps (the network
    /// namespace, the attachment cache, its files) are Internal.
    fn from(e: crius_cni::Error) -> Error {
        if matches!(e, crius_cni::Error::NoNetworkConfig { .. }) {
            return Error::FailedPrecondition(chain(&e));
        }
        let msg = format!("pod network: {}", chain(&e));
        match cni_code(&e) {
            Code::DeadlineExceeded => Error::DeadlineExceeded(msg),
            Code::Unavailable => Error::Unavailable(msg),
            Code::FailedPrecondition => Error::FailedPrecondition(msg),
            Code::InvalidArgument => Error::InvalidArgument(msg),
            _ => Error::internal("pod network", e),
        }
    }
}

/// The code of a CNI failure (see `From<crius_cni::Error>`); several failures at once (the
/// rest of a chain's DEL goes on after one plugin fails) take the first one's.
fn cni_code(e: &crius_cni::Error) -> Code {
    use crius_cni::Error as E;
    match e {
        E::PluginTimeout { .. } => Code::DeadlineExceeded,
        E::Plugin { code, .. } if *code == CNI_TRY_AGAIN_LATER => Code::Unavailable,
        E::NoNetworkConfig { .. }
        | E::InvalidConfig { .. }
        | E::PluginNotFound { .. }
        | E::PluginExec { .. }
        | E::Plugin { .. }
        | E::PluginExit { .. }
        | E::InvalidResult { .. } => Code::FailedPrecondition,
        E::InvalidArgument(_) => Code::InvalidArgument,
        E::Multiple(all) => all.first().map_or(Code::Internal, cni_code),
        _ => Code::Internal,
    }
}

impl From<crius_api::shim::ClientError> for Error {
    fn from(e: crius_api::shim::ClientError) -> Error {
        use crius_api::shim::{ClientError as C, ErrorKind as K};
        let msg = chain(&e);
        match &e {
            C::Shim(s) => match s.kind {
                K::InvalidArgument => Error::InvalidArgument(msg),
                K::NotFound => Error::NotFound(msg),
                K::AlreadyExists => Error::AlreadyExists(msg),
                K::FailedPrecondition => Error::FailedPrecondition(msg),
                K::DeadlineExceeded => Error::DeadlineExceeded(msg),
                // The checks at the door catch unknown sysctls and words for numbers; a value
                // out of the kernel's range is only found when the container's init writes it.
                K::Internal if s.message.contains("failed to set sysctl") => {
                    Error::InvalidArgument(format!(
                        "sysctls: the kernel refused a value (out of its range?): {msg}"
                    ))
                }
                K::UnsupportedVersion | K::Internal => Error::internal("shim", e),
            },
            C::Timeout { .. } => Error::DeadlineExceeded(msg),
            // The connection broke in the middle of a call: the shim died under it.
            C::Io {
                source: crius_api::shim::FrameError::Io(_),
                ..
            } => Error::Unavailable(format!("the pod's shim went away during the call: {msg}")),
            // The pod's shim is gone: the pod can no longer run anything.
            C::Connect { .. } => Error::FailedPrecondition(msg),
            _ => Error::internal("shim", e),
        }
    }
}

/// The whole cause chain on one line: `context: cause: cause`. The modules whose errors are
/// mapped here (`cgroups`, `stream`, `userns`) call [`crius_common::error_chain`] themselves, so
/// that they need not import this module, which imports them.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    crius_common::error_chain(err)
}

/// The longest status message crius sends. gRPC sends the message as a header, and clients
/// built on gRPC's C core refuse a response whose headers exceed their limit (8 KiB by
/// default), so a huge value quoted from a request would hide the error itself.
pub const MAX_STATUS_MESSAGE: usize = 4096;

/// Maps an error to the status the client sees. The only place a status code is chosen.
/// Control characters a request carried into the message (a NUL in a path, a newline in a
/// name) are written as escapes, so the message stays one printable line.
pub fn to_status(err: &Error) -> Status {
    let mut message = chain(err);
    if message.chars().any(char::is_control) {
        message = message
            .chars()
            .map(|c| match c {
                c if c.is_control() => c.escape_default().to_string(),
                c => c.to_string(),
            })
            .collect();
    }
    if message.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let total = message.len();
        message.truncate(end);
        message.push_str(&format!("… ({total} bytes in all)"));
    }
    Status::new(err.code(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_carries_the_cause_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
        let err = Error::internal("open /var/lib/crius/crius.db", io);
        let status = to_status(&err);
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(
            status.message(),
            "open /var/lib/crius/crius.db: permission denied"
        );
    }

    #[test]
    fn status_messages_are_bounded() {
        let huge = "é".repeat(1 << 20);
        let status = to_status(&Error::InvalidArgument(format!("id {huge}")));
        assert!(status.message().len() < MAX_STATUS_MESSAGE + 64);
        assert!(status.message().ends_with("bytes in all)"));
        assert_eq!(crate::util::excerpt("short"), "short");
        let cut = crate::util::excerpt(&huge);
        assert!(cut.len() < 100 && cut.ends_with("(2097152 bytes)"), "{cut}");
    }

    #[test]
    fn control_characters_are_escaped() {
        let status = to_status(&Error::InvalidArgument("path /tmp/x\0y\nz: é".into()));
        assert_eq!(status.message(), "path /tmp/x\\u{0}y\\nz: é");
    }

    #[test]
    fn network_plugin_failures_are_the_nodes_not_crius_s() {
        use std::time::Duration;
        let plugin = || "bridge".to_owned();
        let code = |e: crius_cni::Error| to_status(&Error::from(e)).code();
        assert_eq!(
            code(crius_cni::Error::PluginTimeout {
                plugin: plugin(),
                command: "ADD",
                timeout: Duration::from_secs(3),
            }),
            Code::DeadlineExceeded
        );
        let failed = |code: u32| crius_cni::Error::Plugin {
            plugin: plugin(),
            command: "ADD",
            code,
            msg: "no".into(),
            details: String::new(),
        };
        assert_eq!(code(failed(11)), Code::Unavailable);
        assert_eq!(code(failed(7)), Code::FailedPrecondition);
        assert_eq!(code(failed(100)), Code::FailedPrecondition);
        let status = to_status(&Error::from(crius_cni::Error::InvalidResult {
            plugin: plugin(),
            command: "ADD",
            reason: "expected ident".into(),
        }));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "pod network: plugin bridge (ADD) printed an invalid result: expected ident"
        );
        let own = crius_cni::Error::Netns {
            op: "create",
            path: "/run/crius/netns/x".into(),
            source: std::io::Error::other("boom"),
        };
        assert_eq!(code(own), Code::Internal);
        let several = crius_cni::Error::Multiple(vec![failed(999), failed(11)]);
        assert_eq!(code(several), Code::FailedPrecondition, "the first one's");
    }

    #[test]
    fn cgroup_errors_map_to_statuses() {
        use crate::cgroups::CgroupError;
        let refused = CgroupError::Write {
            path: "/sys/fs/cgroup/cpuset/x/cpuset.cpus".into(),
            value: "0-63".into(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        };
        let e: Error = refused.into();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("cpuset.cpus"), "{e}");
        let e: Error = CgroupError::NotFound("/crius/x".into()).into();
        assert!(matches!(e, Error::FailedPrecondition(_)));
        let e: Error = CgroupError::Read {
            path: "/x".into(),
            source: std::io::Error::from_raw_os_error(libc::EIO),
        }
        .into();
        assert!(matches!(e, Error::Internal { .. }));
        // The checks at the door: the message is the field and the reason, as is.
        let status = to_status(&Error::from(CgroupError::Request {
            field: "config.linux.resources".into(),
            reason: "cpu_shares -1 is negative".into(),
        }));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "config.linux.resources.cpu_shares -1 is negative"
        );
    }

    #[test]
    fn unimplemented_names_the_rpc() {
        let status = to_status(&Error::Unimplemented("Attach"));
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(status.message().contains("Attach"));
    }
}
