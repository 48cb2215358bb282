//! The content store: verified blobs at `<root>/content/sha256/<hex>`. A blob is written to
//! `<root>/content/ingest/` while it streams, checked for size and digest, fsynced, and only
//! then renamed into place, so a visible blob is always complete and correct.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use sha2::{Digest as _, Sha256};

use crate::digest::Digest;
use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct ContentStore {
    blobs: PathBuf,
    ingest: PathBuf,
}

/// A temporary path removed on drop unless it was committed.
pub(crate) struct TempPath {
    path: PathBuf,
    keep: bool,
}

impl TempPath {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path, keep: false }
    }
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
    pub(crate) fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if !self.keep {
            let _ =
                std::fs::remove_file(&self.path).or_else(|_| std::fs::remove_dir_all(&self.path));
        }
    }
}

/// A name unique within this process and across processes for temp files.
pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(Error::io("sync directory", dir))
}

impl ContentStore {
    /// Opens (creating) the store under `root` and removes ingest files a crash left behind.
    pub fn open(root: &Path) -> Result<Self> {
        let blobs = root.join("content").join("sha256");
        let ingest = root.join("content").join("ingest");
        std::fs::create_dir_all(&blobs).map_err(Error::io("create", &blobs))?;
        let _ = std::fs::remove_dir_all(&ingest);
        std::fs::create_dir_all(&ingest).map_err(Error::io("create", &ingest))?;
        Ok(Self { blobs, ingest })
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    /// True if the blob is present (and has `size` bytes, when given).
    pub fn has(&self, digest: &Digest, size: Option<u64>) -> bool {
        match std::fs::metadata(self.path(digest)) {
            Ok(m) => size.is_none_or(|s| m.len() == s),
            Err(_) => false,
        }
    }

    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>> {
        let path = self.path(digest);
        std::fs::read(&path).map_err(Error::io("read blob", path))
    }

    /// Stores `data` under `digest` after checking it matches.
    pub fn write_bytes(&self, digest: &Digest, data: &[u8]) -> Result<()> {
        if self.stage_bytes(digest, data)? {
            fsync_dir(&self.blobs)?;
        }
        Ok(())
    }

    /// [`ContentStore::write_bytes`] without syncing the blob's directory entry: for a pull,
    /// which syncs the blob directory once ([`ContentStore::sync_dir`]) before it records the
    /// image that names its blobs. The blob's data is synced before it becomes visible.
    /// Whether it stored the blob (false: it was there already).
    pub(crate) fn stage_bytes(&self, digest: &Digest, data: &[u8]) -> Result<bool> {
        let actual = Digest::of(data);
        if &actual != digest {
            return Err(Error::Verification {
                expected: digest.clone(),
                reason: format!("content has digest {actual}"),
            });
        }
        if self.has(digest, Some(data.len() as u64)) {
            return Ok(false);
        }
        let tmp = TempPath::new(self.ingest_path(digest));
        let mut f = File::create(tmp.path()).map_err(Error::io("create", tmp.path()))?;
        f.write_all(data)
            .and_then(|()| f.sync_all())
            .map_err(Error::io("write", tmp.path()))?;
        self.rename_in(tmp, digest)?;
        Ok(true)
    }

    /// Makes the directory entries of the blobs renamed in so far durable.
    pub(crate) fn sync_dir(&self) -> Result<()> {
        fsync_dir(&self.blobs)
    }

    /// Moves `file` (on the store's filesystem, synced, with content `digest`, which the caller
    /// has verified) into the store.
    pub(crate) fn adopt(&self, file: &Path, digest: &Digest) -> Result<()> {
        let dest = self.path(digest);
        std::fs::rename(file, &dest).map_err(Error::io("commit blob", &dest))?;
        fsync_dir(&self.blobs)
    }

    fn ingest_path(&self, digest: &Digest) -> PathBuf {
        self.ingest
            .join(format!("{}.{}", digest.hex(), unique_suffix()))
    }

    /// Renames the synced `tmp` in as blob `digest`; its directory entry is not synced.
    fn rename_in(&self, tmp: TempPath, digest: &Digest) -> Result<()> {
        let dest = self.path(digest);
        std::fs::rename(tmp.path(), &dest).map_err(Error::io("commit blob", &dest))?;
        tmp.keep();
        Ok(())
    }

    /// Streams a registry response body into the store, verifying `size` and `digest` before
    /// the blob becomes visible. Stops with [`Error::Stalled`] when no data arrives for
    /// `no_progress`. Returns the bytes written. The blob's data is synced, its directory
    /// entry is not: the pull syncs the directory once ([`ContentStore::sync_dir`]) before it
    /// records an image that names the blob.
    pub(crate) async fn write_stream(
        &self,
        registry: &str,
        digest: &Digest,
        size: u64,
        body: Incoming,
        no_progress: Duration,
        meter: &crate::progress::Meter,
    ) -> Result<u64> {
        let tmp = TempPath::new(self.ingest_path(digest));
        let mut file = File::create(tmp.path()).map_err(Error::io("create", tmp.path()))?;
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        let mut body = body;
        loop {
            let frame = match tokio::time::timeout(no_progress, body.frame()).await {
                Err(_) => {
                    return Err(Error::Stalled {
                        registry: registry.to_string(),
                        digest: digest.clone(),
                        secs: no_progress.as_secs(),
                    })
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Err(Error::Unavailable {
                        registry: registry.to_string(),
                        reason: format!(
                            "download of {digest} broke after {written} bytes: {}",
                            crius_common::error_chain(&e)
                        ),
                    })
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            written += data.len() as u64;
            meter.add(data.len() as u64);
            if written > size {
                return Err(Error::Verification {
                    expected: digest.clone(),
                    reason: format!("registry {registry} sent more than the {size} bytes expected"),
                });
            }
            hasher.update(&data);
            file.write_all(&data)
                .map_err(Error::io("write", tmp.path()))?;
        }
        if written != size {
            return Err(Error::Verification {
                expected: digest.clone(),
                reason: format!("registry {registry} sent {written} bytes, expected {size}"),
            });
        }
        let actual = Digest::from_hasher(hasher);
        if &actual != digest {
            return Err(Error::Verification {
                expected: digest.clone(),
                reason: format!("content from {registry} has digest {actual}"),
            });
        }
        let path = tmp.path().to_path_buf();
        tokio::task::spawn_blocking(move || file.sync_all())
            .await
            .map_err(|e| Error::Internal(format!("fsync task: {e}")))?
            .map_err(Error::io("fsync", path))?;
        self.rename_in(tmp, digest)?;
        Ok(written)
    }

    /// Every blob in the store.
    pub fn list(&self) -> Result<Vec<Digest>> {
        let rd = std::fs::read_dir(&self.blobs).map_err(Error::io("list", &self.blobs))?;
        Ok(rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                Digest::parse(&format!("sha256:{}", e.file_name().to_string_lossy())).ok()
            })
            .collect())
    }

    pub fn remove(&self, digest: &Digest) -> Result<()> {
        let path = self.path(digest);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove blob", path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_bytes_verifies_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let d = Digest::of(b"hello");
        store.write_bytes(&d, b"hello").unwrap();
        store.write_bytes(&d, b"hello").unwrap();
        assert!(store.has(&d, Some(5)));
        assert!(!store.has(&d, Some(4)));
        assert_eq!(store.read(&d).unwrap(), b"hello");
        let err = store
            .write_bytes(&Digest::of(b"other"), b"hello")
            .unwrap_err();
        assert!(err.to_string().contains("failed verification"), "{err}");
        assert_eq!(store.list().unwrap(), vec![d.clone()]);
        store.remove(&d).unwrap();
        store.remove(&d).unwrap();
        assert!(store.list().unwrap().is_empty());
        assert_eq!(
            std::fs::read_dir(dir.path().join("content/ingest"))
                .unwrap()
                .count(),
            0
        );
    }
}
