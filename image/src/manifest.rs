//! OCI and Docker schema2 manifests, indexes and image configs: just the fields a pull or an
//! import needs, the platform choice for an index, and the checks both make of a manifest
//! before they fetch or move any of its blobs.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};

/// The most layers an image may have: Docker's limit, and well within what one overlay mount
/// of the layers can take.
pub(crate) const MAX_LAYERS: usize = 127;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// What the registry is asked to send for a manifest request.
pub const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub annotations: HashMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// linux and the architecture this binary was built for, named as OCI names them.
    pub fn host() -> Self {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "x86" => ("386", None),
            "powerpc64" => ("ppc64le", None),
            "loongarch64" => ("loong64", None),
            other => (other, None),
        };
        Self {
            architecture: architecture.to_string(),
            os: "linux".to_string(),
            variant: variant.map(str::to_string),
        }
    }

    /// Whether an index entry's platform can run here. arm64 treats a missing variant as v8.
    pub fn matches(&self, other: &Platform) -> bool {
        if self.os != other.os || self.architecture != other.architecture {
            return false;
        }
        let norm = |p: &Platform| match (p.architecture.as_str(), p.variant.as_deref()) {
            ("arm64", None | Some("v8")) => None,
            ("amd64", Some("v1")) => None,
            (_, v) => v.map(str::to_string),
        };
        match (norm(self), norm(other)) {
            (_, None) => true,
            (a, b) => a == b,
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    #[serde(default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

impl Index {
    /// The first manifest for `platform`.
    pub fn select(&self, platform: &Platform) -> Option<&Descriptor> {
        self.manifests
            .iter()
            .filter(|d| d.media_type != DOCKER_SCHEMA1)
            .find(|d| d.platform.as_ref().is_some_and(|p| platform.matches(p)))
    }

    /// [`Index::select`], or the error naming `reference` and the platforms the index has:
    /// pulls and imports choose alike.
    pub(crate) fn choose(&self, platform: &Platform, reference: &str) -> Result<&Descriptor> {
        self.select(platform)
            .ok_or_else(|| Error::NoMatchingPlatform {
                reference: reference.to_string(),
                platform: platform.to_string(),
                available: self.platforms(),
            })
    }

    pub fn platforms(&self) -> String {
        let names: Vec<String> = self
            .manifests
            .iter()
            .filter_map(|d| d.platform.as_ref().map(|p| p.to_string()))
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
}

impl Manifest {
    /// Refuses a manifest with more than [`MAX_LAYERS`] layers (it would make as many snapshots
    /// and an overlay no kernel mounts) or with a layer of a media type crius cannot unpack.
    /// `manifest` names the manifest in the first error, `image` the image in the second.
    pub(crate) fn check_layers(&self, manifest: &str, image: &str) -> Result<()> {
        if self.layers.len() > MAX_LAYERS {
            return Err(Error::TooManyLayers {
                what: manifest.to_string(),
                layers: self.layers.len(),
                max: MAX_LAYERS,
            });
        }
        for layer in &self.layers {
            if layer_kind(&layer.media_type).is_none() {
                return Err(Error::UnsupportedMediaType {
                    media_type: layer.media_type.clone(),
                    what: format!("layer {} of {image}", layer.digest),
                });
            }
        }
        Ok(())
    }

    /// Checks that `config` has one diff ID per layer; the reason when it has not (a pull and
    /// an import report it as different errors).
    pub(crate) fn check_diff_ids(&self, config: &ImageConfig) -> std::result::Result<(), String> {
        let (diff_ids, layers) = (config.rootfs.diff_ids.len(), self.layers.len());
        if diff_ids == layers {
            Ok(())
        } else {
            Err(format!(
                "config lists {diff_ids} diff IDs for {layers} layers"
            ))
        }
    }

    /// Bytes of the config and the layers.
    pub(crate) fn size(&self) -> u64 {
        self.config.size + self.layers.iter().map(|l| l.size).sum::<u64>()
    }
}

/// Parses the JSON document `what` (a manifest, an index, a config) whose digest is `digest`.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    data: &[u8],
    what: &str,
    digest: &Digest,
) -> Result<T> {
    serde_json::from_slice(data).map_err(|source| Error::BadJson {
        what: what.to_string(),
        digest: digest.clone(),
        source,
    })
}

/// How a manifest body should be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    Index,
    Manifest,
    Unsupported,
}

/// Decides from the body's `mediaType`, else the Content-Type header, else the fields present.
pub fn manifest_kind(body: &[u8], content_type: Option<&str>) -> (ManifestKind, String) {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
        schema_version: Option<u32>,
    }
    let probe: Option<Probe> = serde_json::from_slice(body).ok();
    let declared = probe
        .as_ref()
        .and_then(|p| p.media_type.clone())
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_string()));
    let kind_of = |mt: &str| match mt {
        OCI_INDEX | DOCKER_LIST => Some(ManifestKind::Index),
        OCI_MANIFEST | DOCKER_MANIFEST => Some(ManifestKind::Manifest),
        _ => None,
    };
    if let Some(k) = declared.as_deref().and_then(kind_of) {
        return (k, declared.unwrap_or_default());
    }
    let guessed = match &probe {
        Some(p) if p.schema_version == Some(2) && p.manifests.is_some() => ManifestKind::Index,
        Some(p) if p.schema_version == Some(2) && p.layers.is_some() => ManifestKind::Manifest,
        _ => ManifestKind::Unsupported,
    };
    (guessed, declared.unwrap_or_default())
}

/// Layer media types, and how each is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Tar,
    Gzip,
    Zstd,
}

/// `(kind, non_distributable)` for a layer media type, or None if it is not a layer type.
pub fn layer_kind(media_type: &str) -> Option<(LayerKind, bool)> {
    Some(match media_type {
        "application/vnd.oci.image.layer.v1.tar" => (LayerKind::Tar, false),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => (LayerKind::Gzip, false),
        "application/vnd.oci.image.layer.v1.tar+zstd" => (LayerKind::Zstd, false),
        "application/vnd.oci.image.layer.nondistributable.v1.tar" => (LayerKind::Tar, true),
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => (LayerKind::Gzip, true),
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => (LayerKind::Zstd, true),
        _ => return None,
    })
}

/// The parts of an image config crius reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<RunConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunConfig {
    #[serde(rename = "User", default)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(arch: &str, variant: Option<&str>) -> Platform {
        Platform {
            architecture: arch.into(),
            os: "linux".into(),
            variant: variant.map(Into::into),
        }
    }

    #[test]
    fn platform_matching() {
        assert!(p("amd64", None).matches(&p("amd64", None)));
        assert!(!p("amd64", None).matches(&p("arm64", None)));
        assert!(p("arm64", Some("v8")).matches(&p("arm64", None)));
        assert!(p("arm64", None).matches(&p("arm64", Some("v8"))));
        assert!(!p("arm", Some("v7")).matches(&p("arm", Some("v6"))));
        let mut windows = p("amd64", None);
        windows.os = "windows".into();
        assert!(!p("amd64", None).matches(&windows));
        assert_eq!(Platform::host().os, "linux");
    }

    #[test]
    fn index_selects_platform() {
        let d = |arch: &str, c: char| {
            format!(
                r#"{{"mediaType":"{OCI_MANIFEST}","digest":"sha256:{}","size":1,"platform":{{"architecture":"{arch}","os":"linux"}}}}"#,
                c.to_string().repeat(64)
            )
        };
        let body = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{},{},{}]}}"#,
            d("unknown", 'c'),
            d("arm64", 'a'),
            d("amd64", 'b')
        );
        let (kind, mt) = manifest_kind(body.as_bytes(), None);
        assert_eq!(kind, ManifestKind::Index);
        assert_eq!(mt, OCI_INDEX);
        let index: Index = serde_json::from_str(&body).unwrap();
        assert_eq!(
            index.select(&p("amd64", None)).unwrap().digest.hex(),
            "b".repeat(64)
        );
        assert_eq!(
            index.select(&p("arm64", Some("v8"))).unwrap().digest.hex(),
            "a".repeat(64)
        );
        assert!(index.select(&p("s390x", None)).is_none());
        assert_eq!(index.platforms(), "linux/unknown, linux/arm64, linux/amd64");
    }

    #[test]
    fn kinds() {
        let (k, _) = manifest_kind(br#"{"schemaVersion":2,"layers":[]}"#, None);
        assert_eq!(k, ManifestKind::Manifest);
        let (k, _) = manifest_kind(br#"{"schemaVersion":2,"manifests":[]}"#, Some(DOCKER_LIST));
        assert_eq!(k, ManifestKind::Index);
        let (k, mt) = manifest_kind(br#"{"schemaVersion":1}"#, Some(DOCKER_SCHEMA1));
        assert_eq!(k, ManifestKind::Unsupported);
        assert_eq!(mt, DOCKER_SCHEMA1);
        assert_eq!(
            layer_kind("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"),
            Some((LayerKind::Gzip, true))
        );
        assert_eq!(
            layer_kind("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some((LayerKind::Zstd, false))
        );
        assert_eq!(layer_kind("text/plain"), None);
    }
}
