//! The crate's error type. Every variant names what failed (reference, registry, digest, path)
//! and maps to an [`ErrorKind`] so the daemon can pick a gRPC status in one place.

use std::path::PathBuf;
use std::sync::Arc;

use crate::digest::Digest;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The class of a failure, one to one with the gRPC codes the daemon returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    Unavailable,
    Unauthenticated,
    PermissionDenied,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    #[error("registry host config {}: {reason}", path.display())]
    HostsConfig { path: PathBuf, reason: String },

    #[error("registry auth file {}: {reason}", path.display())]
    AuthFile { path: PathBuf, reason: String },

    #[error("registry {registry}: authentication required (no credentials given)")]
    AuthenticationRequired { registry: String },

    #[error("registry {registry}: credentials rejected")]
    CredentialsRejected { registry: String },

    #[error("registry {registry}: access to {what} denied")]
    PermissionDenied { registry: String, what: String },

    #[error("registry {registry} unavailable: {reason}")]
    Unavailable { registry: String, reason: String },

    #[error("{what} not found in registry {registry}")]
    NotFoundInRegistry { registry: String, what: String },

    #[error("registry {registry}: {what}: unexpected HTTP status {status}: {body}")]
    RegistryStatus {
        registry: String,
        what: String,
        status: u16,
        body: String,
    },

    #[error("registry {registry}: {what}: {reason}")]
    Protocol {
        registry: String,
        what: String,
        reason: String,
    },

    #[error("download of {digest} from {registry} stalled: no data for {secs} s")]
    Stalled {
        registry: String,
        digest: Digest,
        secs: u64,
    },

    #[error("response body stalled: no data for {secs} s")]
    ResponseStalled { secs: u64 },

    #[error("registry {registry}: {what} stalled: no data for {secs} s")]
    ManifestStalled {
        registry: String,
        what: String,
        secs: u64,
    },

    #[error("blob {expected} failed verification: {reason}")]
    Verification { expected: Digest, reason: String },

    #[error("no manifest for platform {platform} in {reference} (has: {available})")]
    NoMatchingPlatform {
        reference: String,
        platform: String,
        available: String,
    },

    #[error("unsupported media type {media_type:?} for {what}")]
    UnsupportedMediaType { media_type: String, what: String },

    #[error("{what} lists {layers} layers; crius takes at most {max}")]
    TooManyLayers {
        what: String,
        layers: usize,
        max: usize,
    },

    #[error("layer {digest} is non-distributable ({media_type}) and must be fetched from {urls:?}, which crius does not do")]
    NonDistributable {
        digest: Digest,
        media_type: String,
        urls: Vec<String>,
    },

    #[error("invalid {what} {digest}: {source}")]
    BadJson {
        what: String,
        digest: Digest,
        #[source]
        source: serde_json::Error,
    },

    #[error("unpack layer {digest}: entry {entry:?} refused: {reason}")]
    UnsafeEntry {
        digest: Digest,
        entry: String,
        reason: String,
    },

    /// Writing the layer's files failed (the node's disk, not the layer).
    #[error("unpack layer {digest}: {reason}")]
    Unpack { digest: Digest, reason: String },

    /// The image's manifest and config do not agree.
    #[error("invalid image {what}: {reason}")]
    InvalidImage { what: String, reason: String },

    /// The layer is not a tar stream, or not the one the image's config names.
    #[error("unpack layer {digest}: {reason}")]
    BadLayer { digest: Digest, reason: String },

    #[error("image {0:?} not found")]
    ImageNotFound(String),

    /// An image archive being imported is malformed or lacks what it names.
    #[error("image archive: {reason}")]
    Archive { reason: String },

    #[error("image {image} is incomplete: {reason}")]
    Incomplete { image: String, reason: String },

    #[error("{context} {}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{0}")]
    Internal(String),

    /// A failure of work shared by several concurrent callers (two pulls of one image).
    #[error(transparent)]
    Shared(Arc<Error>),
}

impl Error {
    /// The class of this failure, for mapping to a gRPC status.
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            Error::InvalidReference { .. } | Error::Archive { .. } => K::InvalidArgument,
            Error::HostsConfig { .. } | Error::AuthFile { .. } => K::FailedPrecondition,
            Error::AuthenticationRequired { .. } | Error::CredentialsRejected { .. } => {
                K::Unauthenticated
            }
            Error::PermissionDenied { .. } => K::PermissionDenied,
            Error::Unavailable { .. } => K::Unavailable,
            Error::NotFoundInRegistry { .. } | Error::ImageNotFound(_) => K::NotFound,
            // A registry that answers what it should not is not serving: as a 5xx.
            Error::RegistryStatus { status, .. } => match status {
                400 => K::InvalidArgument,
                _ => K::Unavailable,
            },
            Error::Protocol { .. } => K::Unavailable,
            Error::Stalled { .. }
            | Error::ResponseStalled { .. }
            | Error::ManifestStalled { .. } => K::DeadlineExceeded,
            // The image as it is served cannot be used: content that is not what its digest
            // says, manifests or configs that do not parse, layers that are not tar streams
            // or that the unpacker refuses. The image must be fixed, not crius.
            Error::NoMatchingPlatform { .. }
            | Error::UnsupportedMediaType { .. }
            | Error::TooManyLayers { .. }
            | Error::NonDistributable { .. }
            | Error::Verification { .. }
            | Error::BadJson { .. }
            | Error::UnsafeEntry { .. }
            | Error::InvalidImage { .. }
            | Error::BadLayer { .. } => K::FailedPrecondition,
            Error::Unpack { .. }
            | Error::Incomplete { .. }
            | Error::Io { .. }
            | Error::Internal(_) => K::Internal,
            Error::Shared(inner) => inner.kind(),
        }
    }

    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io {
            context,
            path,
            source,
        }
    }
}
