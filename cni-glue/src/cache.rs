//! What DEL needs, kept on disk from before ADD until DEL succeeded.
//!
//! One JSON file per attachment at `<cache_dir>/<container id>/<seq>-<network>-<ifname>.json`,
//! holding the network configuration used, the CNI_ARGS, the capability args, the netns path and,
//! once ADD finished, its result. It is written *before* the first plugin runs, so a DEL after a
//! half-failed ADD, a vanished netns or a daemon restart still runs with the same config and
//! arguments the ADD had, even if the conf dir changed since. Writes are atomic (temp file,
//! fsync, rename, fsync of the directory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// A persisted attachment of one container to one network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// Format version of this record.
    pub kind: String,
    pub container_id: String,
    /// The network's name (also in `config`).
    pub network: String,
    pub ifname: String,
    /// Order of attachment (the loopback network is 0, the pod network 1); DEL goes in reverse.
    pub seq: u32,
    pub netns: String,
    pub cni_args: Vec<(String, String)>,
    pub capability_args: BTreeMap<String, Value>,
    /// The network configuration list (see [`crate::NetworkConfigList::to_json`]).
    pub config: Value,
    /// The final ADD result, once ADD succeeded.
    pub result: Option<Value>,
}

pub(crate) const KIND: &str = "crius-cni-attachment-v1";

fn cache_err(path: &Path, source: std::io::Error) -> Error {
    Error::Cache {
        path: path.to_path_buf(),
        source,
    }
}

/// The cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Cache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, a: &Attachment) -> PathBuf {
        self.dir
            .join(&a.container_id)
            .join(format!("{}-{}-{}.json", a.seq, a.network, a.ifname))
    }

    /// Writes (or replaces) the record atomically; returns its path.
    pub fn write(&self, a: &Attachment) -> Result<PathBuf> {
        let path = self.file(a);
        let parent = path.parent().unwrap_or(&self.dir).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| cache_err(&parent, e))?;
        let bytes = serde_json::to_vec_pretty(a).map_err(|e| cache_err(&path, e.into()))?;
        crius_common::fs::write_atomic(&path, &bytes, None, crius_common::fs::Durability::Full)
            .map_err(|e| cache_err(&path, e))?;
        Ok(path)
    }

    /// Removes the record, and the container's directory once it is empty.
    pub fn remove(&self, a: &Attachment) -> Result<()> {
        let path = self.file(a);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(cache_err(&path, e)),
        }
        // Fails harmlessly while other attachments of the container remain.
        let _ = std::fs::remove_dir(self.dir.join(&a.container_id));
        Ok(())
    }

    /// The records of one container, ordered by `seq`. Unreadable records are errors: DEL
    /// must not silently forget an attachment.
    pub fn list(&self, container_id: &str) -> Result<Vec<Attachment>> {
        let dir = self.dir.join(container_id);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(cache_err(&dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| cache_err(&dir, e))?;
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                // A leftover temp file from a crash during write: the rename never happened.
                if path.extension().is_some_and(|e| e == "tmp") {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| cache_err(&path, e))?;
            let a: Attachment =
                serde_json::from_slice(&bytes).map_err(|e| Error::InvalidConfig {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            out.push(a);
        }
        out.sort_by_key(|a| a.seq);
        Ok(out)
    }

    /// The ids of every container that has records.
    pub fn container_ids(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(cache_err(&self.dir, e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| cache_err(&self.dir, e))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if let Ok(name) = entry.file_name().into_string() {
                    ids.push(name);
                }
            }
        }
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(id: &str, seq: u32, network: &str) -> Attachment {
        Attachment {
            kind: KIND.into(),
            container_id: id.into(),
            network: network.into(),
            ifname: "eth0".into(),
            seq,
            netns: "/run/crius/netns/x".into(),
            cni_args: vec![("K8S_POD_NAME".into(), "p".into())],
            capability_args: BTreeMap::new(),
            config: serde_json::json!({"name": "n"}),
            result: None,
        }
    }

    #[test]
    fn write_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("c"));
        assert!(cache.list("a").unwrap().is_empty());
        assert!(cache.container_ids().unwrap().is_empty());

        let mut a1 = attachment("a", 1, "net");
        let a0 = attachment("a", 0, "lo");
        cache.write(&a1).unwrap();
        cache.write(&a0).unwrap();
        a1.result = Some(serde_json::json!({"ips": []}));
        cache.write(&a1).unwrap();
        // A crash between create and rename leaves a temp file, which is ignored and removed.
        std::fs::write(dir.path().join("c/a/1-net-eth0.json.tmp"), b"{").unwrap();

        let listed = cache.list("a").unwrap();
        assert_eq!(listed, vec![a0.clone(), a1.clone()]);
        assert_eq!(cache.container_ids().unwrap(), vec!["a"]);

        cache.remove(&a1).unwrap();
        cache.remove(&a1).unwrap();
        cache.remove(&a0).unwrap();
        assert!(cache.list("a").unwrap().is_empty());
        assert!(!dir.path().join("c/a").exists());
    }

    #[test]
    fn corrupt_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("b/1-n-eth0.json"), b"{").unwrap();
        assert!(cache.list("b").is_err());
    }
}
