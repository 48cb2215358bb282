//! Image records and their persistence. The daemon keeps its own state in a redb database;
//! to stay independent of it this crate stores each image record as a JSON file,
//! `<root>/images/<id-hex>.json`, and each snapshot lease as `<root>/leases/<holder>.json`,
//! written to a temp file, fsynced and renamed, so a record is either the old or the new one
//! after a crash.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::content::{fsync_dir, unique_suffix, TempPath};
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::manifest::{ImageConfig, Manifest};
use crate::reference::Reference;

/// One image as CRI sees it, plus what crius needs to keep its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `sha256:<config digest hex>`.
    pub id: String,
    /// `docker.io/library/busybox:latest`, …; a tag belongs to one image at a time.
    pub repo_tags: Vec<String>,
    /// `docker.io/library/busybox@sha256:…` (the digest the registry resolved).
    pub repo_digests: Vec<String>,
    /// Bytes of the config and the compressed layers.
    pub size: u64,
    pub config_digest: Digest,
    pub manifest_digest: Digest,
    /// The index the manifest was chosen from, if any.
    #[serde(default)]
    pub index_digest: Option<Digest>,
    /// Compressed layer blobs, bottom first.
    pub layers: Vec<Digest>,
    /// Snapshot chain IDs, bottom first.
    pub chain_ids: Vec<Digest>,
    /// From the config's `User`: a numeric user ...
    pub uid: Option<i64>,
    /// ... or a user name (empty when numeric or unset).
    pub username: String,
    /// Pinned images are never garbage collected by kubelet.
    pub pinned: bool,
    /// When the image was first pulled, seconds since the epoch.
    pub pulled_at: u64,
}

impl ImageRecord {
    /// Every blob the image needs kept in the content store.
    pub fn blobs(&self) -> impl Iterator<Item = &Digest> {
        self.index_digest
            .iter()
            .chain([&self.manifest_digest, &self.config_digest])
            .chain(self.layers.iter())
    }
}

impl ImageRecord {
    /// The record of the image `manifest` describes, stored as `manifest_digest` (chosen from
    /// the index `index_digest`), with its `config` and its snapshots' `chain_ids`: made the
    /// same way whether the image was pulled or imported.
    pub(crate) fn new(
        manifest: &Manifest,
        manifest_digest: Digest,
        index_digest: Option<Digest>,
        config: &ImageConfig,
        chain_ids: Vec<Digest>,
        repo_tags: Vec<String>,
        repo_digests: Vec<String>,
    ) -> ImageRecord {
        let user = config
            .config
            .as_ref()
            .and_then(|c| c.user.clone())
            .unwrap_or_default();
        let (uid, username) = user_of(&user);
        ImageRecord {
            id: format!("sha256:{}", manifest.config.digest.hex()),
            repo_tags,
            repo_digests,
            size: manifest.size(),
            config_digest: manifest.config.digest.clone(),
            manifest_digest,
            index_digest,
            layers: manifest.layers.iter().map(|l| l.digest.clone()).collect(),
            chain_ids,
            uid,
            username,
            pinned: false,
            pulled_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// Whether `name` is an image id as CRI clients pass one: `sha256:<64 hex>` or the 64 hex alone.
/// kubelet sends the id it resolved in `ImageSpec.image`; it is no name a user gave.
pub fn is_image_id(name: &str) -> bool {
    let hex = name.strip_prefix("sha256:").unwrap_or(name);
    hex.len() == 64 && crate::digest::is_hex(hex)
}

/// `User` of an image config as CRI reports it: `1000`, `1000:1000` → uid 1000; `nobody` or
/// `nobody:group` → username; empty → neither.
pub fn user_of(user: &str) -> (Option<i64>, String) {
    let name = user.split(':').next().unwrap_or("");
    if name.is_empty() {
        return (None, String::new());
    }
    match name.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, name.to_string()),
    }
}

/// The image records of one store: in memory by id, each in `<root>/images/<id-hex>.json`.
pub(crate) struct Records {
    dir: JsonDir,
    by_id: RwLock<HashMap<String, ImageRecord>>,
}

fn poisoned() -> Error {
    Error::Internal("image store lock poisoned".into())
}

impl Records {
    /// Opens `<root>/images` and loads every readable record in it.
    pub(crate) fn open(root: &Path) -> Result<Records> {
        let dir = JsonDir::open(root.join("images"))?;
        let by_id = dir
            .load_all::<ImageRecord>()?
            .into_iter()
            .map(|(_, r)| (r.id.clone(), r))
            .collect();
        Ok(Records {
            dir,
            by_id: RwLock::new(by_id),
        })
    }

    /// The image `name` names, as [`crate::ImageStore::get`] takes it.
    pub(crate) fn get(&self, name: &str) -> Result<Option<ImageRecord>> {
        let records = self.by_id.read().map_err(|_| poisoned())?;
        Ok(resolve(&records, name).and_then(|id| records.get(&id).cloned()))
    }

    /// The first repo tag and the first repo digest of the image `id`, if it is here.
    pub(crate) fn names_of(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>> {
        let records = self.by_id.read().map_err(|_| poisoned())?;
        Ok(records.get(id).map(|r| {
            (
                r.repo_tags.first().cloned(),
                r.repo_digests.first().cloned(),
            )
        }))
    }

    /// Every record, or the one `filter` names, by id.
    pub(crate) fn list(&self, filter: Option<&str>) -> Result<Vec<ImageRecord>> {
        let records = self.by_id.read().map_err(|_| poisoned())?;
        let mut out: Vec<ImageRecord> = match filter.filter(|f| !f.is_empty()) {
            None => records.values().cloned().collect(),
            Some(f) => resolve(&records, f)
                .and_then(|id| records.get(&id).cloned())
                .into_iter()
                .collect(),
        };
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Marks the image `name` pinned or not, on disk too.
    pub(crate) fn set_pinned(&self, name: &str, pinned: bool) -> Result<ImageRecord> {
        let mut records = self.by_id.write().map_err(|_| poisoned())?;
        let id = resolve(&records, name).ok_or_else(|| Error::ImageNotFound(name.to_string()))?;
        let record = records
            .get_mut(&id)
            .ok_or_else(|| Error::ImageNotFound(name.to_string()))?;
        record.pinned = pinned;
        self.dir.save(id_hex(&id), record)?;
        Ok(record.clone())
    }

    /// Removes the record of the image `name`, file first; its id, None if there is none.
    pub(crate) fn remove(&self, name: &str) -> Result<Option<String>> {
        let mut records = self.by_id.write().map_err(|_| poisoned())?;
        match resolve(&records, name) {
            None => Ok(None),
            Some(id) => {
                self.dir.delete(id_hex(&id))?;
                records.remove(&id);
                Ok(Some(id))
            }
        }
    }

    /// Stores `new`, merging with an existing record of the same id; its tag moves away from
    /// any other image that had it.
    pub(crate) fn commit(&self, new: ImageRecord) -> Result<ImageRecord> {
        let mut records = self.by_id.write().map_err(|_| poisoned())?;
        for tag in &new.repo_tags {
            let holders: Vec<String> = records
                .values()
                .filter(|r| r.id != new.id && r.repo_tags.contains(tag))
                .map(|r| r.id.clone())
                .collect();
            for id in holders {
                if let Some(r) = records.get_mut(&id) {
                    r.repo_tags.retain(|t| t != tag);
                    self.dir.save(id_hex(&id), r)?;
                }
            }
        }
        let merged = match records.get(&new.id) {
            Some(old) => {
                let mut m = old.clone();
                for t in &new.repo_tags {
                    if !m.repo_tags.contains(t) {
                        m.repo_tags.push(t.clone());
                    }
                }
                for d in &new.repo_digests {
                    if !m.repo_digests.contains(d) {
                        m.repo_digests.push(d.clone());
                    }
                }
                m.manifest_digest = new.manifest_digest;
                m.index_digest = new.index_digest;
                m.layers = new.layers;
                m.chain_ids = new.chain_ids;
                m.size = new.size;
                m
            }
            None => new,
        };
        self.dir.save(id_hex(&merged.id), &merged)?;
        records.insert(merged.id.clone(), merged.clone());
        Ok(merged)
    }

    /// The blobs and the snapshots the records name, for the collection.
    pub(crate) fn referenced(&self) -> Result<(HashSet<Digest>, HashSet<Digest>)> {
        let records = self.by_id.read().map_err(|_| poisoned())?;
        let blobs = records.values().flat_map(|r| r.blobs().cloned()).collect();
        let chains = records
            .values()
            .flat_map(|r| r.chain_ids.iter().cloned())
            .collect();
        Ok((blobs, chains))
    }
}

fn id_hex(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

/// Finds the id of the image `name` refers to.
fn resolve(records: &HashMap<String, ImageRecord>, name: &str) -> Option<String> {
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let hex = name.strip_prefix("sha256:").unwrap_or(name);
    if is_image_id(name) {
        let id = format!("sha256:{hex}");
        if records.contains_key(&id) {
            return Some(id);
        }
    }
    if let Ok(reference) = Reference::parse(name) {
        let found = match reference.digest() {
            Some(d) => {
                let wanted = reference.repo_digest(d);
                records.values().find(|r| r.repo_digests.contains(&wanted))
            }
            None => {
                let wanted = reference.repo_tag();
                records
                    .values()
                    .find(|r| wanted.as_ref().is_some_and(|t| r.repo_tags.contains(t)))
            }
        };
        if let Some(r) = found {
            return Some(r.id.clone());
        }
    }
    if hex.len() >= 12 && crate::digest::is_hex(hex) {
        let mut matches = records.keys().filter(|id| id_hex(id).starts_with(hex));
        if let (Some(one), None) = (matches.next(), matches.next()) {
            return Some(one.clone());
        }
    }
    None
}

/// A directory of JSON files, one per key.
#[derive(Debug, Clone)]
pub(crate) struct JsonDir {
    dir: PathBuf,
}

impl JsonDir {
    pub(crate) fn open(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        // Leftover temp files of an interrupted write.
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(".tmp-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Self { dir })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    pub(crate) fn save<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let path = self.path(key);
        let data = serde_json::to_vec_pretty(value)
            .map_err(|e| Error::Internal(format!("encode {}: {e}", path.display())))?;
        let tmp = TempPath::new(self.dir.join(format!(".tmp-{key}-{}", unique_suffix())));
        let mut f = std::fs::File::create(tmp.path()).map_err(Error::io("create", tmp.path()))?;
        f.write_all(&data)
            .and_then(|()| f.sync_all())
            .map_err(Error::io("write", tmp.path()))?;
        std::fs::rename(tmp.path(), &path).map_err(Error::io("commit", &path))?;
        tmp.keep();
        fsync_dir(&self.dir)
    }

    /// Removes `key` without syncing the directory: the removal survives a killed process, but
    /// a power loss may bring the file back. For entries whose return is harmless and undone
    /// later (a lease of a container that is gone, see [`crate::ImageStore::lease_holders`]).
    pub(crate) fn delete_unsynced(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", path)(e)),
        }
    }

    pub(crate) fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => fsync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", path)(e)),
        }
    }

    /// Every readable entry; unreadable files are logged and skipped so one bad file does not
    /// hide every image.
    pub(crate) fn load_all<T: DeserializeOwned>(&self) -> Result<Vec<(String, T)>> {
        let rd = std::fs::read_dir(&self.dir).map_err(Error::io("list", &self.dir))?;
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(key) = name.strip_suffix(".json") else {
                continue;
            };
            if key.starts_with('.') {
                continue;
            }
            match read_json(&e.path()) {
                Ok(v) => out.push((key.to_string(), v)),
                Err(err) => tracing::warn!("skipping unreadable record: {err}"),
            }
        }
        Ok(out)
    }
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let data = std::fs::read(path).map_err(Error::io("read", path))?;
    serde_json::from_slice(&data)
        .map_err(|e| Error::Internal(format!("decode {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(hex_char: char, tags: &[&str], digests: &[&str]) -> ImageRecord {
        let d = Digest::parse(&format!("sha256:{}", hex_char.to_string().repeat(64))).unwrap();
        ImageRecord {
            id: d.to_string(),
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: digests.iter().map(|s| s.to_string()).collect(),
            size: 1,
            config_digest: d.clone(),
            manifest_digest: d.clone(),
            index_digest: None,
            layers: vec![],
            chain_ids: vec![],
            uid: None,
            username: String::new(),
            pinned: false,
            pulled_at: 0,
        }
    }

    #[test]
    fn name_resolution() {
        let m = format!("sha256:{}", "9".repeat(64));
        let a = rec(
            'a',
            &["docker.io/library/busybox:latest"],
            &[&format!("docker.io/library/busybox@{m}")],
        );
        let b = rec('b', &["127.0.0.1:5000/x:v1"], &[]);
        let records: HashMap<_, _> = [(a.id.clone(), a.clone()), (b.id.clone(), b.clone())].into();
        assert_eq!(resolve(&records, &a.id), Some(a.id.clone()));
        assert_eq!(resolve(&records, &"a".repeat(64)), Some(a.id.clone()));
        assert_eq!(resolve(&records, "busybox"), Some(a.id.clone()));
        assert_eq!(resolve(&records, "busybox:latest"), Some(a.id.clone()));
        assert_eq!(
            resolve(&records, "docker.io/library/busybox"),
            Some(a.id.clone())
        );
        assert_eq!(
            resolve(&records, &format!("busybox@{m}")),
            Some(a.id.clone())
        );
        assert_eq!(resolve(&records, "127.0.0.1:5000/x:v1"), Some(b.id.clone()));
        assert_eq!(resolve(&records, &"b".repeat(12)), Some(b.id.clone()));
        assert_eq!(
            resolve(&records, &"b".repeat(5)),
            None,
            "short prefixes are not ids"
        );
        assert_eq!(resolve(&records, "127.0.0.1:5000/x:v2"), None);
        assert_eq!(resolve(&records, "alpine"), None);
        assert_eq!(resolve(&records, ""), None);
        assert_eq!(resolve(&records, "NOT A REF"), None);
    }

    #[test]
    fn users() {
        assert_eq!(user_of(""), (None, String::new()));
        assert_eq!(user_of("1000"), (Some(1000), String::new()));
        assert_eq!(user_of("1000:1000"), (Some(1000), String::new()));
        assert_eq!(user_of("nobody"), (None, "nobody".into()));
        assert_eq!(user_of("www:www"), (None, "www".into()));
        assert_eq!(user_of("0"), (Some(0), String::new()));
    }

    #[test]
    fn json_dir_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = JsonDir::open(dir.path().join("x")).unwrap();
        store.save("a", &vec![1, 2]).unwrap();
        store.save("a", &vec![3]).unwrap();
        std::fs::write(dir.path().join("x/bad.json"), "{").unwrap();
        let all: Vec<(String, Vec<i32>)> = store.load_all().unwrap();
        assert_eq!(all, vec![("a".to_string(), vec![3])]);
        store.delete("a").unwrap();
        store.delete("a").unwrap();
        assert!(store.load_all::<Vec<i32>>().unwrap().is_empty());
    }
}
