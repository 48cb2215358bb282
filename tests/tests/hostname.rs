//! A pod that names no hostname gets the node's, as with containerd: critest's pod names are
//! longer than the 64 bytes Linux allows a hostname, so the pod name cannot stand in.
#![allow(clippy::unwrap_used)]

mod common;

use common::Env;

#[tokio::test]
async fn pod_without_hostname_gets_the_nodes_even_with_a_long_name() {
    let mut env = Env::with_image(81).await;
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
