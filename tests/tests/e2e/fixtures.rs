//! Each fixture of `crius_tests`, exercised against the real thing.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Read;

use crius_api::v1::VersionRequest;
use crius_tests::images::{self, multi_layer, PushedImage, TestImage};
use crius_tests::registry::{Credentials, Registry, RegistryClient, REALM};
use crius_tests::{crius::Crius, free_port, TestDir};
use serde_json::Value;

/// One entry of a layer tar: kind, mode, uid, gid, content or link target.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: tar::EntryType,
    mode: u32,
    uid: u64,
    gid: u64,
    data: Vec<u8>,
}

/// Unpacks a gzip layer into `/path` → entry.
fn layer_entries(blob: &[u8]) -> Vec<(String, Entry)> {
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(blob)
        .read_to_end(&mut tar)
        .unwrap();
    let mut archive = tar::Archive::new(&tar[..]);
    archive
        .entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let path = format!("/{}", entry.path().unwrap().display());
            let header = entry.header().clone();
            let mut data = Vec::new();
            if let Some(link) = entry.link_name().unwrap() {
                data = link.display().to_string().into_bytes();
            } else {
                entry.read_to_end(&mut data).unwrap();
            }
            let path = path.trim_end_matches('/').to_owned();
            let entry = Entry {
                kind: header.entry_type(),
                mode: header.mode().unwrap(),
                uid: header.uid().unwrap(),
                gid: header.gid().unwrap(),
                data,
            };
            (path, entry)
        })
        .collect()
}

/// Applies layers in order to a model of the file system, following the OCI whiteout rules.
fn apply_layers(layers: &[Vec<u8>]) -> BTreeMap<String, Entry> {
    let mut fs: BTreeMap<String, Entry> = BTreeMap::new();
    let under = |dir: &str, path: &str| path.starts_with(&format!("{dir}/"));
    for blob in layers {
        let entries = layer_entries(blob);
        // Opaque markers hide lower content only, so apply them before this layer's files.
        for (path, _) in &entries {
            if let Some(dir) = path.strip_suffix("/.wh..wh..opq") {
                fs.retain(|existing, _| !under(dir, existing));
            }
        }
        for (path, entry) in entries {
            let (dir, name) = path.rsplit_once('/').unwrap();
            if name == ".wh..wh..opq" {
                continue;
            }
            if let Some(victim) = name.strip_prefix(".wh.") {
                let victim = format!("{dir}/{victim}");
                fs.retain(|existing, _| *existing != victim && !under(&victim, existing));
                continue;
            }
            fs.insert(path, entry);
        }
    }
    fs
}

/// Fetches an image back by tag and by digest and checks every blob against the push.
fn fetch_back(client: &RegistryClient, image: &PushedImage) -> (Value, Vec<Vec<u8>>) {
    let tag = image.tag.as_deref().unwrap();
    let by_tag = client.manifest(&image.repository, tag).unwrap();
    assert_eq!(by_tag.digest, image.digest);
    assert_eq!(by_tag.body, image.manifest);
    assert_eq!(by_tag.media_type, image.media_type);
    let by_digest = client.manifest(&image.repository, &image.digest).unwrap();
    assert_eq!(by_digest.body, image.manifest);

    let manifest: Value = serde_json::from_slice(&by_tag.body).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["config"]["digest"], image.config_digest.as_str());
    let config = client
        .blob(&image.repository, &image.config_digest)
        .unwrap();
    assert_eq!(config, image.config);
    let config: Value = serde_json::from_slice(&config).unwrap();

    let layers: Vec<Vec<u8>> = image
        .layers
        .iter()
        .map(|layer| {
            let blob = client.blob(&image.repository, &layer.digest).unwrap();
            assert_eq!(blob.len() as u64, layer.size);
            blob
        })
        .collect();
    let descriptors = manifest["layers"].as_array().unwrap();
    assert_eq!(descriptors.len(), image.layers.len());
    for (descriptor, layer) in descriptors.iter().zip(&image.layers) {
        assert_eq!(descriptor["digest"], layer.digest.as_str());
        assert_eq!(descriptor["size"], layer.size);
    }
    let diff_ids: Vec<&str> = image.layers.iter().map(|l| l.diff_id.as_str()).collect();
    assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!(diff_ids));
    (config, layers)
}

#[test]
fn free_port_is_bindable() {
    let port = free_port().unwrap();
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
}

#[test]
fn test_dir_unmounts_and_removes_itself() {
    let dir = TestDir::new("testdir").unwrap();
    let path = dir.path().to_owned();
    assert!(path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("crius-testdir-"));
    let target = dir.join("mnt");
    std::fs::create_dir(&target).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &target,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    std::fs::write(target.join("busy"), b"x").unwrap();
    let _open = std::fs::File::open(target.join("busy")).unwrap();
    drop(dir);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(path.to_str().unwrap()), "{mountinfo}");
    assert!(!path.exists());
}

#[test]
fn registry_starts_answers_and_goes_away() {
    let registry = Registry::start().unwrap();
    assert!(registry.url().starts_with("http://127.0.0.1:"));
    assert_eq!(registry.url(), format!("http://{}", registry.host_port()));
    assert!(registry.credentials().is_none());
    let response = registry.anonymous_client().get("/v2/").unwrap();
    assert_eq!(response.status, 200, "{}", response.body_text());
    assert_eq!(
        response.header("docker-distribution-api-version"),
        Some("registry/2.0")
    );

    let dir = registry.storage_dir().parent().unwrap().to_owned();
    let client = registry.client();
    drop(registry);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(client.get("/v2/").is_err(), "registry still answers");
}

#[test]
fn auth_registry_wants_credentials() {
    let registry = Registry::start_with_auth().unwrap();
    let anonymous = registry.anonymous_client().get("/v2/").unwrap();
    assert_eq!(anonymous.status, 401);
    assert_eq!(
        anonymous.header("www-authenticate"),
        Some(format!("Basic realm=\"{REALM}\"").as_str())
    );
    assert_eq!(registry.client().get("/v2/").unwrap().status, 200);

    let wrong = Credentials {
        username: registry.credentials().unwrap().username.clone(),
        password: "wrong".to_owned(),
    };
    let wrong = RegistryClient::new(&registry.url(), Some(&wrong));
    assert_eq!(wrong.get("/v2/").unwrap().status, 401);

    // Pushing works with credentials; reading it back without them does not.
    let image = images::push(&registry, TestImage::Busybox).unwrap();
    fetch_back(&registry.client(), &image);
    let path = format!("/v2/{}/manifests/latest", image.repository);
    assert_eq!(registry.anonymous_client().get(&path).unwrap().status, 401);
}

#[test]
fn busybox_image_round_trips() {
    let registry = Registry::start().unwrap();
    let image = images::push(&registry, TestImage::Busybox).unwrap();
    assert_eq!(
        image.reference,
        format!("{}/crius-test/busybox:latest", registry.host_port())
    );
    assert_eq!(
        image.digest_reference,
        format!(
            "{}/crius-test/busybox@{}",
            registry.host_port(),
            image.digest
        )
    );
    assert_eq!(image.media_type, images::OCI_MANIFEST);
    let (config, layers) = fetch_back(&registry.client(), &image);
    let manifest: Value = serde_json::from_slice(&image.manifest).unwrap();
    assert_eq!(manifest["mediaType"], images::OCI_MANIFEST);
    assert_eq!(manifest["config"]["mediaType"], images::OCI_CONFIG);
    assert_eq!(manifest["layers"][0]["mediaType"], images::OCI_LAYER_GZIP);

    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], images::host_arch());
    let c = &config["config"];
    assert_eq!(
        c["Env"],
        serde_json::json!([images::ENV_PATH, images::ENV_CUSTOM])
    );
    assert_eq!(c["Cmd"], serde_json::json!(images::CMD));
    assert_eq!(c["WorkingDir"], images::WORKING_DIR);
    assert_eq!(c["StopSignal"], images::STOP_SIGNAL);
    assert!(c["ExposedPorts"][images::EXPOSED_PORT].is_object());
    assert_eq!(c["Labels"][images::LABEL.0], images::LABEL.1);
    assert!(c.get("User").is_none());

    let fs = apply_layers(&layers);
    let busybox = &fs["/bin/busybox"];
    assert_eq!(busybox.kind, tar::EntryType::Regular);
    assert_eq!(busybox.mode, 0o755);
    assert_eq!(busybox.data, std::fs::read("/bin/busybox").unwrap());
    for applet in [
        "sh", "ls", "cat", "echo", "sleep", "id", "env", "top", "ps", "wget",
    ] {
        let entry = &fs[&format!("/bin/{applet}")];
        assert_eq!(entry.kind, tar::EntryType::Symlink, "{applet}");
        assert_eq!(entry.data, b"busybox");
    }
    let (link, target) = images::HARDLINK;
    assert_eq!(fs[link].kind, tar::EntryType::Link);
    assert_eq!(fs[link].data, target.trim_start_matches('/').as_bytes());
    assert_eq!(fs["/tmp"].mode, 0o1777);
    assert_eq!(fs["/root"].mode, 0o700);
    assert_eq!((fs["/home/crius"].uid, fs["/home/crius"].gid), (1000, 1000));
    let passwd = String::from_utf8(fs["/etc/passwd"].data.clone()).unwrap();
    assert!(passwd.contains("root:x:0:0:"), "{passwd}");
    assert!(passwd.contains("nobody:x:65534:65534:"), "{passwd}");
    assert!(passwd.contains("crius:x:1000:1000:"), "{passwd}");
    let group = String::from_utf8(fs["/etc/group"].data.clone()).unwrap();
    assert!(group.contains("crius:x:1000:"), "{group}");
    assert!(group.contains("crius-extra:x:1001:crius"), "{group}");

    // A second push of the same image is a no-op with the same digests.
    let again = images::push(&registry, TestImage::Busybox).unwrap();
    assert_eq!(again.digest, image.digest);
    let other = images::push_as(&registry, TestImage::Busybox, "crius-test/other", "v1").unwrap();
    assert_eq!(other.digest, image.digest);
    assert_eq!(
        other.reference,
        format!("{}/crius-test/other:v1", registry.host_port())
    );
}

#[test]
fn docker_schema2_variant_round_trips() {
    let registry = Registry::start().unwrap();
    let image = images::push(&registry, TestImage::BusyboxDocker).unwrap();
    assert_eq!(image.media_type, images::DOCKER_MANIFEST);
    let (config, _) = fetch_back(&registry.client(), &image);
    let manifest: Value = serde_json::from_slice(&image.manifest).unwrap();
    assert_eq!(manifest["config"]["mediaType"], images::DOCKER_CONFIG);
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        images::DOCKER_LAYER_GZIP
    );
    assert_eq!(config["config"]["StopSignal"], images::STOP_SIGNAL);
}

#[test]
fn multi_layer_image_unpacks_as_documented() {
    let registry = Registry::start().unwrap();
    let image = images::push(&registry, TestImage::MultiLayer).unwrap();
    assert_eq!(image.layers.len(), 3);
    let busybox = images::busybox_layer().unwrap();
    assert_eq!(image.layers[0].digest, busybox.digest);
    let (_, layers) = fetch_back(&registry.client(), &image);

    let fs = apply_layers(&layers);
    for (path, content) in multi_layer::FILES {
        assert_eq!(fs[*path].data, content.as_bytes(), "{path}");
    }
    for path in multi_layer::ABSENT {
        assert!(!fs.contains_key(*path), "{path} should be gone");
    }
    let children = |dir: &str| -> Vec<String> {
        fs.keys()
            .filter_map(|path| path.strip_prefix(&format!("{dir}/")))
            .filter(|rest| !rest.contains('/'))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(children("/data"), multi_layer::DATA_ENTRIES);
    assert_eq!(children("/data/opaque"), multi_layer::OPAQUE_ENTRIES);
    // The lower layer really had what the upper one removes.
    let lower = apply_layers(&layers[..2]);
    assert_eq!(
        lower["/data/replace-me"].data,
        multi_layer::REPLACED_CONTENT.as_bytes()
    );
    for path in [
        "/data/delete-me",
        "/data/gone-dir/file",
        "/data/opaque/old",
        "/bin/wget",
    ] {
        assert!(
            lower.contains_key(path),
            "{path} missing from the lower layers"
        );
    }
}

#[test]
fn user_image_round_trips() {
    let registry = Registry::start().unwrap();
    let image = images::push(&registry, TestImage::User).unwrap();
    let (config, _) = fetch_back(&registry.client(), &image);
    assert_eq!(config["config"]["User"], images::USER_IMAGE_USER);
    assert_eq!(
        config["config"]["Cmd"],
        serde_json::json!(images::USER_IMAGE_CMD)
    );
}

#[test]
fn index_lists_both_platforms() {
    let registry = Registry::start().unwrap();
    let index = images::push_index(&registry).unwrap();
    let client = registry.client();
    let fetched = client.manifest(&index.repository, &index.tag).unwrap();
    assert_eq!(fetched.media_type, images::OCI_INDEX);
    assert_eq!(fetched.digest, index.digest);
    assert_eq!(fetched.body, index.manifest);
    assert_eq!(
        client
            .manifest(&index.repository, &index.digest)
            .unwrap()
            .body,
        index.manifest
    );

    let parsed: Value = serde_json::from_slice(&fetched.body).unwrap();
    let entries = parsed["manifests"].as_array().unwrap();
    let platforms: Vec<(String, String, Option<String>)> = entries
        .iter()
        .map(|entry| {
            let platform = &entry["platform"];
            (
                platform["os"].as_str().unwrap().to_owned(),
                platform["architecture"].as_str().unwrap().to_owned(),
                platform["variant"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        vec![
            (
                "linux".to_owned(),
                "arm64".to_owned(),
                Some("v8".to_owned())
            ),
            ("linux".to_owned(), "amd64".to_owned(), None),
        ]
    );
    assert_eq!(entries[0]["digest"], index.arm64.digest.as_str());
    assert_eq!(entries[1]["digest"], index.amd64.digest.as_str());

    for (image, arch) in [(&index.amd64, "amd64"), (&index.arm64, "arm64")] {
        assert!(image.tag.is_none());
        assert_eq!(image.reference, image.digest_reference);
        let by_digest = client.manifest(&image.repository, &image.digest).unwrap();
        assert_eq!(by_digest.body, image.manifest);
        let config: Value = serde_json::from_slice(
            &client
                .blob(&image.repository, &image.config_digest)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(config["architecture"], arch);
        let layers: Vec<Vec<u8>> = image
            .layers
            .iter()
            .map(|layer| client.blob(&image.repository, &layer.digest).unwrap())
            .collect();
        let fs = apply_layers(&layers);
        assert_eq!(
            fs[images::PLATFORM_FILE].data,
            format!("linux/{arch}\n").as_bytes()
        );
    }
    assert_eq!(
        index.for_host().digest,
        match images::host_arch() {
            "arm64" => &index.arm64.digest,
            _ => &index.amd64.digest,
        }
        .as_str()
    );
}

#[tokio::test]
async fn crius_serves_version_and_survives_kill9() {
    let mut crius = Crius::start("").await.unwrap();
    let dir = crius.dir().to_owned();
    assert!(crius.socket().exists());

    let version = crius
        .runtime()
        .version(VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.runtime_name, "crius");
    assert_eq!(version.runtime_api_version, "v1");
    assert!(!version.runtime_version.is_empty());

    let first_pid = crius.pid().unwrap();
    crius.kill9().unwrap();
    assert!(crius.pid().is_none());
    assert!(
        crius
            .runtime()
            .version(VersionRequest::default())
            .await
            .is_err(),
        "a killed crius answered"
    );

    crius.restart().await.unwrap();
    assert_ne!(crius.pid().unwrap(), first_pid);
    let version = crius
        .runtime()
        .version(VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.runtime_name, "crius");

    let sockets = [
        crius.socket(),
        crius.nri_socket(),
        crius.state().join("admin.sock"),
    ];
    for socket in &sockets {
        assert!(
            socket.exists(),
            "{} not there while crius runs",
            socket.display()
        );
    }
    let status = crius.stop().unwrap();
    assert!(status.success(), "SIGTERM exit: {status}\n{}", crius.log());
    // An orderly stop leaves no socket file behind.
    for socket in &sockets {
        assert!(!socket.exists(), "{} left after SIGTERM", socket.display());
    }
    drop(crius);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn fixtures_clean_up_when_a_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let registry = Registry::start().unwrap();
            let crius = Crius::start("").await.unwrap();
            // A mount a failed test could leave in crius's root.
            let mnt = crius.root().join("crius-leftover-mount");
            std::fs::create_dir(&mnt).unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                &mnt,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
            let registry_dir = registry.storage_dir().parent().unwrap().to_owned();
            tx.send((
                crius.dir().to_owned(),
                crius.pid().unwrap(),
                registry_dir,
                registry.url(),
            ))
            .unwrap();
            panic!("deliberate panic with live fixtures");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread should have panicked");

    let (crius_dir, crius_pid, registry_dir, registry_url) = rx.recv().unwrap();
    assert!(!crius_dir.exists(), "{} left behind", crius_dir.display());
    assert!(
        !registry_dir.exists(),
        "{} left behind",
        registry_dir.display()
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{crius_pid}")).exists(),
        "crius (pid {crius_pid}) still running"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(crius_dir.to_str().unwrap()),
        "{mountinfo}"
    );
    let client = RegistryClient::new(&registry_url, None);
    assert!(client.get("/v2/").is_err(), "registry still answers");
}

#[tokio::test]
async fn crius_start_failure_carries_its_log() {
    let err = Crius::start("crius_tests_unknown_key = 1\n")
        .await
        .expect_err("crius started with an unknown config key");
    let message = format!("{err:?}");
    assert!(
        matches!(err, crius_tests::Error::Start { name: "crius", .. }),
        "{message}"
    );
    assert!(message.contains("crius_tests_unknown_key"), "{message}");
}
