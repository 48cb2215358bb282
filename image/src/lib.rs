//! crius-image: everything about container images — references, registry hosts, pulling into a
//! content store, unpacking layers into snapshots, and the image records. It knows nothing
//! about gRPC; the daemon maps [`Error::kind`] to status codes.

pub mod digest;
pub mod error;
pub mod hosts;
pub mod reference;

pub use digest::Digest;
pub use error::{Error, ErrorKind, Result};
pub use reference::Reference;
pub mod content;
pub mod manifest;
pub mod registry;
pub mod unpack;
