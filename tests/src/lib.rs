//! End-to-end fixtures for crius, shared by every test of `tests/tests/e2e/`.
//!
//! Everything here is real: [`registry::Registry`] runs Debian's `docker-registry`,
//! [`images`] builds OCI images from Debian's static busybox and pushes them over the distribution
//! API, and [`crius::Crius`] runs the crius binary on a temporary root, state dir and socket and
//! hands back connected gRPC clients. Every fixture cleans up in `Drop` (processes stopped by PID
//! and reaped, mounts under its temp dir lazily unmounted, dirs removed), so a failing assertion
//! leaves nothing behind. Temp dirs and resources carry "crius" in their names, so a search of
//! processes, mounts, links and cgroups for that name finds anything that escapes.
//!
//! A typical test:
//!
//! ```no_run
//! # async fn t() -> crius_tests::Result<()> {
//! use crius_tests::{crius::Crius, images, registry::Registry};
//! let registry = Registry::start()?;
//! let busybox = images::push(&registry, images::TestImage::Busybox)?;
//! let crius = Crius::start("").await?;
//! let version = crius.runtime().version(crius_api::v1::VersionRequest::default()).await;
//! # let _ = (busybox, version); Ok(()) }
//! ```
//!
//! The registry and image helpers are blocking (plain `std` I/O against a loopback server);
//! calling them from an async test is fine, they only talk to another process.

pub mod archive;
pub mod containerd;
pub mod crius;
mod error;
mod http;
pub mod images;
pub mod nri;
mod process;
pub mod proxy;
pub mod registry;
pub mod soak;
pub mod streaming;
pub mod systemd;
mod tar_layer;
mod testdir;

pub use error::{Error, Result};
pub use http::Response;
pub use testdir::{unmount_all_under, TestDir};

/// The repository (the Makefile's directory): the parent of this crate's.
pub fn repo_dir() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is found by binding port 0 and closing the socket again, so another process can take
/// it before the caller binds it; fixtures that start servers retry with a new port when that
/// happens.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|source| Error::io("bind 127.0.0.1:0 to find a free port", "", source))?;
    let addr = listener
        .local_addr()
        .map_err(|source| Error::io("read the address of a bound socket", "", source))?;
    Ok(addr.port())
}

/// Finds a binary built by this workspace, e.g. `binary("crius")` or `binary("crius-shim")`.
///
/// An environment variable named after the binary wins (`crius` → `CRIUS_BIN`, `crius-shim` →
/// `CRIUS_SHIM_BIN`); otherwise the binary is looked up in the cargo target dir the test runs from
/// (`target/[<triple>/]<profile>/`, the parent of the test executable's `deps/` dir). `cargo test
/// -p crius-tests` does not build other packages' binaries: build them first (`make build`, as
/// `make test` does).
pub fn binary(name: &str) -> Result<PathBuf> {
    let var = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    let path = match std::env::var_os(&var) {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = std::env::current_exe()
                .map_err(|source| Error::io("find the test executable", "", source))?;
            // target/<profile>/deps/<test> → target/<profile>/<name>
            let profile_dir = exe.parent().and_then(|deps| deps.parent()).ok_or_else(|| {
                Error::BinaryNotFound {
                    name: name.to_owned(),
                    path: exe.clone(),
                    var: var.clone(),
                }
            })?;
            profile_dir.join(name)
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::BinaryNotFound {
            name: name.to_owned(),
            path,
            var,
        })
    }
}

/// `sha256:<hex>` of `bytes`, the OCI digest form.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}
