//! The daemon's shared state: configuration, database and the domain services every RPC
//! handler reaches through `&Daemon`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;

/// Everything a running crius owns. One per process, shared behind an `Arc`.
#[derive(Debug)]
pub struct Daemon {
    pub config: Config,
    pub store: Store,
    pub started_at: SystemTime,
}

impl Daemon {
    /// Opens the database under `config.root` and prepares the state directory.
    pub fn open(config: Config) -> anyhow::Result<Arc<Daemon>> {
        use anyhow::Context as _;
        std::fs::create_dir_all(&config.state)
            .with_context(|| format!("create state directory {}", config.state.display()))?;
        let store = Store::open(&config.root)?;
        Ok(Arc::new(Daemon {
            config,
            store,
            started_at: SystemTime::now(),
        }))
    }

    /// Whether pods can get a network: `Ok` when a CNI configuration is present, else why not.
    pub fn network_ready(&self) -> Result<()> {
        let dir = &self.config.cni.conf_dir;
        let found = std::fs::read_dir(dir)
            .map(|entries| {
                entries.flatten().any(|e| {
                    let p: PathBuf = e.path();
                    p.is_file()
                        && matches!(
                            p.extension().and_then(|x| x.to_str()),
                            Some("conf" | "conflist" | "json")
                        )
                })
            })
            .unwrap_or(false);
        if found {
            Ok(())
        } else {
            Err(Error::FailedPrecondition(format!(
                "no network config found in {}",
                dir.display()
            )))
        }
    }
}
