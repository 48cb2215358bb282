//! gRPC clients other than the ones crius was built against can talk to it.
//!
//! Python's grpcio (1.57 and later) sends the socket's path as the HTTP/2 `:authority`; before
//! crius rewrote such authorities (runtime/src/authority.rs) every one of its calls was reset
//! with PROTOCOL_ERROR. The tonic client here sends authorities that are odd but parse (a file
//! name with a port, an IPv6 literal, a bare word), as other clients do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::Env;
use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

/// The Python of the virtual environment `.ci/install-python-deps` makes (`make test` runs it),
/// or `CRIUS_TEST_PYTHON`.
fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("CRIUS_TEST_PYTHON") {
        return PathBuf::from(path);
    }
    let python = crius_tests::repo_dir().join("target/test-venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run .ci/install-python-deps (make test does)",
        python.display()
    );
    python
}

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Runs tests/python/cri_client.py against `env`'s crius; returns what it printed.
fn python_client(env: &Env, authority: Option<&str>, pod: &str) -> serde_json::Value {
    let log_dir = env.log_dir(pod);
    let proto = workspace().join("proto");
    let socket = env.crius.socket();
    python_script(
        "cri_client.py",
        &[
            proto.as_os_str(),
            socket.as_os_str(),
            authority.unwrap_or("-").as_ref(),
            pod.as_ref(),
            log_dir.as_os_str(),
        ],
    )
}

/// Runs `tests/python/<script>` with `args`; returns the JSON it printed.
fn python_script(script: &str, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(workspace().join("tests/python").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} printed {:?}: {e}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test]
async fn python_grpcio_with_the_socket_path_as_authority() {
    let env = Env::new().await;
    let socket = env.crius.socket().display().to_string();
    // grpcio's own choice for a unix target, then the path set explicitly, as grpc-java and
    // older grpc-go clients send it.
    for (authority, pod) in [(None, "py-default"), (Some(socket.as_str()), "py-path")] {
        let seen = python_client(&env, authority, pod);
        let ctx = format!("authority {authority:?}: {seen}");
        assert_eq!(seen["version"], "crius", "{ctx}");
        let id = seen["run_pod_sandbox"]
            .as_str()
            .unwrap_or_else(|| panic!("{ctx}"));
        assert_eq!(seen["list_containers"], 0, "{ctx}");
        assert_eq!(seen["list_pods"], serde_json::json!([id]), "{ctx}");
        assert_eq!(seen["stop_pod_sandbox"], true, "{ctx}");
        assert_eq!(seen["remove_pod_sandbox"], true, "{ctx}");
    }
    env.assert_no_leaks().await;
}

/// A tonic channel to `socket` whose requests carry `authority`.
async fn channel_with_authority(socket: &Path, authority: &str) -> tonic::transport::Channel {
    let path = socket.to_path_buf();
    Endpoint::from_shared(format!("http://{authority}"))
        .unwrap_or_else(|e| panic!("endpoint with authority {authority}: {e}"))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .unwrap_or_else(|e| panic!("connect with authority {authority}: {e}"))
}

#[tokio::test]
async fn tonic_with_odd_authorities() {
    let mut env = Env::new().await;
    let socket = env.crius.socket();
    // tonic (like the http crate under it) cannot send an authority that does not parse, not
    // even a percent-encoded path; these are the odd ones it can.
    for (i, authority) in ["crius.sock:0", "[::1]:1", "unix", "localhost"]
        .into_iter()
        .enumerate()
    {
        let mut rt = RuntimeServiceClient::new(channel_with_authority(&socket, authority).await);
        let version = rt
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
            .unwrap_or_else(|s| panic!("Version with authority {authority}: {s:?}"))
            .into_inner();
        assert_eq!(version.runtime_name, "crius");
        let config = env.pod_config(&format!("tonic-{i}"), false);
        let pod = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("RunPodSandbox with authority {authority}: {s:?}"))
            .into_inner()
            .pod_sandbox_id;
        env.pods.push(pod.clone());
        let listed = rt
            .list_containers(ListContainersRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListContainers with authority {authority}: {s:?}"))
            .into_inner();
        assert!(listed.containers.is_empty());
        env.stop_pod(&pod).await;
        env.remove_pod(&pod).await;
    }
    env.assert_no_leaks().await;
}

/// `grpc.health.v1.Health` on the CRI socket: the server and both CRI services serve; an
/// unknown service is NotFound. (Two worker threads: crius's graceful stop waits for the
/// client to answer its GOAWAY ping, which a blocked single-threaded test runtime never does.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_service_on_the_cri_socket() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let crius = crius_tests::crius::Crius::start("").await.unwrap();
    let mut health = HealthClient::new(crius_tests::crius::connect(&crius.socket()).await.unwrap());
    for service in ["", "runtime.v1.RuntimeService", "runtime.v1.ImageService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("Check {service:?}: {s:?}"))
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

/// Requests whose bytes do not decode (a client with a broken or mismatched message
/// definition) are the client's error: InvalidArgument naming the message and the field, not
/// the Internal that tonic (like grpc-go) answers by default. Nothing is created, and the
/// next good call is served.
#[tokio::test]
async fn requests_that_do_not_decode_are_invalid_argument_naming_the_field() {
    let env = Env::new().await;
    let socket = env.crius.socket();
    let seen = python_script("malformed_requests.py", &[socket.as_os_str()]);
    let expect = [
        (
            "run_pod_sandbox_name_not_utf8",
            "RunPodSandboxRequest does not decode: PodSandboxMetadata.name: \
             PodSandboxConfig.metadata: RunPodSandboxRequest.config: invalid string value",
        ),
        (
            "run_pod_sandbox_truncated",
            "RunPodSandboxRequest does not decode: RunPodSandboxRequest.config: buffer underflow",
        ),
        (
            "container_status_garbage",
            "ContainerStatusRequest does not decode: invalid varint",
        ),
        (
            "image_status_not_utf8",
            "ImageStatusRequest does not decode: ImageSpec.image: ImageStatusRequest.image: \
             invalid string value",
        ),
    ];
    for (case, message) in expect {
        assert_eq!(seen[case][0], "INVALID_ARGUMENT", "{case}: {seen}");
        let details = seen[case][1].as_str().unwrap_or_default();
        assert!(details.starts_with(message), "{case}: {details:?}");
    }
    assert_eq!(seen["version_unknown_field"], "OK", "{seen}");
    let pods = env.list_pods(PodSandboxFilter::default()).await;
    assert!(pods.is_empty(), "{pods:?}");
    env.assert_no_leaks().await;
}
