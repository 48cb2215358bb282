//! User-namespaced pods and where crius's root and state are: a pod's mapped ids (not root on
//! the host) must be able to traverse every directory above them. crius adds search permission
//! to its root and state and to their parents of its own user (a `mktemp -d` directory is 0700);
//! a parent of another user that blocks them turns user namespaces off, and a pod asking for one
//! is refused with the directory named. Real crius, registry, CNI and containers; run as root.
//! Networks 3 and 4.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::{assert_status, pod_sc, Env};
use crius_api::v1::*;
use tonic::Code;

/// Host id of the pod's root; the pod maps 65536 ids from here.
const HOST_BASE: u32 = 400_000;

fn userns_pod(env: &Env, name: &str) -> PodSandboxConfig {
    let mapping = vec![IdMapping {
        host_id: HOST_BASE,
        container_id: 0,
        length: 65536,
    }];
    let mut config = env.pod_config(name, false);
    pod_sc(&mut config)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(UserNamespace {
        mode: NamespaceMode::Pod as i32,
        uids: mapping.clone(),
        gids: mapping,
    });
    config
}

async fn advertised(env: &Env) -> bool {
    let status = env.runtime_status().await;
    status.runtime_handlers[0]
        .features
        .as_ref()
        .unwrap()
        .user_namespaces
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

/// ExecSync `sh -c script`, asserting success; returns stdout trimmed.
async fn sh(env: &Env, id: &str, script: &str) -> String {
    let out = env.exec(id, &["sh", "-c", script], 10).await.unwrap();
    assert_eq!(
        out.exit_code,
        0,
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn parent_of_another_user_blocks_user_namespaces() {
    let mut env = Env::with_config_under("", "private", 0o700).await;
    let pushed = env.pushed.reference.clone();
    env.image_ref = env.pull(&pushed).await;
    let private = env.crius.dir().join("private");
    let private_str = private.display().to_string();
    // another user's 0700 directory (root passes it, a pod's mapped ids do not)
    std::os::unix::fs::chown(&private, Some(4242), Some(4242)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    env.crius.restart().await.unwrap();

    // not advertised, and the log says which directory is in the way
    assert!(!advertised(&env).await, "user namespaces advertised");
    let log = env.crius.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("user-namespaced")
            && l.contains(&private_str)),
        "no warning naming {private_str}:\n{log}"
    );

    // a pod that asks for one is refused up front, naming the directory, and leaves nothing
    let got = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(userns_pod(&env, "userns-blocked")),
            runtime_handler: String::new(),
        })
        .await;
    assert_status(
        got,
        Code::FailedPrecondition,
        &["userns_options", &private_str],
    );
    let pods = env.list_pods(PodSandboxFilter::default()).await;
    assert!(pods.is_empty(), "pods listed after the refusal: {pods:?}");
    for dir in ["pods", "netns", "userns"] {
        let left: Vec<_> = std::fs::read_dir(env.crius.state().join(dir))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left in state/{dir}: {left:?}");
    }

    // crius did not open up a directory it does not own
    assert_eq!(mode(&private), 0o700, "mode of {private_str}");

    // pods without a user namespace run as before
    let config = env.pod_config("plain", false);
    let pod = env.run_pod(config.clone()).await;
    let id = env
        .create_start(
            &pod,
            &config,
            env.container_config("app", &["sleep", "3600"]),
        )
        .await;
    assert_eq!(sh(&env, &id, "id -u").await, "0");
    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn own_root_state_and_parents_are_made_searchable() {
    // as under `mktemp -d`: a 0700 parent of crius's own user
    let mut env = Env::with_config_under("", "data", 0o700).await;
    let pushed = env.pushed.reference.clone();
    env.image_ref = env.pull(&pushed).await;
    // an admin made crius's own directories private; crius opens them for search only
    let (root, state) = (env.crius.root(), env.crius.state());
    for dir in [&root, &state] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    env.crius.restart().await.unwrap();
    for dir in [&root, &state] {
        assert_eq!(mode(dir), 0o711, "mode of {}", dir.display());
    }
    assert_eq!(mode(&env.crius.dir().join("data")), 0o711);

    assert!(advertised(&env).await, "user namespaces not advertised");
    let config = userns_pod(&env, "userns-own-dirs");
    let pod = env.run_pod(config.clone()).await;
    let id = env
        .create_start(
            &pod,
            &config,
            env.container_config("app", &["sleep", "3600"]),
        )
        .await;
    assert_eq!(
        sh(&env, &id, "id -u; cat /proc/self/uid_map")
            .await
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["0", "0", &HOST_BASE.to_string(), "65536"]
    );

    // a parent closed after the start: the next pod is refused before anything is made
    let data = env.crius.dir().join("data");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let got = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(userns_pod(&env, "userns-closed-later")),
            runtime_handler: String::new(),
        })
        .await;
    // ... and so is the next container of the pod already running
    let created = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(env.container_config("late", &["true"])),
            sandbox_config: Some(config.clone()),
        })
        .await;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_status(
        got,
        Code::FailedPrecondition,
        &["userns_options", &data.display().to_string()],
    );
    assert_status(
        created,
        Code::FailedPrecondition,
        &["user namespace", &data.display().to_string()],
    );
    assert_eq!(env.list_pods(PodSandboxFilter::default()).await.len(), 1);
    assert_eq!(
        env.list_containers(ContainerFilter::default()).await.len(),
        1
    );

    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
