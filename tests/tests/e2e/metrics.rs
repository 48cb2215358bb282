//! ListMetricDescriptors and ListPodSandboxMetrics: the cAdvisor metrics of a running pod and
//! its container, with the labels their descriptors list and values from the container's
//! cgroup; and ImageFsInfo's container filesystems (the writable layers). Real crius, registry,
//! CNI and containers. Network 7.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use crate::common::Env;
use crius_api::v1::*;

/// Descriptors that may have no value here: block I/O accounting, which depends on the disk.
const OPTIONAL: &[&str] = &[
    "container_blkio_device_usage_total",
    "container_fs_reads_bytes_total",
    "container_fs_reads_total",
    "container_fs_writes_bytes_total",
    "container_fs_writes_total",
];

#[tokio::test]
async fn pod_metrics_match_their_descriptors() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("metered", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let mut config = env.container_config("app", &["sleep", "1000"]);
    config.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_shares: 512,
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = env.create_start(&pod, &pod_config, config).await;
    env.exec(&c, &["sh", "-c", "echo data > /tmp/file; sync"], 10)
        .await
        .unwrap();

    let descriptors = env
        .rt()
        .list_metric_descriptors(ListMetricDescriptorsRequest {})
        .await
        .unwrap()
        .into_inner()
        .descriptors;
    let keys: HashMap<String, usize> = descriptors
        .iter()
        .map(|d| (d.name.clone(), d.label_keys.len()))
        .collect();
    assert_eq!(keys.len(), descriptors.len(), "duplicate descriptors");
    assert!(descriptors.iter().all(|d| !d.help.is_empty()));

    let all = env
        .rt()
        .list_pod_sandbox_metrics(ListPodSandboxMetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_metrics;
    let ours = all.iter().find(|p| p.pod_sandbox_id == pod).unwrap();
    let container = ours
        .container_metrics
        .iter()
        .find(|m| m.container_id == c)
        .unwrap();
    let mut seen: HashMap<&str, Vec<&Metric>> = HashMap::new();
    for m in ours.metrics.iter().chain(&container.metrics) {
        assert_eq!(
            Some(&m.label_values.len()),
            keys.get(&m.name),
            "{}: labels {:?}",
            m.name,
            m.label_values
        );
        seen.entry(m.name.as_str()).or_default().push(m);
    }
    let missing: Vec<&str> = keys
        .keys()
        .map(String::as_str)
        .filter(|n| !seen.contains_key(n) && !OPTIONAL.contains(n))
        .collect();
    assert!(missing.is_empty(), "no value for {missing:?}");

    let value = |name: &str| seen[name][0].value.unwrap().value;
    assert_eq!(value("container_spec_memory_limit_bytes"), 64 << 20);
    assert_eq!(value("container_spec_cpu_shares"), 512);
    assert!(value("container_processes") >= 1);
    assert!(value("container_memory_usage_bytes") > 0);
    assert!(
        value("container_fs_usage_bytes") > 0,
        "the file the exec wrote"
    );
    let label = &seen["container_network_receive_bytes_total"][0].label_values;
    assert_eq!(label.last().unwrap(), "eth0");
    assert_eq!(seen["container_memory_rss"][0].label_values[1], c);

    // ImageFsInfo's container filesystems: the writable layers, on the image store's disk.
    env.exec(
        &c,
        &["dd", "if=/dev/zero", "of=/big", "bs=1024", "count=512"],
        10,
    )
    .await
    .unwrap();
    let fs = env
        .crius
        .image()
        .image_fs_info(ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let layers = &fs.container_filesystems[0];
    assert!(layers.used_bytes.unwrap().value >= 512 << 10, "{layers:?}");
    assert_eq!(layers.fs_id, fs.image_filesystems[0].fs_id);

    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
