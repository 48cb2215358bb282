//! Errors of the crate.

use std::path::PathBuf;
use std::time::Duration;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while pinning namespaces or running CNI plugins.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The conf dir has no valid network configuration. `Status` reports this as NetworkReady=false.
    #[error("no network config found in {}", dir.display())]
    NoNetworkConfig { dir: PathBuf },

    /// A configuration file (or a cached one) could not be parsed or is not a usable CNI config.
    #[error("invalid network config {}: {reason}", path.display())]
    InvalidConfig { path: PathBuf, reason: String },

    /// A plugin named in the config is in none of the bin dirs.
    #[error("plugin {plugin:?} not found in {dirs:?}")]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },

    /// The plugin process could not be started or talked to.
    #[error("run plugin {plugin} ({command})")]
    PluginExec {
        plugin: String,
        command: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The plugin did not finish in time and was killed.
    #[error("plugin {plugin} ({command}) timed out after {timeout:?} and was killed")]
    PluginTimeout {
        plugin: String,
        command: &'static str,
        timeout: Duration,
    },

    /// The plugin reported a CNI error (spec section 5, "Error").
    #[error(
        "plugin {plugin} ({command}) failed: code {code}: {msg}{}",
        details_suffix(details)
    )]
    Plugin {
        plugin: String,
        command: &'static str,
        /// The CNI error code (1-99 well-known, 100+ plugin specific).
        code: u32,
        msg: String,
        details: String,
    },

    /// The plugin exited non-zero without a parsable CNI error on stdout.
    #[error("plugin {plugin} ({command}) exited with {status}: {stderr}")]
    PluginExit {
        plugin: String,
        command: &'static str,
        status: String,
        stderr: String,
    },

    /// The plugin succeeded but printed a result that is not a CNI result.
    #[error("plugin {plugin} ({command}) printed an invalid result: {reason}")]
    InvalidResult {
        plugin: String,
        command: &'static str,
        reason: String,
    },

    /// An argument given by the caller is unusable (e.g. a container id with a slash).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A network namespace operation failed.
    #[error("{op} network namespace {}", path.display())]
    Netns {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Reading or writing the attachment cache failed.
    #[error("attachment cache {}", path.display())]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Any other file system error, with the path it concerns.
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Several independent steps failed (GC runs every plugin and reports all failures).
    #[error("{}", join_errors(.0))]
    Multiple(Vec<Error>),
}

impl Error {
    /// The CNI error code if this is an error reported by a plugin.
    pub fn cni_code(&self) -> Option<u32> {
        match self {
            Error::Plugin { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True for "no network config found": the node's network is not ready yet.
    pub fn is_no_config(&self) -> bool {
        matches!(self, Error::NoNetworkConfig { .. })
    }
}

fn details_suffix(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!(" ({details})")
    }
}

fn join_errors(errors: &[Error]) -> String {
    errors
        .iter()
        .map(|e| {
            let mut s = e.to_string();
            let mut cur = std::error::Error::source(e);
            while let Some(c) = cur {
                s.push_str(": ");
                s.push_str(&c.to_string());
                cur = c.source();
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}
