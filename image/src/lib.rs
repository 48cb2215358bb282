//! crius-image: everything about container images — references, registry hosts, pulling into a
//! content store, unpacking layers into snapshots, and the image records. It knows nothing
//! about gRPC; the daemon maps [`Error::kind`] to status codes.
//!
//! Entry point: [`ImageStore`] (`open`, `pull`, `get`, `list`, `remove`, `lowerdirs`, `lease`,
//! `release`, `gc`, `fs_usage`).

mod auth;
pub mod auth_file;
pub mod content;
pub mod digest;
mod downloads;
pub mod error;
mod export;
pub mod hosts;
mod import;
#[cfg(test)]
mod layering;
mod leases;
pub mod manifest;
mod progress;
pub mod proxy;
mod pull;
pub mod records;
pub mod reference;
pub mod registry;
mod singleflight;
mod snapshots;
mod store;
pub mod unpack;

pub use auth::Auth;
pub use digest::Digest;
pub use error::{Error, ErrorKind, Result};
pub use export::ExportReport;
pub use import::ImportReport;
pub use manifest::Platform;
pub use progress::{BlobProgress, PullProgress, PullReport};
pub use pull::PullOptions;
pub use records::{is_image_id, ImageRecord};
pub use reference::Reference;
pub use store::{FsUsage, GcStats, ImageStore, LeaseFile, RegistrySettings, StoreConfig};
