//! The CRI gRPC services. One file per group of RPCs (`sandbox.rs`, `container.rs`,
//! `container_update.rs`, `image.rs`, `streaming.rs`, `stats.rs`, `status.rs`, `version.rs`,
//! `runtime_config.rs`), each RPC a thin handler `async fn(&Arc<Daemon>, Request) ->
//! Result<Response>`; this module routes every RPC through [`instrument`], the single place that
//! opens the span, logs the call and its result, and maps errors to gRPC statuses.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crius_api::v1::image_service_server::ImageService;
use crius_api::v1::runtime_service_server::RuntimeService;
use crius_api::v1::*;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::daemon::Daemon;
use crate::error::{self, Error};

mod container;
mod container_checkpoint;
mod container_update;
mod events;
mod ids;
mod image;
mod metrics;
mod pod_checkpoint;
mod runtime_config;
pub(crate) mod sandbox;
mod stats;
mod status;
mod streaming;
mod version;

pub use ids::Ids;

/// The server-streaming response type of the `Stream*` and `GetContainerEvents` RPCs.
pub use tonic::codegen::BoxStream;

/// Both CRI services over one daemon.
#[derive(Clone)]
pub struct CriService {
    daemon: Arc<Daemon>,
}

impl CriService {
    pub fn new(daemon: Arc<Daemon>) -> CriService {
        CriService { daemon }
    }
}

/// Calls that kubelet makes every few seconds: logged at debug so they do not drown the rest.
fn is_poll(method: &str) -> bool {
    method.starts_with("List")
        || method.starts_with("Stream")
        || method.ends_with("Status")
        || method.ends_with("Stats")
        || matches!(
            method,
            "Version" | "ImageFsInfo" | "RuntimeConfig" | "ListMetricDescriptors"
        )
}

/// The calls that change nothing crius keeps (status, lists, stats, probes, streaming URLs,
/// the event stream): they run on the reads lane, every other call and what it leaves running
/// on the writes lane (`lanes`). A call added to the CRI is a write until it is named here.
fn reads_only(method: &str) -> bool {
    is_poll(method)
        || matches!(
            method,
            "ExecSync" | "Exec" | "Attach" | "PortForward" | "GetContainerEvents"
        )
}

/// RPC handlers running now, those that go on after their client's deadline included.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// How many RPC handlers are running now (the start-up page release waits for none).
pub fn handlers_running() -> usize {
    RUNNING.load(Ordering::Relaxed)
}

/// Counts one handler in [`RUNNING`] for as long as it lives.
struct Running;

impl Running {
    fn start() -> Running {
        RUNNING.fetch_add(1, Ordering::Relaxed);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs one RPC: a span with the method and the ids in the request, a log line with the
/// outcome and duration, and the error mapped to a status by [`error::to_status`].
///
/// The handler runs as its own task, so a client that goes away (or whose deadline passes)
/// never cuts an operation off half-way: a RunPodSandbox or CreateContainer always finishes or
/// undoes itself. The client's deadline (`grpc-timeout`) is answered with DeadlineExceeded
/// just before it passes, while the operation completes in the background; tonic would
/// otherwise answer Cancelled when the deadline passes, which is not what CRI clients expect.
pub async fn instrument<Req, Resp, Fut>(
    method: &'static str,
    request: Request<Req>,
    handler: impl FnOnce(Req) -> Fut,
) -> Result<Response<Resp>, Status>
where
    Req: Ids,
    Resp: Send + 'static,
    Fut: Future<Output = error::Result<Resp>> + Send + 'static,
{
    let deadline = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map(answer_before);
    let request = request.into_inner();
    let ids = request.ids();
    let span = tracing::info_span!("rpc", method, id = %ids);
    let start = Instant::now();
    let answer_by = deadline.map(|limit| start + limit);
    let running = Running::start();
    let handled = ANSWER_BY.scope(answer_by, handler(request));
    let handled = async move {
        let _running = running;
        handled.await
    }
    .instrument(span.clone());
    let task = if reads_only(method) {
        tokio::spawn(handled)
    } else {
        crate::lanes::spawn_write(handled)
    };
    let mut task = AbortOnDrop {
        task,
        abort: ends_with_its_client(method),
    };
    let joined = match deadline {
        Some(limit) => match tokio::time::timeout(limit, &mut task.task).await {
            Ok(joined) => joined,
            Err(_) if task.abort => {
                task.task.abort();
                Ok(Err(Error::DeadlineExceeded(format!(
                    "{method}: the client's deadline of {limit:?} passed; the command was killed"
                ))))
            }
            Err(_) => Ok(Err(Error::DeadlineExceeded(format!(
                "{method}: the client's deadline of {limit:?} passed; the operation goes on \
                 and completes or undoes itself"
            )))),
        },
        None => (&mut task.task).await,
    };
    let result = joined.unwrap_or_else(|e| Err(Error::internal(format!("{method} handler"), e)));
    let _enter = span.enter();
    let elapsed = start.elapsed();
    let elapsed_ms = elapsed.as_secs_f64() * 1e3;
    let metrics = crate::telemetry::metrics();
    match result {
        Ok(resp) => {
            metrics.rpc(method, code_name(tonic::Code::Ok), elapsed);
            if is_poll(method) {
                tracing::debug!(elapsed_ms, "ok");
            } else {
                tracing::info!(elapsed_ms, "ok");
            }
            Ok(Response::new(resp))
        }
        Err(err) => {
            let status = error::to_status(&err);
            metrics.rpc(method, code_name(status.code()), elapsed);
            match err {
                Error::Internal { .. } => {
                    tracing::error!(elapsed_ms, code = ?status.code(), "{}", status.message())
                }
                Error::Unimplemented(_) => {
                    tracing::debug!(elapsed_ms, code = ?status.code(), "{}", status.message())
                }
                _ => tracing::warn!(elapsed_ms, code = ?status.code(), "{}", status.message()),
            }
            Err(status)
        }
    }
}

tokio::task_local! {
    /// When [`instrument`] answers DeadlineExceeded if the handler has not answered yet
    /// (`None`: the client set no deadline).
    static ANSWER_BY: Option<Instant>;
}

/// For a handler that must finish (or undo itself) within its client's deadline, as
/// CheckpointPod and RestorePod must: the moment its answer is due, `None` when the client
/// set no deadline (or outside a handler).
pub fn answer_by() -> Option<Instant> {
    ANSWER_BY.try_with(|d| *d).ok().flatten()
}

/// A gRPC status code as Prometheus gRPC metrics name it (`grpc_code`).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// Whether `method` ends when its client goes away or its deadline passes. ExecSync does
/// (as with containerd): its process is killed, since nobody will read its output, and a probe
/// that timed out would otherwise leave one process behind per period. Calls that change state
/// always run to the end or undo themselves.
fn ends_with_its_client(method: &str) -> bool {
    method == "ExecSync"
}

/// A handler's task, aborted when the RPC's future is dropped (the client cancelled) if
/// `abort` says the method ends with its client.
struct AbortOnDrop<T> {
    task: tokio::task::JoinHandle<T>,
    abort: bool,
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if self.abort {
            self.task.abort();
        }
    }
}

/// The `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How long to wait before answering DeadlineExceeded: a little less than the client's
/// deadline, so the answer is ours and not the transport's. At least 50 ms less (a loaded node
/// delays the answer: 7 ms seen under a parallel build, more than 20 on this project's 2-core
/// machine while CRIU restored a 256 MiB process beside the call), at most 100 ms, and never
/// more than half the deadline.
fn answer_before(timeout: Duration) -> Duration {
    let margin = (timeout / 100)
        .clamp(Duration::from_millis(50), Duration::from_millis(100))
        .min(timeout / 2);
    timeout.saturating_sub(margin)
}

/// Whether `labels` hold every key of a CRI `label_selector` with the same value (the
/// selector of every List* and stats filter).
pub fn labels_match(
    selector: &std::collections::HashMap<String, String>,
    labels: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Most items one message of a `Stream*` RPC carries.
pub const CHUNK_ITEMS: usize = 64;
/// Most encoded bytes of items one message carries (kubelet accepts 16 MiB messages).
pub const CHUNK_BYTES: usize = 4 << 20;

/// The answer of a `Stream*` list RPC: `items` in messages of at most [`CHUNK_ITEMS`] items
/// and [`CHUNK_BYTES`] bytes (one item larger than that goes alone), made by `wrap`; an empty
/// list is one empty message. That is why these RPCs exist: a node's whole list may not fit
/// one message.
pub fn in_chunks<I, T>(items: Vec<I>, wrap: impl Fn(Vec<I>) -> T) -> BoxStream<T>
where
    I: prost::Message,
    T: Send + 'static,
{
    let mut messages = Vec::new();
    let mut chunk = Vec::new();
    let mut bytes = 0;
    for item in items {
        let len = item.encoded_len();
        if !chunk.is_empty() && (chunk.len() == CHUNK_ITEMS || bytes + len > CHUNK_BYTES) {
            messages.push(Ok(wrap(std::mem::take(&mut chunk))));
            bytes = 0;
        }
        bytes += len;
        chunk.push(item);
    }
    if !chunk.is_empty() || messages.is_empty() {
        messages.push(Ok(wrap(chunk)));
    }
    Box::pin(futures::stream::iter(messages))
}

/// Writes a service impl in which every method goes through [`instrument`]. The impl is
/// produced by a macro so that the `async_trait` attribute sees the expanded methods.
macro_rules! cri_service {
    (
        $trait:ident {
            $($name:ident($method:literal, $req:ty) -> $resp:ty => $handler:expr;)*
        }
    ) => {
        #[tonic::async_trait]
        impl $trait for CriService {
            $(
                async fn $name(&self, request: Request<$req>) -> Result<Response<$resp>, Status> {
                    let daemon = Arc::clone(&self.daemon);
                    instrument($method, request, move |r| async move {
                        ($handler)(&daemon, r).await
                    })
                    .await
                }
            )*
        }
    };
}

cri_service! {
    RuntimeService {
        version("Version", VersionRequest) -> VersionResponse => version::version;
        status("Status", StatusRequest) -> StatusResponse => status::status;
        runtime_config("RuntimeConfig", RuntimeConfigRequest) -> RuntimeConfigResponse
            => runtime_config::runtime_config;
        update_runtime_config("UpdateRuntimeConfig", UpdateRuntimeConfigRequest)
            -> UpdateRuntimeConfigResponse => runtime_config::update_runtime_config;

        run_pod_sandbox("RunPodSandbox", RunPodSandboxRequest) -> RunPodSandboxResponse
            => sandbox::run;
        stop_pod_sandbox("StopPodSandbox", StopPodSandboxRequest) -> StopPodSandboxResponse
            => sandbox::stop;
        remove_pod_sandbox("RemovePodSandbox", RemovePodSandboxRequest)
            -> RemovePodSandboxResponse => sandbox::remove;
        pod_sandbox_status("PodSandboxStatus", PodSandboxStatusRequest)
            -> PodSandboxStatusResponse => sandbox::status;
        list_pod_sandbox("ListPodSandbox", ListPodSandboxRequest) -> ListPodSandboxResponse
            => sandbox::list;
        stream_pod_sandboxes("StreamPodSandboxes", StreamPodSandboxesRequest)
            -> BoxStream<StreamPodSandboxesResponse> => sandbox::stream;
        update_pod_sandbox_resources("UpdatePodSandboxResources", UpdatePodSandboxResourcesRequest)
            -> UpdatePodSandboxResourcesResponse => container_update::update_pod;

        create_container("CreateContainer", CreateContainerRequest) -> CreateContainerResponse
            => container::create;
        start_container("StartContainer", StartContainerRequest) -> StartContainerResponse
            => container::start;
        stop_container("StopContainer", StopContainerRequest) -> StopContainerResponse
            => container::stop;
        remove_container("RemoveContainer", RemoveContainerRequest) -> RemoveContainerResponse
            => container::remove;
        list_containers("ListContainers", ListContainersRequest) -> ListContainersResponse
            => container::list;
        stream_containers("StreamContainers", StreamContainersRequest)
            -> BoxStream<StreamContainersResponse> => container::stream;
        container_status("ContainerStatus", ContainerStatusRequest) -> ContainerStatusResponse
            => container::status;
        update_container_resources("UpdateContainerResources", UpdateContainerResourcesRequest)
            -> UpdateContainerResourcesResponse => container_update::update_container;
        reopen_container_log("ReopenContainerLog", ReopenContainerLogRequest)
            -> ReopenContainerLogResponse => container::reopen_log;
        checkpoint_container("CheckpointContainer", CheckpointContainerRequest)
            -> CheckpointContainerResponse => container_checkpoint::checkpoint;
        checkpoint_pod("CheckpointPod", CheckpointPodRequest) -> CheckpointPodResponse
            => pod_checkpoint::checkpoint;
        restore_pod("RestorePod", RestorePodRequest) -> RestorePodResponse
            => pod_checkpoint::restore;
        get_container_events("GetContainerEvents", GetEventsRequest)
            -> BoxStream<ContainerEventResponse> => events::get_container_events;

        exec_sync("ExecSync", ExecSyncRequest) -> ExecSyncResponse => container::exec_sync;
        exec("Exec", ExecRequest) -> ExecResponse => streaming::exec;
        attach("Attach", AttachRequest) -> AttachResponse => streaming::attach;
        port_forward("PortForward", PortForwardRequest) -> PortForwardResponse
            => streaming::port_forward;

        container_stats("ContainerStats", ContainerStatsRequest) -> ContainerStatsResponse
            => stats::container;
        list_container_stats("ListContainerStats", ListContainerStatsRequest)
            -> ListContainerStatsResponse => stats::list_containers;
        stream_container_stats("StreamContainerStats", StreamContainerStatsRequest)
            -> BoxStream<StreamContainerStatsResponse> => stats::stream_containers;
        pod_sandbox_stats("PodSandboxStats", PodSandboxStatsRequest) -> PodSandboxStatsResponse
            => stats::pod;
        list_pod_sandbox_stats("ListPodSandboxStats", ListPodSandboxStatsRequest)
            -> ListPodSandboxStatsResponse => stats::list_pods;
        stream_pod_sandbox_stats("StreamPodSandboxStats", StreamPodSandboxStatsRequest)
            -> BoxStream<StreamPodSandboxStatsResponse> => stats::stream_pods;
        list_metric_descriptors("ListMetricDescriptors", ListMetricDescriptorsRequest)
            -> ListMetricDescriptorsResponse => metrics::descriptors;
        list_pod_sandbox_metrics("ListPodSandboxMetrics", ListPodSandboxMetricsRequest)
            -> ListPodSandboxMetricsResponse => metrics::list;
        stream_pod_sandbox_metrics("StreamPodSandboxMetrics", StreamPodSandboxMetricsRequest)
            -> BoxStream<StreamPodSandboxMetricsResponse> => metrics::stream;
    }
}

cri_service! {
    ImageService {
        list_images("ListImages", ListImagesRequest) -> ListImagesResponse
            => image::list;
        stream_images("StreamImages", StreamImagesRequest) -> BoxStream<StreamImagesResponse>
            => image::stream;
        image_status("ImageStatus", ImageStatusRequest) -> ImageStatusResponse
            => image::status;
        pull_image("PullImage", PullImageRequest) -> PullImageResponse
            => image::pull;
        remove_image("RemoveImage", RemoveImageRequest) -> RemoveImageResponse
            => image::remove;
        image_fs_info("ImageFsInfo", ImageFsInfoRequest) -> ImageFsInfoResponse
            => image::fs_info;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stream_answers_come_in_bounded_chunks() {
        use crius_api::v1::KeyValue;
        use futures::StreamExt as _;
        let sizes = |items: Vec<KeyValue>| async move {
            let chunks: Vec<usize> = in_chunks(items, |v| v.len())
                .map(|r| r.unwrap_or(usize::MAX))
                .collect()
                .await;
            chunks
        };
        let small = |n: usize| {
            (0..n)
                .map(|i| KeyValue {
                    key: i.to_string(),
                    value: vec![],
                })
                .collect()
        };
        assert_eq!(sizes(small(130)).await, [64, 64, 2]);
        assert_eq!(
            sizes(small(0)).await,
            [0],
            "an empty list is one empty message"
        );
        let big = |n: usize| {
            (0..n)
                .map(|_| KeyValue {
                    key: String::new(),
                    value: vec![0; CHUNK_BYTES / 2],
                })
                .collect()
        };
        assert_eq!(
            sizes(big(5)).await,
            [1, 1, 1, 1, 1],
            "bytes bound a chunk too"
        );
    }

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("1m"), Some(Duration::from_millis(1)));
        assert_eq!(parse_grpc_timeout("120S"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_grpc_timeout("999999n"),
            Some(Duration::from_nanos(999_999))
        );
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }

    #[test]
    fn answers_come_before_the_deadline() {
        assert_eq!(
            answer_before(Duration::from_millis(2)),
            Duration::from_millis(1)
        );
        assert_eq!(
            answer_before(Duration::from_millis(700)),
            Duration::from_millis(650)
        );
        assert_eq!(
            answer_before(Duration::from_secs(5)),
            Duration::from_millis(4950)
        );
        assert_eq!(
            answer_before(Duration::from_secs(120)),
            Duration::from_millis(119_900)
        );
    }

    #[tokio::test]
    async fn a_handler_knows_when_its_answer_is_due() {
        let mut request = Request::new(VersionRequest::default());
        request
            .metadata_mut()
            .insert("grpc-timeout", "5S".parse().unwrap());
        let before = Instant::now();
        let due = instrument("Version", request, move |_| async move {
            let due = answer_by();
            Ok(VersionResponse {
                version: format!("{:?}", due.map(|d| d.duration_since(before))),
                ..Default::default()
            })
        })
        .await
        .unwrap()
        .into_inner()
        .version;
        assert!(due.starts_with("Some(4.9"), "{due}");
        let none = instrument(
            "Version",
            Request::new(VersionRequest::default()),
            |_| async {
                Ok(VersionResponse {
                    version: format!("{:?}", answer_by()),
                    ..Default::default()
                })
            },
        )
        .await
        .unwrap()
        .into_inner()
        .version;
        assert_eq!(none, "None");
        assert_eq!(answer_by(), None, "outside a handler");
    }

    #[tokio::test]
    async fn a_passed_deadline_is_deadline_exceeded_and_the_work_still_finishes() {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let mut request = Request::new(VersionRequest::default());
        request
            .metadata_mut()
            .insert("grpc-timeout", "50m".parse().unwrap());
        let status = instrument("Version", request, move |_| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(VersionResponse::default())
        })
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(!done.load(std::sync::atomic::Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            done.load(std::sync::atomic::Ordering::SeqCst),
            "the handler ran to completion"
        );
    }
}
