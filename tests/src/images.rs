//! Test images built from Debian's static busybox and pushed over the distribution API.
//!
//! Every image starts from the same busybox layer (built once per test process, identical bytes
//! every time, so its blob is shared between repositories): `/bin/busybox`, a symlink in `/bin`
//! for each applet `busybox --list` names (with [`HARDLINK`] as a hard link instead, so unpacking
//! hard links is exercised), `/etc/passwd` and `/etc/group` with root, nobody and
//! [`USER_NAME`] (1000:1000), `/tmp` with mode 1777, `/root`, `/home/crius` and empty `/dev`,
//! `/proc`, `/sys`.
//!
//! Manifests are OCI by default; [`TestImage::BusyboxDocker`] is the Docker schema2 variant.
//!
//! Note: Debian's busybox-static runs applets inside `sh` without looking at `$PATH`
//! (`FEATURE_SH_STANDALONE`), so a test that deletes or masks `/bin/<applet>` must run it by its
//! full path or as `busybox <applet>` to see the effect.

use std::process::Command;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::registry::Registry;
use crate::tar_layer::LayerTar;
use crate::{sha256_digest, Error, Result};

pub use crate::tar_layer::Layer;

const BUSYBOX: &str = "/bin/busybox";
const CREATED: &str = "2023-11-14T22:13:20Z";

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image config media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI gzip layer media type.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Docker schema2 manifest media type.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker schema2 config media type.
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// Docker schema2 gzip layer media type.
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// `PATH` in every image's `Env`.
pub const ENV_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The custom variable in every image's `Env` (`NAME=value`).
pub const ENV_CUSTOM: &str = "CRIUS_TEST_IMAGE=busybox";
/// `Cmd` of the busybox images.
pub const CMD: &[&str] = &["sh"];
/// `WorkingDir` of the busybox images: not `/`, so a test can tell the image's value was used.
pub const WORKING_DIR: &str = "/tmp";
/// The one `ExposedPorts` key of the busybox images.
pub const EXPOSED_PORT: &str = "80/tcp";
/// `StopSignal` of the busybox images: not SIGTERM, so a test can tell it was honoured
/// (busybox `sh` as PID 1 ignores it, so a stop falls through to SIGKILL after the timeout
/// unless the test's command traps it).
pub const STOP_SIGNAL: &str = "SIGUSR1";
/// A label every image carries (`key`, `value`).
pub const LABEL: (&str, &str) = ("io.crius.test", "busybox");
/// `(link, target)`: the applet stored as a hard link to busybox instead of a symlink.
pub const HARDLINK: (&str, &str) = ("/bin/ash", "/bin/busybox");
/// The non-root user of `/etc/passwd`, uid and gid 1000, home `/home/crius`.
pub const USER_NAME: &str = "crius";
/// uid of [`USER_NAME`].
pub const USER_UID: u32 = 1000;
/// gid of [`USER_NAME`]'s primary group (also named `crius`).
pub const USER_GID: u32 = 1000;
/// A supplementary group (`name`, gid) that `/etc/group` lists [`USER_NAME`] in.
pub const USER_EXTRA_GROUP: (&str, u32) = ("crius-extra", 1001);
/// `User` of [`TestImage::User`].
pub const USER_IMAGE_USER: &str = "1000:1000";
/// `Cmd` of [`TestImage::User`]: prints `uid=1000(crius) gid=1000(crius) ...`.
pub const USER_IMAGE_CMD: &[&str] = &["id"];

/// File in each image of the index telling which platform's manifest was picked.
pub const PLATFORM_FILE: &str = "/etc/crius-platform";

/// What a correct unpack of [`TestImage::MultiLayer`] shows.
///
/// Layers: (1) busybox, (2) a lower data layer, (3) an upper layer that deletes
/// `/data/delete-me` (`.wh.delete-me`), deletes the directory `/data/gone-dir` with its content,
/// deletes `/bin/wget` of the busybox layer, replaces the content of `/data/replace-me`, and makes
/// `/data/opaque` opaque (`.wh..wh..opq`) with one new file.
pub mod multi_layer {
    /// Files present after unpacking, with their exact content.
    pub const FILES: &[(&str, &str)] = &[
        ("/data/keep", "kept from the lower layer\n"),
        ("/data/replace-me", "replaced by the upper layer\n"),
        ("/data/opaque/new", "new in the opaque dir\n"),
    ];
    /// Paths that must not exist after unpacking, whiteout markers included.
    pub const ABSENT: &[&str] = &[
        "/data/delete-me",
        "/data/gone-dir",
        "/data/gone-dir/file",
        "/data/opaque/old",
        "/data/opaque/sub",
        "/bin/wget",
        "/data/.wh.delete-me",
        "/data/.wh.gone-dir",
        "/data/opaque/.wh..wh..opq",
        "/bin/.wh.wget",
    ];
    /// Sorted names in `/data` after unpacking.
    pub const DATA_ENTRIES: &[&str] = &["keep", "opaque", "replace-me"];
    /// Sorted names in `/data/opaque` after unpacking.
    pub const OPAQUE_ENTRIES: &[&str] = &["new"];
    /// Content of `/data/replace-me` in the lower layer (must not be what a container reads).
    pub const REPLACED_CONTENT: &str = "lower content of replace-me\n";
}

/// What [`TestImage::Volumes`] declares and holds.
///
/// Its config declares [`DECLARED`](volumes::DECLARED) as `Volumes`; its top layer has `/data`
/// (mode 0750, owned by [`USER_UID`]:[`USER_GID`]) with a file, a subdirectory and a relative
/// symlink, and
/// `/not-a-dir` as a plain file. `/empty` is declared but absent from the layers.
pub mod volumes {
    /// The `Volumes` keys of the image config (as an image might write them).
    pub const DECLARED: &[&str] = &["/data", "/empty/", "/covered", "/not-a-dir"];
    /// `(path, content)` of the files under `/data`.
    pub const FILES: &[(&str, &str)] = &[
        ("/data/seed", "seeded by the image\n"),
        ("/data/sub/deep", "deep in the image\n"),
    ];
    /// `(link, target)` under `/data`.
    pub const LINK: (&str, &str) = ("/data/link", "seed");
    /// Mode of `/data`.
    pub const DATA_MODE: u32 = 0o750;
}

/// The single-manifest test images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestImage {
    /// busybox with Env, Cmd, WorkingDir, ExposedPorts, StopSignal and Labels (see the consts).
    Busybox,
    /// The same image as a Docker schema2 manifest with Docker media types.
    BusyboxDocker,
    /// busybox plus two layers exercising whiteouts and an opaque dir: see [`multi_layer`].
    MultiLayer,
    /// busybox with `User: "1000:1000"` and `Cmd: ["id"]`.
    User,
    /// busybox with declared `Volumes` and content at some of them: see [`volumes`].
    Volumes,
    /// busybox whose `Cmd` sleeps for 68 years: a pause image for a runtime that needs one
    /// (containerd's `sandbox_image` in the node VM's comparison).
    Sleeper,
}

impl TestImage {
    /// Repository the image is pushed to by [`push`], e.g. `crius-test/busybox`.
    pub fn repository(self) -> &'static str {
        match self {
            TestImage::Busybox => "crius-test/busybox",
            TestImage::BusyboxDocker => "crius-test/busybox-docker",
            TestImage::MultiLayer => "crius-test/multi-layer",
            TestImage::User => "crius-test/user",
            TestImage::Volumes => "crius-test/volumes",
            TestImage::Sleeper => "crius-test/sleeper",
        }
    }
}

/// Repository of [`push_index`].
pub const INDEX_REPOSITORY: &str = "crius-test/multi-arch";

/// A layer's descriptor as pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerInfo {
    /// Digest of the compressed blob.
    pub digest: String,
    /// Digest of the uncompressed tar (`rootfs.diff_ids`).
    pub diff_id: String,
    /// Size of the compressed blob in bytes.
    pub size: u64,
}

/// An image manifest that was pushed, with everything a test may compare against.
#[derive(Debug, Clone)]
pub struct PushedImage {
    /// `crius-test/busybox`
    pub repository: String,
    /// The tag, `None` for a manifest pushed by digest only (the entries of an index).
    pub tag: Option<String>,
    /// `127.0.0.1:PORT/crius-test/busybox:latest`, or the digest reference when untagged.
    pub reference: String,
    /// `127.0.0.1:PORT/crius-test/busybox@sha256:...`
    pub digest_reference: String,
    /// Digest of the manifest.
    pub digest: String,
    /// Media type of the manifest.
    pub media_type: String,
    /// The manifest bytes as pushed.
    pub manifest: Vec<u8>,
    /// Digest of the config: the image ID a runtime reports.
    pub config_digest: String,
    /// The config bytes as pushed.
    pub config: Vec<u8>,
    /// Layers, lowest first.
    pub layers: Vec<LayerInfo>,
}

/// An image index that was pushed, with its two platform manifests.
///
/// The index lists `linux/arm64` (variant v8) first and `linux/amd64` second, so a client that
/// takes the first entry instead of matching its platform picks the wrong one. Each image has
/// [`PLATFORM_FILE`] saying `linux/amd64\n` or `linux/arm64\n`; both carry this machine's busybox
/// binary, so only the one for the host platform can actually run anything.
#[derive(Debug, Clone)]
pub struct PushedIndex {
    /// `crius-test/multi-arch`
    pub repository: String,
    /// `latest`
    pub tag: String,
    /// `127.0.0.1:PORT/crius-test/multi-arch:latest`
    pub reference: String,
    /// `127.0.0.1:PORT/crius-test/multi-arch@sha256:...` (of the index)
    pub digest_reference: String,
    /// Digest of the index.
    pub digest: String,
    /// [`OCI_INDEX`]
    pub media_type: String,
    /// The index bytes as pushed.
    pub manifest: Vec<u8>,
    /// The linux/amd64 entry.
    pub amd64: PushedImage,
    /// The linux/arm64 entry.
    pub arm64: PushedImage,
}

impl PushedIndex {
    /// The entry a client on this machine should pick.
    pub fn for_host(&self) -> &PushedImage {
        if host_arch() == "arm64" {
            &self.arm64
        } else {
            &self.amd64
        }
    }
}

/// Pushes `image` to `<registry>/<image.repository()>:latest`.
pub fn push(registry: &Registry, image: TestImage) -> Result<PushedImage> {
    push_as(registry, image, image.repository(), "latest")
}

/// Pushes `image` under another repository and tag (e.g. to have two names for one image).
pub fn push_as(
    registry: &Registry,
    image: TestImage,
    repository: &str,
    tag: &str,
) -> Result<PushedImage> {
    let (format, built) = build_image(image)?;
    push_built(registry, repository, Some(tag), &built, format)
}

/// An image built as [`push`] builds it, for an archive instead of a registry.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The config bytes; the image id is their digest.
    pub config: Vec<u8>,
    /// `sha256:` of `config`.
    pub config_digest: String,
    /// Layers, lowest first (gzip blobs with their digests and diff IDs).
    pub layers: Vec<Arc<Layer>>,
}

/// Builds `image` without pushing it.
pub fn build(image: TestImage) -> Result<BuiltImage> {
    let (_, built) = build_image(image)?;
    let config = to_json(&built.config_json);
    Ok(BuiltImage {
        config_digest: sha256_digest(&config),
        config,
        layers: built.layers,
    })
}

fn build_image(image: TestImage) -> Result<(Format, Built)> {
    let base = busybox_layer()?;
    Ok(match image {
        TestImage::Busybox => (
            Format::Oci,
            assemble(busybox_config(), vec![base], host_arch()),
        ),
        TestImage::BusyboxDocker => (
            Format::Docker,
            assemble(busybox_config(), vec![base], host_arch()),
        ),
        TestImage::MultiLayer => {
            let layers = vec![
                base,
                Arc::new(multi_layer_lower()?),
                Arc::new(multi_layer_upper()?),
            ];
            (Format::Oci, assemble(busybox_config(), layers, host_arch()))
        }
        TestImage::User => {
            let mut config = busybox_config();
            config["User"] = json!(USER_IMAGE_USER);
            config["Cmd"] = json!(USER_IMAGE_CMD);
            (Format::Oci, assemble(config, vec![base], host_arch()))
        }
        TestImage::Volumes => {
            let mut config = busybox_config();
            config["Volumes"] = volumes::DECLARED
                .iter()
                .map(|v| (v.to_string(), json!({})))
                .collect::<serde_json::Map<_, _>>()
                .into();
            let layers = vec![base, Arc::new(volumes_layer()?)];
            (Format::Oci, assemble(config, layers, host_arch()))
        }
        TestImage::Sleeper => {
            let mut config = busybox_config();
            config["Cmd"] = json!(["sleep", "2147483647"]);
            (Format::Oci, assemble(config, vec![base], host_arch()))
        }
    })
}

/// Pushes the multi-platform index to `<registry>/crius-test/multi-arch:latest`.
pub fn push_index(registry: &Registry) -> Result<PushedIndex> {
    push_index_as(registry, INDEX_REPOSITORY, "latest")
}

/// Pushes the multi-platform index under another repository and tag.
pub fn push_index_as(registry: &Registry, repository: &str, tag: &str) -> Result<PushedIndex> {
    let base = busybox_layer()?;
    let push_platform = |arch: &str| -> Result<PushedImage> {
        let marker = platform_layer(&format!("linux/{arch}\n"))?;
        let mut built = assemble(busybox_config(), vec![base.clone(), Arc::new(marker)], arch);
        if arch == "arm64" {
            built.config_json["variant"] = json!("v8");
        }
        push_built(registry, repository, None, &built, Format::Oci)
    };
    let arm64 = push_platform("arm64")?;
    let amd64 = push_platform("amd64")?;

    let entry = |image: &PushedImage, platform: Value| {
        json!({
            "mediaType": image.media_type,
            "digest": image.digest,
            "size": image.manifest.len(),
            "platform": platform,
        })
    };
    let index = json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            entry(&arm64, json!({"architecture": "arm64", "os": "linux", "variant": "v8"})),
            entry(&amd64, json!({"architecture": "amd64", "os": "linux"})),
        ],
    });
    let manifest = to_json(&index);
    let digest = registry
        .client()
        .push_manifest(repository, tag, OCI_INDEX, &manifest)?;
    let host = registry.host_port();
    Ok(PushedIndex {
        repository: repository.to_owned(),
        tag: tag.to_owned(),
        reference: format!("{host}/{repository}:{tag}"),
        digest_reference: format!("{host}/{repository}@{digest}"),
        digest,
        media_type: OCI_INDEX.to_owned(),
        manifest,
        amd64,
        arm64,
    })
}

/// The busybox rootfs layer (built on first use, then shared).
pub fn busybox_layer() -> Result<Arc<Layer>> {
    static CACHE: Mutex<Option<Arc<Layer>>> = Mutex::new(None);
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(layer) = cache.as_ref() {
        return Ok(layer.clone());
    }
    let layer = Arc::new(build_busybox_layer()?);
    *cache = Some(layer.clone());
    Ok(layer)
}

/// The Go/OCI architecture name of this machine (`amd64`, `arm64`, ...).
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[derive(Debug, Clone, Copy)]
enum Format {
    Oci,
    Docker,
}

struct Built {
    config_json: Value,
    layers: Vec<Arc<Layer>>,
}

fn busybox_config() -> Value {
    json!({
        "Env": [ENV_PATH, ENV_CUSTOM],
        "Cmd": CMD,
        "WorkingDir": WORKING_DIR,
        "ExposedPorts": { EXPOSED_PORT: {} },
        "StopSignal": STOP_SIGNAL,
        "Labels": { LABEL.0: LABEL.1 },
    })
}

fn assemble(config: Value, layers: Vec<Arc<Layer>>, arch: &str) -> Built {
    let history: Vec<Value> = (0..layers.len())
        .map(|i| json!({"created": CREATED, "created_by": format!("crius-tests layer {i}")}))
        .collect();
    let config_json = json!({
        "created": CREATED,
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|layer| layer.diff_id.clone()).collect::<Vec<_>>(),
        },
        "history": history,
    });
    Built {
        config_json,
        layers,
    }
}

fn push_built(
    registry: &Registry,
    repository: &str,
    tag: Option<&str>,
    built: &Built,
    format: Format,
) -> Result<PushedImage> {
    let client = registry.client();
    let (manifest_type, config_type, layer_type) = match format {
        Format::Oci => (OCI_MANIFEST, OCI_CONFIG, OCI_LAYER_GZIP),
        Format::Docker => (DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER_GZIP),
    };

    let mut layers = Vec::new();
    for layer in &built.layers {
        client.push_blob(repository, &layer.blob)?;
        layers.push(LayerInfo {
            digest: layer.digest.clone(),
            diff_id: layer.diff_id.clone(),
            size: layer.blob.len() as u64,
        });
    }
    let config = to_json(&built.config_json);
    let config_digest = client.push_blob(repository, &config)?;

    let manifest = to_json(&json!({
        "schemaVersion": 2,
        "mediaType": manifest_type,
        "config": {"mediaType": config_type, "digest": config_digest, "size": config.len()},
        "layers": layers.iter().map(|layer| json!({
            "mediaType": layer_type,
            "digest": layer.digest,
            "size": layer.size,
        })).collect::<Vec<_>>(),
    }));
    let digest = sha256_digest(&manifest);
    client.push_manifest(repository, tag.unwrap_or(&digest), manifest_type, &manifest)?;

    let host = registry.host_port();
    let digest_reference = format!("{host}/{repository}@{digest}");
    Ok(PushedImage {
        repository: repository.to_owned(),
        tag: tag.map(str::to_owned),
        reference: match tag {
            Some(tag) => format!("{host}/{repository}:{tag}"),
            None => digest_reference.clone(),
        },
        digest_reference,
        digest,
        media_type: manifest_type.to_owned(),
        manifest,
        config_digest,
        config,
        layers,
    })
}

fn to_json(value: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail: all its map keys are strings.
    serde_json::to_vec(value).unwrap_or_default()
}

fn build_busybox_layer() -> Result<Layer> {
    let missing = || Error::MissingProgram {
        program: BUSYBOX,
        package: "busybox-static",
    };
    let binary = std::fs::read(BUSYBOX).map_err(|_| missing())?;
    let list = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .map_err(|_| missing())?;
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    let mut applets: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty() && !name.contains('/') && *name != "busybox")
        .collect();
    applets.sort_unstable();
    applets.dedup();

    let mut tar = LayerTar::new();
    for dir in ["/bin", "/dev", "/etc", "/home", "/proc", "/sys", "/var"] {
        tar.dir(dir, 0o755)?;
    }
    tar.dir("/root", 0o700)?;
    tar.dir("/tmp", 0o1777)?;
    tar.dir_owned(
        "/home/crius",
        0o755,
        u64::from(USER_UID),
        u64::from(USER_GID),
    )?;
    tar.file(BUSYBOX, 0o755, &binary)?;
    let hardlink_name = HARDLINK.0.trim_start_matches("/bin/");
    for applet in &applets {
        if *applet == hardlink_name {
            continue;
        }
        tar.symlink(&format!("/bin/{applet}"), "busybox")?;
    }
    tar.hardlink(HARDLINK.0, HARDLINK.1)?;

    let passwd = format!(
        "root:x:0:0:root:/root:/bin/sh\n\
         nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n\
         {USER_NAME}:x:{USER_UID}:{USER_GID}:crius test user:/home/crius:/bin/sh\n"
    );
    let group = format!(
        "root:x:0:\n\
         nobody:x:65534:\n\
         {USER_NAME}:x:{USER_GID}:\n\
         {}:x:{}:{USER_NAME}\n",
        USER_EXTRA_GROUP.0, USER_EXTRA_GROUP.1
    );
    tar.file("/etc/passwd", 0o644, passwd.as_bytes())?;
    tar.file("/etc/group", 0o644, group.as_bytes())?;
    tar.finish()
}

fn multi_layer_lower() -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.dir("/data", 0o755)?;
    tar.file("/data/keep", 0o644, b"kept from the lower layer\n")?;
    tar.file("/data/delete-me", 0o644, b"deleted by the upper layer\n")?;
    tar.file(
        "/data/replace-me",
        0o644,
        multi_layer::REPLACED_CONTENT.as_bytes(),
    )?;
    tar.dir("/data/gone-dir", 0o755)?;
    tar.file("/data/gone-dir/file", 0o644, b"in a deleted dir\n")?;
    tar.dir("/data/opaque", 0o755)?;
    tar.file("/data/opaque/old", 0o644, b"hidden by the opaque marker\n")?;
    tar.dir("/data/opaque/sub", 0o755)?;
    tar.file("/data/opaque/sub/deep", 0o644, b"hidden too\n")?;
    tar.finish()
}

fn multi_layer_upper() -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.dir("/bin", 0o755)?;
    tar.whiteout("/bin", "wget")?;
    tar.dir("/data", 0o755)?;
    tar.whiteout("/data", "delete-me")?;
    tar.whiteout("/data", "gone-dir")?;
    tar.file("/data/replace-me", 0o644, b"replaced by the upper layer\n")?;
    tar.dir("/data/opaque", 0o755)?;
    tar.opaque("/data/opaque")?;
    tar.file("/data/opaque/new", 0o644, b"new in the opaque dir\n")?;
    tar.finish()
}

fn volumes_layer() -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.dir_owned(
        "/data",
        volumes::DATA_MODE,
        u64::from(USER_UID),
        u64::from(USER_GID),
    )?;
    tar.dir("/data/sub", 0o755)?;
    for (path, content) in volumes::FILES {
        tar.file(path, 0o644, content.as_bytes())?;
    }
    tar.symlink(volumes::LINK.0, volumes::LINK.1)?;
    tar.file("/not-a-dir", 0o644, b"a file where a volume is declared\n")?;
    tar.finish()
}

fn platform_layer(content: &str) -> Result<Layer> {
    let mut tar = LayerTar::new();
    tar.dir("/etc", 0o755)?;
    tar.file(PLATFORM_FILE, 0o644, content.as_bytes())?;
    tar.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_layer_constants_match_the_layers() {
        // The upper layer writes exactly the FILES contents it claims.
        for (path, content) in multi_layer::FILES {
            assert!(!content.is_empty(), "{path}");
        }
        assert_ne!(multi_layer::REPLACED_CONTENT, multi_layer::FILES[1].1);
        assert!(multi_layer_lower().is_ok());
        assert!(multi_layer_upper().is_ok());
    }

    #[test]
    fn config_has_the_documented_fields() {
        let built = assemble(busybox_config(), Vec::new(), "amd64");
        let config = &built.config_json["config"];
        assert_eq!(config["StopSignal"], STOP_SIGNAL);
        assert_eq!(config["WorkingDir"], WORKING_DIR);
        assert_eq!(config["Env"][1], ENV_CUSTOM);
        assert!(config["ExposedPorts"][EXPOSED_PORT].is_object());
        assert_eq!(built.config_json["architecture"], "amd64");
    }
}
