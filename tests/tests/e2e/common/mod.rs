//! Shared helpers of the pod and container end-to-end tests (`pods.rs`, `containers.rs`,
//! `restart.rs`).
//!
//! [`Env`] is one isolated crius: its own registry with the busybox test image (pulled through
//! CRI `PullImage`), its own CNI config (bridge `crius-e2e<N>`, subnet `10.88.<N>.0/24`,
//! host-local's store under the test dir), its own registry hosts dir (`docker.io` mirrored to
//! the local registry, with no fallback to the internet), and pod log dirs under the daemon's temp
//! dir. `N` is handed out by [`NetworkLease`], held while the `Env` lives, so tests running in
//! parallel, in this process or another, never share a bridge or subnet.
//!
//! Drop removes every pod still listed (restarting crius first if a test killed it), kills
//! whatever a broken teardown left in the pods' cgroups, and deletes the bridge, so a failing
//! assertion leaves nothing behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod checkpoints;

use std::collections::HashMap;
use std::future::Future;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crius_api::v1::*;
use crius_tests::crius::Crius;
use crius_tests::images::{self, TestImage};
use crius_tests::registry::Registry;
use crius_tests::TestDir;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tonic::Code;

/// Where Debian's CNI plugins are.
pub const CNI_BIN: &str = "/usr/lib/cni";

/// The file name of the test network's config in its conf dir.
const CONFLIST: &str = "10-crius-e2e.conflist";

/// The bridge network of test `n`: bridge `crius-e2e<n>`, subnet `10.88.<n>.0/24`, no masquerade
/// rule, host-local's store in `ipam_dir`.
fn bridge_conflist(n: u8, ipam_dir: &Path) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "crius-e2e{n}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "crius-e2e{n}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "10.88.{n}.0/24"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}],
        "dataDir": "{ipam}"
      }}
    }}
  ]
}}"#,
        ipam = ipam_dir.display()
    )
}

/// The network numbers [`NetworkLease`] hands out. Others are taken by what picks its own:
/// the lifecycle bench's 160–162, cni-glue's tests' 200 and up.
const NETWORKS: std::ops::RangeInclusive<u8> = 1..=159;

/// One network number `n` (bridge `crius-e2e<n>`, subnet `10.88.<n>.0/24`) held by this
/// process: an abstract unix socket named for it is bound, which the kernel frees when the
/// lease drops or the process dies. So two test processes never take one number, and nothing
/// is left on disk. A number whose bridge exists (left by a killed run) is passed over.
pub struct NetworkLease {
    pub n: u8,
    _held: UnixListener,
}

impl NetworkLease {
    pub fn take() -> NetworkLease {
        // Round robin from where the last lease began, so a number just given back (whose
        // bridge a failed teardown may still be removing) is the last to be taken again.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let (first, count) = (*NETWORKS.start() as usize, NETWORKS.len());
        for _ in 0..count {
            let n = (first + NEXT.fetch_add(1, Ordering::Relaxed) % count) as u8;
            if Path::new(&format!("/sys/class/net/crius-e2e{n}")).exists() {
                continue;
            }
            let name = format!("crius-e2e-net-{n}");
            let addr = SocketAddr::from_abstract_name(name.as_bytes())
                .expect("an abstract socket name of 20 bytes fits in sun_path");
            if let Ok(held) = UnixListener::bind_addr(&addr) {
                return NetworkLease { n, _held: held };
            }
        }
        panic!("every test network number in {NETWORKS:?} is taken");
    }
}

/// One isolated crius with a registry, a pulled busybox image and a private bridge network.
pub struct Env {
    pub crius: Crius,
    /// The image reference pods use (`127.0.0.1:PORT/crius-test/busybox:latest`).
    pub image: String,
    /// The image id (config digest) crius reported after the pull.
    pub image_ref: String,
    pub pushed: images::PushedImage,
    pub n: u8,
    pub bridge: String,
    /// Pods this test created (by [`Env::run_pod`]), checked and cleaned up at the end.
    pub pods: Vec<String>,
    pub registry: Registry,
    net: TestDir,
    /// Holds `n` until the bridge is deleted (the last field: dropped after `Drop::drop`).
    _lease: NetworkLease,
}

impl Env {
    /// [`Env::new`], then the busybox image pulled through CRI `PullImage`.
    pub async fn with_image() -> Env {
        Env::with_image_and_config("").await
    }

    /// [`Env::with_config`], then the busybox image pulled through CRI `PullImage`.
    pub async fn with_image_and_config(extra: &str) -> Env {
        let mut env = Env::with_config(extra).await;
        let pushed = env.pushed.clone();
        env.image_ref = env.pull(&pushed.reference).await;
        assert_eq!(env.image_ref, pushed.config_digest, "PullImage image_ref");
        env
    }

    /// Starts everything on a network of its own ([`NetworkLease`]); the image is pushed to
    /// the registry, not pulled.
    pub async fn new() -> Env {
        Env::with_config("").await
    }

    /// [`Env::new`] with `extra` appended to crius's config file (whole tables, such as
    /// `"[stream]\nheader_timeout_secs = 1\n"`).
    pub async fn with_config(extra: &str) -> Env {
        Env::with_config_in(extra, None).await
    }

    /// [`Env::with_config`] with crius's root and state in a subdirectory `sub` of its temp dir
    /// made with `mode` (see [`Crius::start_under`]).
    pub async fn with_config_under(extra: &str, sub: &str, mode: u32) -> Env {
        Env::with_config_in(extra, Some((sub, mode))).await
    }

    async fn with_config_in(extra: &str, under: Option<(&str, u32)>) -> Env {
        let lease = NetworkLease::take();
        let n = lease.n;
        let registry = Registry::start().unwrap();
        let pushed = images::push(&registry, TestImage::Busybox).unwrap();
        // The same image as docker.io/library/busybox, for the short-name pull.
        images::push_as(&registry, TestImage::Busybox, "library/busybox", "latest").unwrap();

        let net = TestDir::new(&format!("e2e-net-{n}")).unwrap();
        let bridge = format!("crius-e2e{n}");
        let conf_dir = net.join("net.d");
        let hosts_dir = net.join("certs.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::create_dir_all(net.join("bin")).unwrap();
        std::fs::create_dir_all(hosts_dir.join("docker.io")).unwrap();
        std::fs::write(
            conf_dir.join(CONFLIST),
            bridge_conflist(n, &net.join("ipam")),
        )
        .unwrap();
        // The local registry is both mirror and origin: a pull never leaves the machine.
        std::fs::write(
            hosts_dir.join("docker.io/hosts.toml"),
            format!(
                "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                host = registry.host_port()
            ),
        )
        .unwrap();
        let config = format!(
            "[cni]\nconf_dir = \"{}\"\nbin_dirs = [\"{}\", \"{CNI_BIN}\"]\nplugin_timeout_secs = 20\n\n\
             [registry]\nconfig_path = \"{}\"\n\n{extra}",
            conf_dir.display(),
            net.join("bin").display(),
            hosts_dir.display()
        );
        let crius = match under {
            None => Crius::start(&config).await,
            Some((sub, mode)) => Crius::start_under(&config, sub, mode).await,
        }
        .unwrap();
        Env {
            crius,
            image: pushed.reference.clone(),
            image_ref: String::new(),
            pushed,
            n,
            bridge,
            pods: Vec::new(),
            registry,
            net,
            _lease: lease,
        }
    }

    /// `PullImage` of `image`; returns the image ref crius answers.
    pub async fn pull(&self, image: &str) -> String {
        self.crius
            .image()
            .pull_image(PullImageRequest {
                image: Some(ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("PullImage {image}: {s:?}"))
            .into_inner()
            .image_ref
    }

    /// `ImageStatus` of `image` (not verbose): the image, `None` when crius has none by that
    /// name.
    pub async fn image_status(&self, image: &str) -> Option<Image> {
        self.crius
            .image()
            .image_status(ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .unwrap_or_else(|s| panic!("ImageStatus {image}: {s:?}"))
            .into_inner()
            .image
    }

    pub fn rt(&self) -> runtime_service_client::RuntimeServiceClient<tonic::transport::Channel> {
        self.crius.runtime()
    }

    /// The URL an Exec RPC answers for `req` (the call must succeed).
    pub async fn exec_url(&self, req: ExecRequest) -> String {
        self.rt()
            .exec(req)
            .await
            .unwrap_or_else(|s| panic!("Exec: {s:?}"))
            .into_inner()
            .url
    }

    /// This test's subnet, `10.88.<n>.0/24`.
    pub fn subnet(&self) -> String {
        format!("10.88.{}.0/24", self.n)
    }

    /// The prefix of this test's subnet, `10.88.<n>.`.
    pub fn subnet_prefix(&self) -> String {
        format!("10.88.{}.", self.n)
    }

    /// Log directory of a pod named `name`.
    pub fn log_dir(&self, name: &str) -> PathBuf {
        self.crius.dir().join("logs").join(name)
    }

    /// A pod config: metadata from `name`, its own log dir, host or pod network.
    pub fn pod_config(&self, name: &str, host_network: bool) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "crius-e2e".into(),
                attempt: 0,
            }),
            log_directory: self.log_dir(name).display().to_string(),
            labels: HashMap::from([("pod".to_string(), name.to_string())]),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: if host_network {
                            NamespaceMode::Node as i32
                        } else {
                            NamespaceMode::Pod as i32
                        },
                        pid: NamespaceMode::Pod as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// `RunPodSandbox`, remembering the pod for the final checks.
    pub async fn run_pod(&mut self, config: PodSandboxConfig) -> String {
        self.run_pod_with_handler(config, "").await
    }

    /// `RunPodSandbox` with a runtime handler (a RuntimeClass's `handler`).
    pub async fn run_pod_with_handler(
        &mut self,
        config: PodSandboxConfig,
        handler: &str,
    ) -> String {
        let id = self
            .rt()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: handler.to_string(),
            })
            .await
            .unwrap_or_else(|s| panic!("RunPodSandbox: {s:?}"))
            .into_inner()
            .pod_sandbox_id;
        self.pods.push(id.clone());
        id
    }

    /// A container config running `cmd` from the test image, logging to `<name>.log`.
    pub fn container_config(&self, name: &str, cmd: &[&str]) -> ContainerConfig {
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            labels: HashMap::from([("container".to_string(), name.to_string())]),
            ..Default::default()
        }
    }

    /// A container that doubles a shell string until its 32 MiB memory limit gets it
    /// OOM-killed.
    pub fn memory_hog_config(&self, name: &str) -> ContainerConfig {
        let mut hog = self.container_config(
            name,
            &[
                "sh",
                "-c",
                "x=0123456789abcdef; while true; do x=$x$x; done",
            ],
        );
        hog.linux = Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                memory_limit_in_bytes: 32 << 20,
                ..Default::default()
            }),
            ..Default::default()
        });
        hog
    }

    /// `CreateContainer` in `pod` (whose config is `pod_config`).
    pub async fn create(
        &self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> String {
        self.try_create(pod, pod_config, config)
            .await
            .unwrap_or_else(|s| panic!("CreateContainer: {s:?}"))
    }

    /// `CreateContainer` in `pod`, its answer as it is: the new id or the status.
    pub async fn try_create(
        &self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> Result<String, tonic::Status> {
        self.rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    /// The runtime's `Status` (not verbose).
    pub async fn runtime_status(&self) -> StatusResponse {
        self.rt()
            .status(StatusRequest { verbose: false })
            .await
            .unwrap_or_else(|s| panic!("Status: {s:?}"))
            .into_inner()
    }

    /// The pid of the pod's pause process, from its verbose status.
    pub async fn pause_pid(&self, pod: &str) -> i32 {
        let status = self
            .rt()
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: true,
            })
            .await
            .unwrap_or_else(|s| panic!("PodSandboxStatus {pod}: {s:?}"))
            .into_inner();
        let info: serde_json::Value =
            serde_json::from_str(status.info.get("info").expect("verbose info")).unwrap();
        info["pid"].as_i64().expect("pause pid in verbose info") as i32
    }

    /// `CreateContainer` + `StartContainer`.
    pub async fn create_start(
        &self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> String {
        let id = self.create(pod, pod_config, config).await;
        self.start(&id).await;
        id
    }

    pub async fn start(&self, id: &str) {
        self.rt()
            .start_container(StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("StartContainer {id}: {s:?}"));
    }

    pub async fn stop(&self, id: &str, timeout: i64) {
        self.rt()
            .stop_container(StopContainerRequest {
                container_id: id.into(),
                timeout,
            })
            .await
            .unwrap_or_else(|s| panic!("StopContainer {id}: {s:?}"));
    }

    pub async fn remove(&self, id: &str) {
        self.rt()
            .remove_container(RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("RemoveContainer {id}: {s:?}"));
    }

    pub async fn status(&self, id: &str) -> ContainerStatus {
        self.rt()
            .container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .unwrap_or_else(|s| panic!("ContainerStatus {id}: {s:?}"))
            .into_inner()
            .status
            .unwrap()
    }

    /// The `info` JSON of a verbose `ContainerStatus`.
    pub async fn status_info(&self, id: &str) -> serde_json::Value {
        let resp = self
            .rt()
            .container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            })
            .await
            .unwrap_or_else(|s| panic!("ContainerStatus {id}: {s:?}"))
            .into_inner();
        serde_json::from_str(resp.info.get("info").expect("verbose info")).unwrap()
    }

    /// Entry `key` of a verbose runtime `Status`'s info, parsed as JSON.
    pub async fn runtime_info(&self, key: &str) -> serde_json::Value {
        let info = self
            .rt()
            .status(StatusRequest { verbose: true })
            .await
            .unwrap()
            .into_inner()
            .info;
        let entry = info
            .get(key)
            .unwrap_or_else(|| panic!("no {key:?} in Status info"));
        serde_json::from_str(entry).unwrap()
    }

    /// The container's main pid, from the verbose status.
    pub async fn pid(&self, id: &str) -> i32 {
        let info = self.status_info(id).await;
        info["pid"].as_i64().expect("pid in verbose info") as i32
    }

    pub async fn pod_status(&self, id: &str) -> PodSandboxStatus {
        self.rt()
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            })
            .await
            .unwrap_or_else(|s| panic!("PodSandboxStatus {id}: {s:?}"))
            .into_inner()
            .status
            .unwrap()
    }

    pub async fn stop_pod(&self, id: &str) {
        self.rt()
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("StopPodSandbox {id}: {s:?}"));
    }

    pub async fn remove_pod(&self, id: &str) {
        self.rt()
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("RemovePodSandbox {id}: {s:?}"));
    }

    /// `ExecSync`, returning the whole response or the status.
    pub async fn exec(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<ExecSyncResponse, tonic::Status> {
        self.rt()
            .exec_sync(ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn list_containers(&self, filter: ContainerFilter) -> Vec<Container> {
        self.rt()
            .list_containers(ListContainersRequest {
                filter: Some(filter),
            })
            .await
            .unwrap()
            .into_inner()
            .containers
    }

    pub async fn list_pods(&self, filter: PodSandboxFilter) -> Vec<PodSandbox> {
        self.rt()
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await
            .unwrap()
            .into_inner()
            .items
    }

    /// Polls `ContainerStatus` until the container is exited (at most `limit`).
    pub async fn wait_exited(&self, id: &str, limit: Duration) -> ContainerStatus {
        let rt = self;
        wait_for(&format!("container {id} to exit"), limit, || async move {
            let s = rt.status(id).await;
            (s.state == ContainerState::ContainerExited as i32).then_some(s)
        })
        .await
    }

    /// Polls the container's log until `pred` holds for its parsed lines.
    pub async fn wait_log(
        &self,
        path: &Path,
        limit: Duration,
        pred: impl Fn(&[LogLine]) -> bool,
    ) -> Vec<LogLine> {
        let pred = &pred;
        wait_for(
            &format!("log {} to show the expected lines", path.display()),
            limit,
            || async move {
                let lines = read_log(path);
                pred(&lines).then_some(lines)
            },
        )
        .await
    }

    /// Starts container `ticker` running `sh -c script` in pod `pod_name` and waits for three
    /// lines of its log; returns its id and log path.
    pub async fn start_ticker(
        &self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        pod_name: &str,
        script: &str,
    ) -> (String, PathBuf) {
        let config = self.container_config("ticker", &["sh", "-c", script]);
        let id = self.create_start(pod, pod_config, config).await;
        let log = self.log_dir(pod_name).join("ticker.log");
        self.wait_log(&log, Duration::from_secs(10), |l| l.len() >= 3)
            .await;
        (id, log)
    }

    /// Waits (up to 10 s) for the pod to be reported not ready.
    pub async fn wait_pod_not_ready(&self, pod: &str) {
        wait_for(
            "the pod to be not ready",
            Duration::from_secs(10),
            || async {
                (self.pod_status(pod).await.state == PodSandboxState::SandboxNotready as i32)
                    .then_some(())
            },
        )
        .await;
    }

    /// Asserts that a removed pod left nothing: no record, no state dir, no netns pin, no
    /// mount naming it, no cgroup `/sys/fs/cgroup/*/crius/<id>`, no shim or container process.
    pub async fn assert_pod_gone(&self, id: &str) {
        let listed = self.list_pods(PodSandboxFilter::default()).await;
        assert!(
            listed.iter().all(|p| p.id != id),
            "pod {id} is still listed"
        );
        let state = self.crius.state();
        for path in [
            state.join("pods").join(id),
            state.join("shims").join(id),
            state.join("netns").join(id),
        ] {
            assert!(!path.exists(), "pod {id} left {}", path.display());
        }
        let mounts = mounts_containing(id);
        assert!(mounts.is_empty(), "pod {id} left mounts: {mounts:?}");
        let cgroups = pod_cgroups(id);
        assert!(cgroups.is_empty(), "pod {id} left cgroups: {cgroups:?}");
        let procs = processes_of_pod(id);
        assert!(procs.is_empty(), "pod {id} left processes: {procs:?}");
    }

    /// The end of a test: `containers` removed, none listed any more, `pod` removed, nothing
    /// leaked ([`Env::assert_no_leaks`]).
    pub async fn remove_all_and_check(&self, containers: &[&str], pod: &str) {
        for id in containers {
            self.remove(id).await;
        }
        let left = self.list_containers(ContainerFilter::default()).await;
        assert!(left.is_empty(), "containers left: {left:?}");
        self.remove_pod(pod).await;
        self.assert_no_leaks().await;
    }

    /// [`Env::assert_pod_gone`] for every pod of the test, and nothing mounted under the
    /// daemon's dir, no container left in the state dir.
    pub async fn assert_no_leaks(&self) {
        for id in &self.pods {
            self.assert_pod_gone(id).await;
        }
        let mounts = mounts_under(self.crius.dir());
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        let containers: Vec<_> = std::fs::read_dir(self.crius.state().join("containers"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(containers.is_empty(), "container dirs left: {containers:?}");
        let ips = self.allocated_ips();
        assert!(ips.is_empty(), "IPs still allocated: {ips:?}");
        assert_dev_null_is_roots();
        self.wait_trash_empty().await;
    }

    /// Waits (up to 20 s) until the background deletion of removed pods' and containers'
    /// directories has emptied `<root>/trash` and `<state>/trash`.
    pub async fn wait_trash_empty(&self) {
        let trashes = [
            self.crius.root().join("trash"),
            self.crius.state().join("trash"),
        ];
        wait_for("the trash to be emptied", Duration::from_secs(20), || {
            let left: Vec<PathBuf> = trashes
                .iter()
                .flat_map(|t| {
                    std::fs::read_dir(t)
                        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
                        .unwrap_or_default()
                })
                .collect();
            async move { left.is_empty().then_some(()) }
        })
        .await;
    }

    /// Replaces the test's CNI config (crius reloads it when the directory changes).
    pub fn write_cni_config(&self, conflist: &str) {
        let dir = self.net.join("net.d");
        let tmp = dir.join(".conflist.tmp");
        std::fs::write(&tmp, conflist).unwrap();
        std::fs::rename(&tmp, dir.join(CONFLIST)).unwrap();
    }

    /// Writes an executable CNI plugin script `name` into the test's plugin dir (searched
    /// before Debian's).
    pub fn script_plugin(&self, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.net.join("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A path in the test's network dir (for files a script plugin looks at).
    pub fn net_path(&self, rel: &str) -> PathBuf {
        self.net.join(rel)
    }

    /// The test's own bridge config, as [`Env::new`] wrote it.
    pub fn bridge_conflist(&self) -> String {
        bridge_conflist(self.n, &self.net.join("ipam"))
    }

    /// The test's bridge config with `plugin` (a plugin's JSON object) appended to its chain.
    pub fn bridge_conflist_with(&self, plugin: &str) -> String {
        let conflist = self.bridge_conflist();
        let chained = conflist.replacen("\n  ]\n}", &format!(",\n    {plugin}\n  ]\n}}"), 1);
        assert_ne!(chained, conflist, "the chain's end was not found");
        chained
    }

    /// Addresses host-local holds for this test's network.
    pub fn allocated_ips(&self) -> Vec<String> {
        let dir = self.net.join("ipam").join(format!("crius-e2e{}", self.n));
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pid of a pod's shim, from its pid file.
    pub fn shim_pid(&self, pod: &str) -> i32 {
        let path = self.crius.state().join("shims").join(pod).join("shim.pid");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            .trim()
            .parse()
            .unwrap()
    }

    /// Removes every pod crius still lists; used by drop.
    async fn remove_all_pods(&mut self) -> Result<(), String> {
        if self.crius.pid().is_none() {
            self.crius
                .restart()
                .await
                .map_err(|e| format!("restart: {e}"))?;
        }
        let rt = self.crius.runtime();
        let pods = rt
            .clone()
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|s| format!("list pods: {s:?}"))?
            .into_inner()
            .items;
        for pod in pods {
            if let Err(s) = rt
                .clone()
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                })
                .await
            {
                eprintln!("crius-e2e: remove pod {} in drop: {s:?}", pod.id);
            }
        }
        Ok(())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let pods = self.pods.clone();
        let this = &mut *self;
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                if let Err(e) = rt.block_on(this.remove_all_pods()) {
                    eprintln!("crius-e2e: drop: {e}");
                }
                // crius was started (or restarted) from this thread: stop it before the
                // thread's end kills it through PDEATHSIG, so the stop is graceful.
                let _ = this.crius.stop();
            })
            .join()
            .ok();
        });
        // Last resort for a teardown that did not work: kill what is left in the pods'
        // cgroups and remove them, so one failure does not spill into the next tests.
        for id in &pods {
            for pid in processes_of_pod(id) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for id in &pods {
            for dir in pod_cgroups(id) {
                remove_cgroup_tree(&dir);
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The pod's security context (created if missing).
pub fn pod_sc(config: &mut PodSandboxConfig) -> &mut LinuxSandboxSecurityContext {
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

/// The container's security context (created if missing).
pub fn sc(config: &mut ContainerConfig) -> &mut LinuxContainerSecurityContext {
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

/// Polls `f` every 50 ms until it returns `Some`, panicking with `what` after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One line of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub time: String,
    pub stream: String,
    pub tag: String,
    pub text: String,
}

/// Parses a CRI log file (`<RFC3339Nano> <stream> <F|P> <text>`); a missing file is empty.
/// Panics on a line that is not in the CRI format.
pub fn read_log(path: &Path) -> Vec<LogLine> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let (Some(time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
            else {
                panic!("not a CRI log line: {line:?}");
            };
            assert!(
                time.contains('T') && time.ends_with('Z') || time.contains('+'),
                "bad timestamp in {line:?}"
            );
            assert!(
                stream == "stdout" || stream == "stderr",
                "bad stream in {line:?}"
            );
            assert!(tag == "F" || tag == "P", "bad tag in {line:?}");
            LogLine {
                time: time.into(),
                stream: stream.into(),
                tag: tag.into(),
                text: parts.next().unwrap_or("").into(),
            }
        })
        .collect()
}

/// The texts of `stream`'s full lines.
pub fn texts(lines: &[LogLine], stream: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.stream == stream)
        .map(|l| l.text.clone())
        .collect()
}

/// Asserts that an RPC failed with `code` and a message containing every one of `needles`.
pub fn assert_status<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: Code,
    needles: &[&str],
) {
    match result {
        Ok(v) => panic!("expected {code:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "status {s:?}");
            for n in needles {
                assert!(
                    s.message().contains(n),
                    "message {:?} does not mention {n:?}",
                    s.message()
                );
            }
        }
    }
}

/// Mount points whose path contains `needle`.
pub fn mounts_containing(needle: &str) -> Vec<String> {
    mount_points()
        .into_iter()
        .filter(|m| m.contains(needle))
        .collect()
}

/// Mount points at or below `dir`, but for crius's own exec tmpfs (`<state>/bin`, mounted at
/// start and there until reboot like the state directory).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| !(l.contains(" - tmpfs crius-bin ") && l.contains("/state/bin ")))
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&dir))
        .collect()
}

fn mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// `/sys/fs/cgroup/<hierarchy>/crius/<pod-id>` dirs that exist.
pub fn pod_cgroups(pod: &str) -> Vec<PathBuf> {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    hierarchies
        .flatten()
        .map(|h| h.path().join("crius").join(pod))
        .filter(|p| p.exists())
        .collect()
}

/// Processes of a pod: its shim (by its command line) and everything in its cgroup.
pub fn processes_of_pod(pod: &str) -> Vec<i32> {
    let cgroup = format!("/crius/{pod}");
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let is_shim = cmdline.contains("crius-shim") && cmdline.contains(pod);
        let in_cgroup = std::fs::read_to_string(e.path().join("cgroup"))
            .is_ok_and(|c| c.lines().any(|l| l.contains(&cgroup)));
        if is_shim || in_cgroup {
            out.push(pid);
        }
    }
    out
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Where the cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Whether the node has the unified (v2) hierarchy only.
pub fn cgroup_v2() -> bool {
    Path::new(CGROUP_ROOT).join("cgroup.controllers").exists()
}

/// A cgroup the test makes in every hierarchy, as an admin's would be, and removes on drop
/// with whatever is below it, so a failing assertion leaves nothing behind.
pub struct HostCgroup {
    /// The cgroup's path from each hierarchy's root, as `cgroup_parent` names it.
    pub name: String,
    /// Its directory in each hierarchy.
    pub dirs: Vec<PathBuf>,
}

impl HostCgroup {
    pub fn new(name: &str) -> HostCgroup {
        let root = Path::new(CGROUP_ROOT);
        let hierarchies: Vec<PathBuf> = if cgroup_v2() {
            vec![root.to_path_buf()]
        } else {
            std::fs::read_dir(root)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists() && !p.is_symlink())
                .collect()
        };
        let cg = HostCgroup {
            name: format!("/{name}"),
            dirs: hierarchies.iter().map(|h| h.join(name)).collect(),
        };
        for (h, dir) in hierarchies.iter().zip(&cg.dirs) {
            kill_and_remove_cgroup_tree(dir);
            std::fs::create_dir(dir).unwrap();
            // A new v1 cpuset cgroup has no CPUs or memory nodes: give it its parent's.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                    std::fs::write(dir.join(f), v.trim()).unwrap();
                }
            }
        }
        cg
    }

    /// Directories below the cgroup, in any hierarchy.
    pub fn children(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .flat_map(|d| std::fs::read_dir(d).unwrap().flatten())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.path())
            .collect()
    }
}

/// Kills every process in a cgroup directory and those below it, then removes them.
pub fn kill_and_remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            kill_and_remove_cgroup_tree(&e.path());
        }
    }
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

impl Drop for HostCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            kill_and_remove_cgroup_tree(d);
        }
    }
}

/// A tiny xorshift generator for tests whose schedule or input is random but replayable
/// from a printed seed (which must not be 0).
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    /// One of `items`.
    pub fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The node's /dev/null still belongs to root: an OCI runtime given it as a user-namespaced
/// container's stdio (crun 1.8 chowns that stdio to the container's root) must not have had it.
pub fn assert_dev_null_is_roots() {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (0, 0),
        "the node's /dev/null was chowned (to fix: chown root:root /dev/null)"
    );
}
