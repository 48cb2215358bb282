//! `crius images import --from-containerd`: a real containerd on its own socket and root, with
//! images `ctr` pulled into its `k8s.io` namespace from the local registry (one from a
//! multi-platform index, one under two names), is copied into crius through containerd's API:
//! same image ids, names and index digest, and the images run containers. An empty namespace
//! and an unreachable containerd fail with a message. Network 102.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use crate::common::{read_log, texts, Env};
use crius_api::v1::*;
use crius_tests::containerd::Containerd;
use crius_tests::images::{self, TestImage};

fn crius_images(env: &Env, args: &[&str]) -> Output {
    Command::new(crius_tests::binary("crius").unwrap())
        .arg("images")
        .arg("--admin-socket")
        .arg(env.crius.state().join("admin.sock"))
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_move_from_containerd() {
    let mut env = Env::new().await;
    let index = images::push_index(&env.registry).unwrap();
    let user = images::push(&env.registry, TestImage::User).unwrap();
    let containerd = Containerd::start().unwrap();
    for image in [&env.image, &index.reference, &user.reference] {
        containerd
            .ctr_ok(&["-n", "k8s.io", "images", "pull", "--plain-http", image])
            .unwrap();
    }
    let second_name = env.image.replace(":latest", ":second");
    containerd
        .ctr_ok(&["-n", "k8s.io", "images", "tag", &env.image, &second_name])
        .unwrap();
    // Another namespace's image is not copied.
    containerd
        .ctr_ok(&["-n", "other", "images", "pull", "--plain-http", &env.image])
        .unwrap();

    let out = crius_images(
        &env,
        &[
            "import",
            "--from-containerd",
            containerd.socket().to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 images, "), "{stdout}");

    let busybox = env.image_status(&env.image).await.unwrap();
    assert_eq!(busybox.id, env.pushed.config_digest);
    let mut tags = busybox.repo_tags.clone();
    tags.sort();
    assert_eq!(tags, vec![env.image.clone(), second_name.clone()]);
    let multi = env.image_status(&index.reference).await.unwrap();
    assert_eq!(multi.id, index.for_host().config_digest);
    assert_eq!(multi.repo_digests, vec![index.digest_reference.clone()]);
    let user_status = env.image_status(&user.reference).await.unwrap();
    assert_eq!(user_status.id, user.config_digest);
    assert_eq!(user_status.uid, Some(Int64Value { value: 1000 }));

    // They run, from what was copied.
    let pod_config = env.pod_config("migrated", true);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut config = env.container_config("c", &["cat", images::PLATFORM_FILE]);
    config.image = Some(ImageSpec {
        image: index.reference.clone(),
        ..Default::default()
    });
    let id = env.create_start(&pod, &pod_config, config).await;
    let status = env.wait_exited(&id, Duration::from_secs(30)).await;
    assert_eq!(status.exit_code, 0, "{status:?}");
    let lines = read_log(&env.log_dir("migrated").join("c.log"));
    assert_eq!(
        texts(&lines, "stdout"),
        vec![format!("linux/{}", images::host_arch())]
    );
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;

    // Nothing to copy, or no containerd: exit 1 with the reason.
    let out = crius_images(
        &env,
        &[
            "import",
            "--from-containerd",
            containerd.socket().to_str().unwrap(),
            "--namespace",
            "empty",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no image to copy in containerd's namespace empty"),
        "{err}"
    );
    let gone = containerd.root().join("no.sock");
    let out = crius_images(
        &env,
        &["import", "--from-containerd", gone.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connect to containerd at"), "{err}");
    env.assert_no_leaks().await;
}
