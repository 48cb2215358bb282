//! The one error type of the fixtures.

use std::io;
use std::path::PathBuf;

/// What a fixture can fail with. Every variant names what it was doing and on what.
///
/// `Debug` prints the message and its cause chain (not the struct), so a test's `unwrap()` shows
/// a readable error and a failed start shows the server's log with its line breaks.
#[derive(thiserror::Error)]
pub enum Error {
    /// A file, process or socket operation failed.
    #[error("{what}{}", if path.as_os_str().is_empty() { String::new() } else { format!(": {}", path.display()) })]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A Debian package the fixtures rely on is not installed.
    #[error("{program} not found: install Debian's {package} (`make test` installs it)")]
    MissingProgram {
        program: &'static str,
        package: &'static str,
    },

    /// A binary of this workspace has not been built.
    #[error(
        "{name} binary not found at {path}: build it with `make build` (as `make test` does) or set {var}"
    )]
    BinaryNotFound {
        name: String,
        path: PathBuf,
        var: String,
    },

    /// An HTTP exchange with the registry failed below the HTTP level.
    #[error("{method} {url}")]
    Http {
        method: String,
        url: String,
        #[source]
        source: io::Error,
    },

    /// The registry answered with a status the fixture did not expect.
    #[error("{method} {url}: unexpected status {status}: {body}")]
    HttpStatus {
        method: String,
        url: String,
        status: u16,
        body: String,
    },

    /// The registry answered something that breaks the distribution API.
    #[error("{url}: {detail}")]
    Protocol { url: String, detail: String },

    /// A server process did not come up; `log` is what it printed.
    #[error("{name} did not start: {reason}\n--- {name} log ---\n{log}")]
    Start {
        name: &'static str,
        reason: String,
        log: String,
    },

    /// A signal could not be sent to a fixture's process.
    #[error("send {signal} to {name} (pid {pid})")]
    Signal {
        name: &'static str,
        pid: u32,
        signal: &'static str,
        #[source]
        source: nix::Error,
    },

    /// The gRPC channel to crius could not be set up.
    #[error("connect to crius on {socket}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },

    /// crius took connections but did not answer a call.
    #[error("crius does not serve: {0}")]
    Serve(String),

    /// A soak's node could not be read (`soak::Node`).
    #[error("read the node: {0}")]
    Node(String),

    /// Something a fixture waited for did not happen in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// `Result` with the fixtures' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
