//! crius's Prometheus metrics: what the daemon records as it works ([`Metrics`], one per
//! process, reached through [`metrics()`]), what is read at each scrape ([`collect`]), and
//! the HTTP endpoint that serves them ([`server`]).
//!
//! Recording costs an atomic add or a histogram observation whether or not the endpoint is
//! on, so the call sites need no configuration. The names follow containerd's CRI metrics
//! where containerd has one (`<namespace>_cri_sandbox_runtime_create_seconds`, ...), with
//! `[metrics] namespace` in place of containerd's `containerd`.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub mod collect;
pub mod server;

/// Latency buckets (seconds) of the operation and RPC histograms: 1 ms to 2 minutes, the span
/// of a cached-image container start to a slow pull.
const SECONDS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

/// Image pull throughput buckets (MiB/s), containerd's.
const MIBPS: [f64; 11] = [
    0.1, 1.0, 10.0, 25.0, 75.0, 150.0, 300.0, 500.0, 1000.0, 2000.0, 4000.0,
];

fn seconds() -> Histogram {
    Histogram::new(SECONDS)
}

type One = [(&'static str, String); 1];
type Timers = Family<One, Histogram, fn() -> Histogram>;
/// `grpc_service`, `grpc_method`.
type RpcLabels = [(&'static str, &'static str); 2];

fn timers() -> Timers {
    Family::new_with_constructor(seconds as fn() -> Histogram)
}

/// Everything crius records as it works. Scrape-time figures (pods by state, shims, memory)
/// are in [`collect`].
pub struct Metrics {
    /// Every CRI call: `grpc_service`, `grpc_method`, `grpc_code`.
    pub rpcs: Family<[(&'static str, &'static str); 3], Counter>,
    /// Every CRI call's duration: `grpc_service`, `grpc_method`.
    pub rpc_seconds: Family<RpcLabels, Histogram, fn() -> Histogram>,
    pub sandbox_list: Histogram,
    pub sandbox_create_network: Histogram,
    pub sandbox_delete_network: Histogram,
    /// By `runtime` (the pod's handler).
    pub sandbox_runtime_create: Timers,
    pub sandbox_runtime_stop: Timers,
    pub sandbox_remove: Timers,
    pub container_list: Histogram,
    pub container_create: Timers,
    pub container_start: Timers,
    pub container_stop: Timers,
    pub container_remove: Timers,
    /// By `operation_type`: set_up_pod, tear_down_pod, get_pod_network_status.
    pub network_operations: Family<One, Counter>,
    pub network_errors: Family<One, Counter>,
    pub network_seconds: Timers,
    /// By `status`: success, failure.
    pub image_pulls: Family<One, Counter>,
    pub image_pull_bytes: Counter,
    pub image_pull_mibps: Histogram,
    pub oom_kills: Counter,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    rpcs: Family::default(),
    rpc_seconds: Family::new_with_constructor(seconds as fn() -> Histogram),
    sandbox_list: seconds(),
    sandbox_create_network: seconds(),
    sandbox_delete_network: seconds(),
    sandbox_runtime_create: timers(),
    sandbox_runtime_stop: timers(),
    sandbox_remove: timers(),
    container_list: seconds(),
    container_create: timers(),
    container_start: timers(),
    container_stop: timers(),
    container_remove: timers(),
    network_operations: Family::default(),
    network_errors: Family::default(),
    network_seconds: timers(),
    image_pulls: Family::default(),
    image_pull_bytes: Counter::default(),
    image_pull_mibps: Histogram::new(MIBPS),
    oom_kills: Counter::default(),
});

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// The CRI service a method belongs to.
fn service_of(method: &str) -> &'static str {
    match method {
        "PullImage" | "ListImages" | "ImageStatus" | "RemoveImage" | "ImageFsInfo" => {
            "runtime.v1.ImageService"
        }
        _ => "runtime.v1.RuntimeService",
    }
}

/// The label of one value.
pub fn label(key: &'static str, value: &str) -> One {
    [(key, value.to_string())]
}

impl Metrics {
    /// One CRI call ended with `code` (a tonic code's name) after `elapsed`.
    pub fn rpc(&self, method: &'static str, code: &'static str, elapsed: Duration) {
        let service = service_of(method);
        self.rpcs
            .get_or_create(&[
                ("grpc_service", service),
                ("grpc_method", method),
                ("grpc_code", code),
            ])
            .inc();
        self.rpc_seconds
            .get_or_create(&[("grpc_service", service), ("grpc_method", method)])
            .observe(elapsed.as_secs_f64());
    }

    /// A CNI operation (`set_up_pod`, `tear_down_pod`) ended; a successful one is also timed
    /// in `on_success` (containerd's `sandbox_create_network` / `sandbox_delete_network`).
    pub fn network_operation(
        &self,
        op: &'static str,
        ok: bool,
        elapsed: Duration,
        on_success: &Histogram,
    ) {
        let l = label("operation_type", op);
        self.network_operations.get_or_create(&l).inc();
        if ok {
            on_success.observe(elapsed.as_secs_f64());
        } else {
            self.network_errors.get_or_create(&l).inc();
        }
        self.network_seconds
            .get_or_create(&l)
            .observe(elapsed.as_secs_f64());
    }

    /// An image pull ended; `fetched` bytes came from the registry in `elapsed`.
    pub fn image_pull(&self, ok: bool, fetched: u64, elapsed: Duration) {
        let status = if ok { "success" } else { "failure" };
        self.image_pulls
            .get_or_create(&label("status", status))
            .inc();
        self.image_pull_bytes.inc_by(fetched);
        // A pull that fetched nothing (all cached) says nothing of throughput.
        if fetched > 0 && !elapsed.is_zero() {
            self.image_pull_mibps
                .observe(fetched as f64 / (1 << 20) as f64 / elapsed.as_secs_f64());
        }
    }

    /// Registers every recorded metric in `registry` (whose prefix is the namespace).
    fn register(&self, r: &mut Registry) {
        r.register(
            "grpc_server_handled",
            "CRI calls completed, by service, method and gRPC status code",
            self.rpcs.clone(),
        );
        r.register(
            "grpc_server_handling_seconds",
            "CRI call duration in seconds, by service and method",
            self.rpc_seconds.clone(),
        );
        let cri = r.sub_registry_with_prefix("cri");
        let timer = |r: &mut Registry, name: &str, help: &str, h: &Histogram| {
            r.register(format!("{name}_seconds"), help, h.clone());
        };
        timer(
            cri,
            "sandbox_list",
            "time to list sandboxes",
            &self.sandbox_list,
        );
        timer(
            cri,
            "sandbox_create_network",
            "time to create the network for a sandbox",
            &self.sandbox_create_network,
        );
        timer(
            cri,
            "sandbox_delete_network",
            "time to delete a sandbox's network",
            &self.sandbox_delete_network,
        );
        timer(
            cri,
            "container_list",
            "time to list containers",
            &self.container_list,
        );
        let by_runtime: [(&str, &str, &Timers); 7] = [
            (
                "sandbox_runtime_create",
                "time to create a sandbox in the runtime (the whole RunPodSandbox)",
                &self.sandbox_runtime_create,
            ),
            (
                "sandbox_runtime_stop",
                "time to stop a sandbox",
                &self.sandbox_runtime_stop,
            ),
            (
                "sandbox_remove",
                "time to remove a sandbox",
                &self.sandbox_remove,
            ),
            (
                "container_create",
                "time to create a container",
                &self.container_create,
            ),
            (
                "container_start",
                "time to start a container",
                &self.container_start,
            ),
            (
                "container_stop",
                "time to stop a container",
                &self.container_stop,
            ),
            (
                "container_remove",
                "time to remove a container",
                &self.container_remove,
            ),
        ];
        for (name, help, family) in by_runtime {
            cri.register(format!("{name}_seconds"), help, family.clone());
        }
        cri.register(
            "network_plugin_operations",
            "cumulative number of network plugin operations by operation type",
            self.network_operations.clone(),
        );
        cri.register(
            "network_plugin_operations_errors",
            "cumulative number of failed network plugin operations by operation type",
            self.network_errors.clone(),
        );
        cri.register(
            "network_plugin_operations_duration_seconds",
            "latency in seconds of network plugin operations, by operation type",
            self.network_seconds.clone(),
        );
        cri.register(
            "image_pulls",
            "image pulls by outcome (status: success, failure)",
            self.image_pulls.clone(),
        );
        cri.register(
            "image_pulling_throughput_mibps",
            "image pull throughput in MiB/s (fetched bytes over the pull's duration; pulls \
             that fetched nothing are left out)",
            self.image_pull_mibps.clone(),
        );
        r.register(
            "image_pull_bytes",
            "bytes fetched from registries by image pulls",
            self.image_pull_bytes.clone(),
        );
        r.register(
            "container_oom_kills",
            "containers whose init was killed by the kernel's OOM killer",
            self.oom_kills.clone(),
        );
    }
}

/// Times an operation for a histogram, observed only if it succeeds (as containerd's timers):
/// `let t = Timer::start(); ...; t.observe(&h)`.
pub struct Timer(std::time::Instant);

impl Timer {
    pub fn start() -> Timer {
        Timer(std::time::Instant::now())
    }

    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    pub fn observe(&self, histogram: &Histogram) {
        histogram.observe(self.0.elapsed().as_secs_f64());
    }

    /// Observes into `family`'s histogram for the `runtime` (handler) label.
    pub fn observe_runtime(&self, family: &Timers, runtime: &str) {
        self.observe(&family.get_or_create(&label("runtime", runtime)));
    }
}

/// The registry a scrape encodes: the recorded metrics and the scrape-time collector.
pub fn registry(
    namespace: &str,
    collector: impl prometheus_client::collector::Collector,
) -> Registry {
    let mut r = Registry::with_prefix(namespace);
    metrics().register(&mut r);
    r.register_collector(Box::new(collector));
    r
}
