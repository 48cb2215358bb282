//! Errors of OCI spec generation.

use std::path::PathBuf;

/// Why a spec could not be built. [`SpecError::is_invalid_argument`] tells a bad request
/// (`InvalidArgument`) from a failure of this node (`Internal`).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A request field is wrong; the message names the field and the value.
    #[error("{0}")]
    InvalidArgument(String),
    /// A seccomp profile the request names is missing or not a valid profile.
    #[error("seccomp profile {path}: {reason}")]
    SeccompProfile { path: PathBuf, reason: String },
    /// A CDI spec file of this node is unreadable or invalid.
    #[error("cdi spec {path}: {reason}")]
    CdiSpec { path: PathBuf, reason: String },
    /// This node cannot give what the request asks (its default AppArmor profile did not
    /// load): gRPC `FailedPrecondition`.
    #[error("{0}")]
    Node(String),
    /// The caller (crius itself, not the request) passed an input the spec cannot be built from.
    #[error("spec input: {0}")]
    Input(String),
    /// Reading a file (in the image rootfs, a device node, /dev) failed for another reason.
    #[error("{context} {path}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// oci-spec refused a value while building the spec.
    #[error("build the oci spec")]
    Build(#[from] oci_spec::OciSpecError),
}

impl SpecError {
    /// True when the request is at fault (gRPC `InvalidArgument`), false for `Internal`.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            SpecError::InvalidArgument(_) | SpecError::SeccompProfile { .. }
        )
    }

    pub(crate) fn invalid(message: impl Into<String>) -> SpecError {
        SpecError::InvalidArgument(message.into())
    }

    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> SpecError {
        SpecError::Io {
            context,
            path: path.into(),
            source,
        }
    }
}

/// Result of spec generation.
pub type Result<T> = std::result::Result<T, SpecError>;
