//! The snapshots: one unpacked layer per chain ID, `<root>/snapshots/<chain-hex>/fs`, each an
//! overlay lowerdir. A snapshot appears whole or not at all ([`crate::unpack::unpack_layer`]
//! works in a `tmp-` directory and renames it into place); pulls and imports unpack through
//! [`Snapshots::unpack`], which unpacks each chain ID once however many ask for it at the same
//! time, and at most `max_concurrent_unpacks` layers at once across the store.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::content::unique_suffix;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::progress::Stats;
use crate::singleflight::Singleflight;
use crate::unpack::{unpack_layer, UnpackStats};

/// The snapshots directory and the unpacks under way in it.
pub(crate) struct Snapshots {
    dir: PathBuf,
    /// Flush each unpacked layer to disk before it becomes visible (`sync_snapshots`).
    sync: bool,
    work: Singleflight<UnpackStats>,
    slots: Arc<Semaphore>,
}

impl Snapshots {
    /// Opens `<root>/snapshots`, removing what an interrupted unpack or removal left there.
    pub(crate) fn open(root: &Path, max_unpacks: usize, sync: bool) -> Result<Snapshots> {
        let dir = root.join("snapshots");
        std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("tmp-") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(Snapshots {
            dir,
            sync,
            work: Singleflight::default(),
            slots: Arc::new(Semaphore::new(max_unpacks.max(1))),
        })
    }

    /// The snapshots directory (what the store's fs usage is reported for).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, chain: &Digest) -> PathBuf {
        self.dir.join(chain.hex())
    }

    /// Whether the snapshot of `chain` is complete.
    pub(crate) fn has(&self, chain: &Digest) -> bool {
        self.path(chain).join("fs").is_dir()
    }

    /// The lowerdirs of the snapshots `chain_ids` (bottom first), top first as `lowerdir=`
    /// wants them; an error naming `image` when one is missing.
    pub(crate) fn lowerdirs(&self, chain_ids: &[Digest], image: &str) -> Result<Vec<PathBuf>> {
        chain_ids
            .iter()
            .rev()
            .map(|c| {
                let fs = self.path(c).join("fs");
                if fs.is_dir() {
                    Ok(fs)
                } else {
                    Err(Error::Incomplete {
                        image: image.to_string(),
                        reason: format!("snapshot {c} is missing"),
                    })
                }
            })
            .collect()
    }

    /// Unpacks the layer blob at `blob` (digest `digest`, uncompressed digest `diff`) into the
    /// snapshot of `chain`, once however many callers ask; the caller whose call does the work
    /// has it counted in its `stats`. `hold` is called as the unpack starts and its result
    /// kept until the snapshot is in place: the unpack may outlive the pull that started it
    /// (another caller still waits for it), and the store's gate hold keeps a collection from
    /// sweeping meanwhile.
    pub(crate) async fn unpack<H: Send + 'static>(
        &self,
        blob: PathBuf,
        digest: &Digest,
        diff: &Digest,
        chain: &Digest,
        stats: &Arc<Stats>,
        hold: impl FnOnce() -> H + Send + 'static,
    ) -> Result<()> {
        let dest = self.path(chain);
        if dest.join("fs").is_dir() {
            return Ok(());
        }
        let slots = self.slots.clone();
        let sync = self.sync;
        let digest = digest.clone();
        let diff = diff.clone();
        let stats = stats.clone();
        self.work
            .run(chain.as_str(), move || async move {
                let slot = slots
                    .acquire_owned()
                    .await
                    .map_err(|_| Error::Internal("unpack slots closed".into()))?;
                if dest.join("fs").is_dir() {
                    return Ok(UnpackStats::default());
                }
                let start = Instant::now();
                let hold = hold();
                let unpacked = tokio::task::spawn_blocking(move || {
                    let _slot = slot;
                    let _hold = hold;
                    unpack_layer(&blob, &digest, &diff, &dest, sync)
                })
                .await
                .map_err(|e| Error::Internal(format!("unpack task: {e}")))??;
                stats.unpacked(start, unpacked.tar_bytes);
                Ok(unpacked)
            })
            .await?;
        Ok(())
    }

    /// Removes every snapshot whose chain ID (hex) is not in `keep` (blocking); returns how
    /// many it removed. A snapshot is renamed first, so a half-removed one is never taken for
    /// a complete one.
    pub(crate) fn sweep(&self, keep: &HashSet<String>) -> Result<usize> {
        let rd = std::fs::read_dir(&self.dir).map_err(Error::io("list", &self.dir))?;
        let mut removed = 0;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("tmp-") || keep.contains(&name) {
                continue;
            }
            let doomed = self.dir.join(format!("tmp-rm-{name}-{}", unique_suffix()));
            std::fs::rename(e.path(), &doomed).map_err(Error::io("remove snapshot", e.path()))?;
            std::fs::remove_dir_all(&doomed).map_err(Error::io("remove snapshot", &doomed))?;
            removed += 1;
        }
        Ok(removed)
    }
}
