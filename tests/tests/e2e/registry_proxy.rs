//! A crius started with `HTTP_PROXY` in its environment (as the systemd unit's `Environment=`
//! sets it) pulls through that proxy: Debian's tinyproxy logs the manifest and blob requests as
//! forward-proxy requests; with `NO_PROXY` naming the registry it goes direct. No pods, no
//! network.
#![allow(clippy::unwrap_used)]

use crius_api::v1::{ImageSpec, PullImageRequest};
use crius_tests::crius::Crius;
use crius_tests::images::{self, TestImage};
use crius_tests::proxy::TinyProxy;
use crius_tests::registry::Registry;

async fn pull(crius: &Crius, image: &str) -> String {
    crius
        .image()
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .image_ref
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_go_through_the_environments_proxy() {
    let registry = Registry::start().unwrap();
    let pushed = images::push(&registry, TestImage::Busybox).unwrap();
    let proxy = TinyProxy::start().unwrap();

    let crius = Crius::start_with_env("", &[("HTTP_PROXY", &proxy.url())])
        .await
        .unwrap();
    assert_eq!(pull(&crius, &pushed.reference).await, pushed.config_digest);
    let seen = proxy.requests();
    let manifest = format!(
        "GET http://{}/v2/{}/manifests/latest ",
        registry.host_port(),
        pushed.repository
    );
    assert!(seen.iter().any(|r| r.starts_with(&manifest)), "{seen:?}");
    let layer = format!(
        "GET http://{}/v2/{}/blobs/{}",
        registry.host_port(),
        pushed.repository,
        pushed.layers[0].digest
    );
    assert!(seen.iter().any(|r| r.starts_with(&layer)), "{seen:?}");
    drop(crius);

    // NO_PROXY names the registry's address: straight to it.
    let before = proxy.requests().len();
    let crius = Crius::start_with_env(
        "",
        &[("HTTP_PROXY", &proxy.url()), ("NO_PROXY", "127.0.0.1")],
    )
    .await
    .unwrap();
    assert_eq!(pull(&crius, &pushed.reference).await, pushed.config_digest);
    assert_eq!(proxy.requests().len(), before, "{:?}", proxy.requests());
}
