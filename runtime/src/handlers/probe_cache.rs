//! What the probes of the `oci` handlers found, kept in `<state>/handler-probes.json` so that
//! a restart of the same crius with the same runtimes does not probe them again. A runtime
//! without a `features` command is probed with trial containers (`trial.rs`), 20 to 70 ms per
//! handler on this project's machine, and a start waits for the slowest before it serves: a
//! crius killed or restarted with 60 pods answered again after 93 ms, 72 of them probes.
//!
//! An entry is used only when nothing the probe depended on has changed: the handler's
//! configuration, the runtime's binary and crius's own (each by device, inode, size,
//! modification and change time; a change time cannot be set back), and what the node offers
//! crius (recursive read-only mounts, user namespaces). The state directory is a tmpfs by
//! default, so a reboot, and with it a new kernel, probes afresh. A probe that failed is not
//! kept: a runtime left out is probed again at the next start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::CheckpointSupport;
use crate::config::HandlerConfig;
use crate::util::FileId;

const FILE: &str = "handler-probes.json";

/// Everything a handler's probe depended on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Key {
    config: HandlerConfig,
    runtime: FileId,
    crius: FileId,
    node_rro: bool,
    node_userns: bool,
}

impl Key {
    /// `None` when a binary cannot be looked at (then nothing is cached for the handler).
    pub(super) fn of(h: &HandlerConfig, node_rro: bool, node_userns: bool) -> Option<Key> {
        Some(Key {
            config: h.clone(),
            runtime: FileId::of(&std::fs::metadata(&h.binary).ok()?),
            crius: FileId::of(&std::fs::metadata("/proc/self/exe").ok()?),
            node_rro,
            node_userns,
        })
    }
}

/// What the probe of one handler found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Found {
    pub rro: bool,
    pub user_namespaces: bool,
    pub criu: CheckpointSupport,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: Key,
    found: Found,
}

/// The cache file of a state directory, as read at start.
pub(super) struct Cache {
    path: PathBuf,
    entries: BTreeMap<String, Entry>,
    changed: bool,
}

impl Cache {
    /// Reads `<state>/handler-probes.json`; a missing or unreadable file is an empty cache.
    pub(super) fn load(state: &Path) -> Cache {
        let path = state.join(FILE);
        let entries = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Cache {
            path,
            entries,
            changed: false,
        }
    }

    /// What handler `name` was found to support, if `key` is still what it was probed with.
    pub(super) fn get(&self, name: &str, key: &Key) -> Option<Found> {
        self.entries
            .get(name)
            .filter(|e| e.key == *key)
            .map(|e| e.found)
    }

    pub(super) fn put(&mut self, name: &str, key: Key, found: Found) {
        let entry = Entry { key, found };
        self.entries.insert(name.to_owned(), entry);
        self.changed = true;
    }

    /// Forgets handlers no longer configured or that failed their probe this time.
    pub(super) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.entries.len();
        self.entries.retain(|name, _| keep(name));
        self.changed |= self.entries.len() != before;
    }

    /// Writes the file if anything changed (whole, through a rename; not synced: the state
    /// directory is a tmpfs by default). A cache that cannot be written only costs the next
    /// start its probes.
    pub(super) fn save(&self) {
        if !self.changed {
            return;
        }
        let written = serde_json::to_vec(&self.entries)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                crius_common::fs::write_atomic(
                    &self.path,
                    &bytes,
                    None,
                    crius_common::fs::Durability::None,
                )
            });
        if let Err(e) = written {
            tracing::warn!(file = %self.path.display(), "handler probes not kept: {e}");
        }
    }
}
