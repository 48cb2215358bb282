//! A pod that names no hostname gets the node's, as with containerd: critest's pod names are
//! longer than the 64 bytes Linux allows a hostname, so the pod name cannot stand in. A pod on
//! the node's network has the node's hostname and cannot name another.
#![allow(clippy::unwrap_used)]

use crate::common::{assert_status, Env};
use crius_api::v1::{PodSandboxFilter, RunPodSandboxRequest};
use tonic::Code;

#[tokio::test]
async fn pod_without_hostname_gets_the_nodes_even_with_a_long_name() {
    let mut env = Env::with_image().await;
    let long_name = format!("pod-with-a-rather-long-name-{}", "x".repeat(60));
    let pod_config = env.pod_config(&long_name, false);
    assert!(pod_config.hostname.is_empty());
    let pod = env.run_pod(pod_config.clone()).await;
    let config = env.container_config("sleeper", &["sleep", "3600"]);
    let id = env.create_start(&pod, &pod_config, config).await;
    let out = env.exec(&id, &["cat", "/etc/hostname"], 10).await.unwrap();
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), node.trim());
    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn host_network_pod_cannot_name_its_own_hostname() {
    let env = Env::new().await;
    let mut config = env.pod_config("hostnet-named", true);
    config.hostname = "not-the-node".into();
    let refused = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await;
    assert_status(
        refused,
        Code::InvalidArgument,
        &["config.hostname", "not-the-node", "host network"],
    );
    assert!(env.list_pods(PodSandboxFilter::default()).await.is_empty());

    // The node's own name is what kubelet would mean: accepted.
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    config.hostname = node.trim().to_string();
    let mut env = env;
    let pod = env.run_pod(config).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
