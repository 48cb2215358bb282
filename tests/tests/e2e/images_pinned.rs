//! `[images] pinned`: images whose reference matches a pattern are reported pinned by
//! ImageStatus and ListImages (kubelet's image garbage collection then keeps them) and
//! RemoveImage refuses them; other images are not; SIGHUP applies a new list. Network 59.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::{wait_for, Env};
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use tonic::Code;

async fn pinned(env: &Env, image: &str) -> bool {
    env.image_status(image).await.unwrap().pinned
}

async fn remove(env: &Env, image: &str) -> Result<(), tonic::Status> {
    env.crius
        .image()
        .remove_image(RemoveImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_images_are_kept() {
    let config = "[images]\npinned = [\"*/crius-test/busybox:*\"]\n";
    let env = Env::with_config(config).await;
    let busybox = env.image.clone();
    let other = images::push(&env.registry, TestImage::User)
        .unwrap()
        .reference;
    assert!(!other.contains("crius-test/busybox:"), "{other}");
    env.pull(&busybox).await;
    env.pull(&other).await;

    assert!(pinned(&env, &busybox).await);
    assert!(!pinned(&env, &other).await);
    let listed = env
        .crius
        .image()
        .list_images(ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    for image in &listed {
        let is_busybox = image.repo_tags.contains(&busybox);
        assert_eq!(image.pinned, is_busybox, "{image:?}");
    }

    let refused = remove(&env, &busybox).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("pinned"), "{refused:?}");
    remove(&env, &other).await.unwrap();

    // No pattern after a SIGHUP: nothing pinned, the image goes.
    let path = env.crius.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(config, "[images]\npinned = []\n")).unwrap();
    let pid = nix::unistd::Pid::from_raw(env.crius.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for("SIGHUP to unpin", Duration::from_secs(10), || async {
        (!pinned(&env, &busybox).await).then_some(())
    })
    .await;
    remove(&env, &busybox).await.unwrap();
}
