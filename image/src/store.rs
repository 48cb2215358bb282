//! [`ImageStore`]: the crate's entry point. It owns the content store, the snapshots, the
//! image records and the leases, each a type with a file of its own (`content.rs`,
//! `snapshots.rs`, `records.rs`, `leases.rs`; the downloads are `downloads.rs`'s); this file
//! keeps the collection, and the gate that stops it from sweeping what a pull is making. All
//! of them live under one root directory:
//!
//! ```text
//! <root>/content/sha256/<hex>      verified blobs (manifests, configs, layers)
//! <root>/content/ingest/           downloads in progress (emptied at open)
//! <root>/snapshots/<chain-hex>/fs  one unpacked layer each, an overlay lowerdir
//! <root>/images/<id-hex>.json      image records
//! <root>/leases/<holder>.json      snapshots held for a container
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::content::ContentStore;
use crate::digest::Digest;
use crate::downloads::Downloads;
use crate::error::{Error, Result};
use crate::leases::{check_holder, Leases};
use crate::manifest::{Descriptor, Platform};
use crate::progress::{PullReport, Stats};
use crate::records::{ImageRecord, Records};
use crate::registry::Clients;
use crate::singleflight::Singleflight;
use crate::snapshots::Snapshots;

/// Settings of an [`ImageStore`]; every field has a default.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Root directory of blobs, snapshots and records.
    pub root: PathBuf,
    /// containerd-style `hosts.toml` directory (`[registry] config_path`).
    pub registry_config_dir: Option<PathBuf>,
    /// Blobs downloaded at once, across all pulls.
    pub max_concurrent_downloads: usize,
    /// Layers unpacked at once, across all pulls.
    pub max_concurrent_unpacks: usize,
    /// A download (or a registry response) that makes no progress for this long is cancelled.
    pub no_progress_timeout: Duration,
    /// The platform chosen from an image index.
    pub platform: Platform,
    /// Registry credentials for pulls whose request carries none ([`crate::auth_file`]).
    pub auth_file: Option<PathBuf>,
    /// Flush each unpacked layer to disk (syncfs) before it becomes visible, so snapshots are
    /// complete after a power loss. containerd does not; it costs time on a busy disk.
    pub sync_snapshots: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/var/lib/crius"),
            registry_config_dir: Some(PathBuf::from("/etc/crius/certs.d")),
            max_concurrent_downloads: 3,
            max_concurrent_unpacks: std::thread::available_parallelism().map_or(2, |n| n.get()),
            no_progress_timeout: Duration::from_secs(5 * 60),
            platform: Platform::host(),
            auth_file: None,
            sync_snapshots: true,
        }
    }
}

/// The registry settings of a store that may change while it is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySettings {
    /// containerd-style `hosts.toml` directory.
    pub config_dir: Option<PathBuf>,
    /// Blobs downloaded at once, across all pulls.
    pub max_concurrent_downloads: usize,
    /// A download (or a registry response) that makes no progress for this long is cancelled.
    pub no_progress_timeout: Duration,
    /// Credentials for pulls whose request carries none (docker `config.json` format), read at
    /// each pull.
    pub auth_file: Option<PathBuf>,
}

impl Inner {
    pub(crate) fn registry_settings(&self) -> RegistrySettings {
        self.registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Bytes and inodes used by the image store, for CRI's ImageFsInfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsUsage {
    /// The directory the usage is for (the snapshots directory).
    pub mountpoint: PathBuf,
    pub used_bytes: u64,
    pub inodes_used: u64,
}

/// What a garbage collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    pub blobs_removed: usize,
    pub snapshots_removed: usize,
}

/// The file of a lease taken by [`ImageStore::lease_deferred`], not yet written.
#[must_use = "a lease that is not persisted is lost at the next start"]
pub struct LeaseFile {
    inner: Arc<Inner>,
    holder: String,
    chain_ids: Vec<Digest>,
}

impl LeaseFile {
    /// Writes and syncs the lease file (blocking).
    pub fn persist(self) -> Result<()> {
        self.inner.leases.persist(&self.holder, &self.chain_ids)
    }
}

/// Images: pull, look up, list, remove, hold for containers, collect garbage. Cheap to clone.
#[derive(Clone)]
pub struct ImageStore {
    pub(crate) inner: Arc<Inner>,
}

/// What a pull run gives every caller that joined it: the record (None when the pull only
/// fetched) and the pull's figures.
pub(crate) type PullOutcome = (Option<ImageRecord>, PullReport);

pub(crate) struct Inner {
    pub(crate) config: StoreConfig,
    pub(crate) content: ContentStore,
    pub(crate) snapshots: Snapshots,
    pub(crate) records: Records,
    leases: Leases,
    pub(crate) clients: Arc<Clients>,
    pub(crate) pulls: Singleflight<PullOutcome>,
    /// The pull runs under way and how far each has come.
    pub(crate) progress: Arc<crate::progress::Pulls>,
    /// The registry settings that may change while crius runs (SIGHUP).
    registry: RwLock<RegistrySettings>,
    pub(crate) downloads: Downloads,
    /// Pulls (and the unpacks they started) hold it shared through a [`GateHold`]; garbage
    /// collection takes it exclusively, never waiting, so it never removes what a pull in
    /// progress has fetched but not yet recorded.
    gc_gate: Arc<tokio::sync::RwLock<()>>,
    /// A collection was asked for while the gate was held: the last holder to let go runs it.
    gc_pending: AtomicBool,
    /// Bumped whenever blobs or snapshots may have changed; keys the fs usage cache.
    generation: AtomicU64,
    usage_cache: Mutex<Option<(u64, Instant, FsUsage)>>,
}

/// How long a computed fs usage is reused when nothing changed in between: walking a large
/// store costs a stat per file, and kubelet asks every few seconds.
const USAGE_CACHE_TTL: Duration = Duration::from_secs(30);

impl ImageStore {
    /// Opens the store at `config.root`, loading the records and removing what an interrupted
    /// pull left behind.
    pub fn open(config: StoreConfig) -> Result<Self> {
        let root = &config.root;
        let content = ContentStore::open(root)?;
        let snapshots =
            Snapshots::open(root, config.max_concurrent_unpacks, config.sync_snapshots)?;
        let records = Records::open(root)?;
        let leases = Leases::open(root)?;
        let registry = RegistrySettings {
            config_dir: config.registry_config_dir.clone(),
            max_concurrent_downloads: config.max_concurrent_downloads.max(1),
            no_progress_timeout: config.no_progress_timeout,
            auth_file: config.auth_file.clone(),
        };
        let inner = Inner {
            downloads: Downloads::new(config.max_concurrent_downloads),
            config,
            content,
            snapshots,
            records,
            leases,
            clients: Arc::new(Clients::default()),
            pulls: Singleflight::default(),
            progress: Arc::default(),
            registry: RwLock::new(registry),
            gc_gate: Arc::new(tokio::sync::RwLock::new(())),
            gc_pending: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            usage_cache: Mutex::new(None),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The settings the store was opened with (the registry settings in force are
    /// [`ImageStore::registry_settings`]).
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// The pulls under way and how far each has come.
    pub fn pulls_in_progress(&self) -> Vec<crate::PullProgress> {
        self.inner.progress.snapshot()
    }

    /// The registry settings in force.
    pub fn registry_settings(&self) -> RegistrySettings {
        self.inner.registry_settings()
    }

    /// Applies new registry settings to the pulls that start from now on; pulls under way
    /// finish with the settings they started with. A lower download limit takes effect as
    /// downloads under way end.
    pub fn set_registry_settings(&self, new: RegistrySettings) {
        let new = RegistrySettings {
            max_concurrent_downloads: new.max_concurrent_downloads.max(1),
            ..new
        };
        let old = {
            let mut settings = self
                .inner
                .registry
                .write()
                .unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *settings, new.clone())
        };
        self.inner
            .downloads
            .set_limit(old.max_concurrent_downloads, new.max_concurrent_downloads);
    }

    pub fn content(&self) -> &ContentStore {
        &self.inner.content
    }

    /// The image named by `name`: a full id (`sha256:<hex>` or `<hex>`), a reference
    /// (`busybox`, `repo:tag`, `repo@sha256:…`), or a unique id prefix of 12+ hex characters.
    /// None if no image matches.
    pub fn get(&self, name: &str) -> Result<Option<ImageRecord>> {
        self.inner.records.get(name)
    }

    /// The first repo tag and the first repo digest of the image whose id is `id`, each if it
    /// has one; None if the image is not here. A status call asks this for every container, so
    /// it copies the two names, not the record.
    pub fn names_of(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>> {
        self.inner.records.names_of(id)
    }

    /// All images, or those `filter` names (same forms as [`ImageStore::get`]).
    pub fn list(&self, filter: Option<&str>) -> Result<Vec<ImageRecord>> {
        self.inner.records.list(filter)
    }

    /// The image config JSON, as the registry served it (for verbose ImageStatus).
    pub fn config_json(&self, record: &ImageRecord) -> Result<String> {
        let data = self.inner.content.read(&record.config_digest)?;
        String::from_utf8(data)
            .map_err(|_| Error::Internal(format!("config {} is not UTF-8", record.config_digest)))
    }

    /// Marks an image pinned or not (kubelet never collects pinned images).
    pub fn set_pinned(&self, name: &str, pinned: bool) -> Result<ImageRecord> {
        self.inner.records.set_pinned(name, pinned)
    }

    /// Removes the image `name` (id, tag or digest) with all its tags, then frees the blobs
    /// and snapshots nothing else uses. Returns the removed id; None (not an error) if no such
    /// image exists, so removal is idempotent.
    pub async fn remove(&self, name: &str) -> Result<Option<String>> {
        let removed = self.inner.records.remove(name)?;
        if removed.is_some() {
            self.gc().await?;
        }
        Ok(removed)
    }

    /// The annotations of the manifest `record` was pulled or imported by.
    pub fn manifest_annotations(
        &self,
        record: &ImageRecord,
    ) -> Result<std::collections::HashMap<String, String>> {
        let body = self.content().read(&record.manifest_digest)?;
        let manifest: crate::manifest::Manifest =
            serde_json::from_slice(&body).map_err(|source| crate::Error::BadJson {
                what: "manifest".to_owned(),
                digest: record.manifest_digest.clone(),
                source,
            })?;
        Ok(manifest.annotations)
    }

    /// The overlay lowerdirs of an image, top layer first (the order `lowerdir=` wants).
    pub fn lowerdirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        let record = self
            .get(name)?
            .ok_or_else(|| Error::ImageNotFound(name.to_string()))?;
        self.inner
            .snapshots
            .lowerdirs(&record.chain_ids, &record.id)
    }

    /// Holds the snapshots of image `name` for `holder` (a container id) so that removing the
    /// image keeps them until [`ImageStore::release`]. Persisted; returns the lowerdirs.
    pub fn lease(&self, holder: &str, name: &str) -> Result<Vec<PathBuf>> {
        let (dirs, file) = self.lease_deferred(holder, name)?;
        if let Err(e) = file.persist() {
            // Not on disk, so not held.
            self.inner.leases.forget(holder)?;
            return Err(e);
        }
        Ok(dirs)
    }

    /// As [`ImageStore::lease`], but the lease file is written by the returned [`LeaseFile`],
    /// so that its two disk flushes can overlap with other work. The lease holds at once (the
    /// collection reads the leases in memory); the caller persists it before it reports the
    /// holder made, and before it releases it (a file written after the release would stay
    /// until the next start).
    pub fn lease_deferred(&self, holder: &str, name: &str) -> Result<(Vec<PathBuf>, LeaseFile)> {
        check_holder(holder)?;
        let record = self
            .get(name)?
            .ok_or_else(|| Error::ImageNotFound(name.to_string()))?;
        let dirs = self
            .inner
            .snapshots
            .lowerdirs(&record.chain_ids, &record.id)?;
        self.inner.leases.hold(holder, record.chain_ids.clone())?;
        let file = LeaseFile {
            inner: Arc::clone(&self.inner),
            holder: holder.to_string(),
            chain_ids: record.chain_ids,
        };
        Ok((dirs, file))
    }

    /// The lowerdirs a holder's lease keeps, if it has one (e.g. after the image was removed).
    pub fn leased_lowerdirs(&self, holder: &str) -> Result<Option<Vec<PathBuf>>> {
        match self.inner.leases.chains_of(holder)? {
            None => Ok(None),
            Some(chain) => Ok(Some(self.inner.snapshots.lowerdirs(&chain, holder)?)),
        }
    }

    /// The holders of every lease (container ids, `<id>.vol<i>`).
    pub fn lease_holders(&self) -> Result<Vec<String>> {
        self.inner.leases.holders()
    }

    /// Drops `holder`'s lease (idempotent) and frees what only it kept. The lease file's
    /// removal is not synced (it saves a directory fsync per RemoveContainer): after a power
    /// loss the lease may be back, and the daemon releases, at its start, every lease whose
    /// holder it does not know ([`ImageStore::lease_holders`]).
    /// A collection follows only when the lease held a snapshot nothing else references
    /// (its image was removed meanwhile): usually the image is still there and there is
    /// nothing to free, and a RemoveContainer need not list the content store.
    pub async fn release(&self, holder: &str) -> Result<()> {
        let Some(chains) = self.inner.leases.release(holder)? else {
            return Ok(());
        };
        // In the collection's order (records, then leases). What changes meanwhile is
        // harmless: the collection works out what is referenced again.
        let (_, recorded) = self.inner.records.referenced()?;
        let leased = self.inner.leases.held_chains()?;
        let freed = chains
            .iter()
            .any(|c| !recorded.contains(c) && !leased.contains(c));
        if freed {
            self.gc().await?;
        }
        Ok(())
    }

    /// Removes blobs and snapshots no image record or lease references. If a pull is in
    /// progress the collection is deferred until it ends (and this returns zero counts).
    pub async fn gc(&self) -> Result<GcStats> {
        self.inner.clone().gc().await
    }

    /// Bytes and inodes used by blobs and snapshots.
    pub async fn fs_usage(&self) -> Result<FsUsage> {
        let generation = self.inner.generation.load(Ordering::SeqCst);
        if let Ok(cache) = self.inner.usage_cache.lock() {
            if let Some((g, at, usage)) = cache.as_ref() {
                if *g == generation && at.elapsed() < USAGE_CACHE_TTL {
                    return Ok(usage.clone());
                }
            }
        }
        let root = self.inner.config.root.clone();
        let snapshots = self.inner.snapshots.dir().to_path_buf();
        let usage = tokio::task::spawn_blocking(move || {
            let mut seen = HashSet::new();
            let mut usage = (0u64, 0u64);
            for dir in [root.join("content"), snapshots.clone()] {
                du(&dir, &mut seen, &mut usage);
            }
            FsUsage {
                mountpoint: snapshots,
                used_bytes: usage.0,
                inodes_used: usage.1,
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("fs usage task: {e}")))?;
        if let Ok(mut cache) = self.inner.usage_cache.lock() {
            *cache = Some((generation, Instant::now(), usage.clone()));
        }
        Ok(usage)
    }
}

impl Inner {
    /// Unpacks the fetched `layer` into the snapshot of `chain` (its diff ID `diff` checked),
    /// for a pull or an import alike; an unpack that outlives its caller holds the gate.
    pub(crate) async fn unpack(
        self: &Arc<Self>,
        layer: &Descriptor,
        diff: &Digest,
        chain: &Digest,
        stats: &Arc<Stats>,
    ) -> Result<()> {
        let this = self.clone();
        self.snapshots
            .unpack(
                self.content.path(&layer.digest),
                &layer.digest,
                diff,
                chain,
                stats,
                move || this.hold_gate_now(),
            )
            .await
    }

    pub(crate) async fn gc(self: Arc<Self>) -> Result<GcStats> {
        let Ok(gate) = self.gc_gate.clone().try_write_owned() else {
            self.gc_pending
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Ok(GcStats::default());
        };
        let (blobs, recorded) = self.records.referenced()?;
        let leased = self.leases.held_chains()?;
        let chains: HashSet<String> = recorded
            .iter()
            .chain(leased.iter())
            .map(|c| c.hex().to_string())
            .collect();
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || -> Result<GcStats> {
            // The sweep keeps the gate even if the caller stops waiting for it.
            let _gate = gate;
            let mut stats = GcStats::default();
            for d in this.content.list()? {
                if !blobs.contains(&d) {
                    this.content.remove(&d)?;
                    stats.blobs_removed += 1;
                }
            }
            stats.snapshots_removed = this.snapshots.sweep(&chains)?;
            Ok(stats)
        })
        .await
        .map_err(|e| Error::Internal(format!("gc task: {e}")))??;
        if stats != GcStats::default() {
            self.generation.fetch_add(1, Ordering::SeqCst);
            tracing::info!(
                blobs = stats.blobs_removed,
                snapshots = stats.snapshots_removed,
                "image gc"
            );
        }
        Ok(stats)
    }
}

/// A shared hold on the gc gate. Letting go of the last hold runs the collection that was asked
/// for while it was held. A pull's hold is `dirty`: a pull that fails, or is dropped half-way,
/// leaves blobs and snapshots no record names, and its hold asks for a collection on the way
/// out so they do not wait for the next start.
pub(crate) struct GateHold {
    inner: Arc<Inner>,
    guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    dirty: bool,
}

impl Inner {
    /// Waits for a running collection, then holds the gate; `dirty` as in [`GateHold`].
    pub(crate) async fn hold_gate(self: &Arc<Self>, dirty: bool) -> GateHold {
        let guard = self.gc_gate.clone().read_owned().await;
        GateHold {
            inner: self.clone(),
            guard: Some(guard),
            dirty,
        }
    }

    /// One more hold while one is already held (a collection never waits for the gate, so
    /// this does not fail then). Used by unpacks, which go on after their pull is dropped.
    pub(crate) fn hold_gate_now(self: &Arc<Self>) -> Option<GateHold> {
        let guard = self.gc_gate.clone().try_read_owned().ok()?;
        Some(GateHold {
            inner: self.clone(),
            guard: Some(guard),
            dirty: false,
        })
    }
}

impl GateHold {
    /// Lets go of the gate; true when the caller must now run a collection (one was asked for,
    /// or `failed` and the hold is dirty).
    pub(crate) fn release(mut self, failed: bool) -> bool {
        self.dirty &= failed;
        self.let_go()
    }

    fn let_go(&mut self) -> bool {
        if self.dirty {
            self.inner.gc_pending.store(true, Ordering::SeqCst);
            self.dirty = false;
        }
        if self.guard.take().is_none() {
            return false;
        }
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        self.inner.gc_pending.swap(false, Ordering::SeqCst)
    }
}

impl Drop for GateHold {
    fn drop(&mut self) {
        if !self.let_go() {
            return;
        }
        // Dropped without release (a cancelled pull, an unpack outliving its pull): collect in
        // the background, or leave the request for the next holder when no runtime is left.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let inner = self.inner.clone();
                rt.spawn(async move {
                    if let Err(e) = inner.gc().await {
                        tracing::warn!("image gc after a pull: {e}");
                    }
                });
            }
            Err(_) => self.inner.gc_pending.store(true, Ordering::SeqCst),
        }
    }
}

/// Adds up allocated bytes and inodes under `dir`, counting hard-linked inodes once.
fn du(dir: &Path, seen: &mut HashSet<(u64, u64)>, usage: &mut (u64, u64)) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        usage.0 += m.blocks() * 512;
        usage.1 += 1;
        if m.is_dir() {
            du(&e.path(), seen, usage);
        }
    }
}
