//! Pulls against a real docker-registry on 127.0.0.1 (and a fake one for stalls and bearer
//! tokens). Needs root (ownership, device nodes, overlay mounts), /usr/bin/docker-registry,
//! busybox-static and apache2-utils.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use crius_image::{Auth, ErrorKind, ImageStore, Platform, StoreConfig};

fn root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("crius-image-root")
        .tempdir()
        .unwrap()
}

fn open(root: &Path, hosts: Option<&Path>) -> ImageStore {
    ImageStore::open(StoreConfig {
        root: root.to_path_buf(),
        registry_config_dir: hosts.map(Path::to_path_buf),
        no_progress_timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .unwrap()
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|rd| rd.count()).unwrap_or(0)
}

/// Nothing half-written may be left behind by any pull, failed or not.
fn assert_no_temp_files(root: &Path) {
    assert_eq!(
        count_files(&root.join("content/ingest")),
        0,
        "ingest files left"
    );
    for e in std::fs::read_dir(root.join("snapshots")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with("tmp-"), "temp snapshot {name} left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_tag_and_digest_then_list_status_remove() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let pushed = pusher
        .image(
            "crius/busybox",
            "v1",
            &ImageSpec::new(vec![busybox_layer()]),
        )
        .await;
    let root = root();
    let store = open(root.path(), None);

    let name = format!("{}/crius/busybox:v1", reg.host());
    let rec = store.pull(&name, &Auth::default()).await.unwrap();
    assert_eq!(rec.id, pushed.config_digest);
    assert_eq!(rec.repo_tags, vec![name.clone()]);
    assert_eq!(
        rec.repo_digests,
        vec![format!(
            "{}/crius/busybox@{}",
            reg.host(),
            pushed.manifest_digest
        )]
    );
    assert_eq!(rec.uid, None);
    assert!(rec.size > 1_000_000, "size {}", rec.size);

    // The unpacked busybox is there, with its links.
    let lower = store.lowerdirs(&rec.id).unwrap();
    assert_eq!(lower.len(), 1);
    let bin = lower[0].join("bin");
    let m = std::fs::metadata(bin.join("busybox")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o755);
    assert_eq!(m.nlink(), 2, "bin/true is a hard link to busybox");
    assert_eq!(
        std::fs::read_link(bin.join("sh")).unwrap().to_str(),
        Some("busybox")
    );
    assert_eq!(
        std::fs::metadata(lower[0].join("tmp")).unwrap().mode() & 0o7777,
        0o1777
    );
    assert_eq!(m.mtime(), 1_700_000_000);

    // By digest: same image, no tag added by that pull.
    let by_digest = format!("{}/crius/busybox@{}", reg.host(), pushed.manifest_digest);
    let rec2 = store.pull(&by_digest, &Auth::default()).await.unwrap();
    assert_eq!(rec2.id, rec.id);
    assert_eq!(rec2.repo_tags, vec![name.clone()]);

    // Lookup by every name a user may use.
    for n in [&rec.id, &name, &by_digest, &rec.id[7..19].to_string()] {
        assert_eq!(store.get(n).unwrap().unwrap().id, rec.id, "{n}");
    }
    assert_eq!(store.list(None).unwrap().len(), 1);
    assert_eq!(store.list(Some(&name)).unwrap().len(), 1);
    assert!(store.list(Some("nothere")).unwrap().is_empty());
    assert!(store.config_json(&rec).unwrap().contains("diff_ids"));
    let usage = store.fs_usage().await.unwrap();
    assert!(
        usage.used_bytes > 2_000_000 && usage.inodes_used > 5,
        "{usage:?}"
    );

    // Records survive a restart.
    drop(store);
    let store = open(root.path(), None);
    assert_eq!(store.get(&name).unwrap().unwrap(), rec2);

    let before = store.fs_usage().await.unwrap();
    assert_eq!(before, store.fs_usage().await.unwrap());
    // Removing by tag removes the image, its blobs and snapshots; again is a no-op.
    assert_eq!(store.remove(&name).await.unwrap(), Some(rec.id.clone()));
    let after = store.fs_usage().await.unwrap();
    assert!(
        after.used_bytes < before.used_bytes / 10,
        "{before:?} -> {after:?}"
    );
    assert!(store.get(&rec.id).unwrap().is_none());
    assert_eq!(store.remove(&name).await.unwrap(), None);
    assert_eq!(count_files(&root.path().join("content/sha256")), 0);
    assert_eq!(count_files(&root.path().join("snapshots")), 0);
    assert_no_temp_files(root.path());
    drop(store);
    assert!(open(root.path(), None).list(None).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_through_docker_io_mirror() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let mut spec = ImageSpec::new(vec![busybox_layer()]);
    spec.docker = true;
    let pushed = pusher.image("library/busybox", "latest", &spec).await;
    let root = root();
    let hosts = root.path().join("certs.d");
    hosts_toml(
        &hosts,
        "docker.io",
        &format!(
            "server = \"https://registry-1.docker.io\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            reg.host()
        ),
    );
    let store = open(root.path(), Some(&hosts));
    let rec = store.pull("busybox", &Auth::default()).await.unwrap();
    assert_eq!(rec.id, pushed.config_digest);
    assert_eq!(rec.repo_tags, vec!["docker.io/library/busybox:latest"]);
    assert_eq!(
        rec.repo_digests,
        vec![format!(
            "docker.io/library/busybox@{}",
            pushed.manifest_digest
        )]
    );
    assert!(store
        .get("docker.io/library/busybox:latest")
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_picks_the_platform() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let amd = pusher
        .image(
            "crius/multi",
            "amd64",
            &ImageSpec::new(vec![busybox_layer()]),
        )
        .await;
    let mut arm_spec = ImageSpec::new(vec![tar(&[file("arch", "arm64")])]);
    arm_spec.architecture = "arm64".into();
    let arm = pusher.image("crius/multi", "arm64", &arm_spec).await;
    let index = pusher
        .index("crius/multi", "latest", &[("arm64", &arm), ("amd64", &amd)])
        .await;

    let name = format!("{}/crius/multi", reg.host());
    let root1 = root();
    let store = open(root1.path(), None);
    let rec = store.pull(&name, &Auth::default()).await.unwrap();
    let want = if Platform::host().architecture == "arm64" {
        &arm
    } else {
        &amd
    };
    assert_eq!(rec.id, want.config_digest);
    assert_eq!(
        rec.repo_digests,
        vec![format!("{}/crius/multi@{index}", reg.host())]
    );

    let root2 = root();
    let arm_store = ImageStore::open(StoreConfig {
        root: root2.path().to_path_buf(),
        platform: Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: Some("v8".into()),
        },
        registry_config_dir: None,
        ..Default::default()
    })
    .unwrap();
    let rec = arm_store.pull(&name, &Auth::default()).await.unwrap();
    assert_eq!(rec.id, arm.config_digest);
    let lower = arm_store.lowerdirs(&rec.id).unwrap();
    assert_eq!(
        std::fs::read_to_string(lower[0].join("arch")).unwrap(),
        "arm64"
    );

    let s390 = ImageStore::open(StoreConfig {
        root: root2.path().join("other"),
        platform: Platform {
            architecture: "s390x".into(),
            os: "linux".into(),
            variant: None,
        },
        registry_config_dir: None,
        ..Default::default()
    })
    .unwrap();
    let err = s390.pull(&name, &Auth::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    assert!(err.to_string().contains("linux/s390x"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whiteouts_are_applied_in_the_overlay() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let base = tar(&[
        Entry::Dir("etc", 0o755),
        file("etc/keep", "k"),
        file("etc/remove-me", "r"),
        Entry::Dir("opq", 0o755),
        file("opq/old", "o"),
        Entry::Dir("gone", 0o755),
        file("gone/inside", "i"),
    ]);
    let top = tar(&[
        Entry::Dir("etc", 0o755),
        file("etc/.wh.remove-me", ""),
        file(".wh.gone", ""),
        Entry::Dir("opq", 0o755),
        file("opq/.wh..wh..opq", ""),
        file("opq/new", "n"),
        Entry::Owned("owned".into(), b"u".to_vec(), 0o600, 1000, 1000),
    ]);
    for compression in [Compression::Gzip, Compression::Zstd, Compression::None] {
        let mut spec = ImageSpec::new(vec![busybox_layer(), base.clone(), top.clone()]);
        spec.compression = compression;
        let tag = format!("c{}", compression as u8);
        pusher.image("crius/layers", &tag, &spec).await;
        let root = root();
        let store = open(root.path(), None);
        let rec = store
            .pull(
                &format!("{}/crius/layers:{tag}", reg.host()),
                &Auth::default(),
            )
            .await
            .unwrap();
        assert_eq!(rec.chain_ids.len(), 3);
        let lower = store.lowerdirs(&rec.id).unwrap();
        assert_eq!(lower.len(), 3);
        // Top snapshot: overlay's own whiteout forms.
        let wh = std::fs::symlink_metadata(lower[0].join("etc/remove-me")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        let owned = std::fs::metadata(lower[0].join("owned")).unwrap();
        assert_eq!(
            (owned.uid(), owned.gid(), owned.mode() & 0o777),
            (1000, 1000, 0o600)
        );

        let mnt = OverlayMount::new(&lower);
        let merged = mnt.path();
        assert_eq!(
            std::fs::read_to_string(merged.join("etc/keep")).unwrap(),
            "k"
        );
        assert!(!merged.join("etc/remove-me").exists());
        assert!(!merged.join("gone").exists());
        assert!(!merged.join("opq/old").exists());
        assert_eq!(
            std::fs::read_to_string(merged.join("opq/new")).unwrap(),
            "n"
        );
        assert!(merged.join("bin/busybox").is_file());
        drop(mnt);
        assert_no_temp_files(root.path());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_from_config() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let root = root();
    let store = open(root.path(), None);
    for (tag, user, uid, username) in [
        ("u1", "1000:1000", Some(1000), ""),
        ("u2", "nobody", None, "nobody"),
        ("u3", "", None, ""),
    ] {
        let mut spec = ImageSpec::new(vec![tar(&[file(tag, tag)])]);
        spec.user = Some(user.into());
        pusher.image("crius/user", tag, &spec).await;
        let rec = store
            .pull(
                &format!("{}/crius/user:{tag}", reg.host()),
                &Auth::default(),
            )
            .await
            .unwrap();
        assert_eq!((rec.uid, rec.username.as_str()), (uid, username), "{user}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_share_the_work() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let big: Vec<u8> = (0..8_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let spec = ImageSpec::new(vec![busybox_layer(), tar(&[file("big", big)])]);
    pusher.image("crius/concurrent", "v1", &spec).await;
    let root = root();
    let store = open(root.path(), None);
    let name = format!("{}/crius/concurrent:v1", reg.host());
    let opts = crius_image::PullOptions::default();
    let none = Auth::default();
    let short = name.clone();
    let (a, b, c) = tokio::join!(
        store.pull_with(&name, &none, opts),
        store.pull_with(&name, &none, opts),
        store.pull(&short, &none),
    );
    let (ra, report_a) = a.unwrap();
    let (rb, report_b) = b.unwrap();
    assert_eq!(ra.unwrap().id, rb.unwrap().id);
    assert_eq!(c.unwrap().id, store.list(None).unwrap()[0].id);
    // One run, one download: both callers got the same report.
    assert_eq!(report_a.fetched_bytes, report_b.fetched_bytes);
    assert!(report_a.fetched_bytes > 0);
    assert_eq!(store.list(None).unwrap().len(), 1);
    assert_no_temp_files(root.path());
    // A second pull fetches nothing.
    let (_, again) = store
        .pull_with(&name, &Auth::default(), opts)
        .await
        .unwrap();
    assert_eq!((again.fetched_bytes, again.unpacked_bytes), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_is_unavailable() {
    let root = root();
    let store = open(root.path(), None);
    let port = free_port();
    let err = store
        .pull(&format!("127.0.0.1:{port}/crius/none:v1"), &Auth::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );

    // A mirror that is down falls through to the origin.
    let reg = Registry::start();
    Pusher::new(&reg)
        .image(
            "crius/fallback",
            "v1",
            &ImageSpec::new(vec![tar(&[file("x", "x")])]),
        )
        .await;
    let hosts = root.path().join("certs.d");
    hosts_toml(
        &hosts,
        &reg.host(),
        &format!("[host.\"http://127.0.0.1:{port}\"]\n"),
    );
    let store = open(&root.path().join("r2"), Some(&hosts));
    store
        .pull(
            &format!("{}/crius/fallback:v1", reg.host()),
            &Auth::default(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_registry_with_and_without_credentials() {
    let reg = Registry::start_with(Some(("crius", "s3cret")));
    Pusher::new(&reg)
        .image(
            "crius/private",
            "v1",
            &ImageSpec::new(vec![tar(&[file("p", "p")])]),
        )
        .await;
    let root = root();
    let store = open(root.path(), None);
    let name = format!("{}/crius/private:v1", reg.host());

    let err = store.pull(&name, &Auth::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated);
    assert!(err.to_string().contains("authentication required"), "{err}");
    assert!(err.to_string().contains(&reg.host()), "{err}");

    let wrong = Auth {
        username: "crius".into(),
        password: "nope".into(),
        ..Default::default()
    };
    let err = store.pull(&name, &wrong).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated);
    assert!(err.to_string().contains("credentials rejected"), "{err}");

    let good = Auth {
        username: "crius".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    store.pull(&name, &good).await.unwrap();
    use base64::Engine as _;
    let encoded = Auth {
        auth: base64::engine::general_purpose::STANDARD.encode("crius:s3cret"),
        ..Default::default()
    };
    let store2 = open(&root.path().join("r2"), None);
    store2.pull(&name, &encoded).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_blob_is_refused_and_nothing_recorded() {
    let reg = Registry::start();
    let pushed = Pusher::new(&reg)
        .image(
            "crius/corrupt",
            "v1",
            &ImageSpec::new(vec![busybox_layer()]),
        )
        .await;
    let blob = reg.blob_file(&pushed.layer_digests[0]);
    let mut data = std::fs::read(&blob).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&blob, data).unwrap();

    let root = root();
    let store = open(root.path(), None);
    let err = store
        .pull(
            &format!("{}/crius/corrupt:v1", reg.host()),
            &Auth::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&pushed.layer_digests[0]), "{err}");
    assert!(err.to_string().contains("failed verification"), "{err}");
    // The registry's content is broken, not crius.
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert!(store.list(None).unwrap().is_empty());
    let hex = pushed.layer_digests[0].trim_start_matches("sha256:");
    assert!(!root.path().join("content/sha256").join(hex).exists());
    assert_eq!(count_files(&root.path().join("snapshots")), 0);
    assert_no_temp_files(root.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaping_tar_is_refused() {
    let reg = Registry::start();
    let pusher = Pusher::new(&reg);
    let root = root();
    let store = open(root.path(), None);
    let evil = [
        tar(&[Entry::RawName("../crius-escaped", b"x".to_vec())]),
        tar(&[
            Entry::Symlink("up", "/tmp"),
            Entry::RawName("up/crius-escaped", b"x".to_vec()),
        ]),
    ];
    for (i, layer) in evil.into_iter().enumerate() {
        let tag = format!("e{i}");
        pusher
            .image("crius/evil", &tag, &ImageSpec::new(vec![layer]))
            .await;
        let err = store
            .pull(
                &format!("{}/crius/evil:{tag}", reg.host()),
                &Auth::default(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
        assert!(store.list(None).unwrap().is_empty());
        assert!(!root.path().join("snapshots/crius-escaped").exists());
        assert!(!Path::new("/tmp/crius-escaped").exists());
        assert_no_temp_files(root.path());
    }
}

/// A store under a new root that has pulled `crius/<repo>:v1`, a busybox image pushed to `reg`;
/// returns the root (keep it), the store and the image's name.
async fn pulled_busybox(reg: &Registry, repo: &str) -> (tempfile::TempDir, ImageStore, String) {
    Pusher::new(reg)
        .image(
            &format!("crius/{repo}"),
            "v1",
            &ImageSpec::new(vec![busybox_layer()]),
        )
        .await;
    let root = root();
    let store = open(root.path(), None);
    let name = format!("{}/crius/{repo}:v1", reg.host());
    store.pull(&name, &Auth::default()).await.unwrap();
    (root, store, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keeps_snapshots_until_released() {
    let reg = Registry::start();
    let (root, store, name) = pulled_busybox(&reg, "leased").await;
    let dirs = store.lease("crius-ctr-1", &name).unwrap();
    store.remove(&name).await.unwrap();
    assert!(dirs[0].join("bin/busybox").exists(), "leased snapshot kept");
    // The lease survives a restart too.
    drop(store);
    let store = open(root.path(), None);
    assert_eq!(
        store.leased_lowerdirs("crius-ctr-1").unwrap(),
        Some(dirs.clone())
    );
    store.gc().await.unwrap();
    assert!(dirs[0].exists());
    store.release("crius-ctr-1").await.unwrap();
    assert!(!dirs[0].exists());
    store.release("crius-ctr-1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_goes_with_the_last_lease_of_a_removed_image() {
    let reg = Registry::start();
    let (_root, store, name) = pulled_busybox(&reg, "twice").await;
    let dirs = store.lease("crius-ctr-a", &name).unwrap();
    store.lease("crius-ctr-b", &name).unwrap();
    // The image is still there: releasing frees nothing.
    store.release("crius-ctr-a").await.unwrap();
    assert!(dirs[0].join("bin/busybox").exists());
    store.lease("crius-ctr-a", &name).unwrap();
    store.remove(&name).await.unwrap();
    store.release("crius-ctr-a").await.unwrap();
    assert!(dirs[0].join("bin/busybox").exists(), "still leased by b");
    store.release("crius-ctr-b").await.unwrap();
    assert!(
        !dirs[0].exists(),
        "the last lease of a removed image frees its snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_lease_holds_before_its_file_is_written() {
    let reg = Registry::start();
    let (root, store, name) = pulled_busybox(&reg, "deferred").await;
    let (dirs, file) = store.lease_deferred("crius-ctr-2", &name).unwrap();
    // Held in memory already: removing the image and collecting keep the snapshot.
    store.remove(&name).await.unwrap();
    store.gc().await.unwrap();
    assert!(dirs[0].join("bin/busybox").exists(), "leased snapshot kept");
    assert!(!root.path().join("leases/crius-ctr-2.json").exists());
    file.persist().unwrap();
    drop(store);
    let store = open(root.path(), None);
    assert_eq!(
        store.leased_lowerdirs("crius-ctr-2").unwrap(),
        Some(dirs.clone())
    );
    store.release("crius-ctr-2").await.unwrap();
    assert!(!dirs[0].exists());
}

/// Pulls `crius/stall:v1` from `fake` into a store under `root` whose stall timeout is 1 s:
/// the error and how long the pull took.
async fn pull_with_1s_stall_timeout(
    root: &Path,
    fake: &FakeRegistry,
) -> (crius_image::Error, Duration) {
    let store = ImageStore::open(StoreConfig {
        root: root.to_path_buf(),
        registry_config_dir: None,
        no_progress_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .unwrap();
    let started = std::time::Instant::now();
    let err = store
        .pull(&format!("{}/crius/stall:v1", fake.host()), &Auth::default())
        .await
        .unwrap_err();
    (err, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_download_is_cancelled() {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let config_digest = sha256(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [],
    }))
    .unwrap();
    let fake = FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/manifests/") {
            Reply::ok(
                manifest.clone(),
                "application/vnd.oci.image.manifest.v1+json",
            )
        } else if path.contains("/blobs/") {
            let mut r = Reply::ok(config.clone(), "application/octet-stream");
            r.stall_after = Some(10);
            r
        } else {
            Reply::status(404)
        }
    })
    .await;
    let root = root();
    let (err, took) = pull_with_1s_stall_timeout(root.path(), &fake).await;
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded, "{err}");
    assert!(err.to_string().contains("stalled"), "{err}");
    assert!(took < Duration::from_secs(5));
    assert_no_temp_files(root.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_flow() {
    let layer = gzip(&tar(&[file("t", "token")]));
    let diff = sha256(&tar(&[file("t", "token")]));
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": sha256(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": sha256(&layer), "size": layer.len()}],
    }))
    .unwrap();
    let blobs = [(sha256(&config), config), (sha256(&layer), layer)];
    let port_cell = std::sync::Arc::new(std::sync::OnceLock::<u16>::new());
    let pc = port_cell.clone();
    let token_requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tr = token_requests.clone();
    let fake = FakeRegistry::start(move |method, path, headers, body| {
        let auth = headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        if path.starts_with("/token") {
            tr.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if method == "POST" {
                // An identity token is exchanged as an OAuth2 refresh token.
                let form = String::from_utf8_lossy(body);
                if form.contains("grant_type=refresh_token") && form.contains("refresh_token=id-tok") {
                    return Reply::ok(br#"{"access_token":"tok-123"}"#.to_vec(), "application/json");
                }
                return Reply::status(401);
            }
            // user:pass is dXNlcjpwYXNz
            if auth == "Basic dXNlcjpwYXNz" && path.contains("scope=repository%3Acrius%2Ftok%3Apull") {
                return Reply::ok(br#"{"token":"tok-123"}"#.to_vec(), "application/json");
            }
            return Reply::status(401);
        }
        if auth != "Bearer tok-123" {
            let port = pc.get().copied().unwrap_or(0);
            let mut r = Reply::status(401);
            r.headers.push((
                "WWW-Authenticate".into(),
                format!("Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"fake\",scope=\"repository:crius/tok:pull\""),
            ));
            return r;
        }
        if path.contains("/manifests/") {
            return Reply::ok(manifest.clone(), "application/vnd.docker.distribution.manifest.v2+json");
        }
        for (d, data) in &blobs {
            if path.ends_with(d.as_str()) {
                return Reply::ok(data.clone(), "application/octet-stream");
            }
        }
        Reply::status(404)
    })
    .await;
    port_cell.set(fake.port).unwrap();
    let root = root();
    let store = open(root.path(), None);
    let name = format!("{}/crius/tok:v1", fake.host());

    let err = store.pull(&name, &Auth::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
    assert!(err.to_string().contains("authentication required"), "{err}");

    let auth = Auth {
        username: "user".into(),
        password: "pass".into(),
        ..Default::default()
    };
    let rec = store.pull(&name, &auth).await.unwrap();
    assert_eq!(rec.layers.len(), 1);
    let lower = store.lowerdirs(&rec.id).unwrap();
    assert_eq!(
        std::fs::read_to_string(lower[0].join("t")).unwrap(),
        "token"
    );
    // One token for the whole pull (plus the refused anonymous attempt).
    assert_eq!(token_requests.load(std::sync::atomic::Ordering::SeqCst), 2);

    // A registry token is sent as is, without a challenge.
    let store2 = open(&root.path().join("r2"), None);
    let rt = Auth {
        registry_token: "tok-123".into(),
        ..Default::default()
    };
    store2.pull(&name, &rt).await.unwrap();
    assert_eq!(token_requests.load(std::sync::atomic::Ordering::SeqCst), 2);

    let store3 = open(&root.path().join("r3"), None);
    let identity = Auth {
        identity_token: "id-tok".into(),
        ..Default::default()
    };
    store3.pull(&name, &identity).await.unwrap();
    assert_eq!(token_requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    let bad_identity = Auth {
        identity_token: "wrong".into(),
        ..Default::default()
    };
    let err = open(&root.path().join("r4"), None)
        .pull(&name, &bad_identity)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("credentials rejected"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_pull_leaves_no_temp_files() {
    let layer = vec![7u8; 1 << 20];
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(&layer), "size": layer.len()}],
    }))
    .unwrap();
    let config_digest = sha256(&config);
    let fake = FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/manifests/") {
            Reply::ok(
                manifest.clone(),
                "application/vnd.oci.image.manifest.v1+json",
            )
        } else if path.ends_with(&config_digest) {
            Reply::ok(config.clone(), "application/octet-stream")
        } else {
            let mut r = Reply::ok(layer.clone(), "application/octet-stream");
            r.stall_after = Some(300_000);
            r
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    let name = format!("{}/crius/cancel:v1", fake.host());
    let none = Auth::default();
    let pull = store.pull(&name, &none);
    let cancelled = tokio::time::timeout(Duration::from_millis(500), pull).await;
    assert!(cancelled.is_err(), "the pull stalls until cancelled");
    assert_no_temp_files(root.path());
    assert!(store.list(None).unwrap().is_empty());
    // The half-downloaded layer never became a blob, and the manifest and config the dropped
    // pull had stored are freed behind it.
    let blobs = root.path().join("content/sha256");
    assert_eventually(
        || names(&blobs).is_empty(),
        "blobs of the cancelled pull freed",
    );
}

/// The file names in `dir`.
fn names(dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Waits up to 10 s for `cond` (a collection behind a failed pull may finish in the background).
fn assert_eventually(cond: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "not so after 10 s: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An image the fake registry serves: one manifest and its blobs by digest.
struct FakeImage {
    repo: &'static str,
    manifest: Vec<u8>,
    blobs: Vec<(String, Vec<u8>)>,
}

impl FakeImage {
    /// An OCI image of uncompressed tar `layers`.
    fn new(repo: &'static str, layers: &[Vec<u8>]) -> Self {
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| sha256(l)).collect::<Vec<_>>()},
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": sha256(&config), "size": config.len()},
            "layers": layers.iter().map(|l| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": sha256(l), "size": l.len(),
            })).collect::<Vec<_>>(),
        }))
        .unwrap();
        let mut blobs = vec![(sha256(&config), config)];
        blobs.extend(layers.iter().map(|l| (sha256(l), l.clone())));
        Self {
            repo,
            manifest,
            blobs,
        }
    }

    fn layer_hex(&self, i: usize) -> String {
        self.blobs[i + 1]
            .0
            .trim_start_matches("sha256:")
            .to_string()
    }
}

/// Serves `images`; `tweak(digest, reply)` may delay or spoil a blob's reply.
async fn serve(
    images: Vec<FakeImage>,
    tweak: impl Fn(&str, &mut Reply) + Send + Sync + 'static,
) -> FakeRegistry {
    FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/manifests/") {
            return match images
                .iter()
                .find(|i| path.contains(&format!("/{}/", i.repo)))
            {
                Some(i) => Reply::ok(
                    i.manifest.clone(),
                    "application/vnd.oci.image.manifest.v1+json",
                ),
                None => Reply::status(404),
            };
        }
        let blob = images
            .iter()
            .flat_map(|i| i.blobs.iter())
            .find(|(d, _)| path.ends_with(d.as_str()));
        match blob {
            Some((digest, body)) => {
                let mut r = Reply::ok(body.clone(), "application/octet-stream");
                tweak(digest, &mut r);
                r
            }
            None => Reply::status(404),
        }
    })
    .await
}

/// A pull that fails part-way (one layer fails its digest check after another was fetched and
/// unpacked) frees its manifest, config, layers and snapshots; a layer it shares with an image
/// already present stays, with its snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pull_frees_what_it_fetched_but_not_a_shared_layer() {
    let shared = tar(&[file("shared", "s")]);
    let kept = FakeImage::new("crius/kept", &[shared.clone(), tar(&[file("k", "k")])]);
    let broken = FakeImage::new(
        "crius/broken",
        &[shared, tar(&[file("g", "good")]), tar(&[file("b", "bad")])],
    );
    let shared_hex = kept.layer_hex(0);
    let bad = broken.blobs[3].0.clone();
    let fake = serve(vec![kept, broken], move |digest, r| {
        if digest == bad {
            r.body[0] ^= 0xff;
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    store
        .pull(&format!("{}/crius/kept:v1", fake.host()), &Auth::default())
        .await
        .unwrap();
    let blobs = root.path().join("content/sha256");
    let snapshots = root.path().join("snapshots");
    let (blobs_before, snapshots_before) = (names(&blobs), names(&snapshots));
    assert_eq!(blobs_before.len(), 4, "manifest, config and two layers");
    assert!(blobs_before.contains(&shared_hex));

    let err = store
        .pull(
            &format!("{}/crius/broken:v1", fake.host()),
            &Auth::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("failed verification"), "{err}");
    assert_eventually(
        || names(&blobs) == blobs_before && names(&snapshots) == snapshots_before,
        "only the kept image's blobs and snapshots are left",
    );
    assert_eq!(names(&blobs), blobs_before);
    assert_eq!(names(&snapshots), snapshots_before);
    assert_no_temp_files(root.path());
    let kept = store.list(None).unwrap();
    assert_eq!(kept.len(), 1);
    for dir in store.lowerdirs(&kept[0].id).unwrap() {
        assert!(dir.is_dir(), "{}", dir.display());
    }
}

/// A pull that fails while another pull sharing a layer is still running leaves that layer
/// alone; its own blobs go once the other pull is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pull_during_another_keeps_their_shared_layer() {
    let shared = tar(&[file("shared", "s")]);
    let slow = FakeImage::new("crius/slow", &[shared.clone(), tar(&[file("u", "u")])]);
    let broken = FakeImage::new("crius/broken", &[shared, tar(&[file("b", "bad")])]);
    let shared_hex = slow.layer_hex(0);
    let slow_layer = slow.blobs[2].0.clone();
    let bad = broken.blobs[2].0.clone();
    let fake = serve(vec![slow, broken], move |digest, r| {
        if digest == slow_layer {
            r.delay = Some(Duration::from_secs(2));
        } else if digest == bad {
            r.body[0] ^= 0xff;
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    let blobs = root.path().join("content/sha256");
    let slow_pull = tokio::spawn({
        let store = store.clone();
        let name = format!("{}/crius/slow:v1", fake.host());
        async move { store.pull(&name, &Auth::default()).await }
    });
    let shared_blob = blobs.join(&shared_hex);
    assert_eventually(
        || shared_blob.exists(),
        "the slow pull fetched the shared layer",
    );

    let err = store
        .pull(
            &format!("{}/crius/broken:v1", fake.host()),
            &Auth::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("failed verification"), "{err}");
    assert!(!slow_pull.is_finished(), "the slow pull is still running");
    assert!(
        shared_blob.exists(),
        "shared layer removed under a running pull"
    );

    let record = slow_pull.await.unwrap().unwrap();
    let wanted: std::collections::BTreeSet<String> =
        record.blobs().map(|d| d.hex().to_string()).collect();
    assert_eq!(wanted.len(), 4, "manifest, config and two layers");
    assert_eventually(
        || names(&blobs) == wanted,
        "the failed pull's blobs are freed, the slow image's kept",
    );
    for dir in store.lowerdirs(&record.id).unwrap() {
        assert!(dir.is_dir(), "{}", dir.display());
    }
    assert_no_temp_files(root.path());
}

/// The config downloads beside the layers. One that the pull refuses (it lists fewer diff IDs
/// than the manifest has layers) while a layer is still arriving ends the pull with the
/// config's error, and the manifest, the config and the layer all go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_refused_while_a_layer_downloads_ends_the_pull_and_leaves_nothing() {
    let layers = [tar(&[file("a", "a")]), tar(&[file("b", "b")])];
    let mut image = FakeImage::new("crius/short", &layers);
    // The same image, but a config naming only the first layer.
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layers[0])]},
    }))
    .unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&image.manifest).unwrap();
    manifest["config"]["digest"] = sha256(&config).into();
    manifest["config"]["size"] = config.len().into();
    image.manifest = serde_json::to_vec(&manifest).unwrap();
    image.blobs[0] = (sha256(&config), config);
    let (config_digest, slow_layer) = (image.blobs[0].0.clone(), image.blobs[2].0.clone());
    let layer_asked = Arc::new(AtomicBool::new(false));
    let asked = layer_asked.clone();
    let fake = serve(vec![image], move |digest, r| {
        if digest == config_digest {
            r.delay = Some(Duration::from_millis(200));
        } else if digest == slow_layer {
            asked.store(true, Ordering::SeqCst);
            r.delay = Some(Duration::from_millis(600));
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    let err = store
        .pull(&format!("{}/crius/short:v1", fake.host()), &Auth::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("config lists 1 diff IDs for 2 layers"),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert!(
        layer_asked.load(Ordering::SeqCst),
        "the layer was asked for while the config downloaded"
    );
    // Past the layer's arrival: a download the failed pull left running would land by now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let blobs = root.path().join("content/sha256");
    assert_eventually(
        || names(&blobs).is_empty(),
        "the failed pull's manifest, config and layers are freed",
    );
    assert_eq!(count_files(&root.path().join("snapshots")), 0);
    assert!(store.list(None).unwrap().is_empty());
    assert_no_temp_files(root.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_registry_with_ca_or_skip_verify() {
    let mut reg = Registry::start();
    Pusher::new(&reg)
        .image(
            "crius/tls",
            "v1",
            &ImageSpec::new(vec![tar(&[file("s", "secure")])]),
        )
        .await;
    let ca = reg.restart_with_tls();
    let name = format!("{}/crius/tls:v1", reg.host());
    let root = root();
    let hosts = root.path().join("certs.d");
    let with = |text: String, n: &str| {
        let dir = hosts.join(n);
        hosts_toml(&dir, &reg.host(), &text);
        open(&root.path().join(n), Some(&dir))
    };
    let server = format!("server = \"https://{}\"\n", reg.host());

    let err = with(server.clone(), "untrusted")
        .pull(&name, &Auth::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    let trusted = with(format!("{server}ca = \"{}\"\n", ca.display()), "ca");
    let rec = trusted.pull(&name, &Auth::default()).await.unwrap();
    let lower = trusted.lowerdirs(&rec.id).unwrap();
    assert_eq!(
        std::fs::read_to_string(lower[0].join("s")).unwrap(),
        "secure"
    );

    with(format!("{server}skip_verify = true\n"), "skip")
        .pull(&name, &Auth::default())
        .await
        .unwrap();

    let err = with(format!("{server}ca = \"missing.crt\"\n"), "missing-ca")
        .pull(&name, &Auth::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("missing.crt"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_distributable_layer_is_reported() {
    let layer = tar(&[file("f", "foreign")]);
    let layer_digest = sha256(&gzip(&layer));
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": sha256(&config), "size": config.len()},
        "layers": [{
            "mediaType": "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
            "digest": layer_digest, "size": 100,
            "urls": ["https://foreign.example.com/layer"],
        }],
    }))
    .unwrap();
    let config_digest = sha256(&config);
    let fake = FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/manifests/") {
            Reply::ok(
                manifest.clone(),
                "application/vnd.docker.distribution.manifest.v2+json",
            )
        } else if path.ends_with(&config_digest) {
            Reply::ok(config.clone(), "application/octet-stream")
        } else {
            Reply::status(404)
        }
    })
    .await;
    let root = root();
    let err = open(root.path(), None)
        .pull(
            &format!("{}/crius/foreign:v1", fake.host()),
            &Auth::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("non-distributable") && msg.contains("foreign.example.com"),
        "{msg}"
    );
}

/// A registry that stalls while sending a manifest: DeadlineExceeded, like a stalled blob.
#[tokio::test]
async fn stalled_manifest_is_deadline_exceeded() {
    let fake = FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/manifests/") {
            let mut r = Reply::ok(
                br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#
                    .to_vec(),
                "application/vnd.oci.image.manifest.v1+json",
            );
            r.stall_after = Some(10);
            r
        } else {
            Reply::status(404)
        }
    })
    .await;
    let root = root();
    let (err, took) = pull_with_1s_stall_timeout(root.path(), &fake).await;
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded, "{err}");
    assert!(err.to_string().contains("manifest"), "{err}");
    assert!(took < Duration::from_secs(5));
}

/// A manifest listing one layer thousands of times is refused before anything is fetched.
#[tokio::test]
async fn a_manifest_with_too_many_layers_is_refused_before_any_download() {
    let layer = gzip(&tar(&[file("f", "x")]));
    let layer_digest = sha256(&layer);
    let layers: Vec<serde_json::Value> = (0..5000)
        .map(|_| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer_digest, "size": layer.len(),
            })
        })
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256(b"{}"), "size": 2},
        "layers": layers,
    }))
    .unwrap();
    let blob_requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&blob_requests);
    let fake = FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/manifests/") {
            Reply::ok(
                manifest.clone(),
                "application/vnd.oci.image.manifest.v1+json",
            )
        } else {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Reply::status(404)
        }
    })
    .await;
    let root = root();
    let err = open(root.path(), None)
        .pull(
            &format!("{}/crius/layers:v1", fake.host()),
            &Auth::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("5000 layers"), "{err}");
    assert_eq!(
        blob_requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "blobs fetched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_registry() {
    let mut reg = Registry::start();
    Pusher::new(&reg)
        .image(
            "crius/mtls",
            "v1",
            &ImageSpec::new(vec![tar(&[file("m", "mutual")])]),
        )
        .await;
    let ca = reg.restart_with_tls_opts(true);
    let certs = ca.parent().unwrap();
    let name = format!("{}/crius/mtls:v1", reg.host());
    let root = root();
    let base = format!(
        "server = \"https://{}\"\nca = \"{}\"\n",
        reg.host(),
        ca.display()
    );

    let hosts = root.path().join("no-client");
    hosts_toml(&hosts, &reg.host(), &base);
    let err = open(&root.path().join("a"), Some(&hosts))
        .pull(&name, &Auth::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    let hosts = root.path().join("client");
    hosts_toml(
        &hosts,
        &reg.host(),
        &format!(
            "{base}client = [\"{}\", \"{}\"]\n",
            certs.join("client.crt").display(),
            certs.join("client.key").display()
        ),
    );
    let store = open(&root.path().join("b"), Some(&hosts));
    let rec = store.pull(&name, &Auth::default()).await.unwrap();
    let lower = store.lowerdirs(&rec.id).unwrap();
    assert_eq!(
        std::fs::read_to_string(lower[0].join("m")).unwrap(),
        "mutual"
    );
}

/// While a pull runs it is listed with the bytes its blobs add up to and the bytes present so
/// far; a stalled layer counts what arrived; a pull that ends is no longer listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_under_way_reports_its_progress() {
    let small = tar(&[file("small", "s")]);
    let big = tar(&[file("big", "x".repeat(200_000))]);
    let image = FakeImage::new("crius/progress", &[small, big]);
    let sizes: Vec<u64> = image.blobs.iter().map(|(_, b)| b.len() as u64).collect();
    let big_layer = image.blobs[2].0.clone();
    let big_layer_digest = big_layer.clone();
    let small_layer_digest = image.blobs[1].0.clone();
    let fake = serve(vec![image], move |digest, r| {
        if digest == big_layer {
            r.stall_after = Some(50_000);
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    assert!(store.pulls_in_progress().is_empty());
    let name = format!("{}/crius/progress:v1", fake.host());
    let pull = tokio::spawn({
        let store = store.clone();
        async move { store.pull(&name, &Auth::default()).await }
    });
    // The config and the small layer are in; of the big one, what came before the stall.
    let expected = sizes[0] + sizes[1] + 50_000;
    assert_eventually(
        || store.pulls_in_progress().first().map(|p| p.done_bytes) == Some(expected),
        "the pull counts the bytes that arrived",
    );
    let now = store.pulls_in_progress();
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].total_bytes, sizes.iter().sum::<u64>());
    assert!(now[0].image.ends_with("crius/progress:v1"), "{now:?}");
    // Per blob: the stalled layer has what came and, a moment later, its stall time.
    std::thread::sleep(Duration::from_millis(300));
    let now = store.pulls_in_progress();
    let blob = |digest: &str| {
        now[0]
            .blobs
            .iter()
            .find(|b| b.digest == digest)
            .unwrap_or_else(|| panic!("{digest} not listed: {now:?}"))
            .clone()
    };
    let stalled = blob(&big_layer_digest);
    assert_eq!(
        (stalled.done_bytes, stalled.total_bytes),
        (50_000, sizes[2])
    );
    assert!(stalled.stalled >= Duration::from_millis(300), "{stalled:?}");
    let small_layer = blob(&small_layer_digest);
    assert_eq!(small_layer.done_bytes, sizes[1]);
    assert_eq!(small_layer.stalled, Duration::ZERO);
    pull.abort();
    assert_eventually(
        || store.pulls_in_progress().is_empty(),
        "a pull that ended is no longer listed",
    );
}

/// Registry settings changed while the store is open apply to the next pull: a shorter stall
/// timeout ends a stalled download sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_settings_change_for_the_next_pull() {
    let image = FakeImage::new("crius/stalls", &[tar(&[file("f", "y".repeat(100_000))])]);
    let layer = image.blobs[1].0.clone();
    let fake = serve(vec![image], move |digest, r| {
        if digest == layer {
            r.stall_after = Some(1000);
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    let mut settings = store.registry_settings();
    assert_eq!(settings.no_progress_timeout, Duration::from_secs(10));
    settings.no_progress_timeout = Duration::from_secs(1);
    settings.max_concurrent_downloads = 1;
    store.set_registry_settings(settings.clone());
    assert_eq!(store.registry_settings(), settings);
    let started = std::time::Instant::now();
    let err = store
        .pull(
            &format!("{}/crius/stalls:v1", fake.host()),
            &Auth::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded, "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "{err}");
}

/// What the registry serves decides the code, never Internal: an image that cannot be used
/// (a manifest that does not parse, a layer that is not a tar stream) is FailedPrecondition, a
/// registry that answers what it should not is Unavailable. Nothing is left of either pull.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_image_is_failed_precondition_and_a_confused_registry_unavailable() {
    let not_tar = FakeImage::new("crius/not-tar", &[b"this is not a tar stream ".repeat(40)]);
    let fake = FakeRegistry::start(move |_, path, _, _| {
        if path.contains("/crius/not-json/manifests/") {
            return Reply::ok(
                b"{not json".to_vec(),
                "application/vnd.oci.image.manifest.v1+json",
            );
        }
        if path.contains("/crius/teapot/") {
            return Reply::status(418);
        }
        if path.contains("/manifests/") {
            return Reply::ok(
                not_tar.manifest.clone(),
                "application/vnd.oci.image.manifest.v1+json",
            );
        }
        match not_tar
            .blobs
            .iter()
            .find(|(d, _)| path.ends_with(d.as_str()))
        {
            Some((_, body)) => Reply::ok(body.clone(), "application/octet-stream"),
            None => Reply::status(404),
        }
    })
    .await;
    let root = root();
    let store = open(root.path(), None);
    for (repo, kind, says) in [
        (
            "not-json",
            ErrorKind::FailedPrecondition,
            "invalid manifest",
        ),
        ("not-tar", ErrorKind::FailedPrecondition, "read tar"),
        (
            "teapot",
            ErrorKind::Unavailable,
            "unexpected HTTP status 418",
        ),
    ] {
        let err = store
            .pull(
                &format!("{}/crius/{repo}:v1", fake.host()),
                &Auth::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{repo}: {err}");
        assert!(err.to_string().contains(says), "{repo}: {err}");
    }
    let blobs = root.path().join("content/sha256");
    assert_eventually(
        || names(&blobs).is_empty(),
        "the failed pulls' blobs are freed",
    );
    assert_eq!(count_files(&root.path().join("snapshots")), 0);
    assert!(store.list(None).unwrap().is_empty());
    assert_no_temp_files(root.path());
}
