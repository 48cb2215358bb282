//! Volumes an image declares (`config.Volumes`, Dockerfile `VOLUME`): each container gets its
//! own directory at each declared path, filled from the image with its owner and mode, unless a
//! CRI mount covers the path; removed with the container. Real crius, registry and containers.
#![allow(clippy::unwrap_used)]

use crate::common::Env;
use crius_api::v1::*;
use crius_tests::images::{self, volumes, TestImage};
use crius_tests::TestDir;

/// ExecSync `sh -c script`; returns exit code and stdout trimmed.
async fn sh(env: &Env, id: &str, script: &str) -> (i32, String) {
    let out = env.exec(id, &["sh", "-c", script], 10).await.unwrap();
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// Is `path` a mount point of its own in the container?
async fn is_mount(env: &Env, id: &str, path: &str) -> bool {
    let (_, mounts) = sh(env, id, "cat /proc/self/mountinfo").await;
    mounts.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

/// The mount destinations of the container's OCI spec, from the verbose status.
async fn spec_destinations(env: &Env, id: &str) -> Vec<String> {
    let info = env.status_info(id).await;
    info["runtimeSpec"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["destination"].as_str().unwrap().to_string())
        .collect()
}

async fn volumes_env(extra_config: &str) -> (Env, String) {
    let env = Env::with_config(extra_config).await;
    let pushed = images::push(&env.registry, TestImage::Volumes).unwrap();
    env.pull(&pushed.reference).await;
    (env, pushed.reference)
}

#[tokio::test]
async fn declared_volumes_are_per_container_copies_of_the_image() {
    let (mut env, image) = volumes_env("").await;
    let covered = TestDir::new("image-volumes-covered").unwrap();
    std::fs::write(covered.join("marker"), "from the host\n").unwrap();

    let pod_config = env.pod_config("image-volumes", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut ids = Vec::new();
    for name in ["first", "second"] {
        let mut config = env.container_config(name, &["sleep", "3600"]);
        config.image.as_mut().unwrap().image = image.clone();
        config.mounts.push(Mount {
            container_path: "/covered".into(),
            host_path: covered.path().display().to_string(),
            ..Default::default()
        });
        ids.push(env.create_start(&pod, &pod_config, config).await);
    }
    let first = &ids[0];

    // The image's content, owner, mode and links, on a mount of its own.
    for (path, content) in volumes::FILES {
        assert_eq!(
            sh(&env, first, &format!("cat {path}")).await.1,
            content.trim()
        );
    }
    let (_, data) = sh(&env, first, "stat -c '%u:%g %a' /data").await;
    assert_eq!(
        data,
        format!(
            "{}:{} {:o}",
            images::USER_UID,
            images::USER_GID,
            volumes::DATA_MODE
        )
    );
    assert_eq!(
        sh(&env, first, &format!("readlink {}", volumes::LINK.0))
            .await
            .1,
        volumes::LINK.1
    );
    assert!(is_mount(&env, first, "/data").await);
    // Declared but absent from the image: an empty directory of root's.
    assert_eq!(
        sh(&env, first, "stat -c '%u:%g %a' /empty; ls -A /empty")
            .await
            .1,
        "0:0 755"
    );
    assert!(is_mount(&env, first, "/empty").await);
    // A CRI mount at a declared path wins; a declared path that is a file is left alone.
    assert_eq!(
        sh(&env, first, "cat /covered/marker").await.1,
        "from the host"
    );
    assert!(!is_mount(&env, first, "/not-a-dir").await);
    assert_eq!(sh(&env, first, "test -f /not-a-dir").await.0, 0);
    let destinations = spec_destinations(&env, first).await;
    for d in ["/data", "/empty"] {
        assert!(
            destinations.iter().any(|x| x == d),
            "{d} in {destinations:?}"
        );
    }
    assert_eq!(destinations.iter().filter(|d| *d == "/covered").count(), 1);

    // Writable, and each container has its own.
    assert_eq!(
        sh(&env, first, "echo mine > /data/new && cat /data/new")
            .await
            .1,
        "mine"
    );
    assert_eq!(sh(&env, &ids[1], "test -e /data/new").await.0, 1);

    // Removed with the container, and only with it.
    let layer = env.crius.root().join("containers").join(first);
    assert!(layer.join("volumes").is_dir());
    env.stop(first, 0).await;
    env.remove(first).await;
    assert!(!layer.exists(), "{} is left", layer.display());
    assert_eq!(
        sh(&env, &ids[1], "cat /data/seed").await.1,
        volumes::FILES[0].1.trim()
    );
    env.stop(&ids[1], 0).await;
    env.remove(&ids[1]).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn ignore_image_defined_volumes_leaves_them_in_the_rootfs() {
    let (mut env, image) = volumes_env("[runtime]\nignore_image_defined_volumes = true\n").await;
    let pod_config = env.pod_config("image-volumes-off", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut config = env.container_config("c", &["sleep", "3600"]);
    config.image.as_mut().unwrap().image = image;
    let id = env.create_start(&pod, &pod_config, config).await;
    assert!(!is_mount(&env, &id, "/data").await);
    assert_eq!(
        sh(&env, &id, "cat /data/seed").await.1,
        volumes::FILES[0].1.trim()
    );
    assert_eq!(sh(&env, &id, "test -e /empty").await.0, 1);
    assert!(!env
        .crius
        .root()
        .join("containers")
        .join(&id)
        .join("volumes")
        .exists());
    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
