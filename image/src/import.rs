//! Importing image archives: an OCI image layout in a tar (`index.json`, `oci-layout`,
//! `blobs/sha256/…`), or a `docker save` archive (`manifest.json` naming a config and layer
//! tars). Several images per archive; an archive that has both (a newer `docker save`, or
//! crius's own export) is read as the OCI layout.
//!
//! The archive is read once, front to back, so it can come from a pipe: every regular file is
//! streamed into a staging directory under `content/ingest/` while its digest is computed, and
//! only then is the archive interpreted. A blob is looked up by the digest of what was actually
//! read, so a descriptor naming content the archive does not hold (or holds under another
//! digest) fails, and an OCI `blobs/sha256/<hex>` file whose content has another digest fails
//! the whole import. Layers are unpacked into snapshots by the same code as a pull (the diff ID
//! checked), and the records written the same way, so an imported image is indistinguishable
//! from a pulled one; the staging directory goes with whatever was not used.
//!
//! From an index the manifest for the store's platform is chosen, as a pull chooses it; index
//! entries for other platforms are skipped.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::content::{unique_suffix, TempPath};
use crate::digest::{chain_ids, Digest};
use crate::error::{Error, Result};
use crate::manifest::{
    self, parse_json, Descriptor, ImageConfig, Index, LayerKind, Manifest, ManifestKind, Platform,
};
use crate::progress::{Stats, Tracker};
use crate::records::ImageRecord;
use crate::reference::Reference;
use crate::store::{ImageStore, Inner};

/// The most entries an archive may have: far more than any real image (a layout holds one file
/// per blob), few enough that a runaway archive stops early.
const MAX_ENTRIES: usize = 100_000;
/// The largest JSON document (index, manifest, config, `manifest.json`) read from an archive.
const MAX_JSON_BYTES: u64 = 8 << 20;
/// The annotation containerd (and `docker save` from Docker 25) uses for an image's full name.
pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation for a reference name (often only the tag).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The media type of the manifests crius makes for `docker save` images, which have none.
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// What an import did.
#[derive(Debug, Clone, Default)]
pub struct ImportReport {
    /// The images recorded, in archive order (one record per image, with all its names).
    pub images: Vec<ImageRecord>,
    /// Index entries skipped because they are for another platform.
    pub skipped_platforms: Vec<String>,
    /// Bytes of archive read.
    pub archive_bytes: u64,
    /// Layers unpacked by this import (layers already present are not counted).
    pub layers_unpacked: usize,
    pub seconds: f64,
}

/// One regular file of the archive, staged.
#[derive(Debug)]
struct StagedFile {
    digest: Digest,
    size: u64,
    path: PathBuf,
}

/// The archive's content after the one pass: files by their path in the archive, links.
struct Staged {
    dir: TempPath,
    files: HashMap<String, StagedFile>,
    links: HashMap<String, String>,
    by_digest: HashMap<Digest, String>,
    bytes: u64,
}

/// An image found in the archive, ready to be committed.
struct Found {
    names: Vec<Reference>,
    /// The digest `repo@digest` names: the index or manifest the archive's entry pointed at
    /// (None for a `docker save` image, which has no manifest of its own).
    top: Option<Digest>,
    index: Option<(Digest, String)>,
    /// The manifest, and where its bytes are (staged, or made here for `docker save`).
    manifest_digest: Digest,
    manifest_source: Blob,
    manifest: Manifest,
    config: ImageConfig,
    /// Archive path of each blob (config, layers) by digest.
    blobs: Vec<(Digest, String)>,
}

enum Blob {
    Staged(String),
    Made(Vec<u8>),
}

impl ImageStore {
    /// Imports every image of the archive `input` (an OCI layout or a `docker save` tar,
    /// uncompressed, gzip- or zstd-compressed), as described in the module documentation.
    pub async fn import<R: Read + Send + 'static>(&self, input: R) -> Result<ImportReport> {
        let started = Instant::now();
        let inner = self.inner.clone();
        let progress = inner.progress.begin("import".to_string());
        let hold = inner.hold_gate(true).await;
        let result = inner
            .clone()
            .import(input, progress.tracker.clone(), started)
            .await;
        drop(progress);
        if hold.release(result.is_err()) {
            if let Err(e) = inner.clone().gc().await {
                tracing::warn!("image gc after an import: {e}");
            }
        }
        result
    }
}

impl Inner {
    /// One import: stage and read the archive, then commit each image it has for this
    /// platform (its blobs, its snapshots, its record).
    async fn import<R: Read + Send + 'static>(
        self: Arc<Self>,
        input: R,
        tracker: Arc<Tracker>,
        started: Instant,
    ) -> Result<ImportReport> {
        let (staged, found, skipped) = self.read_archive(input, tracker.clone()).await?;
        tracker.set_total(staged.bytes);
        let stats = Arc::new(Stats::new(tracker));
        let mut report = ImportReport {
            skipped_platforms: skipped,
            archive_bytes: staged.bytes,
            ..Default::default()
        };
        let before: usize = found
            .iter()
            .flat_map(|f| chain_ids(&f.config.rootfs.diff_ids))
            .filter(|c| self.snapshots.has(c))
            .count();
        let mut records = Vec::new();
        for image in found {
            records.push(self.commit_image(&staged, &image, &stats).await?);
        }
        let after: usize = records
            .iter()
            .flat_map(|r| r.chain_ids.iter())
            .filter(|c| self.snapshots.has(c))
            .count();
        report.layers_unpacked = after.saturating_sub(before);
        report.images = records;
        report.seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            images = report.images.len(),
            bytes = report.archive_bytes,
            secs = report.seconds,
            "imported images"
        );
        Ok(report)
    }

    /// Stages the archive (on a blocking thread) and finds its images for this platform;
    /// the platforms of the index entries skipped. An archive with none for it fails.
    async fn read_archive<R: Read + Send + 'static>(
        &self,
        input: R,
        meter: Arc<Tracker>,
    ) -> Result<(Staged, Vec<Found>, Vec<String>)> {
        let ingest = self.config.root.join("content").join("ingest");
        let staged = tokio::task::spawn_blocking(move || stage(input, &ingest, &meter))
            .await
            .map_err(|e| Error::Internal(format!("import task: {e}")))??;
        let platform = &self.config.platform;
        let (found, skipped) = interpret(&staged, platform)?;
        if found.is_empty() {
            return Err(Error::Archive {
                reason: if skipped.is_empty() {
                    "no images in it".into()
                } else {
                    format!(
                        "no image for platform {platform} (has: {})",
                        skipped.join(", ")
                    )
                },
            });
        }
        Ok((staged, found, skipped))
    }

    /// Moves the image's blobs into the content store, unpacks its layers as a pull does and
    /// records it.
    async fn commit_image(
        self: &Arc<Self>,
        staged: &Staged,
        image: &Found,
        stats: &Arc<Stats>,
    ) -> Result<ImageRecord> {
        // Blobs move into the content store first: the unpack reads them from there, as for
        // a pull.
        if let Some((digest, path)) = &image.index {
            self.adopt(staged, digest, path)?;
        }
        match &image.manifest_source {
            Blob::Staged(path) => self.adopt(staged, &image.manifest_digest, path)?,
            Blob::Made(bytes) => self.content.write_bytes(&image.manifest_digest, bytes)?,
        }
        for (digest, path) in &image.blobs {
            self.adopt(staged, digest, path)?;
        }
        // checked_image made sure there is one diff ID per layer.
        let diff_ids = &image.config.rootfs.diff_ids;
        let chains = chain_ids(diff_ids);
        let work = image
            .manifest
            .layers
            .iter()
            .zip(diff_ids.iter().zip(&chains))
            .map(|(layer, (diff, chain))| self.unpack(layer, diff, chain, stats));
        futures::future::try_join_all(work).await?;
        self.record(image, chains)
    }

    /// Moves the staged file at `path` into the content store as `digest` (already verified:
    /// the staged file's digest is what was read).
    fn adopt(&self, staged: &Staged, digest: &Digest, path: &str) -> Result<()> {
        let file = staged.file(path)?;
        if &file.digest != digest {
            return Err(Error::Verification {
                expected: digest.clone(),
                reason: format!("archive file {path} has digest {}", file.digest),
            });
        }
        if self.content.has(digest, Some(file.size)) {
            return Ok(());
        }
        File::open(&file.path)
            .and_then(|f| f.sync_all())
            .map_err(Error::io("sync", &file.path))?;
        self.content.adopt(&file.path, digest)
    }

    fn record(&self, image: &Found, chains: Vec<Digest>) -> Result<ImageRecord> {
        let record = ImageRecord::new(
            &image.manifest,
            image.manifest_digest.clone(),
            image.index.as_ref().map(|(d, _)| d.clone()),
            &image.config,
            chains,
            image.names.iter().filter_map(|r| r.repo_tag()).collect(),
            match &image.top {
                Some(top) => image.names.iter().map(|r| r.repo_digest(top)).collect(),
                None => Vec::new(),
            },
        );
        self.records.commit(record)
    }
}

impl Staged {
    /// The file at `path`, following the archive's links (old `docker save` links layers that
    /// appear twice).
    fn file(&self, path: &str) -> Result<&StagedFile> {
        let mut path = normalise(path);
        for _ in 0..16 {
            if let Some(f) = self.files.get(&path) {
                return Ok(f);
            }
            match self.links.get(&path) {
                Some(target) => path = target.clone(),
                None => break,
            }
        }
        Err(Error::Archive {
            reason: format!("{path} is not in the archive"),
        })
    }

    fn has(&self, path: &str) -> bool {
        self.file(path).is_ok()
    }

    /// The blob with digest `d`, wherever the archive has it.
    fn blob(&self, d: &Descriptor, what: &str) -> Result<String> {
        let path = self
            .by_digest
            .get(&d.digest)
            .ok_or_else(|| Error::Archive {
                reason: format!("{what} {} is not in the archive", d.digest),
            })?;
        let file = self.file(path)?;
        if file.size != d.size {
            return Err(Error::Verification {
                expected: d.digest.clone(),
                reason: format!(
                    "{what} in the archive has {} bytes, its descriptor says {}",
                    file.size, d.size
                ),
            });
        }
        Ok(path.clone())
    }

    fn read_json<T: serde::de::DeserializeOwned>(&self, path: &str, what: &str) -> Result<T> {
        let file = self.file(path)?;
        let data = read_small(&file.path, what)?;
        serde_json::from_slice(&data).map_err(|e| Error::Archive {
            reason: format!("{what} ({path}): {e}"),
        })
    }

    fn read(&self, path: &str, what: &str) -> Result<Vec<u8>> {
        read_small(&self.file(path)?.path, what)
    }
}

fn read_small(path: &Path, what: &str) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|f| f.take(MAX_JSON_BYTES + 1).read_to_end(&mut data))
        .map_err(Error::io("read staged", path))?;
    if data.len() as u64 > MAX_JSON_BYTES {
        return Err(Error::Archive {
            reason: format!("{what} is larger than {MAX_JSON_BYTES} bytes"),
        });
    }
    Ok(data)
}

/// `./a//b/` → `a/b`.
fn normalise(path: &str) -> String {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// Resolves a link target relative to the link's directory (`..` allowed within the archive).
fn link_target(link: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        let mut dir: Vec<&str> = link.split('/').collect();
        dir.pop();
        dir
    };
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}

/// Reads the whole archive, staging every regular file under `ingest`.
fn stage<R: Read>(input: R, ingest: &Path, meter: &Tracker) -> Result<Staged> {
    let dir = TempPath::new(ingest.join(format!("import-{}", unique_suffix())));
    std::fs::create_dir(dir.path()).map_err(Error::io("create", dir.path()))?;
    let mut input = std::io::BufReader::with_capacity(1 << 20, input);
    let magic = std::io::BufRead::fill_buf(&mut input)
        .map_err(|e| archive_io("read", e))?
        .to_vec();
    let input: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(input))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(
            zstd::stream::read::Decoder::with_buffer(input).map_err(|e| archive_io("zstd", e))?,
        )
    } else {
        Box::new(input)
    };
    let mut archive = tar::Archive::new(input);
    let mut staged = Staged {
        dir,
        files: HashMap::new(),
        links: HashMap::new(),
        by_digest: HashMap::new(),
        bytes: 0,
    };
    let mut buf = vec![0u8; 256 << 10];
    let entries = archive.entries().map_err(|e| archive_io("read", e))?;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(Error::Archive {
                reason: format!("more than {MAX_ENTRIES} entries"),
            });
        }
        let mut entry =
            entry.map_err(|e| archive_io(if n == 0 { "not a tar archive" } else { "read" }, e))?;
        let name = entry
            .path()
            .map_err(|e| archive_io("read an entry name", e))?
            .to_string_lossy()
            .into_owned();
        let name = normalise(&name);
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| archive_io("read a link", e))?
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let target = if entry.header().entry_type() == tar::EntryType::Link {
                    normalise(&target)
                } else {
                    link_target(&name, &target)
                };
                staged.links.insert(name, target);
                continue;
            }
            _ => continue,
        }
        let path = staged.dir.path().join(n.to_string());
        let mut out = File::create(&path).map_err(Error::io("create", &path))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        loop {
            let got = entry
                .read(&mut buf)
                .map_err(|e| archive_io(&format!("read {name}"), e))?;
            if got == 0 {
                break;
            }
            hasher.update(&buf[..got]);
            out.write_all(&buf[..got])
                .map_err(Error::io("write", &path))?;
            size += got as u64;
            meter.add_done(got as u64);
        }
        let expected = entry.header().size().unwrap_or(size);
        if size != expected {
            return Err(Error::Archive {
                reason: format!("cut short in {name} ({size} of {expected} bytes)"),
            });
        }
        let digest = Digest::from_hasher(hasher);
        // An OCI blob is named by its digest: a file that does not match is corrupt.
        if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            if hex != digest.hex() {
                return Err(Error::Archive {
                    reason: format!("{name} is corrupt: its content has digest {digest}"),
                });
            }
        }
        staged.bytes += size;
        staged
            .by_digest
            .entry(digest.clone())
            .or_insert(name.clone());
        staged.files.insert(name, StagedFile { digest, size, path });
    }
    Ok(staged)
}

/// An archive read error; the tar reader quotes raw header bytes, which are kept printable
/// and short.
fn archive_io(what: &str, e: std::io::Error) -> Error {
    let text: String = e
        .to_string()
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(160)
        .collect();
    Error::Archive {
        reason: format!("{what}: {text}"),
    }
}

/// The images of the archive, and the platforms of the index entries skipped.
fn interpret(staged: &Staged, platform: &Platform) -> Result<(Vec<Found>, Vec<String>)> {
    if staged.has("index.json") {
        oci_layout(staged, platform)
    } else if staged.has("manifest.json") {
        Ok((docker_archive(staged)?, Vec::new()))
    } else {
        Err(Error::Archive {
            reason: "neither an OCI image layout (no index.json) nor a docker save archive \
                     (no manifest.json)"
                .into(),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayoutMarker {
    image_layout_version: String,
}

fn oci_layout(staged: &Staged, platform: &Platform) -> Result<(Vec<Found>, Vec<String>)> {
    if staged.has("oci-layout") {
        let marker: LayoutMarker = staged.read_json("oci-layout", "oci-layout")?;
        if !marker.image_layout_version.starts_with("1.") {
            return Err(Error::Archive {
                reason: format!(
                    "image layout version {:?} (crius reads 1.x)",
                    marker.image_layout_version
                ),
            });
        }
    }
    let index: Index = staged.read_json("index.json", "index.json")?;
    let mut found: Vec<Found> = Vec::new();
    let mut skipped = Vec::new();
    for entry in &index.manifests {
        if let Some(p) = &entry.platform {
            if !platform.matches(p) {
                skipped.push(p.to_string());
                continue;
            }
        }
        let names = entry_names(entry)?;
        let top_path = staged.blob(entry, "manifest")?;
        let top_bytes = staged.read(&top_path, "manifest")?;
        let (kind, media_type) = manifest::manifest_kind(&top_bytes, Some(&entry.media_type));
        let (index_blob, manifest_desc, manifest_path) = match kind {
            ManifestKind::Index => {
                let nested: Index = parse_json(&top_bytes, "image index", &entry.digest)?;
                let chosen = nested.choose(platform, &format!("archive entry {}", entry.digest))?;
                let path = staged.blob(chosen, "manifest")?;
                (Some((entry.digest.clone(), top_path)), chosen.clone(), path)
            }
            ManifestKind::Manifest => (None, entry.clone(), top_path),
            ManifestKind::Unsupported => {
                return Err(Error::UnsupportedMediaType {
                    media_type,
                    what: format!("archive entry {}", entry.digest),
                })
            }
        };
        let bytes = staged.read(&manifest_path, "manifest")?;
        let manifest: Manifest = parse_json(&bytes, "manifest", &manifest_desc.digest)?;
        let image = checked_image(
            staged,
            names,
            Some(entry.digest.clone()),
            index_blob,
            manifest_desc.digest.clone(),
            Blob::Staged(manifest_path),
            manifest,
        )?;
        // Several entries for one image (one per name): one record with every name.
        match found
            .iter_mut()
            .find(|f| f.manifest_digest == image.manifest_digest)
        {
            Some(same) => same.names.extend(image.names),
            None => found.push(image),
        }
    }
    Ok((found, skipped))
}

/// The names an index entry gives its image: containerd's full-name annotation, else the OCI
/// ref name when it is a whole reference (a bare tag names no repository and is ignored).
fn entry_names(entry: &Descriptor) -> Result<Vec<Reference>> {
    let name = entry.annotations.get(ANNOTATION_IMAGE_NAME).or_else(|| {
        entry
            .annotations
            .get(ANNOTATION_REF_NAME)
            .filter(|n| n.contains('/') || n.contains(':') || n.contains('@'))
    });
    match name {
        None => Ok(Vec::new()),
        Some(name) => Ok(vec![Reference::parse(name)?]),
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct DockerManifestEntry {
    pub(crate) config: String,
    #[serde(default)]
    pub(crate) repo_tags: Option<Vec<String>>,
    pub(crate) layers: Vec<String>,
}

/// `docker save`: `manifest.json` lists each image's config file, tags and layer tars. There
/// is no image manifest: crius makes an OCI one from the files (layers stay as they are,
/// compressed or not), which keeps the image id (the config's digest) that Docker reports.
fn docker_archive(staged: &Staged) -> Result<Vec<Found>> {
    let entries: Vec<DockerManifestEntry> = staged.read_json("manifest.json", "manifest.json")?;
    let mut found = Vec::new();
    for entry in entries {
        let config_file = staged.file(&entry.config)?;
        // Docker names the config file after its digest: `<hex>.json` or `blobs/sha256/<hex>`.
        let stem = entry.config.trim_end_matches(".json");
        let stem = stem.rsplit('/').next().unwrap_or(stem);
        if stem.len() == 64 && stem != config_file.digest.hex() {
            return Err(Error::Verification {
                expected: Digest::parse(&format!("sha256:{stem}")).map_err(|reason| {
                    Error::Archive {
                        reason: format!("{}: {reason}", entry.config),
                    }
                })?,
                reason: format!(
                    "archive file {} has digest {}",
                    entry.config, config_file.digest
                ),
            });
        }
        let mut layers = Vec::new();
        for path in &entry.layers {
            let file = staged.file(path)?;
            let media_type = match compression_of(&file.path)? {
                LayerKind::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
                LayerKind::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
                LayerKind::Tar => "application/vnd.oci.image.layer.v1.tar",
            };
            layers.push(serde_json::json!({
                "mediaType": media_type,
                "digest": file.digest,
                "size": file.size,
            }));
        }
        let made = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": manifest::OCI_MANIFEST,
            "config": {
                "mediaType": OCI_CONFIG,
                "digest": config_file.digest,
                "size": config_file.size,
            },
            "layers": layers,
        });
        let bytes = serde_json::to_vec(&made)
            .map_err(|e| Error::Internal(format!("encode a manifest: {e}")))?;
        let digest = Digest::of(&bytes);
        let manifest: Manifest = parse_json(&bytes, "manifest", &digest)?;
        let names = entry
            .repo_tags
            .unwrap_or_default()
            .iter()
            .map(|t| Reference::parse(t))
            .collect::<Result<Vec<_>>>()?;
        found.push(checked_image(
            staged,
            names,
            None,
            None,
            digest,
            Blob::Made(bytes),
            manifest,
        )?);
    }
    Ok(found)
}

fn compression_of(path: &Path) -> Result<LayerKind> {
    let mut magic = [0u8; 4];
    let mut f = File::open(path).map_err(Error::io("open", path))?;
    let n = f.read(&mut magic).map_err(Error::io("read", path))?;
    Ok(match &magic[..n] {
        [0x1f, 0x8b, ..] => LayerKind::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd] => LayerKind::Zstd,
        _ => LayerKind::Tar,
    })
}

/// Checks a manifest as a pull does (layer count, media types, diff IDs) and finds its blobs.
fn checked_image(
    staged: &Staged,
    names: Vec<Reference>,
    top: Option<Digest>,
    index: Option<(Digest, String)>,
    manifest_digest: Digest,
    manifest_source: Blob,
    manifest: Manifest,
) -> Result<Found> {
    let what = format!("image {}", manifest.config.digest);
    manifest.check_layers(&format!("manifest {manifest_digest}"), &what)?;
    let config_path = staged.blob(&manifest.config, "config")?;
    let mut blobs = vec![(manifest.config.digest.clone(), config_path.clone())];
    for layer in &manifest.layers {
        blobs.push((layer.digest.clone(), staged.blob(layer, "layer")?));
    }
    let config_bytes = staged.read(&config_path, "image config")?;
    let config: ImageConfig = parse_json(&config_bytes, "image config", &manifest.config.digest)?;
    manifest
        .check_diff_ids(&config)
        .map_err(|reason| Error::Archive {
            reason: format!("{what}: {reason}"),
        })?;
    Ok(Found {
        names,
        top,
        index,
        manifest_digest,
        manifest_source,
        manifest,
        config,
        blobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(normalise("./blobs//sha256/ab/"), "blobs/sha256/ab");
        assert_eq!(link_target("a/layer.tar", "../b/layer.tar"), "b/layer.tar");
        assert_eq!(link_target("a/layer.tar", "/x"), "x");
        assert_eq!(link_target("top", "other"), "other");
    }
}
