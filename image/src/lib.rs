//! crius-image: everything about container images — references, registry hosts, pulling into a
//! content store, unpacking layers into snapshots, and the image records. It knows nothing
//! about gRPC; the daemon maps [`Error::kind`] to status codes.
//!
//! Entry point: [`ImageStore`] (`open`, `pull`, `get`, `list`, `remove`, `lowerdirs`, `lease`,
//! `release`, `gc`, `fs_usage`).

pub mod content;
pub mod digest;
pub mod error;
pub mod hosts;
pub mod manifest;
mod pull;
pub mod records;
pub mod reference;
pub mod registry;
mod singleflight;
mod store;
pub mod unpack;

pub use digest::Digest;
pub use error::{Error, ErrorKind, Result};
pub use manifest::Platform;
pub use pull::{PullOptions, PullReport};
pub use records::ImageRecord;
pub use reference::Reference;
pub use registry::Auth;
pub use store::{FsUsage, GcStats, ImageStore, StoreConfig};

#[cfg(test)]
mod test_support {
    /// Whether the test `name` can run: it needs root (mounts, chown, the full capability set
    /// or a system bus); without root it says so and is skipped (`make unit` runs without root).
    pub fn is_root(name: &str) -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped {name}: needs root");
        }
        root
    }
}
