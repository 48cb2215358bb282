//! Import and export of image archives (OCI layout and `docker save`) on a store in a temp
//! dir: no registry, no network. Unpacking sets owners, so run as root for the full check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use crius_image::{ErrorKind, ImageStore, Platform, StoreConfig};
use serde_json::json;

fn open(root: &Path) -> ImageStore {
    ImageStore::open(StoreConfig {
        root: root.to_path_buf(),
        registry_config_dir: None,
        sync_snapshots: false,
        ..Default::default()
    })
    .unwrap()
}

fn root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("crius-image-archive")
        .tempdir()
        .unwrap()
}

/// `(digest, bytes)` of each blob.
type Blobs = Vec<(String, Vec<u8>)>;

/// An image of `layers` (uncompressed tars, sent gzipped) for `arch`: (config, manifest, blobs).
fn image(layers: &[Vec<u8>], arch: &str) -> (Vec<u8>, Vec<u8>, Blobs) {
    let config = serde_json::to_vec(&json!({
        "architecture": arch, "os": "linux",
        "config": {"User": "1000"},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| sha256(l)).collect::<Vec<_>>()},
    }))
    .unwrap();
    let blobs: Vec<Vec<u8>> = layers.iter().map(|l| gzip(l)).collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256(&config), "size": config.len()},
        "layers": blobs.iter().map(|b| json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": sha256(b), "size": b.len(),
        })).collect::<Vec<_>>(),
    }))
    .unwrap();
    let mut all = vec![(sha256(&config), config.clone())];
    all.extend(blobs.into_iter().map(|b| (sha256(&b), b)));
    (config, manifest, all)
}

fn blob_entry(data: &[u8]) -> Entry {
    let digest = sha256(data);
    file(
        &format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")),
        data,
    )
}

fn layer(name: &str, content: &str) -> Vec<u8> {
    tar(&[
        Entry::Dir("etc", 0o755),
        file(&format!("etc/{name}"), content),
    ])
}

/// An OCI layout whose one entry is an index of an amd64 and an arm64 image, named
/// `example.com/app:v1`. Returns the archive and the host image's config digest.
fn multi_platform_layout() -> (Vec<u8>, String, String) {
    let (host_config, host_manifest, host_blobs) = image(
        &[layer("base", "base\n"), layer("host", "host\n")],
        &Platform::host().architecture,
    );
    let other_arch = if Platform::host().architecture == "s390x" {
        "amd64"
    } else {
        "s390x"
    };
    let (_, other_manifest, other_blobs) = image(&[layer("other", "other\n")], other_arch);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": sha256(&other_manifest), "size": other_manifest.len(),
             "platform": {"architecture": other_arch, "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": sha256(&host_manifest), "size": host_manifest.len(),
             "platform": {"architecture": Platform::host().architecture, "os": "linux"}},
        ],
    }))
    .unwrap();
    let top = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": sha256(&index), "size": index.len(),
            "annotations": {"io.containerd.image.name": "example.com/app:v1",
                            "org.opencontainers.image.ref.name": "v1"},
        }],
    }))
    .unwrap();
    let mut entries = vec![
        file("oci-layout", r#"{"imageLayoutVersion":"1.0.0"}"#),
        file("index.json", top),
        blob_entry(&index),
        blob_entry(&host_manifest),
        blob_entry(&other_manifest),
    ];
    // The other platform's layers are left out, as a single-platform save leaves them.
    entries.extend(host_blobs.iter().map(|(_, b)| blob_entry(b)));
    entries.push(blob_entry(&other_blobs[0].1));
    (tar(&entries), sha256(&host_config), sha256(&index))
}

fn read_in(store: &ImageStore, image: &str, path: &str) -> String {
    for dir in store.lowerdirs(image).unwrap() {
        if let Ok(s) = std::fs::read_to_string(dir.join(path)) {
            return s;
        }
    }
    panic!("{path} not in any layer of {image}");
}

fn assert_clean(root: &Path) {
    let left: Vec<_> = std::fs::read_dir(root.join("content/ingest"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "ingest left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_layout_import_then_export_round_trip() {
    let dir = root();
    let store = open(dir.path());
    let (archive, config, index) = multi_platform_layout();
    // From a gzip stream, as `crius images import - < x.tar.gz` sends it.
    let report = store
        .import(std::io::Cursor::new(gzip(&archive)))
        .await
        .unwrap();
    assert_eq!(report.images.len(), 1);
    let record = &report.images[0];
    assert_eq!(record.id, config);
    assert_eq!(record.repo_tags, vec!["example.com/app:v1"]);
    assert_eq!(
        record.repo_digests,
        vec![format!("example.com/app@{index}")]
    );
    assert_eq!(record.uid, Some(1000));
    assert_eq!(report.layers_unpacked, 2);
    assert_eq!(read_in(&store, "example.com/app:v1", "etc/host"), "host\n");
    assert_eq!(read_in(&store, "example.com/app:v1", "etc/base"), "base\n");
    assert_clean(dir.path());

    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let written = store
        .export(&["example.com/app:v1".into()], Shared(out.clone()))
        .await
        .unwrap();
    assert_eq!(written.images, vec![config.clone()]);
    let exported = out.lock().unwrap().clone();

    // Into a fresh store, and into this one after removing the image: same id, same content.
    let other = root();
    let fresh = open(other.path());
    let again = fresh
        .import(std::io::Cursor::new(exported.clone()))
        .await
        .unwrap();
    assert_eq!(again.images[0].id, config);
    assert_eq!(again.images[0].repo_tags, vec!["example.com/app:v1"]);
    assert_eq!(read_in(&fresh, &config, "etc/host"), "host\n");

    store.remove(&config).await.unwrap();
    assert!(store.get(&config).unwrap().is_none());
    // zstd-compressed this time.
    let zst = zstd::encode_all(&exported[..], 3).unwrap();
    let back = store.import(std::io::Cursor::new(zst)).await.unwrap();
    assert_eq!(back.images[0].id, config);
    assert_eq!(back.images[0].layers, record.layers);
    assert_eq!(back.images[0].chain_ids, record.chain_ids);
    assert_clean(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_save_archive() {
    let dir = root();
    let store = open(dir.path());
    let base = layer("base", "base\n");
    let top = layer("top", "top\n");
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(&base), sha256(&top), sha256(&base)]},
    }))
    .unwrap();
    let config_name = format!("{}.json", sha256(&config).trim_start_matches("sha256:"));
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": ["busybox:v1", "127.0.0.1:5000/x/y:z"],
        "Layers": ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"],
    }]);
    let archive = tar(&[
        file(&config_name, config.clone()),
        Entry::Dir("aaa", 0o755),
        file("aaa/layer.tar", base.clone()),
        file("bbb/layer.tar", gzip(&top)),
        // Old `docker save` links a layer that appears twice.
        Entry::Symlink("ccc/layer.tar", "../aaa/layer.tar"),
        file("manifest.json", serde_json::to_vec(&manifest).unwrap()),
    ]);
    let report = store.import(std::io::Cursor::new(archive)).await.unwrap();
    let record = &report.images[0];
    assert_eq!(record.id, sha256(&config));
    assert_eq!(
        record.repo_tags,
        vec!["docker.io/library/busybox:v1", "127.0.0.1:5000/x/y:z"]
    );
    assert!(record.repo_digests.is_empty(), "{record:?}");
    assert_eq!(read_in(&store, "busybox:v1", "etc/top"), "top\n");
    assert_eq!(store.lowerdirs("busybox:v1").unwrap().len(), 3);
    assert_clean(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_or_incomplete_archives_are_refused() {
    let dir = root();
    let store = open(dir.path());
    let (archive, _, _) = multi_platform_layout();

    // A blob whose content is not what its name says.
    let bad_blob = tar(&[
        file("index.json", r#"{"schemaVersion":2,"manifests":[]}"#),
        file(&format!("blobs/sha256/{}", "ab".repeat(32)), "not that"),
    ]);
    let err = store
        .import(std::io::Cursor::new(bad_blob))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("is corrupt"), "{err}");

    // A layer missing from the archive.
    let (_, manifest, blobs) = image(&[layer("x", "x\n")], &Platform::host().architecture);
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha256(&manifest), "size": manifest.len(),
        "annotations": {"io.containerd.image.name": "example.com/missing:v1"}}]});
    let missing = tar(&[
        file("index.json", serde_json::to_vec(&index).unwrap()),
        blob_entry(&manifest),
        blob_entry(&blobs[0].1),
    ]);
    let err = store
        .import(std::io::Cursor::new(missing))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("layer {} is not in the archive", blobs[1].0)),
        "{err}"
    );

    // Cut short in the middle of a blob.
    let err = store
        .import(std::io::Cursor::new(archive[..archive.len() / 2].to_vec()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("cut short"), "{err}");

    let err = store
        .import(std::io::Cursor::new(b"not a tar at all".repeat(100)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("not a tar archive"), "{err}");
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i * 7919 % 251) as u8 | 0x80)
        .collect();
    let err = store.import(std::io::Cursor::new(noise)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.chars().all(|c| c.is_ascii() && !c.is_ascii_control()),
        "{text}"
    );

    assert!(store.list(None).unwrap().is_empty());
    assert_clean(dir.path());
    // What the failed imports stored is collected.
    let blobs = std::fs::read_dir(dir.path().join("content/sha256"))
        .unwrap()
        .count();
    assert_eq!(blobs, 0);
}
