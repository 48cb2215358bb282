//! Image archives built from the test images, for `crius images import`: an OCI image layout
//! tar (as `skopeo copy … oci-archive:` or `ctr images export` write one) and a classic
//! `docker save` tar (`manifest.json`, `<config-hex>.json`, `<id>/layer.tar` uncompressed).

use std::io::Read;

use serde_json::json;

use crate::images::{BuiltImage, OCI_CONFIG, OCI_LAYER_GZIP, OCI_MANIFEST};
use crate::{sha256_digest, Error, Result};

/// An OCI image layout holding `images`, each under its full name (`host/repo:tag`): the
/// layout's `index.json` names them as containerd does (`io.containerd.image.name`, and the tag
/// in `org.opencontainers.image.ref.name`). Returns the tar and each image's manifest digest.
pub fn oci_layout(images: &[(&BuiltImage, &str)]) -> Result<(Vec<u8>, Vec<String>)> {
    let mut tar = Tar::new();
    tar.file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let mut entries = Vec::new();
    let mut digests = Vec::new();
    for (image, name) in images {
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": image.config_digest,
                       "size": image.config.len()},
            "layers": image.layers.iter().map(|l| json!({
                "mediaType": OCI_LAYER_GZIP, "digest": l.digest, "size": l.blob.len(),
            })).collect::<Vec<_>>(),
        }))
        .map_err(json_error)?;
        tar.blob(&image.config)?;
        for layer in &image.layers {
            tar.blob(&layer.blob)?;
        }
        let digest = tar.blob(&manifest)?;
        let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
        entries.push(json!({
            "mediaType": OCI_MANIFEST, "digest": digest, "size": manifest.len(),
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": tag},
        }));
        digests.push(digest);
    }
    let index = json!({"schemaVersion": 2, "manifests": entries});
    tar.file(
        "index.json",
        &serde_json::to_vec(&index).map_err(json_error)?,
    )?;
    Ok((tar.finish()?, digests))
}

/// A `docker save` archive of `images`, each with its tags (`busybox:v1`, `host/repo:tag`).
pub fn docker_save(images: &[(&BuiltImage, &[&str])]) -> Result<Vec<u8>> {
    let mut tar = Tar::new();
    let mut manifest = Vec::new();
    for (image, tags) in images {
        let config_name = format!("{}.json", image.config_digest.trim_start_matches("sha256:"));
        tar.file(&config_name, &image.config)?;
        let mut layers = Vec::new();
        for layer in &image.layers {
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(&layer.blob[..])
                .read_to_end(&mut raw)
                .map_err(|source| Error::io("gunzip a test layer", "", source))?;
            // Docker names each layer directory after a digest of its own; any unique name does.
            let path = format!("{}/layer.tar", layer.diff_id.trim_start_matches("sha256:"));
            if !layers.contains(&path) {
                tar.file(&path, &raw)?;
            }
            layers.push(path);
        }
        manifest.push(json!({"Config": config_name, "RepoTags": tags, "Layers": layers}));
    }
    tar.file(
        "manifest.json",
        &serde_json::to_vec(&manifest).map_err(json_error)?,
    )?;
    tar.finish()
}

fn json_error(e: serde_json::Error) -> Error {
    Error::io("encode JSON", "", std::io::Error::other(e))
}

struct Tar {
    builder: tar::Builder<Vec<u8>>,
    blobs: Vec<String>,
}

impl Tar {
    fn new() -> Tar {
        Tar {
            builder: tar::Builder::new(Vec::new()),
            blobs: Vec::new(),
        }
    }

    fn file(&mut self, path: &str, data: &[u8]) -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_entry_type(tar::EntryType::Regular);
        self.builder
            .append_data(&mut header, path, data)
            .map_err(|source| Error::io("add to an archive", path, source))
    }

    /// Adds `blobs/sha256/<hex>` once; returns the digest.
    fn blob(&mut self, data: &[u8]) -> Result<String> {
        let digest = sha256_digest(data);
        if !self.blobs.contains(&digest) {
            let path = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
            self.file(&path, data)?;
            self.blobs.push(digest.clone());
        }
        Ok(digest)
    }

    fn finish(self) -> Result<Vec<u8>> {
        self.builder
            .into_inner()
            .map_err(|source| Error::io("finish an archive", "", source))
    }
}
