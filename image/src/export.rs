//! Exporting images as one tar that is both an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) and a `docker save` archive (`manifest.json` naming the same blobs), so
//! `crius images import` and `ctr images import` read it, and `docker load` should.
//!
//! Each image is written as the manifest crius unpacked (this platform's, not the index it was
//! chosen from, whose other platforms crius never fetched: a layout must hold every blob it
//! names). `index.json` has one entry per name, with the full name in `io.containerd.image.name`
//! and the tag in `org.opencontainers.image.ref.name`, as containerd writes them. The blobs are
//! the stored bytes, so an image imported from the export has the same id.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;

use serde_json::{json, Value};

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::import::{DockerManifestEntry, ANNOTATION_IMAGE_NAME, ANNOTATION_REF_NAME};
use crate::manifest;
use crate::records::ImageRecord;
use crate::reference::Reference;
use crate::store::ImageStore;

/// What an export wrote.
#[derive(Debug, Clone, Default)]
pub struct ExportReport {
    /// The ids of the images written, in the order asked.
    pub images: Vec<String>,
    pub blobs: usize,
    /// Bytes of blobs written (the tar adds its headers).
    pub blob_bytes: u64,
}

impl ImageStore {
    /// Writes the images `names` name (each as [`ImageStore::get`] takes it; an image named
    /// twice is written once) to `out` as a tar. Every name must resolve; nothing is written
    /// otherwise.
    pub async fn export<W: Write + Send + 'static>(
        &self,
        names: &[String],
        out: W,
    ) -> Result<ExportReport> {
        if names.is_empty() {
            return Err(Error::Archive {
                reason: "no image to export".into(),
            });
        }
        let mut records: Vec<ImageRecord> = Vec::new();
        for name in names {
            let record = self
                .get(name)?
                .ok_or_else(|| Error::ImageNotFound(name.clone()))?;
            if !records.iter().any(|r| r.id == record.id) {
                records.push(record);
            }
        }
        // Held while writing: a collection must not remove a blob about to be read (an image
        // removed meanwhile is still written whole).
        let hold = self.inner.hold_gate(false).await;
        let this = self.clone();
        let report = tokio::task::spawn_blocking(move || this.write_archive(&records, out))
            .await
            .map_err(|e| Error::Internal(format!("export task: {e}")));
        // A collection asked for while the export held the gate runs now.
        if hold.release(false) {
            if let Err(e) = self.inner.clone().gc().await {
                tracing::warn!("image gc after an export: {e}");
            }
        }
        report?
    }

    fn write_archive<W: Write>(&self, records: &[ImageRecord], out: W) -> Result<ExportReport> {
        let mut tar = tar::Builder::new(out);
        tar.mode(tar::HeaderMode::Deterministic);
        let mut report = ExportReport::default();
        let mut written: HashSet<Digest> = HashSet::new();
        let mut index_entries = Vec::new();
        let mut docker_entries = Vec::new();
        append(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        for record in records {
            let content = self.content();
            let manifest_bytes = content.read(&record.manifest_digest)?;
            let (_, media_type) = manifest::manifest_kind(&manifest_bytes, None);
            let config: Value = serde_json::from_slice(&content.read(&record.config_digest)?)
                .map_err(|source| Error::BadJson {
                    what: "image config".into(),
                    digest: record.config_digest.clone(),
                    source,
                })?;
            let mut platform = json!({
                "architecture": config["architecture"],
                "os": config["os"],
            });
            if let Some(variant) = config["variant"].as_str() {
                platform["variant"] = json!(variant);
            }
            let blobs = [&record.manifest_digest, &record.config_digest]
                .into_iter()
                .chain(record.layers.iter());
            for digest in blobs {
                if !written.insert(digest.clone()) {
                    continue;
                }
                let path = content.path(digest);
                let mut file = File::open(&path).map_err(Error::io("open blob", &path))?;
                let size = file
                    .metadata()
                    .map_err(Error::io("stat blob", &path))?
                    .len();
                let mut header = header(size);
                tar.append_data(&mut header, blob_path(digest), &mut file)
                    .map_err(Error::io("export blob", &path))?;
                report.blobs += 1;
                report.blob_bytes += size;
            }
            let descriptor = json!({
                "mediaType": media_type,
                "digest": record.manifest_digest,
                "size": manifest_bytes.len(),
                "platform": platform,
            });
            if record.repo_tags.is_empty() {
                index_entries.push(descriptor.clone());
            }
            for tag in &record.repo_tags {
                let mut entry = descriptor.clone();
                let short = Reference::parse(tag)
                    .ok()
                    .and_then(|r| r.tag().map(str::to_string))
                    .unwrap_or_default();
                entry["annotations"] = json!({
                    ANNOTATION_IMAGE_NAME: tag,
                    ANNOTATION_REF_NAME: short,
                });
                index_entries.push(entry);
            }
            docker_entries.push(DockerManifestEntry {
                config: blob_path(&record.config_digest),
                repo_tags: Some(record.repo_tags.clone()),
                layers: record.layers.iter().map(blob_path).collect(),
            });
            report.images.push(record.id.clone());
        }
        let index = json!({
            "schemaVersion": 2,
            "mediaType": manifest::OCI_INDEX,
            "manifests": index_entries,
        });
        append(&mut tar, "index.json", &to_vec(&index)?)?;
        let docker = serde_json::to_vec(&docker_entries)
            .map_err(|e| Error::Internal(format!("encode manifest.json: {e}")))?;
        append(&mut tar, "manifest.json", &docker)?;
        tar.into_inner()
            .and_then(|mut out| out.flush())
            .map_err(|e| Error::Internal(format!("finish the archive: {e}")))?;
        Ok(report)
    }
}

fn blob_path(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

fn header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header
}

fn append<W: Write>(tar: &mut tar::Builder<W>, path: &str, data: &[u8]) -> Result<()> {
    let mut header = header(data.len() as u64);
    tar.append_data(&mut header, path, data)
        .map_err(|e| Error::Internal(format!("export {path}: {e}")))
}

fn to_vec(value: &Value) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::Internal(format!("encode index.json: {e}")))
}
