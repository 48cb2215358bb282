//! The CRI v1 API (`runtime.v1`), generated at build time from `runtime/v1/api.proto`.

/// Package `runtime.v1`: messages, the `RuntimeService` and `ImageService` servers and clients.
pub mod runtime {
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
}

pub use runtime::v1;

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

pub mod shim;
