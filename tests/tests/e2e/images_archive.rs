//! `crius images import` and `crius images export` through a real crius's admin socket: an OCI
//! layout and a `docker save` archive built by the fixtures are imported under names whose
//! registry does not exist (`airgap.invalid`) and run containers; an export of pulled images
//! (one chosen from a multi-platform index) imported back after their removal gives the same
//! image ids and runs; broken archives and unknown images fail with a message and leave
//! nothing. Networks 100 and 101.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::{read_log, texts, Env};
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use crius_tests::{archive, TestDir};

/// `crius images --admin-socket <env's> ARGS…`, with `stdin` fed in when given.
fn crius_images(env: &Env, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let socket = env.crius.state().join("admin.sock");
    let mut child = Command::new(crius_tests::binary("crius").unwrap())
        .arg("images")
        .arg("--admin-socket")
        .arg(&socket)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(data).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "crius images failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `cmd` in a new pod from `image` and returns its stdout lines once it exited 0.
async fn run(env: &mut Env, pod: &str, image: &str, cmd: &[&str]) -> Vec<String> {
    let pod_config = env.pod_config(pod, true);
    let pod_id = env.run_pod(pod_config.clone()).await;
    let mut config = env.container_config("c", cmd);
    config.image = Some(ImageSpec {
        image: image.into(),
        ..Default::default()
    });
    let id = env.create_start(&pod_id, &pod_config, config).await;
    let status = env.wait_exited(&id, Duration::from_secs(30)).await;
    assert_eq!(status.exit_code, 0, "{status:?}");
    let lines = read_log(&env.log_dir(pod).join("c.log"));
    env.stop_pod(&pod_id).await;
    env.remove_pod(&pod_id).await;
    texts(&lines, "stdout")
}

async fn image_ids(env: &Env) -> Vec<(String, Vec<String>)> {
    let mut images: Vec<_> = env
        .crius
        .image()
        .list_images(ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images
        .into_iter()
        .map(|i| (i.id, i.repo_tags))
        .collect();
    images.sort();
    images
}

async fn remove(env: &Env, image: &str) {
    env.crius
        .image()
        .remove_image(RemoveImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
}

fn write(dir: &TestDir, name: &str, data: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_archives_run_without_a_registry() {
    let mut env = Env::new().await;
    let dir = TestDir::new("archives").unwrap();
    let busybox = images::build(TestImage::Busybox).unwrap();
    let multi = images::build(TestImage::MultiLayer).unwrap();
    let user = images::build(TestImage::User).unwrap();

    // An OCI layout with two images, from a file.
    let (layout, manifests) = archive::oci_layout(&[
        (&busybox, "airgap.invalid/crius/busybox:v1"),
        (&multi, "airgap.invalid/crius/multi:v1"),
    ])
    .unwrap();
    let file = write(&dir, "layout.tar", &layout);
    let out = ok(&crius_images(&env, &["import", s(&file)], None));
    assert!(
        out.contains(&format!(
            "imported {} airgap.invalid/crius/busybox:v1\n",
            busybox.config_digest
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "imported {} airgap.invalid/crius/multi:v1\n",
            multi.config_digest
        )),
        "{out}"
    );
    assert!(out.contains("2 images, "), "{out}");
    let status = env
        .image_status("airgap.invalid/crius/busybox:v1")
        .await
        .unwrap();
    assert_eq!(status.id, busybox.config_digest);
    assert_eq!(
        status.repo_digests,
        vec![format!("airgap.invalid/crius/busybox@{}", manifests[0])]
    );

    // A docker save archive, gzip-compressed, from stdin.
    let saved =
        archive::docker_save(&[(&user, &["airgap.invalid/crius/user:v1", "user:v1"])]).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&saved).unwrap();
    let out = ok(&crius_images(
        &env,
        &["import", "-"],
        Some(&gz.finish().unwrap()),
    ));
    assert_eq!(
        out.lines().next().unwrap(),
        format!(
            "imported {} airgap.invalid/crius/user:v1 docker.io/library/user:v1",
            user.config_digest
        )
    );

    // The names' registry does not exist: these run from what was imported alone.
    let lines = run(
        &mut env,
        "airgap-busybox",
        "airgap.invalid/crius/busybox:v1",
        &["sh", "-c", "echo $CRIUS_TEST_IMAGE"],
    )
    .await;
    assert_eq!(lines, vec!["busybox"]);
    let (path, content) = images::multi_layer::FILES[1];
    let lines = run(
        &mut env,
        "airgap-multi",
        "airgap.invalid/crius/multi:v1",
        &["cat", path],
    )
    .await;
    assert_eq!(lines, vec![content.trim_end()]);
    let lines = run(&mut env, "airgap-user", "user:v1", &["id", "-u"]).await;
    assert_eq!(lines, vec![images::USER_UID.to_string()]);

    // Broken archives: an error naming the problem, exit 1, no image.
    let before = image_ids(&env).await;
    let mut corrupt = layout.clone();
    let at = corrupt.len() / 2;
    corrupt[at] ^= 0xff;
    let file = write(&dir, "corrupt.tar", &corrupt);
    let err = failed(&crius_images(&env, &["import", s(&file)], None));
    assert!(err.contains("crius: import "), "{err}");
    assert!(
        err.contains("is corrupt") || err.contains("failed verification"),
        "{err}"
    );
    let file = write(&dir, "short.tar", &layout[..layout.len() / 3]);
    let err = failed(&crius_images(&env, &["import", s(&file)], None));
    assert!(err.contains("cut short"), "{err}");
    let err = failed(&crius_images(&env, &["import", "/nonexistent.tar"], None));
    assert!(err.contains("open /nonexistent.tar"), "{err}");
    assert_eq!(image_ids(&env).await, before);
    assert!(
        std::fs::read_dir(env.crius.root().join("content/ingest"))
            .unwrap()
            .next()
            .is_none(),
        "ingest left behind"
    );
    env.assert_no_leaks().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_gives_the_same_images() {
    let mut env = Env::with_image().await;
    let index = images::push_index(&env.registry).unwrap();
    let index_id = env.pull(&index.reference).await;
    assert_eq!(index_id, index.for_host().config_digest);
    let before = image_ids(&env).await;
    let dir = TestDir::new("exports").unwrap();
    let file = dir.join("images.tar");

    let out = crius_images(
        &env,
        &["export", &env.image, &index.reference, "-o", s(&file)],
        None,
    );
    ok(&out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.starts_with("exported 2 images ("), "{said}");
    for (id, tags) in &before {
        remove(&env, id).await;
        assert!(env.image_status(&tags[0]).await.is_none());
    }

    let out = ok(&crius_images(&env, &["import", s(&file)], None));
    assert!(out.contains("2 images, "), "{out}");
    assert_eq!(
        image_ids(&env).await,
        before,
        "ids and tags after the round trip"
    );
    let lines = run(
        &mut env,
        "exported",
        &index.reference,
        &["cat", images::PLATFORM_FILE],
    )
    .await;
    assert_eq!(lines, vec![format!("linux/{}", images::host_arch())]);

    // To stdout and back from stdin: the same images again.
    let out = crius_images(&env, &["export", &index.reference, "-o", "-"], None);
    let piped = out.stdout.clone();
    ok(&out);
    assert!(piped.len() > 1024, "{} bytes exported", piped.len());
    remove(&env, &index.reference).await;
    let out = ok(&crius_images(&env, &["import", "-"], Some(&piped)));
    assert!(out.starts_with(&format!("imported {index_id} ")), "{out}");

    // Root only: another user cannot use the admin socket.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(crius_tests::binary("crius").unwrap())
        .args(["images", "--admin-socket"])
        .arg(env.crius.state().join("admin.sock"))
        .arg("pulls")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");

    // Every name must resolve, or nothing is written.
    let missing = dir.join("missing.tar");
    let err = failed(&crius_images(
        &env,
        &["export", &env.image, "no/such:image", "-o", s(&missing)],
        None,
    ));
    assert!(err.contains("image \"no/such:image\" not found"), "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "files left"
    );
    env.assert_no_leaks().await;
}
