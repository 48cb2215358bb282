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
use crate::error::{Error, ErrorKind, Result};
use crate::hosts::{resolve_hosts, RegistryHost};
use crate::manifest::{self, parse_json, Descriptor, ImageConfig, Index, Manifest, ManifestKind};
use crate::progress::{Meter, PullReport, Stats, Tracker};
use crate::records::ImageRecord;
use crate::reference::Reference;
use crate::registry::{read_limited, Auth, Session};
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

impl Inner {
    async fn pull(
        self: Arc<Self>,
        reference: &Reference,
        auth: &Auth,
        options: PullOptions,
        started: Instant,
        progress: Arc<Tracker>,
    ) -> Result<PullOutcome> {
        let what = reference.to_string();
        let settings = self.registry_settings();
        let hosts = resolve_hosts(settings.config_dir.as_deref(), reference.domain())?;
        let file_auths = match &settings.auth_file {
            Some(path) => crate::auth_file::load(path)?,
            None => Default::default(),
        };
        let session = Arc::new(Session::new(
            self.clients.clone(),
            hosts,
            reference.domain(),
            reference.path(),
            auth,
            file_auths,
            settings.no_progress_timeout,
        ));
        let by_digest = reference.digest().is_some();
        let resolvers: Vec<RegistryHost> = session
            .hosts
            .iter()
            .filter(|h| {
                if by_digest {
                    h.capabilities.pull
                } else {
                    h.capabilities.resolve
                }
            })
            .cloned()
            .collect();
        let pullers: Vec<RegistryHost> = session
            .hosts
            .iter()
            .filter(|h| h.capabilities.pull)
            .cloned()
            .collect();

        let (top_digest, top_bytes, content_type) = self
            .fetch_manifest(
                &session,
                &resolvers,
                &reference.object(),
                reference.digest(),
                &what,
            )
            .await?;
        // Stored (on a blocking thread) while the config and layers download, below.
        let mut manifests = vec![(top_digest.clone(), top_bytes.clone())];
        let (kind, media_type) = manifest::manifest_kind(&top_bytes, content_type.as_deref());
        let (index_digest, manifest_digest, manifest_bytes) = match kind {
            ManifestKind::Index => {
                let index: Index = parse_json(&top_bytes, "image index", &top_digest)?;
                let platform = &self.config.platform;
                let chosen = index
                    .select(platform)
                    .ok_or_else(|| Error::NoMatchingPlatform {
                        reference: what.clone(),
                        platform: platform.to_string(),
                        available: index.platforms(),
                    })?;
                let (d, bytes, ct) = self
                    .fetch_manifest(
                        &session,
                        &pullers,
                        chosen.digest.as_str(),
                        Some(&chosen.digest),
                        &what,
                    )
                    .await?;
                let (child_kind, child_type) = manifest::manifest_kind(&bytes, ct.as_deref());
                if child_kind != ManifestKind::Manifest {
                    return Err(Error::UnsupportedMediaType {
                        media_type: child_type,
                        what: format!("manifest {d} of {what}"),
                    });
                }
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
        // Refused before any download.
        manifest.check_layers(&format!("manifest of {what}"), &what)?;

        progress.set_total(manifest.size());
        let stats = Arc::new(Stats::new(progress));
        // The config is fetched beside the layers, not before them: a layer's unpack needs its
        // diff ID from the config, its download does not. The layers' IDs reach their tasks
        // through `ids`; should the config fail, its error is the pull's and the layer tasks
        // are dropped with it.
        let (ids_tx, ids) = tokio::sync::watch::channel(None);
        let config_work = async {
            self.fetch_blob(&session, &manifest.config, &stats).await?;
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
            let _ = ids_tx.send(Some(layer_ids.clone()));
            Ok((config, layer_ids))
        };

        let work = manifest.layers.iter().enumerate().map(|(i, layer)| {
            let this = self.clone();
            let session = session.clone();
            let stats = stats.clone();
            let mut ids = ids.clone();
            async move {
                this.fetch_blob(&session, layer, &stats).await?;
                if options.unpack {
                    // Waits for the config's IDs. Their sender lives as long as this pull,
                    // so no error comes while the join below runs; should one come, the
                    // config's own result decides the pull.
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
                    this.unpack(layer, diff, chain, &stats).await?;
                }
                Ok::<_, Error>(())
            }
        });
        let staging = {
            let this = self.clone();
            let stats = stats.clone();
            tokio::task::spawn_blocking(move || {
                for (digest, bytes) in &manifests {
                    if this.content.stage_bytes(digest, bytes)? {
                        stats.stored.store(true, Ordering::Relaxed);
                    }
                }
                Ok::<_, Error>(())
            })
        };
        let joined =
            futures::future::try_join(config_work, futures::future::try_join_all(work)).await;
        // Awaited whatever the downloads did: the collection after a failed pull must find
        // the manifests in the store to free them.
        let staged = staging
            .await
            .map_err(|e| Error::Internal(format!("store the manifests: {e}")))?;
        let ((config, layer_ids), _) = joined?;
        staged?;
        let chains = layer_ids.1.clone();

        let report = stats.report(manifest.layers.len(), started)?;
        if !options.unpack {
            return Ok((None, report));
        }

        let record = ImageRecord::new(
            &manifest,
            manifest_digest,
            index_digest,
            &config,
            chains,
            reference.repo_tag().into_iter().collect(),
            vec![reference.repo_digest(&top_digest)],
        );
        // The directory entries of the blobs this pull stored (or waited for) are durable
        // before the record that names them.
        if stats.stored.load(Ordering::Relaxed) {
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.content.sync_dir())
                .await
                .map_err(|e| Error::Internal(format!("sync the blob directory: {e}")))??;
        }
        let record = self.commit_record(record)?;
        tracing::info!(
            image = %what,
            id = %record.id,
            secs = report.total_time.as_secs_f64(),
            fetched = report.fetched_bytes,
            "pulled image"
        );
        Ok((Some(record), report))
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

    /// Makes sure `desc` is in the content store, downloading it once however many pulls ask.
    async fn fetch_blob(
        self: &Arc<Self>,
        session: &Arc<Session>,
        desc: &Descriptor,
        stats: &Arc<Stats>,
    ) -> Result<()> {
        if self.content.has(&desc.digest, Some(desc.size)) {
            stats.progress.add_done(desc.size);
            return Ok(());
        }
        stats.stored.store(true, Ordering::Relaxed);
        let this = self.clone();
        let session = session.clone();
        let size = desc.size;
        let desc = desc.clone();
        let stats = stats.clone();
        let key = desc.digest.to_string();
        // Counts the bytes as they arrive when this pull's run downloads the blob; when it
        // joins another pull's download, the blob counts once it is there.
        let meter = Arc::new(Meter::new(
            stats.progress.clone(),
            desc.digest.as_str(),
            desc.size,
        ));
        let counting = meter.clone();
        self.blob_work
            .run(&key, move || async move {
                this.download(&session, &desc, &stats, &counting).await
            })
            .await?;
        meter.finish(size);
        Ok(())
    }

    async fn download(
        &self,
        session: &Session,
        desc: &Descriptor,
        stats: &Stats,
        meter: &Meter,
    ) -> Result<u64> {
        let _slot = self
            .download_slots
            .acquire()
            .await
            .map_err(|_| Error::Internal("download slots closed".into()))?;
        if self.content.has(&desc.digest, Some(desc.size)) {
            return Ok(0);
        }
        let non_distributable = manifest::layer_kind(&desc.media_type).is_some_and(|(_, nd)| nd);
        let label = format!("blob {}", desc.digest);
        let mut last = None;
        for host in session.hosts.iter().filter(|h| h.capabilities.pull) {
            let start = Instant::now();
            let result = async {
                let resp = session
                    .get(host, &format!("blobs/{}", desc.digest), "", &label)
                    .await?;
                self.content
                    .write_stream(
                        &host.authority,
                        &desc.digest,
                        desc.size,
                        resp.into_body(),
                        session.timeout,
                        meter,
                    )
                    .await
            }
            .await;
            match result {
                Ok(n) => {
                    stats.fetched(start, n);
                    return Ok(n);
                }
                Err(e) => {
                    meter.undo();
                    tracing::warn!(host = %host, "{label}: {e}");
                    last = Some(e);
                }
            }
        }
        let err = last.unwrap_or_else(|| no_hosts(&label));
        if non_distributable && err.kind() == ErrorKind::NotFound {
            return Err(Error::NonDistributable {
                digest: desc.digest.clone(),
                media_type: desc.media_type.clone(),
                urls: desc.urls.clone(),
            });
        }
        Err(err)
    }
}

fn no_hosts(what: &str) -> Error {
    Error::Internal(format!(
        "{what}: no registry host may serve it (check the capabilities in hosts.toml)"
    ))
}
