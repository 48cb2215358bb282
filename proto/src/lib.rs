//! The CRI v1 API (`runtime.v1`), generated at build time from `runtime/v1/api.proto`.

/// Package `runtime.v1`: messages, the `RuntimeService` and `ImageService` servers and clients.
pub mod runtime {
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
}

pub use runtime::v1;

pub mod shim;
