//! A working directory the image does not have is made in the container's rootfs (runc does
//! this under containerd), and never outside it.
#![allow(clippy::unwrap_used)]

use crate::common::Env;

#[tokio::test]
async fn a_missing_working_dir_is_made_inside_the_rootfs() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("cwd", false);
    let pod = env.run_pod(config.clone()).await;

    let mut c = env.container_config("deep", &["sleep", "1000"]);
    c.working_dir = "/does/not/exist".into();
    let id = env.create_start(&pod, &config, c).await;
    let out = env.exec(&id, &["pwd"], 10).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "/does/not/exist"
    );
    let out = env
        .exec(&id, &["stat", "-c", "%a %u", "/does/not/exist"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "755 0");
    env.stop(&id, 0).await;
    env.remove(&id).await;

    // `..` cannot climb out of the rootfs: the directory lands inside it.
    let escape = format!("/tmp/crius-cwd-escape-{}", std::process::id());
    let mut c = env.container_config("climber", &["sleep", "1000"]);
    c.working_dir = format!("/../../..{escape}");
    let id = env.create_start(&pod, &config, c).await;
    let out = env.exec(&id, &["pwd"], 10).await.unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .ends_with(&escape),
        "{out:?}"
    );
    assert!(
        !std::path::Path::new(&escape).exists(),
        "{escape} was made on the node"
    );
    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
