//! `crius images import --from-containerd [SOCKET]`: moving a node's images from containerd to
//! crius without pulling them again.
//!
//! The images of one containerd namespace (`k8s.io`, where containerd's CRI keeps kubelet's)
//! are listed and their blobs read through containerd's own API (`Images.List`,
//! `Content.Info`, `Content.Read`; `crius_api::containerd`), and streamed to crius's admin
//! socket as one OCI image layout, so they go through exactly the import path of `crius images
//! import`: every blob checked against its digest there, the platform chosen from an index as a
//! pull chooses it, layers unpacked as pulled ones. Nothing is written to disk on the way.
//!
//! Of an index, the platform manifests whose blobs containerd has are sent (containerd keeps
//! only what its pulls fetched: usually one platform's). An image containerd lacks blobs of
//! (a garbage-collected layer) is skipped and named. containerd's CRI also records each image
//! under its id (`sha256:<hex>`); those names are not references and are dropped.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{bail, Context as _};
use crius_api::containerd::content::content_client::ContentClient;
use crius_api::containerd::content::{InfoRequest, ReadContentRequest};
use crius_api::containerd::images::images_client::ImagesClient;
use crius_api::containerd::images::{Descriptor, ListImagesRequest};
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::admin::{read_line, write_line, ChunkWriter, ImportSummary, Request, Response};

/// containerd's default socket.
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";
/// The namespace containerd's CRI plugin keeps kubelet's images in.
pub const DEFAULT_NAMESPACE: &str = "k8s.io";

const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// The largest index or manifest read into memory.
const MAX_MANIFEST: i64 = 4 << 20;

/// What a migration did: crius's import summary, and the images left behind with why.
#[derive(Debug)]
pub struct Migration {
    pub summary: ImportSummary,
    pub skipped: Vec<String>,
}

/// One image to send: its names, the descriptor they point at, and the blobs it needs.
struct Plan {
    names: Vec<String>,
    target: Descriptor,
    /// Manifests and indexes, already read.
    small: Vec<(String, Vec<u8>)>,
    /// Configs and layers: digest and size, read when sent.
    large: Vec<(String, i64)>,
}

struct Containerd {
    images: ImagesClient<Channel>,
    content: ContentClient<Channel>,
    namespace: String,
}

/// Copies the images of `namespace` from the containerd on `socket` into the crius serving
/// `admin`.
pub async fn migrate(socket: &Path, namespace: &str, admin: &Path) -> anyhow::Result<Migration> {
    let channel = super::grpc_channel(socket)
        .await
        .with_context(|| format!("connect to containerd at {}", socket.display()))?;
    let mut containerd = Containerd {
        images: ImagesClient::new(channel.clone()).max_decoding_message_size(64 << 20),
        content: ContentClient::new(channel).max_decoding_message_size(64 << 20),
        namespace: namespace.to_string(),
    };
    let listed = containerd
        .images
        .list(containerd.request(ListImagesRequest { filters: vec![] })?)
        .await
        .with_context(|| format!("list containerd's images in namespace {namespace}"))?
        .into_inner()
        .images;

    let mut plans: Vec<Plan> = Vec::new();
    let mut skipped = Vec::new();
    for image in listed {
        // containerd's CRI names each image by its id too: `sha256:<64 hex>`.
        if crius_image::is_image_id(&image.name) {
            continue;
        }
        let Some(target) = image.target else {
            skipped.push(format!("{}: no target", image.name));
            continue;
        };
        if let Some(plan) = plans.iter_mut().find(|p| p.target.digest == target.digest) {
            plan.names.push(image.name);
            continue;
        }
        match containerd.plan(&target).await {
            Ok((small, large)) => plans.push(Plan {
                names: vec![image.name],
                target,
                small,
                large,
            }),
            Err(e) => skipped.push(format!(
                "{}: {}",
                image.name,
                crius_common::error_chain(e.as_ref())
            )),
        }
    }
    if plans.is_empty() {
        bail!(
            "no image to copy in containerd's namespace {namespace}{}",
            if skipped.is_empty() {
                String::new()
            } else {
                format!(" (skipped: {})", skipped.join("; "))
            }
        );
    }

    let mut stream = UnixStream::connect(admin).with_context(|| {
        format!(
            "connect to crius's admin socket {} (is crius running, and are you root?)",
            admin.display()
        )
    })?;
    write_line(&mut stream, &Request::Import).context("send the request")?;
    let mut out = ChunkWriter::new(stream.try_clone().context("admin stream")?);
    let sent = containerd.send(&plans, &mut out).await;
    let sent = sent.and_then(|()| out.finish().map(drop).context("send the archive"));
    match read_line::<_, Response>(&mut stream) {
        Ok(Response::Imported(summary)) => Ok(Migration { summary, skipped }),
        Ok(Response::Error { message }) => bail!("{message}"),
        Ok(other) => bail!("unexpected answer {other:?}"),
        Err(e) => match sent {
            Err(sent) => Err(sent),
            Ok(()) => Err(e).context("read crius's answer"),
        },
    }
}

impl Containerd {
    fn request<T>(&self, message: T) -> anyhow::Result<tonic::Request<T>> {
        let mut request = tonic::Request::new(message);
        let value = self
            .namespace
            .parse()
            .with_context(|| format!("namespace {:?}", self.namespace))?;
        request.metadata_mut().insert("containerd-namespace", value);
        Ok(request)
    }

    /// The size containerd has for `digest`, or an error if it has none.
    async fn size_of(&mut self, digest: &str) -> anyhow::Result<i64> {
        let request = self.request(InfoRequest {
            digest: digest.to_string(),
        })?;
        let info = self
            .content
            .info(request)
            .await
            .with_context(|| format!("blob {digest}"))?
            .into_inner()
            .info
            .with_context(|| format!("blob {digest}: no info"))?;
        Ok(info.size)
    }

    /// Reads a whole blob of at most [`MAX_MANIFEST`] bytes.
    async fn read_small(&mut self, desc: &Descriptor) -> anyhow::Result<Vec<u8>> {
        if desc.size > MAX_MANIFEST {
            bail!("{} is larger than {MAX_MANIFEST} bytes", desc.digest);
        }
        let mut data = Vec::new();
        self.read_into(&desc.digest, desc.size, &mut data).await?;
        Ok(data)
    }

    /// Streams blob `digest` of `size` bytes into `out`.
    async fn read_into(
        &mut self,
        digest: &str,
        size: i64,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        let request = self.request(ReadContentRequest {
            digest: digest.to_string(),
            offset: 0,
            size: 0,
        })?;
        let mut stream = self
            .content
            .read(request)
            .await
            .with_context(|| format!("read blob {digest}"))?
            .into_inner();
        let mut total: i64 = 0;
        while let Some(chunk) = stream
            .message()
            .await
            .with_context(|| format!("read blob {digest}"))?
        {
            total += i64::try_from(chunk.data.len()).unwrap_or(i64::MAX);
            if total > size {
                bail!("blob {digest}: containerd sent more than its {size} bytes");
            }
            out.write_all(&chunk.data)
                .with_context(|| format!("send blob {digest}"))?;
        }
        if total != size {
            bail!("blob {digest}: containerd sent {total} of {size} bytes");
        }
        Ok(())
    }

    /// The blobs an image needs, checking containerd has each: the manifests (read) and the
    /// configs and layers (sizes).
    async fn plan(
        &mut self,
        target: &Descriptor,
    ) -> anyhow::Result<(Vec<(String, Vec<u8>)>, Vec<(String, i64)>)> {
        let mut small = Vec::new();
        let mut large = Vec::new();
        let top = self.read_small(target).await?;
        let kind = media_type(&top).unwrap_or_else(|| target.media_type.clone());
        if INDEX_TYPES.contains(&kind.as_str()) {
            let index: Value =
                serde_json::from_slice(&top).with_context(|| format!("index {}", target.digest))?;
            small.push((target.digest.clone(), top));
            let mut complete = 0;
            for child in index["manifests"].as_array().into_iter().flatten() {
                let Some(child) = descriptor(child) else {
                    continue;
                };
                // A platform containerd did not pull: not sent (the index still names it).
                if let Ok((mut s, mut l)) = self.manifest(&child).await {
                    small.append(&mut s);
                    large.append(&mut l);
                    complete += 1;
                }
            }
            if complete == 0 {
                bail!(
                    "containerd has no complete platform image of index {}",
                    target.digest
                );
            }
        } else if MANIFEST_TYPES.contains(&kind.as_str()) {
            let (mut s, mut l) = self.manifest_from(target, top).await?;
            small.append(&mut s);
            large.append(&mut l);
        } else {
            bail!("unsupported media type {kind:?} of {}", target.digest);
        }
        Ok((small, large))
    }

    async fn manifest(
        &mut self,
        desc: &Descriptor,
    ) -> anyhow::Result<(Vec<(String, Vec<u8>)>, Vec<(String, i64)>)> {
        self.size_of(&desc.digest).await?;
        let bytes = self.read_small(desc).await?;
        self.manifest_from(desc, bytes).await
    }

    async fn manifest_from(
        &mut self,
        desc: &Descriptor,
        bytes: Vec<u8>,
    ) -> anyhow::Result<(Vec<(String, Vec<u8>)>, Vec<(String, i64)>)> {
        let manifest: Value =
            serde_json::from_slice(&bytes).with_context(|| format!("manifest {}", desc.digest))?;
        let mut large = Vec::new();
        let blobs = std::iter::once(&manifest["config"])
            .chain(manifest["layers"].as_array().into_iter().flatten());
        for blob in blobs {
            let blob = descriptor(blob)
                .with_context(|| format!("manifest {}: a bad descriptor", desc.digest))?;
            let size = self.size_of(&blob.digest).await?;
            if size != blob.size {
                bail!(
                    "blob {} has {size} bytes in containerd, its descriptor says {}",
                    blob.digest,
                    blob.size
                );
            }
            large.push((blob.digest, size));
        }
        Ok((vec![(desc.digest.clone(), bytes)], large))
    }

    /// Writes the OCI layout of `plans` to `out` as a tar.
    async fn send(&mut self, plans: &[Plan], out: &mut impl Write) -> anyhow::Result<()> {
        let mut sent: HashSet<String> = HashSet::new();
        write_entry(out, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let mut entries = Vec::new();
        for plan in plans {
            for (digest, bytes) in &plan.small {
                if sent.insert(digest.clone()) {
                    write_entry(out, &blob_path(digest)?, bytes)?;
                }
            }
            for (digest, size) in &plan.large {
                if sent.insert(digest.clone()) {
                    let path = blob_path(digest)?;
                    let size_u = u64::try_from(*size).context("negative blob size")?;
                    out.write_all(header(&path, size_u)?.as_bytes())
                        .context("send the archive")?;
                    self.read_into(digest, *size, out).await?;
                    pad(out, size_u)?;
                }
            }
            for name in &plan.names {
                entries.push(json!({
                    "mediaType": plan.target.media_type,
                    "digest": plan.target.digest,
                    "size": plan.target.size,
                    "annotations": {"io.containerd.image.name": name},
                }));
            }
        }
        let index = json!({"schemaVersion": 2, "manifests": entries});
        write_entry(out, "index.json", &serde_json::to_vec(&index)?)?;
        // The end of a tar: two zero blocks.
        out.write_all(&[0u8; 1024]).context("send the archive")?;
        Ok(())
    }
}

fn media_type(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v["mediaType"].as_str().map(str::to_string)
}

fn descriptor(v: &Value) -> Option<Descriptor> {
    Some(Descriptor {
        media_type: v["mediaType"].as_str().unwrap_or_default().to_string(),
        digest: v["digest"].as_str()?.to_string(),
        size: v["size"].as_i64()?,
        annotations: Default::default(),
    })
}

fn blob_path(digest: &str) -> anyhow::Result<String> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(format!("blobs/sha256/{hex}"))
        }
        _ => bail!("digest {digest:?} is not sha256"),
    }
}

fn header(path: &str, size: u64) -> anyhow::Result<tar::Header> {
    let mut header = tar::Header::new_gnu();
    header
        .set_path(path)
        .with_context(|| format!("tar path {path}"))?;
    header.set_size(size);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    Ok(header)
}

fn pad(out: &mut impl Write, size: u64) -> anyhow::Result<()> {
    let rest = (512 - size % 512) % 512;
    out.write_all(&[0u8; 512][..rest as usize])
        .context("send the archive")
}

fn write_entry(out: &mut impl Write, path: &str, data: &[u8]) -> anyhow::Result<()> {
    out.write_all(header(path, data.len() as u64)?.as_bytes())
        .and_then(|()| out.write_all(data))
        .context("send the archive")?;
    pad(out, data.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_paths() {
        assert!(crius_image::is_image_id(&format!(
            "sha256:{}",
            "a".repeat(64)
        )));
        assert!(!crius_image::is_image_id(
            "docker.io/library/busybox:latest"
        ));
        assert!(blob_path("sha512:00").is_err());
        assert_eq!(
            blob_path(&format!("sha256:{}", "b".repeat(64))).unwrap(),
            format!("blobs/sha256/{}", "b".repeat(64))
        );
    }

    #[test]
    fn tar_entries_are_padded_to_blocks() {
        let mut out = Vec::new();
        write_entry(&mut out, "index.json", b"{}").unwrap();
        assert_eq!(out.len(), 1024);
        let mut archive = tar::Archive::new(&out[..]);
        let entry = archive.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(entry.path().unwrap().to_str(), Some("index.json"));
        assert_eq!(entry.size(), 2);
    }
}
