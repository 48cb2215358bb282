//! Pulling an image: resolve the reference on the registry's hosts (mirrors first), pick this
//! platform's manifest from an index, fetch the config and the layers concurrently into the
//! content store, unpack each layer into its snapshot as soon as it is there, and record the
//! image. Concurrent pulls of one image share one run; blobs and snapshots are shared by
//! digest and chain ID across pulls.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::CONTENT_TYPE;

use crate::digest::{chain_ids, Digest};
use crate::error::{Error, Result};
use crate::hosts::{resolve_hosts, RegistryHost};
use crate::manifest::{self, parse_json, Descriptor, ImageConfig, Index, Manifest, ManifestKind};
use crate::progress::{PullReport, Stats, Tracker};
use crate::records::ImageRecord;
use crate::reference::Reference;
use crate::registry::{no_hosts, read_limited, Auth, Session};
use crate::store::{ImageStore, Inner, PullOutcome};

const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// How to pull.
#[derive(Debug, Clone, Copy)]
pub struct PullOptions {
    /// Unpack layers and record the image (false: only fetch the blobs, for benchmarks).
    pub unpack: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self { unpack: true }
    }
}

impl ImageStore {
    /// Pulls `image` (any reference form) and returns its record. Two concurrent pulls of the
    /// same reference share the work.
    pub async fn pull(&self, image: &str, auth: &Auth) -> Result<ImageRecord> {
        let (record, _) = self.pull_with(image, auth, PullOptions::default()).await?;
        record.ok_or_else(|| Error::Internal(format!("pull {image}: no image recorded")))
    }

    /// [`ImageStore::pull`] with options, also returning the pull's figures.
    pub async fn pull_with(
        &self,
        image: &str,
        auth: &Auth,
        options: PullOptions,
    ) -> Result<(Option<ImageRecord>, PullReport)> {
        let reference = Reference::parse(image)?;
        // Pulls with other credentials do not share a run: each gets its own auth errors.
        let key = format!("{reference}|{}|{}", options.unpack, auth.fingerprint());
        let inner = self.inner.clone();
        let auth = auth.clone();
        self.inner
            .pulls
            .run(&key, move || async move {
                let started = Instant::now();
                let progress = inner.progress.begin(reference.to_string());
                let hold = inner.hold_gate(true).await;
                let result = inner
                    .clone()
                    .pull(
                        &reference,
                        &auth,
                        options,
                        started,
                        progress.tracker.clone(),
                    )
                    .await;
                drop(progress);
                // A failed pull frees what it fetched and nothing else names. A layer another
                // pull in progress shares is safe: the collection is put off until no pull
                // holds the gate, and by then that pull's record names the layer.
                if hold.release(result.is_err()) {
                    if let Err(e) = inner.clone().gc().await {
                        tracing::warn!("image gc after a pull: {e}");
                    }
                }
                result
            })
            .await
    }
}

/// What a pull's reference resolved to: this platform's manifest, checked, and the manifests
/// on the way there (stored while the blobs download).
struct Resolved {
    /// The digest the reference resolved to: the index's, or the manifest's when there is none.
    top_digest: Digest,
    index_digest: Option<Digest>,
    manifest_digest: Digest,
    manifest: Manifest,
    /// The index (if any) and the manifest, as the registry served them.
    manifests: Vec<(Digest, Bytes)>,
}

/// The layers' diff IDs and chain IDs from the config, one of each per layer.
type LayerIds = Arc<(Vec<Digest>, Vec<Digest>)>;

impl Inner {
    /// One pull run: resolve the reference, fetch the config and layers (unpacking each as it
    /// comes), then record the image.
    async fn pull(
        self: Arc<Self>,
        reference: &Reference,
        auth: &Auth,
        options: PullOptions,
        started: Instant,
        progress: Arc<Tracker>,
    ) -> Result<PullOutcome> {
        let what = reference.to_string();
        let session = self.session(reference, auth)?;
        let resolved = self.resolve(&session, reference, &what).await?;
        let manifest = &resolved.manifest;
        progress.set_total(manifest.size());
        let stats = Arc::new(Stats::new(progress));
        let (config, layer_ids) = self
            .fetch_and_unpack(&session, &resolved, options.unpack, &stats, &what)
            .await?;
        let report = stats.report(manifest.layers.len(), started)?;
        if !options.unpack {
            return Ok((None, report));
        }
        let record = ImageRecord::new(
            manifest,
            resolved.manifest_digest.clone(),
            resolved.index_digest.clone(),
            &config,
            layer_ids.1.clone(),
            reference.repo_tag().into_iter().collect(),
            vec![reference.repo_digest(&resolved.top_digest)],
        );
        let record = self.record_pulled(record, &stats).await?;
        tracing::info!(
            image = %what,
            id = %record.id,
            secs = report.total_time.as_secs_f64(),
            fetched = report.fetched_bytes,
            "pulled image"
        );
        Ok((Some(record), report))
    }

    /// A registry session for the reference's hosts (`hosts.toml`, mirrors first) with the
    /// request's credentials and those of the auth file, read now.
    fn session(&self, reference: &Reference, auth: &Auth) -> Result<Arc<Session>> {
        let settings = self.registry_settings();
        let hosts = resolve_hosts(settings.config_dir.as_deref(), reference.domain())?;
        let file_auths = match &settings.auth_file {
            Some(path) => crate::auth_file::load(path)?,
            None => Default::default(),
        };
        Ok(Arc::new(Session::new(
            self.clients.clone(),
            hosts,
            reference.domain(),
            reference.path(),
            auth,
            file_auths,
            settings.no_progress_timeout,
        )))
    }

    /// Resolves `reference` to this platform's manifest and checks it, before any blob is
    /// downloaded. A tag is resolved on the hosts that may resolve, a digest on those that
    /// may serve pulls.
    async fn resolve(
        &self,
        session: &Session,
        reference: &Reference,
        what: &str,
    ) -> Result<Resolved> {
        let by_digest = reference.digest().is_some();
        let resolvers = hosts_where(session, |h| {
            if by_digest {
                h.capabilities.pull
            } else {
                h.capabilities.resolve
            }
        });
        let (top_digest, top_bytes, content_type) = self
            .fetch_manifest(
                session,
                &resolvers,
                &reference.object(),
                reference.digest(),
                what,
            )
            .await?;
        let mut manifests = vec![(top_digest.clone(), top_bytes.clone())];
        let (kind, media_type) = manifest::manifest_kind(&top_bytes, content_type.as_deref());
        let (index_digest, manifest_digest, manifest_bytes) = match kind {
            ManifestKind::Index => {
                let (d, bytes) = self
                    .platform_manifest(session, &top_digest, &top_bytes, what)
                    .await?;
                manifests.push((d.clone(), bytes.clone()));
                (Some(top_digest.clone()), d, bytes)
            }
            ManifestKind::Manifest => (None, top_digest.clone(), top_bytes),
            ManifestKind::Unsupported => {
                return Err(Error::UnsupportedMediaType {
                    media_type,
                    what: format!("manifest of {what}"),
                })
            }
        };
        let manifest: Manifest = parse_json(&manifest_bytes, "manifest", &manifest_digest)?;
        manifest.check_layers(&format!("manifest of {what}"), what)?;
        Ok(Resolved {
            top_digest,
            index_digest,
            manifest_digest,
            manifest,
            manifests,
        })
    }

    /// This platform's manifest from the index `index_bytes`, fetched from the hosts that
    /// may serve pulls; it must be a manifest, not another index.
    async fn platform_manifest(
        &self,
        session: &Session,
        index_digest: &Digest,
        index_bytes: &[u8],
        what: &str,
    ) -> Result<(Digest, Bytes)> {
        let index: Index = parse_json(index_bytes, "image index", index_digest)?;
        let chosen = index.choose(&self.config.platform, what)?;
        let pullers = hosts_where(session, |h| h.capabilities.pull);
        let (d, bytes, ct) = self
            .fetch_manifest(
                session,
                &pullers,
                chosen.digest.as_str(),
                Some(&chosen.digest),
                what,
            )
            .await?;
        let (kind, media_type) = manifest::manifest_kind(&bytes, ct.as_deref());
        if kind != ManifestKind::Manifest {
            return Err(Error::UnsupportedMediaType {
                media_type,
                what: format!("manifest {d} of {what}"),
            });
        }
        Ok((d, bytes))
    }

    /// Fetches the config and the layers concurrently, unpacking each layer (with `unpack`)
    /// as soon as its blob and the config's diff IDs are there, while a blocking thread stores
    /// the manifests. Returns the config and the layers' IDs.
    async fn fetch_and_unpack(
        self: &Arc<Self>,
        session: &Arc<Session>,
        resolved: &Resolved,
        unpack: bool,
        stats: &Arc<Stats>,
        what: &str,
    ) -> Result<(ImageConfig, LayerIds)> {
        let manifest = &resolved.manifest;
        // The config is fetched beside the layers, not before them: a layer's unpack needs its
        // diff ID from the config, its download does not. The layers' IDs reach their tasks
        // through `ids`; should the config fail, its error is the pull's and the layer tasks
        // are dropped with it. The sender lives until the join below is over.
        let (ids_tx, ids) = tokio::sync::watch::channel(None);
        let config_work = self.fetch_config(session, manifest, stats, &ids_tx, what);
        let layer_work = manifest
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| self.fetch_layer(session, layer, i, unpack, stats, ids.clone()));
        let staging = self.stage_manifests(resolved.manifests.clone(), stats);
        let joined =
            futures::future::try_join(config_work, futures::future::try_join_all(layer_work)).await;
        // Awaited whatever the downloads did: the collection after a failed pull must find
        // the manifests in the store to free them.
        let staged = staging
            .await
            .map_err(|e| Error::Internal(format!("store the manifests: {e}")))?;
        let ((config, layer_ids), _) = joined?;
        staged?;
        Ok((config, layer_ids))
    }

    /// Fetches and checks the config, then sends the layers' IDs to the layer tasks.
    async fn fetch_config(
        self: &Arc<Self>,
        session: &Arc<Session>,
        manifest: &Manifest,
        stats: &Arc<Stats>,
        ids: &tokio::sync::watch::Sender<Option<LayerIds>>,
        what: &str,
    ) -> Result<(ImageConfig, LayerIds)> {
        self.downloads
            .fetch(&self.content, session, &manifest.config, stats)
            .await?;
        let config_bytes = self.content.read(&manifest.config.digest)?;
        let config: ImageConfig =
            parse_json(&config_bytes, "image config", &manifest.config.digest)?;
        manifest
            .check_diff_ids(&config)
            .map_err(|reason| Error::InvalidImage {
                what: what.to_string(),
                reason,
            })?;
        let diff_ids = config.rootfs.diff_ids.clone();
        let chains = chain_ids(&diff_ids);
        let layer_ids = Arc::new((diff_ids, chains));
        // Nobody listening is fine: without unpacking, no layer task waits.
        let _ = ids.send(Some(layer_ids.clone()));
        Ok((config, layer_ids))
    }

    /// Fetches layer `i`, then (with `unpack`) waits for the config's IDs and unpacks it.
    async fn fetch_layer(
        self: &Arc<Self>,
        session: &Arc<Session>,
        layer: &Descriptor,
        i: usize,
        unpack: bool,
        stats: &Arc<Stats>,
        mut ids: tokio::sync::watch::Receiver<Option<LayerIds>>,
    ) -> Result<()> {
        self.downloads
            .fetch(&self.content, session, layer, stats)
            .await?;
        if !unpack {
            return Ok(());
        }
        // The sender lives as long as the pull's join, so no error comes while it runs;
        // should one come, the config's own result decides the pull.
        let layer_ids = match ids.wait_for(Option::is_some).await {
            Ok(ids) => ids.clone(),
            Err(_) => None,
        };
        let Some(layer_ids) = layer_ids else {
            return Ok(());
        };
        let (diff_ids, chains) = &*layer_ids;
        // The config's work checked that there is one per layer.
        let (Some(diff), Some(chain)) = (diff_ids.get(i), chains.get(i)) else {
            return Err(Error::Internal(format!("no diff ID for layer {i}")));
        };
        self.unpack(layer, diff, chain, stats).await
    }

    /// Stores the manifests on a blocking thread, started at once.
    fn stage_manifests(
        self: &Arc<Self>,
        manifests: Vec<(Digest, Bytes)>,
        stats: &Arc<Stats>,
    ) -> tokio::task::JoinHandle<Result<()>> {
        let this = self.clone();
        let stats = stats.clone();
        tokio::task::spawn_blocking(move || {
            for (digest, bytes) in &manifests {
                if this.content.stage_bytes(digest, bytes)? {
                    stats.stored.store(true, Ordering::Relaxed);
                }
            }
            Ok(())
        })
    }

    /// Records the image, once the directory entries of the blobs this pull stored (or
    /// waited for) are durable: never a record naming a blob a power loss can take.
    async fn record_pulled(
        self: &Arc<Self>,
        record: ImageRecord,
        stats: &Stats,
    ) -> Result<ImageRecord> {
        if stats.stored.load(Ordering::Relaxed) {
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.content.sync_dir())
                .await
                .map_err(|e| Error::Internal(format!("sync the blob directory: {e}")))??;
        }
        self.records.commit(record)
    }

    /// Fetches a manifest from the first host that has it, checking its digest when known.
    async fn fetch_manifest(
        &self,
        session: &Session,
        hosts: &[RegistryHost],
        object: &str,
        expected: Option<&Digest>,
        what: &str,
    ) -> Result<(Digest, Bytes, Option<String>)> {
        let mut last = None;
        for host in hosts {
            match self
                .fetch_manifest_from(session, host, object, expected, what)
                .await
            {
                Ok(found) => return Ok(found),
                Err(e) => {
                    tracing::warn!(host = %host, "manifest of {what}: {e}");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| no_hosts(what)))
    }

    async fn fetch_manifest_from(
        &self,
        session: &Session,
        host: &RegistryHost,
        object: &str,
        expected: Option<&Digest>,
        what: &str,
    ) -> Result<(Digest, Bytes, Option<String>)> {
        let label = format!("manifest {what}");
        let resp = session
            .get(
                host,
                &format!("manifests/{object}"),
                manifest::ACCEPT_MANIFESTS,
                &label,
            )
            .await?;
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_limited(resp, MAX_MANIFEST_BYTES, session.timeout)
            .await
            .map_err(|e| match e {
                // A stalled manifest is a deadline, like a stalled blob.
                Error::ResponseStalled { secs } => Error::ManifestStalled {
                    registry: host.authority.clone(),
                    what: label.clone(),
                    secs,
                },
                e => Error::Protocol {
                    registry: host.authority.clone(),
                    what: label.clone(),
                    reason: e.to_string(),
                },
            })?;
        let digest = Digest::of(&body);
        if let Some(expected) = expected {
            if expected != &digest {
                return Err(Error::Verification {
                    expected: expected.clone(),
                    reason: format!("manifest from {} has digest {digest}", host.authority),
                });
            }
        }
        Ok((digest, body, content_type))
    }
}

/// The session's hosts that `keep` lets through, in order.
fn hosts_where(session: &Session, keep: impl Fn(&RegistryHost) -> bool) -> Vec<RegistryHost> {
    session.hosts.iter().filter(|h| keep(h)).cloned().collect()
}
