//! crius on a modern node: the node VM of contrib/node-vm (Debian 13 booted by qemu: systemd
//! 257 as PID 1, cgroup v2 only, AppArmor enabled, kernel 6.12), with crius's `.deb` installed
//! and run as the systemd service `crius`. A pod's whole life goes through it with each cgroup
//! driver: the busybox test image pulled from this host's registry (which the guest reaches
//! through qemu's guestfwd, its only way out), a container started, exec'd into, its log read in
//! the guest, stopped and removed, nothing left in the guest's cgroups or systemd units.
//!
//! Runs when `CRIUS_NODE_DEB` names the package to install (`make test` and `make test-node`
//! set it); skipped otherwise. Needs root, qemu and the image `contrib/node-vm/build-image`
//! makes (built here on a cache miss). The guest is powered off, or killed, on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crius_api::v1::image_service_client::ImageServiceClient;
use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use crius_tests::registry::Registry;
use crius_tests::{crius::connect, repo_dir, soak, Error, TestDir};
use tonic::transport::Channel;

/// The guest's address for the host's registry (qemu's guestfwd), with the registry's port.
const GUEST_REGISTRY: &str = "10.0.2.100";
const GUEST_SOCKET: &str = "/run/crius/crius.sock";
/// qemu is killed after this long whatever happens to the test (the smoke with its reboots
/// takes 5 to 7 minutes).
const GUEST_LIFETIME_SECS: u64 = 1500;

/// A running node VM, stopped on drop.
struct Guest {
    script: PathBuf,
    dir: TestDir,
    /// Seconds after each boot at which qemu is killed whatever happens.
    lifetime: u64,
}

impl Guest {
    fn start(registry_port: u16) -> Guest {
        Guest::start_for(registry_port, GUEST_LIFETIME_SECS)
    }

    /// [`Guest::start`] of a guest killed `lifetime` seconds after its boot.
    fn start_for(registry_port: u16, lifetime: u64) -> Guest {
        let guest = Guest {
            script: repo_dir().join("contrib/node-vm/node-vm"),
            dir: TestDir::new("node-vm").unwrap(),
            lifetime,
        };
        let took = guest.boot(registry_port);
        eprintln!("node vm: booted in {took:.1?}");
        guest
    }

    /// `node-vm start` of this guest's directory: how long the boot took.
    fn boot(&self, registry_port: u16) -> Duration {
        let started = Instant::now();
        let out = Command::new(&self.script)
            .args(["start", self.dir.path().to_str().unwrap()])
            .arg(registry_port.to_string())
            // A test killed before its drop leaves no guest for longer than this.
            .env("CRIUS_NODE_VM_LIFETIME", self.lifetime.to_string())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "node-vm start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        started.elapsed()
    }

    /// A power loss and the next boot: qemu killed, then the same disk booted again.
    fn power_cycle(&self, registry_port: u16) {
        let out = self.node_vm(&["kill"]);
        assert!(
            out.status.success(),
            "node-vm kill: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let took = self.boot(registry_port);
        eprintln!("node vm: booted again after a power loss in {took:.1?}");
    }

    /// A clean `systemctl reboot`; returns once the guest answers from its new boot.
    fn reboot(&self) {
        let started = Instant::now();
        let out = self.node_vm(&["reboot"]);
        assert!(
            out.status.success(),
            "node-vm reboot: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("node vm: rebooted in {:.1?}", started.elapsed());
    }

    fn node_vm(&self, args: &[&str]) -> Output {
        let dir = self.dir.path().to_str().unwrap();
        Command::new(&self.script)
            .arg(args[0])
            .arg(dir)
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `cmd` (a shell string) in the guest: stdout, or a panic with stderr.
    fn sh(&self, cmd: &str) -> String {
        let out = self.node_vm(&["ssh", cmd]);
        assert!(
            out.status.success(),
            "in the guest: {cmd}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn copy(&self, file: &Path, guest_dir: &str) {
        let out = self.node_vm(&["copy", file.to_str().unwrap(), guest_dir]);
        assert!(
            out.status.success(),
            "copy {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A client of the guest's crius, through a forward of its socket to the host socket
    /// `<name>.sock` (a new name for each forward: a killed ssh leaves its socket file).
    async fn crius(&self, name: &str) -> Client {
        self.client(name, GUEST_SOCKET).await
    }

    /// A CRI client of the guest's unix socket `socket`, forwarded as [`Guest::crius`] does.
    async fn client(&self, name: &str, socket: &str) -> Client {
        let local = self.dir.join(format!("{name}.sock"));
        let child = Command::new(&self.script)
            .args(["forward", self.dir.path().to_str().unwrap()])
            .arg(&local)
            .arg(socket)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let forward = Forward(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !local.exists() {
            assert!(
                Instant::now() < deadline,
                "no forward of {socket} after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let channel = connect(&local).await.unwrap();
        Client {
            rt: RuntimeServiceClient::new(channel.clone()),
            image: ImageServiceClient::new(channel),
            _forward: forward,
        }
    }
}

impl Drop for Guest {
    /// Never panics (a panic while unwinding would abort the test run): a failed stop is
    /// reported and the guest killed.
    fn drop(&mut self) {
        let run = |what: &str| {
            Command::new(&self.script)
                .arg(what)
                .arg(self.dir.path())
                .stdin(Stdio::null())
                .output()
        };
        match run("stop") {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                eprintln!("node-vm stop: {}", String::from_utf8_lossy(&out.stderr));
                let _ = run("kill");
            }
            Err(e) => eprintln!("node-vm stop: {e}"),
        }
    }
}

/// The `node-vm forward` of a client's socket, killed on drop.
struct Forward(Child);

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Client {
    rt: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    _forward: Forward,
}

/// A pod config as kubelet sends one: its log dir under /var/log/pods, the pod's own network.
fn pod_config(name: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "crius-node".into(),
            attempt: 0,
        }),
        log_directory: format!("/var/log/pods/crius-node_{name}_uid-{name}"),
        labels: HashMap::from([("pod".to_string(), name.to_string())]),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
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

/// crius restarted by systemd with `[cgroup] driver = "<driver>"` in /etc/crius/config.toml.
fn use_driver(guest: &Guest, driver: &str) {
    let out = guest.node_vm(&[
        "ssh",
        &format!(
            "sed -i 's/^driver = .*/driver = \"{driver}\"/' /etc/crius/config.toml && \
             grep -qx 'driver = \"{driver}\"' /etc/crius/config.toml && \
             systemctl restart crius && systemctl is-active crius"
        ),
    ]);
    assert!(
        out.status.success(),
        "crius with the {driver} driver: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        journal(guest)
    );
}

/// RunPodSandbox, PullImage, CreateContainer, StartContainer, ExecSync, the log, StopContainer,
/// RemoveContainer, StopPodSandbox, RemovePodSandbox, with the guest's view of each step.
async fn pod_lifecycle(guest: &Guest, c: &mut Client, image: &str, driver: &str) {
    let started = Instant::now();
    let name = format!("smoke-{driver}");
    let config = pod_config(&name);
    let pod = run_pod(guest, c, &config).await;
    let status =
        c.rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.state, PodSandboxState::SandboxReady as i32);
    let ip = status.network.unwrap().ip;
    assert!(ip.starts_with("10."), "pod ip {ip:?}");

    let image_ref = pull(guest, c, image).await;
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");

    let container = container_config(
        "sh",
        image,
        &[
            "sh",
            "-c",
            "trap 'exit 0' TERM USR1; echo hello from the node; while :; do sleep 1; done",
        ],
    );
    let id = create_start(c, &pod, &config, container)
        .await
        .unwrap_or_else(|s| {
            panic!(
                "Create/StartContainer ({driver}): {s:?}\n{}",
                journal(guest)
            )
        });

    let exec =
        c.rt.exec_sync(ExecSyncRequest {
            container_id: id.clone(),
            cmd: ["sh", "-c", "echo exec in $(hostname); exit 3"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            timeout: 30,
        })
        .await
        .unwrap_or_else(|s| panic!("ExecSync ({driver}): {s:?}\n{}", journal(guest)))
        .into_inner();
    assert_eq!(exec.exit_code, 3, "{exec:?}");
    assert_eq!(
        String::from_utf8_lossy(&exec.stdout).trim(),
        format!("exec in {}", guest.sh("hostname").trim())
    );

    // The container's process as the node sees it: its cgroup (the driver's layout) and its
    // AppArmor label.
    assert_eq!(
        container_status(c, &id).await.state,
        ContainerState::ContainerRunning as i32
    );
    let pid = init_pid(c, &id).await;
    let cgroup = guest.sh(&format!("cat /proc/{pid}/cgroup"));
    let label = guest.sh(&format!("cat /proc/{pid}/attr/apparmor/current"));
    eprintln!(
        "node vm ({driver}): container {id} pid {pid}, cgroup {}, apparmor {}",
        cgroup.trim(),
        label.trim()
    );
    assert!(cgroup.starts_with("0::/"), "not cgroup v2 only: {cgroup}");
    assert!(cgroup.contains(&id), "{driver} cgroup {cgroup}");
    if driver == "systemd" {
        assert!(
            cgroup.trim().ends_with(&format!("crius-{id}.scope")),
            "{cgroup}"
        );
        let state = guest.sh(&format!("systemctl show -P ActiveState crius-{id}.scope"));
        assert_eq!(state.trim(), "active");
    }

    let log = format!("{}/sh/0.log", config.log_directory);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = guest.sh(&format!("cat {log} 2>/dev/null || true"));
        if text.contains(" stdout F hello from the node") {
            break;
        }
        assert!(Instant::now() < deadline, "{log}: {text:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    c.rt.stop_container(StopContainerRequest {
        container_id: id.clone(),
        timeout: 20,
    })
    .await
    .unwrap_or_else(|s| panic!("StopContainer ({driver}): {s:?}\n{}", journal(guest)));
    let status = container_status(c, &id).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    // The test image's stop signal is SIGUSR1, which the trap turns into exit 0.
    assert_eq!(status.exit_code, 0, "the trap ends the shell: {status:?}");

    c.rt.remove_container(RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|s| panic!("RemoveContainer ({driver}): {s:?}"));
    remove_pod(guest, c, &pod).await;

    let pods =
        c.rt.list_pod_sandbox(ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
    assert!(pods.is_empty(), "{pods:?}");
    // Nothing of the pod is left in the node's cgroups or among systemd's units.
    let left = guest.sh(&format!(
        "find /sys/fs/cgroup -name '*{pod}*' -o -name '*{id}*'; \
         systemctl list-units --all --plain --no-legend '*{pod}*' '*{id}*'"
    ));
    assert_eq!(left.trim(), "", "left behind ({driver})");
    eprintln!(
        "node vm ({driver}): pod lifecycle in {:.1?}",
        started.elapsed()
    );
}

/// The end of crius's journal in the guest, for a failure's message.
fn journal(guest: &Guest) -> String {
    let out = guest.node_vm(&["ssh", "journalctl -u crius --no-pager -n 40"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// PullImage of `image`: its image ref, or a panic with the journal.
async fn pull(guest: &Guest, c: &mut Client, image: &str) -> String {
    c.image
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("PullImage {image}: {s:?}\n{}", journal(guest)))
        .into_inner()
        .image_ref
}

/// StopPodSandbox, then RemovePodSandbox, of `pod`: a panic with the journal if either fails.
async fn remove_pod(guest: &Guest, c: &mut Client, pod: &str) {
    c.rt.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod.into(),
    })
    .await
    .unwrap_or_else(|s| panic!("StopPodSandbox {pod}: {s:?}\n{}", journal(guest)));
    c.rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod.into(),
    })
    .await
    .unwrap_or_else(|s| panic!("RemovePodSandbox {pod}: {s:?}\n{}", journal(guest)));
}

#[tokio::test(flavor = "multi_thread")]
async fn crius_deb_runs_pods_on_a_systemd_cgroup2_apparmor_node() {
    let Some(deb) = std::env::var_os("CRIUS_NODE_DEB") else {
        eprintln!("skipped: CRIUS_NODE_DEB names no crius .deb to install in the node VM");
        return;
    };
    let registry = Registry::start().unwrap();
    let pushed = images::push(&registry, TestImage::Busybox).unwrap();
    let port = registry.port();
    let guest_registry = format!("{GUEST_REGISTRY}:{port}");
    let image = pushed
        .reference
        .replace(&registry.host_port(), &guest_registry);

    let guest = Guest::start(port);
    let node = guest.sh(
        "systemctl --version | head -1; uname -r; stat -fc %T /sys/fs/cgroup; \
         cat /sys/module/apparmor/parameters/enabled; \
         awk '$5 == \"/run\" {print $6}' /proc/self/mountinfo",
    );
    eprintln!("node vm: {}", node.trim().replace('\n', " | "));
    let lines: Vec<&str> = node.lines().collect();
    assert!(lines[0].starts_with("systemd 257"), "{node}");
    assert!(lines[1].starts_with("6.12."), "{node}");
    assert_eq!(lines[2], "cgroup2fs", "{node}");
    assert_eq!(lines[3], "Y", "AppArmor: {node}");

    let started = Instant::now();
    guest.copy(Path::new(&deb), "/root/crius.deb");
    guest.sh("dpkg -i /root/crius.deb && systemctl is-enabled crius");
    // The host's registry, over plain HTTP, at the guestfwd address.
    guest.sh(&format!(
        "mkdir -p /etc/crius/certs.d/{guest_registry} && \
         printf 'server = \"http://{guest_registry}\"\\n' > /etc/crius/certs.d/{guest_registry}/hosts.toml"
    ));
    for driver in ["cgroupfs", "systemd"] {
        use_driver(&guest, driver);
        let mut client = guest.crius(driver).await;
        pod_lifecycle(&guest, &mut client, &image, driver).await;
        if driver == "systemd" {
            confinement(&guest, &mut client, &image).await;
        }
    }
    // The service stops cleanly, as on a node's shutdown.
    guest.sh("systemctl stop crius && ! systemctl is-failed crius");
    eprintln!("node vm: install and smoke in {:.1?}", started.elapsed());

    let started = Instant::now();
    guest.sh("systemctl start crius && systemctl is-active crius");
    reboots(&guest, &image, port).await;
    eprintln!(
        "node vm: reboot and power loss in {:.1?}",
        started.elapsed()
    );
}

/// Pods `<prefix>-0` and `<prefix>-1` (attempt `attempt`), each with a sleeper: their ids and
/// the ids of their containers.
async fn sleeping_pods(
    guest: &Guest,
    c: &mut Client,
    image: &str,
    prefix: &str,
    attempt: u32,
) -> Vec<(String, String)> {
    let mut pods = Vec::new();
    for i in 0..2 {
        let mut config = pod_config(&format!("{prefix}-{i}"));
        if let Some(m) = config.metadata.as_mut() {
            m.attempt = attempt;
        }
        let pod = run_pod(guest, c, &config).await;
        // kubelet counts the container's attempts on too: its name is new.
        let mut container = container_config("sleep", image, &["sleep", "3600"]);
        if let Some(m) = container.metadata.as_mut() {
            m.attempt = attempt;
        }
        let id = create_start(c, &pod, &config, container)
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "create and start in {prefix}-{i}: {s:?}\n{}",
                    journal(guest)
                )
            });
        pods.push((pod, id));
    }
    pods
}

/// Waits for systemd to report crius active after a boot (its start probes the runtime
/// handlers, 10 to 20 s under TCG): panics with the journal if it fails or takes over 3 min.
fn wait_active(guest: &Guest) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let out = guest.node_vm(&["ssh", "systemctl is-active crius"]);
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        match state.as_str() {
            "active" => return,
            "activating" | "inactive" if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_secs(1))
            }
            _ => panic!("crius after the boot: {state}\n{}", journal(guest)),
        }
    }
}

/// Polls `cmd` in the guest until it prints nothing (60 s at most): what it prints at the end.
fn until_empty(guest: &Guest, cmd: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = guest.sh(cmd);
        if out.trim().is_empty() || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Addresses host-local still holds for the package's bridge network (a reboot keeps them),
/// CNI attachments crius still caches, and netns pins.
const NETWORK_HELD: &str =
    "ls /var/lib/cni/networks/crius | grep -v -e '^lock$' -e '^last_reserved_ip' | sed 's/^/host-local: /'; \
     ls /var/lib/crius/cni | sed 's/^/attachment: /'; \
     ls /run/crius/netns 2>/dev/null | sed 's/^/netns pin: /'; true";

/// The pods of an earlier boot as crius reports them: every pod not ready, every container
/// exited, none holding an address. `reset` says the boot ended without a shutdown, so no
/// container's end was seen: each must say the node restarted.
async fn after_boot(guest: &Guest, c: &mut Client, pods: &[(String, String)], reset: bool) {
    for (pod, id) in pods {
        let status =
            c.rt.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.clone(),
                verbose: false,
            })
            .await
            .unwrap_or_else(|s| panic!("PodSandboxStatus {pod} after the boot: {s:?}"))
            .into_inner()
            .status
            .unwrap();
        assert_eq!(
            status.state,
            PodSandboxState::SandboxNotready as i32,
            "pod {pod}"
        );
        let container = container_status(c, id).await;
        assert_eq!(
            container.state,
            ContainerState::ContainerExited as i32,
            "{container:?}"
        );
        if reset {
            assert_eq!(container.exit_code, 255, "{container:?}");
            assert_eq!(container.reason, "NodeRestarted", "{container:?}");
            assert!(
                container.message.contains("the node restarted"),
                "{container:?}"
            );
        }
    }
    // Released by crius itself at start, before kubelet stops the old pods.
    let held = until_empty(guest, NETWORK_HELD);
    assert_eq!(
        held.trim(),
        "",
        "network of the earlier boot's pods still held\n{}",
        journal(guest)
    );
}

/// A clean reboot, then a power loss, with pods running each time: after each boot crius runs
/// (started by systemd), reports the earlier pods not ready and their containers exited (after
/// the power loss with reason `NodeRestarted`), has released their addresses on its own, and
/// runs the pods kubelet creates again; once every pod is removed nothing of them is left.
async fn reboots(guest: &Guest, image: &str, registry_port: u16) {
    let mut c = guest.crius("before-reboot").await;
    let first = sleeping_pods(guest, &mut c, image, "boot", 0).await;
    drop(c);

    guest.reboot();
    wait_active(guest);
    let mut c = guest.crius("after-reboot").await;
    after_boot(guest, &mut c, &first, false).await;
    // kubelet's next attempt of the same pods.
    let second = sleeping_pods(guest, &mut c, image, "boot", 1).await;
    drop(c);

    guest.power_cycle(registry_port);
    wait_active(guest);
    let mut c = guest.crius("after-power-loss").await;
    after_boot(guest, &mut c, &first, false).await;
    after_boot(guest, &mut c, &second, true).await;
    let third = sleeping_pods(guest, &mut c, image, "boot", 2).await;

    // kubelet removes what it no longer wants: everything.
    for (pod, _) in first.iter().chain(&second).chain(&third) {
        remove_pod(guest, &mut c, pod).await;
    }
    let containers =
        c.rt.list_containers(ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers;
    assert!(containers.is_empty(), "{containers:?}");
    let left = guest.sh(&format!(
        "{NETWORK_HELD}; ls /var/lib/crius/containers; ls /var/lib/crius/leases; \
         find /sys/fs/cgroup -name 'crius-*' ! -name 'crius-*.slice' -o -path '/sys/fs/cgroup/crius/*'; \
         find /sys/fs/cgroup/crius.slice -mindepth 1 -type d 2>/dev/null; \
         systemctl list-units --all --plain --no-legend 'crius-*'; \
         awk '$5 ~ \"^/run/crius/\" && $5 != \"/run/crius/bin\" {{print $5}}' /proc/self/mountinfo"
    ));
    assert_eq!(left.trim(), "", "left behind after the reboots");
}

/// A container `name` of `image` running `command`, its log at `<name>/0.log`.
fn container_config(name: &str, image: &str, command: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}/0.log"),
        ..Default::default()
    }
}

/// RunPodSandbox of `config` with the default handler: the pod's id.
async fn run_pod(guest: &Guest, c: &mut Client, config: &PodSandboxConfig) -> String {
    c.rt.run_pod_sandbox(RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: String::new(),
    })
    .await
    .unwrap_or_else(|s| panic!("RunPodSandbox: {s:?}\n{}", journal(guest)))
    .into_inner()
    .pod_sandbox_id
}

/// The ContainerStatus of `id`.
async fn container_status(c: &mut Client, id: &str) -> ContainerStatus {
    c.rt.container_status(ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    })
    .await
    .unwrap_or_else(|s| panic!("ContainerStatus {id}: {s:?}"))
    .into_inner()
    .status
    .expect("a status")
}

/// The node's pid of container `id`'s init, from its verbose status.
async fn init_pid(c: &mut Client, id: &str) -> i64 {
    let info =
        c.rt.container_status(ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .unwrap_or_else(|s| panic!("ContainerStatus {id}: {s:?}"))
        .into_inner()
        .info;
    let verbose: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
    verbose["pid"].as_i64().expect("pid in the verbose info")
}

/// `sh -c <script>` in container `id` through ExecSync: (exit code, stdout, stderr).
async fn exec_sh(c: &mut Client, id: &str, script: &str) -> (i32, String, String) {
    let out =
        c.rt.exec_sync(ExecSyncRequest {
            container_id: id.into(),
            cmd: ["sh", "-c", script].iter().map(|s| s.to_string()).collect(),
            timeout: 30,
        })
        .await
        .unwrap_or_else(|s| panic!("ExecSync {script:?}: {s:?}"))
        .into_inner();
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A container of `pod` running `sleep`, with `apparmor` and the resources given, started.
async fn sleeper(
    c: &mut Client,
    pod: &str,
    pod_config: &PodSandboxConfig,
    image: &str,
    name: &str,
    apparmor: Option<SecurityProfile>,
    privileged: bool,
) -> Result<String, tonic::Status> {
    let config = ContainerConfig {
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                memory_limit_in_bytes: 64 << 20,
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                ..Default::default()
            }),
            security_context: Some(LinuxContainerSecurityContext {
                apparmor,
                privileged,
                ..Default::default()
            }),
        }),
        ..container_config(name, image, &["sleep", "600"])
    };
    create_start(c, pod, pod_config, config).await
}

/// CreateContainer of `config` in `pod`, then StartContainer: the new id, or the first error.
async fn create_start(
    c: &mut Client,
    pod: &str,
    pod_config: &PodSandboxConfig,
    config: ContainerConfig,
) -> Result<String, tonic::Status> {
    let id =
        c.rt.create_container(CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(pod_config.clone()),
        })
        .await?
        .into_inner()
        .container_id;
    c.rt.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await?;
    Ok(id)
}

/// What a workload sees of its confinement on this node: its own cgroup namespace with its
/// limits at /sys/fs/cgroup (read-only), crius's default AppArmor profile on the container and
/// its exec'd processes, a Localhost profile enforced, one that is not loaded refused by name,
/// and a privileged container with neither.
async fn confinement(guest: &Guest, c: &mut Client, image: &str) {
    let mut config = pod_config("confined");
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.privileged = true;
    }
    let pod = run_pod(guest, c, &config).await;

    let id = sleeper(c, &pod, &config, image, "default", None, false)
        .await
        .unwrap_or_else(|s| panic!("CreateContainer: {s:?}\n{}", journal(guest)));
    let (code, out, err) = exec_sh(
        c,
        &id,
        "cat /proc/self/cgroup; cat /proc/self/attr/current; echo; \
         cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu.weight; \
         ls /sys/fs/cgroup | grep -c -e '^crius' -e '\\.slice$' -e '\\.scope$'; \
         touch /sys/fs/cgroup/x 2>&1 | grep -c 'Read-only file system'",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    // (AppArmor ends `attr/current` with a newline, some kernels' LSM files not.)
    let lines: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    eprintln!("node vm: inside a container: {}", lines.join(" | "));
    assert_eq!(lines[0], "0::/", "its own cgroup namespace: {out}");
    assert_eq!(lines[1], "crius-default (enforce)", "exec'd process: {out}");
    assert_eq!(lines[2], (64u64 << 20).to_string(), "memory.max: {out}");
    assert_eq!(lines[3], "50000 100000", "cpu.max: {out}");
    // 512 shares, by runc 1.5's conversion (the linear one gave 20).
    assert_eq!(lines[4], "59", "cpu.weight: {out}");
    assert_eq!(lines[5], "0", "other cgroups visible: {out}");
    assert_eq!(lines[6], "1", "/sys/fs/cgroup writable: {out}");
    let pid = init_pid(c, &id).await;
    let label = guest.sh(&format!("cat /proc/{pid}/attr/apparmor/current"));
    assert_eq!(
        label.trim(),
        "crius-default (enforce)",
        "the container's init"
    );

    // The container's scope outlives systemd's daemon-reload and a restart of crius, and the
    // container is the same one afterwards (same init, still confined).
    guest.sh("systemctl daemon-reload && systemctl restart crius && systemctl is-active crius");
    let scope = guest.sh(&format!("systemctl show -P ActiveState crius-{id}.scope"));
    assert_eq!(scope.trim(), "active", "the scope after the restarts");
    // (The client's connection broke with the restart: the first calls may be Unavailable.)
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.rt.version(VersionRequest::default()).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "crius answers no call after its restart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, out, err) = exec_sh(c, &id, "cat /proc/self/cgroup /proc/self/attr/current").await;
    assert_eq!(code, 0, "exec after crius's restart: {out}{err}");
    assert!(out.starts_with("0::/\ncrius-default (enforce)"), "{out}");
    let again = guest.sh(&format!("cat /proc/{pid}/attr/apparmor/current"));
    assert_eq!(
        again.trim(),
        "crius-default (enforce)",
        "the same init after the restart"
    );

    // A Localhost profile the node loaded is enforced; one it did not is refused by name.
    guest.sh(
        "printf 'profile crius-test-deny-write flags=(attach_disconnected) {\\n  file,\\n  \
         deny /** w,\\n}\\n' > /root/deny-write && apparmor_parser --replace /root/deny-write",
    );
    let localhost = |name: &str| SecurityProfile {
        profile_type: security_profile::ProfileType::Localhost as i32,
        localhost_ref: name.into(),
    };
    let denied = sleeper(
        c,
        &pod,
        &config,
        image,
        "deny-write",
        Some(localhost("crius-test-deny-write")),
        false,
    )
    .await
    .unwrap_or_else(|s| panic!("CreateContainer (Localhost): {s:?}\n{}", journal(guest)));
    let (code, out, err) = exec_sh(
        c,
        &denied,
        "cat /proc/self/attr/current; echo; echo x > /tmp/x",
    )
    .await;
    assert!(out.starts_with("crius-test-deny-write (enforce)"), "{out}");
    assert_ne!(code, 0, "a write under deny-write: {out}{err}");
    assert!(err.contains("Permission denied"), "{err}");
    let missing = sleeper(
        c,
        &pod,
        &config,
        image,
        "missing",
        Some(localhost("crius-test-not-loaded")),
        false,
    )
    .await
    .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::InvalidArgument, "{missing:?}");
    assert!(
        missing.message().contains("crius-test-not-loaded")
            && missing.message().contains("not loaded"),
        "{missing:?}"
    );

    // An OOM kill under the driver's cgroup (memory.events of its scope or cgroup) is reported.
    let hog = ContainerConfig {
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                memory_limit_in_bytes: 32 << 20,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..container_config(
            "hog",
            image,
            &[
                "sh",
                "-c",
                "x=0123456789abcdef; while true; do x=$x$x; done",
            ],
        )
    };
    let hog = create_start(c, &pod, &config, hog)
        .await
        .unwrap_or_else(|s| panic!("the hog: {s:?}\n{}", journal(guest)));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        let status = container_status(c, &hog).await;
        if status.state == ContainerState::ContainerExited as i32 {
            break status;
        }
        assert!(Instant::now() < deadline, "the hog still runs: {status:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(status.reason, "OOMKilled", "{status:?}");
    assert_eq!(status.exit_code, 137, "{status:?}");

    // Privileged: unconfined, the node's cgroup namespace.
    let privileged = sleeper(c, &pod, &config, image, "privileged", None, true)
        .await
        .unwrap_or_else(|s| panic!("CreateContainer (privileged): {s:?}\n{}", journal(guest)));
    let (_, out, _) = exec_sh(
        c,
        &privileged,
        "cat /proc/self/attr/current; echo; cat /proc/self/cgroup",
    )
    .await;
    let lines: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines[0], "unconfined", "{out}");
    assert_ne!(lines[1], "0::/", "{out}");

    c.rt.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await
    .unwrap();
    guest.sh("apparmor_parser --remove /root/deny-write");
}

/// containerd's CRI config in the guest for [`bench_pod_start_against_containerd`]: Debian 13's
/// containerd 1.7 with runc and the cgroupfs driver (crius's default), Debian's CNI plugins and
/// the same network config as crius, the host's registry through crius's hosts files, and the
/// sleeper image as its pause.
fn containerd_config(sandbox_image: &str) -> String {
    format!(
        "version = 2\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{sandbox_image}\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  \
         conf_dir = \"/etc/cni/net.d\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/crius/certs.d\"\n"
    )
}

fn median_ms(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples
        .get(samples.len() / 2)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// A benchmark, not a test: RunPodSandbox, and CreateContainer + StartContainer, in the node VM,
/// crius against the containerd 1.7 Debian 13 ships in the same guest (runc, cgroupfs, the same
/// bridge network and image), one call at a time, the two runtimes interleaved. It prints the
/// medians and their ratios and asserts nothing about time (absolute times under TCG mean
/// little; the ratio is the figure). Runs only when `CRIUS_NODE_VM_BENCH` gives the number of
/// pods per runtime (`make bench-node`), with `CRIUS_NODE_DEB` as for the smoke.
#[tokio::test(flavor = "multi_thread")]
async fn bench_pod_start_against_containerd() {
    let (Some(deb), Some(rounds)) = (
        std::env::var_os("CRIUS_NODE_DEB"),
        std::env::var("CRIUS_NODE_VM_BENCH")
            .ok()
            .and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("skipped: set CRIUS_NODE_VM_BENCH=<pods per runtime> and CRIUS_NODE_DEB");
        return;
    };
    let registry = Registry::start().unwrap();
    let busybox = images::push(&registry, TestImage::Busybox).unwrap();
    let sleeper = images::push(&registry, TestImage::Sleeper).unwrap();
    let port = registry.port();
    let guest_registry = format!("{GUEST_REGISTRY}:{port}");
    let in_guest = |r: &str| r.replace(&registry.host_port(), &guest_registry);
    let (image, pause) = (in_guest(&busybox.reference), in_guest(&sleeper.reference));

    let guest = Guest::start(port);
    guest.copy(Path::new(&deb), "/root/crius.deb");
    guest.sh("dpkg -i /root/crius.deb >/dev/null");
    guest.sh(&format!(
        "mkdir -p /etc/crius/certs.d/{guest_registry} && \
         printf 'server = \"http://{guest_registry}\"\\n\\n[host.\"http://{guest_registry}\"]\\n  \
         capabilities = [\"pull\", \"resolve\"]\\n' > /etc/crius/certs.d/{guest_registry}/hosts.toml && \
         mkdir -p /etc/containerd && cat > /etc/containerd/config.toml <<'EOF'\n{}EOF\n\
         systemctl restart crius containerd && systemctl is-active crius containerd",
        containerd_config(&pause)
    ));
    let versions = guest.sh("crius --version; containerd --version; runc --version | head -1");
    eprintln!("node vm bench: {}", versions.trim().replace('\n', " | "));
    let mut runtimes = [
        ("crius", guest.crius("bench-crius").await),
        (
            "containerd",
            guest
                .client("bench-containerd", "/run/containerd/containerd.sock")
                .await,
        ),
    ];
    for (name, c) in runtimes.iter_mut() {
        let wanted = if *name == "containerd" {
            vec![image.clone(), pause.clone()]
        } else {
            vec![image.clone()]
        };
        for i in wanted {
            c.image
                .pull_image(PullImageRequest {
                    image: Some(ImageSpec {
                        image: i.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|s| panic!("{name}: PullImage {i}: {s:?}"));
        }
    }
    let mut run_pod = [Vec::new(), Vec::new()];
    let mut starts = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (k, (name, c)) in runtimes.iter_mut().enumerate() {
            let config = pod_config(&format!("bench-{name}-{round}"));
            let started = Instant::now();
            let pod =
                c.rt.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await
                .unwrap_or_else(|s| panic!("{name}: RunPodSandbox: {s:?}"))
                .into_inner()
                .pod_sandbox_id;
            run_pod[k].push(started.elapsed());
            let container = container_config("sleep", &image, &["sleep", "600"]);
            let started = Instant::now();
            create_start(c, &pod, &config, container)
                .await
                .unwrap_or_else(|s| panic!("{name}: create and start: {s:?}"));
            starts[k].push(started.elapsed());
            c.rt.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            })
            .await
            .unwrap_or_else(|s| panic!("{name}: StopPodSandbox: {s:?}"));
            c.rt.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod,
            })
            .await
            .unwrap_or_else(|s| panic!("{name}: RemovePodSandbox: {s:?}"));
        }
    }
    for (what, samples) in [
        ("RunPodSandbox", &mut run_pod),
        ("CreateContainer + StartContainer", &mut starts),
    ] {
        let (ours, theirs) = (median_ms(&mut samples[0]), median_ms(&mut samples[1]));
        eprintln!(
            "node vm bench: {what}, median of {rounds}: crius {ours:.1} ms, containerd \
             {theirs:.1} ms, crius/containerd {:.2}",
            ours / theirs
        );
    }
}

/// A host registry with the busybox test image, and a guest with package `deb` installed and
/// crius running with the systemd driver, pulling from that registry: (the registry, the
/// image as the guest names it, the guest, the registry's port).
fn systemd_node(deb: &std::ffi::OsStr, lifetime: u64) -> (Registry, String, Guest, u16) {
    let registry = Registry::start().unwrap();
    let pushed = images::push(&registry, TestImage::Busybox).unwrap();
    let port = registry.port();
    let guest_registry = format!("{GUEST_REGISTRY}:{port}");
    let image = pushed
        .reference
        .replace(&registry.host_port(), &guest_registry);
    let guest = Guest::start_for(port, lifetime);
    guest.copy(Path::new(&deb), "/root/crius.deb");
    guest.sh(&format!(
        "dpkg -i /root/crius.deb >/dev/null && mkdir -p /etc/crius/certs.d/{guest_registry} && \
         printf 'server = \"http://{guest_registry}\"\\n' > /etc/crius/certs.d/{guest_registry}/hosts.toml && \
         sed -i 's/^driver = .*/driver = \"systemd\"/' /etc/crius/config.toml && \
         systemctl restart crius && systemctl is-active crius"
    ));
    (registry, image, guest, port)
}

/// What one call of a power-loss burst was answered before the power went.
#[derive(Debug, Default, Clone)]
struct Acked {
    pod: Option<String>,
    container: Option<String>,
    started: bool,
    stopped: bool,
}

/// One of the burst's 20 workers: RunPodSandbox, CreateContainer, StartContainer,
/// StopContainer, in turn, noting each answer as it comes; the first error (the power going)
/// ends it.
async fn burst_worker(
    mut c: RuntimeServiceClient<Channel>,
    image: String,
    name: String,
    acked: std::sync::Arc<std::sync::Mutex<Acked>>,
) {
    let note = |f: &dyn Fn(&mut Acked)| {
        if let Ok(mut a) = acked.lock() {
            f(&mut a);
        }
    };
    let config = pod_config(&name);
    let Ok(pod) = c
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
    else {
        return;
    };
    let pod = pod.into_inner().pod_sandbox_id;
    note(&|a| a.pod = Some(pod.clone()));
    let Ok(id) = c
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container_config("sleep", &image, &["sleep", "3600"])),
            sandbox_config: Some(config),
        })
        .await
    else {
        return;
    };
    let id = id.into_inner().container_id;
    note(&|a| a.container = Some(id.clone()));
    let start = StartContainerRequest {
        container_id: id.clone(),
    };
    if c.start_container(start).await.is_err() {
        return;
    }
    note(&|a| a.started = true);
    let stop = StopContainerRequest {
        container_id: id,
        timeout: 0,
    };
    if c.stop_container(stop).await.is_ok() {
        note(&|a| a.stopped = true);
    }
}

/// A power loss in the middle of work, `CRIUS_NODE_VM_POWER_LOSS` times (`make test-node`: 10):
/// 20 pods at once go through RunPodSandbox, CreateContainer, StartContainer and
/// StopContainer, and qemu is killed at a different moment of the burst each round. After
/// every boot crius runs, its database opens, and what it reports agrees with itself and with
/// what clients were told: every pod whose RunPodSandbox was answered is there and not ready,
/// every container is exited and in a pod crius has, a container whose create was answered is
/// there or reported NotFound (its record is written unflushed, as the README says), none
/// is running, and every pod can be stopped and removed, releasing its address. Skipped
/// unless the variable is set, with `CRIUS_NODE_DEB` as for the smoke.
#[tokio::test(flavor = "multi_thread")]
async fn power_loss_during_a_burst_of_calls() {
    let (Some(deb), Some(rounds)) = (
        std::env::var_os("CRIUS_NODE_DEB"),
        std::env::var("CRIUS_NODE_VM_POWER_LOSS")
            .ok()
            .and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!("skipped: set CRIUS_NODE_VM_POWER_LOSS=<rounds> and CRIUS_NODE_DEB");
        return;
    };
    let (_registry, image, guest, port) = systemd_node(&deb, GUEST_LIFETIME_SECS);
    pull(&guest, &mut guest.crius("pull").await, &image).await;
    for round in 0..rounds {
        let c = guest.crius(&format!("burst-{round}")).await;
        let acked: Vec<_> = (0..20)
            .map(|_| std::sync::Arc::new(std::sync::Mutex::new(Acked::default())))
            .collect();
        let workers: Vec<_> = acked
            .iter()
            .enumerate()
            .map(|(i, a)| {
                tokio::spawn(burst_worker(
                    c.rt.clone(),
                    image.clone(),
                    format!("burst-{round}-{i}"),
                    std::sync::Arc::clone(a),
                ))
            })
            .collect();
        // A different moment of the burst each round, 1 to 28 s in (under TCG the 20 pods
        // are up about 20 s in, their containers after that).
        let cut = Duration::from_millis(1_000 + (round * 3_000) % 30_000);
        tokio::time::sleep(cut).await;
        guest.power_cycle(port);
        for w in workers {
            let _ = w.await;
        }
        drop(c);
        let acked: Vec<Acked> = acked
            .iter()
            .map(|a| a.lock().map(|a| a.clone()).unwrap_or_default())
            .collect();
        wait_active(&guest);
        let mut c = guest.crius(&format!("after-burst-{round}")).await;
        let summary = after_power_loss(&guest, &mut c, &acked).await;
        eprintln!("node vm: power loss {round} at {cut:?} into the burst: {summary}");
    }
}

/// The checks of [`power_loss_during_a_burst_of_calls`] after one boot, then every pod
/// stopped and removed and nothing of them left: a line saying what the clients had been told.
async fn after_power_loss(guest: &Guest, c: &mut Client, acked: &[Acked]) -> String {
    let pods =
        c.rt.list_pod_sandbox(ListPodSandboxRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListPodSandbox after the boot: {s:?}\n{}", journal(guest)))
            .into_inner()
            .items;
    let containers =
        c.rt.list_containers(ListContainersRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListContainers after the boot: {s:?}\n{}", journal(guest)))
            .into_inner()
            .containers;
    let pod_ids: std::collections::HashSet<&str> = pods.iter().map(|p| p.id.as_str()).collect();
    for p in &pods {
        assert_eq!(p.state, PodSandboxState::SandboxNotready as i32, "{p:?}");
    }
    for k in &containers {
        assert!(
            pod_ids.contains(k.pod_sandbox_id.as_str()),
            "container {} in a pod crius does not list",
            k.id
        );
        let status = container_status(c, &k.id).await;
        assert_eq!(
            status.state,
            ContainerState::ContainerExited as i32,
            "{status:?}"
        );
    }
    let (mut pods_acked, mut created, mut started, mut stopped, mut creates_lost) = (0, 0, 0, 0, 0);
    for a in acked {
        if let Some(pod) = &a.pod {
            pods_acked += 1;
            assert!(
                pod_ids.contains(pod.as_str()),
                "pod {pod} was answered, then lost"
            );
        }
        if let Some(id) = &a.container {
            created += 1;
            started += a.started as u32;
            stopped += a.stopped as u32;
            let got =
                c.rt.container_status(ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await;
            match got {
                Ok(s) => {
                    let s = s.into_inner().status.expect("a status");
                    assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");
                }
                Err(s) if s.code() == tonic::Code::NotFound => creates_lost += 1,
                Err(s) => panic!("ContainerStatus {id} after the boot: {s:?}"),
            }
        }
    }
    for p in &pods {
        remove_pod(guest, c, &p.id).await;
    }
    // Interrupted creates are removed in the background after the boot: given a minute.
    let left = until_empty(
        guest,
        &format!(
            "{NETWORK_HELD}; cd /var/lib/crius && ls -d containers/* leases/* 2>/dev/null; \
             systemctl list-units --all --plain --no-legend 'crius-*'; \
             find /sys/fs/cgroup/crius.slice -mindepth 1 -type d 2>/dev/null; true"
        ),
    );
    assert_eq!(
        left.trim(),
        "",
        "left behind after removing every pod\n{}",
        journal(guest)
    );
    format!(
        "{} pods listed ({pods_acked} answered), {} containers ({created} creates answered, \
         {creates_lost} of them gone; {started} starts, {stopped} stops answered)",
        pods.len(),
        containers.len()
    )
}

/// The version dpkg has of crius in the guest.
fn installed_version(guest: &Guest) -> String {
    guest
        .sh("dpkg-query -W -f '${Version}' crius")
        .trim()
        .to_string()
}

/// The pid of crius's main process, as systemd knows it.
fn crius_pid(guest: &Guest) -> String {
    guest
        .sh("systemctl show -P MainPID crius")
        .trim()
        .to_string()
}

/// The numbers a counting container wrote to its CRI log (`<ts> stdout F line N`), in order.
fn logged_numbers(guest: &Guest, pod: &str, name: &str) -> Vec<u64> {
    let log = guest.sh(&format!(
        "cat /var/log/pods/crius-node_{pod}_uid-{pod}/{name}/0.log"
    ));
    log.lines()
        .filter_map(|l| {
            l.rsplit_once("line ")
                .and_then(|(_, n)| n.trim().parse().ok())
        })
        .collect()
}

/// What a package upgrade (and a downgrade back) does to a node's running work
/// (`CRIUS_NODE_VM_UPGRADE=1`, set by `make test-node`; with `CRIUS_NODE_DEB` as for the
/// smoke): 20 pods run a container each that writes a numbered log line five times a second,
/// an ExecSync is in flight, and the package is installed with apt over itself at a newer
/// version (the same files, repackaged), then the older one again. Each time the postinst
/// restarts crius (a new main pid, the package's version), no container restarts (same init
/// pid and start time, still running), the logs have every number once and in order, the
/// ExecSync in flight ends with an answer or a clean Unavailable, a new one works, and after
/// every pod is removed nothing is left.
#[tokio::test(flavor = "multi_thread")]
async fn package_upgrade_and_downgrade_keep_pods_running() {
    let (Some(deb), Some(_)) = (
        std::env::var_os("CRIUS_NODE_DEB"),
        std::env::var_os("CRIUS_NODE_VM_UPGRADE"),
    ) else {
        eprintln!("skipped: set CRIUS_NODE_VM_UPGRADE=1 and CRIUS_NODE_DEB");
        return;
    };
    let (_registry, image, guest, _) = systemd_node(&deb, GUEST_LIFETIME_SECS);
    // The newer package: the same files at a higher version, as a point release would be.
    let older = installed_version(&guest);
    let newer = format!("{older}+upgrade1");
    guest.sh(&format!(
        "rm -rf /root/up && dpkg-deb -R /root/crius.deb /root/up && \
         sed -i 's/^Version: .*/Version: {newer}/' /root/up/DEBIAN/control && \
         dpkg-deb -b /root/up /root/crius-newer.deb >/dev/null && rm -rf /root/up"
    ));

    let mut c = guest.crius("upgrade").await;
    pull(&guest, &mut c, &image).await;
    let started = Instant::now();
    let counter = "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.2; done";
    let mut running = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (mut rt, image) = (c.rt.clone(), image.clone());
        tasks.push(tokio::spawn(async move {
            let name = format!("up-{i}");
            let config = pod_config(&name);
            let pod = rt
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await?
                .into_inner()
                .pod_sandbox_id;
            let id = rt
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.clone(),
                    config: Some(container_config("count", &image, &["sh", "-c", counter])),
                    sandbox_config: Some(config),
                })
                .await?
                .into_inner()
                .container_id;
            rt.start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await?;
            Ok::<_, tonic::Status>((name, pod, id))
        }));
    }
    for t in tasks {
        running.push(
            t.await
                .unwrap()
                .unwrap_or_else(|s| panic!("a pod of the 20: {s:?}\n{}", journal(&guest))),
        );
    }
    eprintln!("node vm: 20 pods up in {:.1?}", started.elapsed());
    let mut before = Vec::new();
    for (_, _, id) in &running {
        let s = container_status(&mut c, id).await;
        before.push((init_pid(&mut c, id).await, s.started_at));
    }

    for (step, package, version) in [
        ("upgrade", "/root/crius-newer.deb", newer.as_str()),
        ("downgrade", "/root/crius.deb", older.as_str()),
    ] {
        let pid = crius_pid(&guest);
        let (_, _, first) = &running[0];
        let mut rt = c.rt.clone();
        let in_flight_id = first.clone();
        let in_flight = tokio::spawn(async move {
            rt.exec_sync(ExecSyncRequest {
                container_id: in_flight_id,
                cmd: vec!["sh".into(), "-c".into(), "sleep 8; echo done".into()],
                timeout: 60,
            })
            .await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let took = Instant::now();
        guest.sh(&format!(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades \
             {package} >/dev/null"
        ));
        wait_active(&guest);
        eprintln!("node vm: {step} to {version} in {:.1?}", took.elapsed());
        assert_eq!(installed_version(&guest), version);
        assert_ne!(
            crius_pid(&guest),
            pid,
            "{step}: the postinst restarted crius"
        );
        // The old crius's connection goes with it: an answer, or the transport's end.
        match in_flight.await.unwrap() {
            Ok(out) => assert_eq!(String::from_utf8_lossy(&out.into_inner().stdout), "done\n"),
            Err(s) => {
                assert!(
                    matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown),
                    "{step}: ExecSync in flight: {s:?}"
                );
                eprintln!(
                    "node vm: {step}: the ExecSync in flight ended with {:?}",
                    s.code()
                );
            }
        }
        drop(c);
        c = guest.crius(&format!("after-{step}")).await;
        for ((name, _, id), (pid, started_at)) in running.iter().zip(&before) {
            let s = container_status(&mut c, id).await;
            assert_eq!(
                s.state,
                ContainerState::ContainerRunning as i32,
                "{step}: {s:?}"
            );
            assert_eq!(s.started_at, *started_at, "{step}: {name} restarted");
            assert_eq!(init_pid(&mut c, id).await, *pid, "{step}: {name} restarted");
        }
        let (code, out, _) = exec_sh(&mut c, first, "echo still here").await;
        assert_eq!((code, out.as_str()), (0, "still here\n"), "{step}");
    }
    // Every line once, in order, across both restarts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (name, pod, _) in &running {
        let numbers = logged_numbers(&guest, name, "count");
        assert!(numbers.len() > 20, "{name}: {} lines", numbers.len());
        let expected: Vec<u64> = (0..numbers.len() as u64).collect();
        assert_eq!(
            numbers, expected,
            "{name} ({pod}): a gap or a repeat in its log"
        );
    }
    for (_, pod, _) in &running {
        remove_pod(&guest, &mut c, pod).await;
    }
    let left = until_empty(
        &guest,
        &format!(
            "{NETWORK_HELD}; cd /var/lib/crius && ls -d containers/* leases/* 2>/dev/null; \
             systemctl list-units --all --plain --no-legend 'crius-*'; true"
        ),
    );
    assert_eq!(
        left.trim(),
        "",
        "left behind after the pods\n{}",
        journal(&guest)
    );
}

/// A runtime of the guest read over ssh, for [`soak_with_churn_probes_and_logs`].
struct InGuest {
    script: PathBuf,
    dir: PathBuf,
    runtime: &'static GuestRuntime,
}

/// Where [`soak::SAMPLER`] finds a runtime in the guest, and how its log says a line is a
/// warning or an error.
struct GuestRuntime {
    unit: &'static str,
    db: &'static str,
    shim: &'static str,
    /// `grep` arguments picking its warnings and errors out of the journal.
    complaints: &'static str,
}

const CRIUS_IN_GUEST: GuestRuntime = GuestRuntime {
    unit: "crius",
    db: "/var/lib/crius/crius.db",
    shim: "crius-shim",
    complaints: "-e ' WARN ' -e ' ERROR '",
};

const CONTAINERD_IN_GUEST: GuestRuntime = GuestRuntime {
    unit: "containerd",
    db: "/var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db",
    shim: "containerd-shim-runc-v2",
    complaints: "-e level=warning -e level=error",
};

impl InGuest {
    fn sh(&self, cmd: &str) -> crius_tests::Result<String> {
        let out = Command::new(&self.script)
            .arg("ssh")
            .arg(&self.dir)
            .arg(cmd)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Node(format!("node-vm ssh: {e}")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(Error::Node(format!("in the guest: {}: {err}", out.status)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl soak::Node for InGuest {
    fn sample(&mut self) -> crius_tests::Result<soak::Sample> {
        let GuestRuntime { unit, db, shim, .. } = self.runtime;
        let out = self.sh(&format!(
            "python3 - --daemon-pid \"$(systemctl show -p MainPID --value {unit})\" \
             --db {db} --shim {shim} --filter '' <<'EOF'\n{}\nEOF",
            soak::SAMPLER
        ))?;
        soak::Sample::parse(&out)
    }

    fn read(&mut self, path: &str) -> crius_tests::Result<String> {
        self.sh(&format!("cat '{path}'"))
    }

    fn complaints(&mut self) -> crius_tests::Result<Vec<String>> {
        let GuestRuntime {
            unit, complaints, ..
        } = self.runtime;
        let out = self.sh(&format!(
            "journalctl -u {unit} --no-pager -o cat | grep {complaints}; true"
        ))?;
        Ok(out.lines().map(String::from).collect())
    }
}

/// Issue 49's soak in the node VM, shorter than on the host (`tests/tests/e2e/soak.rs`): pods
/// (`CRIUS_NODE_VM_SOAK_PODS`, 20) for `CRIUS_NODE_VM_SOAK` minutes under kubelet's relist,
/// stats and an exec probe of each pod every 10 s, one pod replaced every 30 s with its log
/// checked, the daemon's and the shims' resources printed each minute. Asserts no failed call,
/// no log with a gap or a repeat, no error in crius's journal, nothing left after the pods.
/// With `CRIUS_NODE_VM_SOAK_CONTAINERD=1` the same soak then runs against the guest's
/// containerd 1.7 (runc, cgroupfs, the same network and image; its pause the sleeper image),
/// for its figures beside crius's: nothing is asserted of it.
#[tokio::test(flavor = "multi_thread")]
async fn soak_with_churn_probes_and_logs() {
    let (Some(deb), Some(mins)) = (
        std::env::var_os("CRIUS_NODE_DEB"),
        std::env::var("CRIUS_NODE_VM_SOAK")
            .ok()
            .and_then(|n| n.parse::<f64>().ok()),
    ) else {
        eprintln!("skipped: set CRIUS_NODE_VM_SOAK=<minutes> and CRIUS_NODE_DEB");
        return;
    };
    let pods = std::env::var("CRIUS_NODE_VM_SOAK_PODS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let duration = Duration::from_secs_f64(mins * 60.0);
    let lifetime = duration.as_secs() + 1800;
    let (registry, image, guest, port) = systemd_node(&deb, lifetime);
    let c = guest.crius("soak").await;
    pull(&guest, &mut guest.crius("pull").await, &image).await;
    let plan = soak::Plan {
        pods,
        duration,
        churn_every: Duration::from_secs(30),
        probe_every: Duration::from_secs(10),
        sample_every: Duration::from_secs(60).min(duration / 4),
        warmup: Duration::from_secs(180).min(duration / 4),
        parallel_starts: 5,
    };
    let shape = std::sync::Arc::new(soak::Shape {
        pod: Box::new(pod_config),
        container: Box::new({
            let image = image.clone();
            move |name| container_config(name, &image, soak::LOGGER)
        }),
    });
    let in_guest = |runtime| InGuest {
        script: guest.script.clone(),
        dir: guest.dir.path().to_path_buf(),
        runtime,
    };
    let mut node = in_guest(&CRIUS_IN_GUEST);
    let report = soak::run(
        c.rt.clone(),
        &plan,
        shape.clone(),
        Box::new(in_guest(&CRIUS_IN_GUEST)),
    )
    .await;
    println!(
        "node vm soak, {pods} pods, {mins} min:\n{}",
        report.render()
    );
    let complaints = soak::Node::complaints(&mut node).unwrap();
    println!(
        "crius's journal, WARN and ERROR: {} lines",
        complaints.len()
    );
    for (shape, n) in soak::shapes(&complaints) {
        println!("  {n:>5} x {shape}");
    }
    let errors: Vec<&String> = complaints
        .iter()
        .filter(|l| l.contains(" ERROR "))
        .collect();
    assert!(errors.is_empty(), "crius logged errors: {errors:#?}");
    assert_eq!(report.failed, 0, "failed calls: {:#?}", report.failures);
    assert!(report.log_problems.is_empty(), "{:#?}", report.log_problems);
    assert!(report.cycles > 0, "the churn replaced no pod");
    assert!(report.saw_every_shim(), "the sampler missed shims");
    let after = report.after.expect("a sample after the pods were removed");
    assert!(
        after.shims.is_empty(),
        "shims left: {:?}",
        after.shims.keys()
    );
    let left = until_empty(
        &guest,
        &format!(
            "{NETWORK_HELD}; cd /var/lib/crius && ls -d containers/* leases/* 2>/dev/null; \
             systemctl list-units --all --plain --no-legend 'crius-*'; \
             find /sys/fs/cgroup/crius.slice -mindepth 1 -type d 2>/dev/null; true"
        ),
    );
    assert_eq!(
        left.trim(),
        "",
        "left behind after the soak\n{}",
        journal(&guest)
    );
    if std::env::var_os("CRIUS_NODE_VM_SOAK_CONTAINERD").is_some() {
        soak_containerd(&guest, &registry, port, &image, &plan, shape).await;
    }
}

/// [`soak_with_churn_probes_and_logs`]'s soak against the guest's containerd: its figures.
async fn soak_containerd(
    guest: &Guest,
    registry: &Registry,
    port: u16,
    image: &str,
    plan: &soak::Plan,
    shape: std::sync::Arc<soak::Shape>,
) {
    let sleeper = images::push(registry, TestImage::Sleeper).unwrap();
    let pause = sleeper
        .reference
        .replace(&registry.host_port(), &format!("{GUEST_REGISTRY}:{port}"));
    // containerd takes a host without `[host]` capabilities for an HTTPS one.
    let guest_registry = format!("{GUEST_REGISTRY}:{port}");
    guest.sh(&format!(
        "printf 'server = \"http://{guest_registry}\"\\n\\n[host.\"http://{guest_registry}\"]\\n  \
         capabilities = [\"pull\", \"resolve\"]\\n' > /etc/crius/certs.d/{guest_registry}/hosts.toml && \
         mkdir -p /etc/containerd && cat > /etc/containerd/config.toml <<'EOF'\n{}EOF\n\
         systemctl restart containerd && systemctl is-active containerd",
        containerd_config(&pause)
    ));
    // The pods take crius's pods' names again: their logs (which only kubelet removes) go.
    guest.sh("rm -rf /var/log/pods/crius-node_soak-*");
    let versions = guest.sh("containerd --version; runc --version | head -1");
    println!(
        "node vm soak against {}",
        versions.trim().replace('\n', " | ")
    );
    let mut c = guest
        .client("soak-containerd", "/run/containerd/containerd.sock")
        .await;
    for i in [image, pause.as_str()] {
        pull(guest, &mut c, i).await;
    }
    let report = soak::run(
        c.rt.clone(),
        plan,
        shape,
        Box::new(InGuest {
            script: guest.script.clone(),
            dir: guest.dir.path().to_path_buf(),
            runtime: &CONTAINERD_IN_GUEST,
        }),
    )
    .await;
    println!(
        "node vm soak, containerd, {} pods:\n{}",
        plan.pods,
        report.render()
    );
    let complaints = soak::Node::complaints(&mut InGuest {
        script: guest.script.clone(),
        dir: guest.dir.path().to_path_buf(),
        runtime: &CONTAINERD_IN_GUEST,
    })
    .unwrap_or_default();
    println!(
        "containerd's journal, warning and error: {} lines",
        complaints.len()
    );
    for (shape, n) in soak::shapes(&complaints).into_iter().take(20) {
        println!("  {n:>5} x {shape}");
    }
}
