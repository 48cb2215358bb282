//! The Prometheus endpoint (`[metrics] address`): scraped over HTTP through a pod's whole
//! lifecycle, its figures checked against what happened (calls, their outcomes, pods and
//! containers by state, the shim and its memory, CNI operations, pulls, an OOM kill), and
//! containerd's names with `namespace = "containerd"`. Real crius, registry, CNI and
//! containers. Network 37–38.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use crate::common;
use crate::common::Env;
use crius_api::v1::*;

/// The port crius's metrics endpoint took (port 0 in the config: no two tests race for one),
/// from its log line `metrics endpoint listening url=http://127.0.0.1:<port>/metrics`.
async fn metrics_port(env: &Env) -> u16 {
    common::wait_for("the metrics endpoint", Duration::from_secs(10), || async {
        let log = env.crius.log();
        let rest = log
            .split("metrics endpoint listening url=http://127.0.0.1:")
            .nth(1)?;
        rest.split('/').next()?.parse().ok()
    })
    .await
}

/// `GET path` on 127.0.0.1:`port`: the status line and the body.
fn get(port: u16, path: &str) -> (String, String) {
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(tcp, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// One scrape: every sample as `name{labels}` → value.
fn scrape(port: u16) -> HashMap<String, f64> {
    let (status, body) = get(port, "/metrics");
    assert!(status.contains("200"), "{status}\n{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap();
            (key.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// The value of `key`, 0 when absent.
fn value(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_pod_lifecycle() {
    let port = crius_tests::free_port().unwrap();
    let mut env = Env::with_config(&format!("[metrics]\naddress = \"127.0.0.1:{port}\"\n")).await;
    let m = scrape(port);
    assert_eq!(value(&m, r#"crius_pods{state="ready"}"#), 0.0);
    assert_eq!(value(&m, "crius_shims"), 0.0);
    assert!(value(&m, "crius_resident_memory_bytes") > 1e6, "{m:?}");
    assert!(value(&m, "crius_database_size_bytes") > 0.0, "{m:?}");
    assert_eq!(value(&m, "crius_cri_in_progress_image_pulls"), 0.0);

    env.pull(&env.image.clone()).await;
    let mut rt = env.rt();
    let missing = rt
        .container_status(ContainerStatusRequest {
            container_id: "no-such-container".into(),
            verbose: false,
        })
        .await;
    assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound);
    let pod_config = env.pod_config("scraped", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let app = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("app", &["sleep", "1000"]),
        )
        .await;
    let hog = env
        .create_start(&pod, &pod_config, env.memory_hog_config("hog"))
        .await;
    let s = env.wait_exited(&hog, Duration::from_secs(60)).await;
    assert_eq!(s.reason, "OOMKilled", "{s:?}");

    let m = scrape(port);
    let ok = |method: &str| {
        format!(
            r#"crius_grpc_server_handled_total{{grpc_service="runtime.v1.RuntimeService",grpc_method="{method}",grpc_code="OK"}}"#
        )
    };
    assert_eq!(value(&m, &ok("RunPodSandbox")), 1.0, "{m:?}");
    assert_eq!(value(&m, &ok("StartContainer")), 2.0, "{m:?}");
    assert_eq!(
        value(
            &m,
            r#"crius_grpc_server_handled_total{grpc_service="runtime.v1.RuntimeService",grpc_method="ContainerStatus",grpc_code="NotFound"}"#
        ),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        value(
            &m,
            r#"crius_grpc_server_handled_total{grpc_service="runtime.v1.ImageService",grpc_method="PullImage",grpc_code="OK"}"#
        ),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        value(
            &m,
            r#"crius_grpc_server_handling_seconds_count{grpc_service="runtime.v1.RuntimeService",grpc_method="RunPodSandbox"}"#
        ),
        1.0
    );
    assert_eq!(value(&m, r#"crius_pods{state="ready"}"#), 1.0, "{m:?}");
    assert_eq!(value(&m, r#"crius_containers{state="running"}"#), 1.0);
    assert_eq!(value(&m, r#"crius_containers{state="exited"}"#), 1.0);
    assert_eq!(value(&m, "crius_shims"), 1.0);
    let shim_rss = value(&m, "crius_shim_resident_memory_bytes");
    assert!(shim_rss > 100e3 && shim_rss < 16e6, "{shim_rss}");
    assert_eq!(value(&m, "crius_container_oom_kills_total"), 1.0, "{m:?}");
    assert_eq!(
        value(
            &m,
            r#"crius_cri_sandbox_runtime_create_seconds_count{runtime="crius"}"#
        ),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        value(
            &m,
            r#"crius_cri_container_start_seconds_count{runtime="crius"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &m,
            r#"crius_cri_container_create_seconds_count{runtime="crius"}"#
        ),
        2.0
    );
    assert_eq!(
        value(&m, "crius_cri_sandbox_create_network_seconds_count"),
        1.0
    );
    assert_eq!(
        value(
            &m,
            r#"crius_cri_network_plugin_operations_total{operation_type="set_up_pod"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&m, r#"crius_cri_image_pulls_total{status="success"}"#),
        1.0
    );
    assert!(value(&m, "crius_image_pull_bytes_total") > 0.0, "{m:?}");
    assert!(value(&m, "crius_cri_image_pulling_throughput_mibps_count") >= 1.0);

    env.stop(&app, 0).await;
    env.remove(&app).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let m = scrape(port);
    assert_eq!(value(&m, r#"crius_pods{state="ready"}"#), 0.0);
    assert_eq!(value(&m, "crius_shims"), 0.0);
    assert_eq!(
        value(
            &m,
            r#"crius_cri_container_stop_seconds_count{runtime="crius"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            r#"crius_cri_sandbox_runtime_stop_seconds_count{runtime="crius"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            r#"crius_cri_sandbox_remove_seconds_count{runtime="crius"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            r#"crius_cri_network_plugin_operations_total{operation_type="tear_down_pod"}"#
        ),
        1.0,
        "{m:?}"
    );
    let (status, _) = get(port, "/other");
    assert!(status.contains("404"), "{status}");
    env.assert_no_leaks().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_names_with_its_namespace() {
    let mut env =
        Env::with_config("[metrics]\naddress = \"127.0.0.1:0\"\nnamespace = \"containerd\"\n")
            .await;
    let port = metrics_port(&env).await;
    let pod = env.run_pod(env.pod_config("named", false)).await;
    let m = scrape(port);
    assert_eq!(
        value(
            &m,
            r#"containerd_cri_sandbox_runtime_create_seconds_count{runtime="crius"}"#
        ),
        1.0,
        "{m:?}"
    );
    assert!(!m.keys().any(|k| k.starts_with("crius_")), "{m:?}");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}
