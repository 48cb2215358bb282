//! The CRI v1 API (`runtime.v1`), generated at build time from `runtime/v1/api.proto`.

/// Package `runtime.v1`: messages, the `RuntimeService` and `ImageService` servers and clients.
pub mod runtime {
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
}

pub use runtime::v1;

pub mod codec;

/// The NRI protocol (`nri.pkg.api.v1alpha1`) and ttrpc's envelope, messages only.
pub mod nri {
    /// Package `nri.pkg.api.v1alpha1`.
    #[allow(clippy::all)]
    pub mod api {
        tonic::include_proto!("nri.pkg.api.v1alpha1");
    }
    /// Package `ttrpc`: the request and response frames' payloads.
    pub mod ttrpc {
        tonic::include_proto!("ttrpc");
    }
}

/// Clients of containerd's image and content services (the subset in `containerd/`), for
/// `crius images import --from-containerd`.
pub mod containerd {
    /// `containerd.services.images.v1`: `Images.List`.
    pub mod images {
        tonic::include_proto!("containerd.services.images.v1");
    }
    /// `containerd.services.content.v1`: `Content.Info` and `Content.Read`.
    pub mod content {
        tonic::include_proto!("containerd.services.content.v1");
    }
}

pub mod shim;
