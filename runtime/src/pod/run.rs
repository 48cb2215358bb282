//! `RunPodSandbox`: validation, then the record, the pod's files, network namespace, network and
//! pause process, each step undone by one teardown if a later one fails.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crius_api::v1::{ContainerEventType, NamespaceMode, PodSandboxConfig};
use prost::Message as _;

use super::{files, namespace_modes, write_spec, PodPaths, SandboxRecord, SandboxState};
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::Handler;
use crate::mounts;
use crate::store::Flush;
use crate::userns::IdMaps;
use crate::util::{check_name, excerpt, new_id, now_nanos, Phases};

fn validate(config: &PodSandboxConfig) -> Result<()> {
    let Some(m) = config.metadata.as_ref() else {
        return Err(Error::InvalidArgument("config.metadata is required".into()));
    };
    for (field, value) in [
        ("config.metadata.name", &m.name),
        ("config.metadata.namespace", &m.namespace),
        ("config.metadata.uid", &m.uid),
    ] {
        check_name(field, value).map_err(Error::InvalidArgument)?;
    }
    if config.hostname.len() > 64 || config.hostname.contains(['/', '\0', '\n']) {
        return Err(Error::InvalidArgument(format!(
            "config.hostname {:?} is not a valid hostname (at most 64 bytes)",
            excerpt(&config.hostname)
        )));
    }
    if let Some(linux) = &config.linux {
        cgroups::check_cgroup_parent("config.linux.cgroup_parent", &linux.cgroup_parent)
            .map_err(Error::InvalidArgument)?;
        for (field, r) in [
            ("config.linux.resources", &linux.resources),
            ("config.linux.overhead", &linux.overhead),
        ] {
            if let Some(r) = r {
                cgroups::check_resources(field, r)?;
            }
        }
    }
    // A pod's namespaces are made with it: there is no container to join yet.
    let (network, pid, ipc) = namespace_modes(config);
    for (field, m) in [("network", network), ("pid", pid), ("ipc", ipc)] {
        if m == NamespaceMode::Target {
            return Err(Error::InvalidArgument(format!(
                "namespace_options {field} TARGET is for a container joining another \
                 container's namespace, not for a pod"
            )));
        }
    }
    validate_log_directory(config)?;
    validate_host_network_hostname(config)?;
    if let Some(dns) = &config.dns_config {
        files::validate_dns(dns)?;
    }
    validate_ports(config)
}

/// The log directory: absolute, and a directory if something is there.
fn validate_log_directory(config: &PodSandboxConfig) -> Result<()> {
    // Resolved against crius's own working directory otherwise.
    if !config.log_directory.is_empty()
        && (!config.log_directory.starts_with('/') || config.log_directory.contains('\0'))
    {
        return Err(Error::InvalidArgument(format!(
            "config.log_directory {:?} must be an absolute path",
            excerpt(&config.log_directory)
        )));
    }
    // Made when the first container logs; something else in its place fails every create.
    if std::fs::metadata(&config.log_directory).is_ok_and(|m| !m.is_dir()) {
        return Err(Error::InvalidArgument(format!(
            "config.log_directory {:?} is not a directory",
            excerpt(&config.log_directory)
        )));
    }
    Ok(())
}

/// A host-network pod shares the node's UTS namespace: a hostname of its own would show in
/// /etc/hostname and $HOSTNAME while `hostname` says the node's.
fn validate_host_network_hostname(config: &PodSandboxConfig) -> Result<()> {
    if !config.hostname.is_empty() && namespace_modes(config).0 == NamespaceMode::Node {
        let node = files::node_hostname();
        if config.hostname != node {
            return Err(Error::InvalidArgument(format!(
                "config.hostname {:?}: a pod with host network (namespace_options.network NODE) \
                 has the node's hostname {node:?} and cannot set its own",
                config.hostname
            )));
        }
    }
    Ok(())
}

/// Port mappings: ports in range, a host port to a container port, each host port once, host
/// IPs that are addresses.
fn validate_ports(config: &PodSandboxConfig) -> Result<()> {
    let mut published = std::collections::HashMap::new();
    for (i, p) in config.port_mappings.iter().enumerate() {
        let ok = |v: i32| (0..=65535).contains(&v);
        if !ok(p.host_port) || !ok(p.container_port) {
            return Err(Error::InvalidArgument(format!(
                "port_mappings[{i}]: port out of range (container {}, host {})",
                p.container_port, p.host_port
            )));
        }
        // A mapping without a host port publishes nothing (it is not given to CNI).
        if p.host_port == 0 {
            continue;
        }
        if p.container_port == 0 {
            return Err(Error::InvalidArgument(format!(
                "port_mappings[{i}]: host port {} goes to container port 0",
                p.host_port
            )));
        }
        // Two rules for one host port: the second would never see a packet.
        let key = (p.protocol, p.host_ip.as_str(), p.host_port);
        if let Some(first) = published.insert(key, i) {
            return Err(Error::InvalidArgument(format!(
                "port_mappings[{i}]: host port {} ({}) is port_mappings[{first}]'s already",
                p.host_port,
                if p.host_ip.is_empty() {
                    "all addresses"
                } else {
                    &p.host_ip
                }
            )));
        }
        if !p.host_ip.is_empty() && p.host_ip.parse::<std::net::IpAddr>().is_err() {
            return Err(Error::InvalidArgument(format!(
                "port_mappings[{i}].host_ip {:?} is not an IP address",
                excerpt(&p.host_ip)
            )));
        }
    }
    Ok(())
}

/// What CNI needs to know of a pod.
fn pod_network(
    record: &SandboxRecord,
    config: &PodSandboxConfig,
    netns: &Path,
) -> Result<crius_cni::PodNetwork> {
    let meta = config.metadata.clone().unwrap_or_default();
    let annotations: BTreeMap<String, String> = config
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let bandwidth = crius_cni::Bandwidth::from_annotations(&annotations)
        .map_err(|e| Error::InvalidArgument(crate::error::chain(&e)))?;
    let port_mappings = config
        .port_mappings
        .iter()
        .map(|p| crius_cni::PortMapping {
            host_port: p.host_port as u16,
            container_port: p.container_port as u16,
            protocol: match crius_api::v1::Protocol::try_from(p.protocol) {
                Ok(crius_api::v1::Protocol::Udp) => "udp",
                Ok(crius_api::v1::Protocol::Sctp) => "sctp",
                _ => "tcp",
            }
            .to_string(),
            host_ip: p.host_ip.clone(),
        })
        .collect();
    Ok(crius_cni::PodNetwork {
        id: record.id.clone(),
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        netns_path: netns.to_path_buf(),
        port_mappings,
        bandwidth,
        dns: config.dns_config.as_ref().map(|d| crius_cni::DnsConfig {
            servers: d.servers.clone(),
            searches: d.searches.clone(),
            options: d.options.clone(),
        }),
        annotations,
        cgroup_path: Some(record.cgroup.clone()),
    })
}

impl Daemon {
    /// `RunPodSandbox`: returns the new pod's id once its pause process runs.
    pub async fn run_pod(
        self: &Arc<Self>,
        config: PodSandboxConfig,
        runtime_handler: String,
    ) -> Result<String> {
        let mut phases = Phases::start();
        validate(&config)?;
        let handler = self.handlers().get(&runtime_handler)?.clone();
        // Held to the end: a plugin synchronizing meanwhile sees this pod in its snapshot or
        // as an event, never neither nor both.
        let _nri_sync = self.nri.block_sync().await;
        let id_maps = self.check_pod_userns(&config, &handler)?;
        let id = new_id().map_err(|e| Error::internal("draw a pod id", e))?;
        let record = new_record(&id, &config, runtime_handler)?;
        let lock = self.locks.lock(&id).await;
        phases.mark("checks");
        // The name and the record in one durable commit.
        let name = &record.name;
        if let Some(holder) =
            self.sandboxes
                .put_named(&self.store, &id, record.clone(), name, Flush::Now)?
        {
            return Err(Error::AlreadyExists(format!(
                "pod sandbox name {name:?} is reserved for {holder}"
            )));
        }
        phases.mark("reserve");
        let pod = PodStart {
            config: &config,
            handler: &handler,
            paths: PodPaths::new(&self.config.state, &id),
            id_maps,
        };
        if let Err(e) = self.setup_pod(record, &pod, &mut phases).await {
            tracing::warn!(pod = %id, "run pod failed, undoing: {e}");
            if let Err(undo) = self.teardown_pod(&lock, true).await {
                tracing::error!(pod = %id, "undo of a failed pod start: {undo}");
            }
            return Err(e);
        }
        self.watch_pod(id.clone());
        self.events
            .emit(ContainerEventType::ContainerCreatedEvent, &id, &id);
        self.events
            .emit(ContainerEventType::ContainerStartedEvent, &id, &id);
        Ok(id)
    }

    /// The id maps of a pod that asks for a user namespace, once it is checked that it can
    /// have one here: the node and the handler support them, and the pod's ids reach crius's
    /// directories (checked at start with stand-in ids; checked again with the pod's, before
    /// anything is made, as a directory may have changed since).
    fn check_pod_userns(
        &self,
        config: &PodSandboxConfig,
        handler: &Handler,
    ) -> Result<Option<IdMaps>> {
        let Some(maps) = crate::spec::pod_id_maps(config)? else {
            return Ok(None);
        };
        self.userns_support().map_err(|why| {
            Error::FailedPrecondition(format!(
                "userns_options mode POD: user namespaces are not supported on this node: {why}"
            ))
        })?;
        if !handler.user_namespaces {
            return Err(Error::FailedPrecondition(format!(
                "userns_options mode POD: runtime handler {:?} does not support user \
                 namespaces (Status lists what each handler supports)",
                handler.name
            )));
        }
        if let Some((uid, gid)) = maps.host_root() {
            let dirs = [self.config.root.as_path(), self.config.state.as_path()];
            crate::userns::reachable(&dirs, &self.pause_binary, uid, gid).map_err(|why| {
                Error::FailedPrecondition(format!("userns_options mode POD: {why}"))
            })?;
        }
        Ok(Some(maps))
    }

    /// Everything after the record: files, shm, namespaces, network and pause, NRI, `Ready`.
    async fn setup_pod(
        self: &Arc<Self>,
        mut record: SandboxRecord,
        pod: &PodStart<'_>,
        phases: &mut Phases,
    ) -> Result<()> {
        let shm = self.make_pod_files(&record, pod)?;
        phases.mark("files");
        if let Some((uid, gid)) = pod.id_maps_root() {
            // the pod's root owns its /etc files, as it would without a user namespace
            files::chown(&pod.paths.dir, uid, gid)?;
        }
        if !record.host_network {
            record.netns = Some(make_netns(&record.id, pod).await?);
            phases.mark("netns");
        }
        // Under the built-in handler the network plugins configure the namespace while the
        // shim starts the pause in it: neither needs the other, and each takes about as long.
        // Both run to their end before an error of either is acted on, so the teardown finds
        // each finished or not begun. An `oci` handler's runtime may read the namespace's
        // interfaces when it creates the sandbox (gVisor's `--network=sandbox`, VM runtimes),
        // so there the network comes first, as containerd does it.
        let network = self.set_up_network(&record, pod.config);
        let pause = self.start_pause(&record, pod, shm.as_deref());
        let (network, pause) = if pod.handler.oci_runtime().is_none() {
            tokio::join!(network, pause)
        } else {
            let network = network.await?;
            (Ok(network), pause.await)
        };
        let ((ips, cni_took), (pid, pause_took)) = (network?, pause?);
        phases.mark("network_and_pause");
        phases.add("cni_add", cni_took);
        phases.add("pause", pause_took.total());
        phases.extend(pause_took);
        record.ips = ips.iter().map(|ip| ip.to_string()).collect();
        record.pause_pid = u32::try_from(pid).ok();
        self.pod_ready(record, phases).await
    }

    /// The pod's directory with its `/etc` files, and its `/dev/shm` unless it shares the
    /// node's IPC namespace (then `None`).
    fn make_pod_files(
        &self,
        record: &SandboxRecord,
        pod: &PodStart<'_>,
    ) -> Result<Option<PathBuf>> {
        let paths = &pod.paths;
        std::fs::create_dir_all(&paths.dir)
            .map_err(|e| Error::internal(format!("create {}", paths.dir.display()), e))?;
        files::write(
            &paths.dir,
            &record.hostname,
            pod.config.dns_config.as_ref(),
            record.host_network,
        )?;
        if namespace_modes(pod.config).2 == NamespaceMode::Node {
            return Ok(None);
        }
        mounts::mount_shm(&paths.shm, self.config.runtime.shm_size)?;
        Ok(Some(paths.shm.clone()))
    }

    /// CNI ADD for the pod's namespace: its IPs (IPv4 first) and how long the plugins took.
    async fn set_up_network(
        &self,
        record: &SandboxRecord,
        config: &PodSandboxConfig,
    ) -> Result<(Vec<IpAddr>, Duration)> {
        let Some(netns) = &record.netns else {
            return Ok((Vec::new(), Duration::ZERO));
        };
        let network = pod_network(record, config, netns)?;
        let timer = crate::telemetry::Timer::start();
        let result = self.network.setup(&network).await;
        let metrics = crate::telemetry::metrics();
        let (ok, took) = (result.is_ok(), timer.elapsed());
        metrics.network_operation("set_up_pod", ok, took, &metrics.sandbox_create_network);
        let mut ips: Vec<IpAddr> = result?.pod_ips();
        ips.sort_by_key(|ip| ip.is_ipv6());
        Ok((ips, took))
    }

    /// Shows the started pod to NRI plugins and records it `Ready`.
    async fn pod_ready(
        self: &Arc<Self>,
        mut record: SandboxRecord,
        phases: &mut Phases,
    ) -> Result<()> {
        let id = record.id.clone();
        // Still Creating, so not listed: plugins see the pod before any client can use it,
        // and a plugin's refusal undoes it.
        if self.nri.active() {
            self.nri
                .run_pod_sandbox(&crate::nri::convert::pod(&record))
                .await?;
        } else {
            self.nri.note_created(&id);
        }
        record.state = SandboxState::Ready;
        self.sandboxes.put(&self.store, &id, record)?;
        phases.mark("record");
        tracing::debug!(pod = %id, phases = %phases, "run phases");
        // The pod's first container is created with a helper that is ready.
        self.prepare_shim_helper_after_reply(&id);
        Ok(())
    }
}

/// What the steps of a pod's start read besides its record.
struct PodStart<'a> {
    config: &'a PodSandboxConfig,
    handler: &'a Handler,
    paths: PodPaths,
    /// The id maps of the pod's user namespace, when it has one.
    id_maps: Option<IdMaps>,
}

impl PodStart<'_> {
    /// The pod's root in its user namespace.
    fn id_maps_root(&self) -> Option<(u32, u32)> {
        self.id_maps.as_ref().and_then(|m| m.host_root())
    }
}

/// The pod's record as it is first written: `Creating`.
fn new_record(
    id: &str,
    config: &PodSandboxConfig,
    runtime_handler: String,
) -> Result<SandboxRecord> {
    let meta = config.metadata.clone().unwrap_or_default();
    let cgroup_parent = config
        .linux
        .as_ref()
        .map_or("", |l| l.cgroup_parent.as_str());
    Ok(SandboxRecord {
        id: id.to_owned(),
        name: format!(
            "{}_{}_{}_{}",
            meta.name, meta.namespace, meta.uid, meta.attempt
        ),
        config: config.encode_to_vec(),
        runtime_handler,
        state: SandboxState::Creating,
        created_at: now_nanos(),
        host_network: namespace_modes(config).0 == NamespaceMode::Node,
        netns: None,
        ips: Vec::new(),
        pause_pid: None,
        cgroup: cgroups::pod_cgroup(cgroup_parent, id)?,
        // No hostname in the request: the node's, as containerd does (kubelet always sends
        // one; the pod's name would not do, it may be longer than the 64 bytes Linux allows).
        hostname: match config.hostname.is_empty() {
            true => files::node_hostname(),
            false => config.hostname.clone(),
        },
        network_error: None,
    })
}

/// The pod's network namespace, made and pinned (for a user-namespaced pod, with its user
/// namespace) on a blocking thread.
async fn make_netns(id: &str, pod: &PodStart<'_>) -> Result<PathBuf> {
    let (dir, userns_dir) = (pod.paths.netns_dir.clone(), pod.paths.userns_dir.clone());
    let (id, id_maps) = (id.to_owned(), pod.id_maps.clone());
    // Not written to the database yet: teardown derives the netns path and the CNI
    // attachment from the id, so a crash before the final write leaks nothing, and a pod
    // start pays two database syncs instead of four.
    tokio::task::spawn_blocking(move || match id_maps {
        None => crius_cni::netns::create(&dir, &id).map_err(Error::from),
        Some(maps) => {
            crate::userns::create_pod_namespaces(&maps, &userns_dir, &dir, &id).map_err(Error::from)
        }
    })
    .await
    .map_err(|e| Error::internal("create netns", e))?
}

/// How long a user-namespaced pod's start waits for its pause to exec (a pause in a pod
/// cgroup throttled to a sliver of a CPU may take long; one that never gets there is logged).
const PAUSE_EXEC_LIMIT: Duration = Duration::from_secs(10);

impl Daemon {
    /// The pod's shim, and the pause process in it, created in the pod's namespaces and
    /// cgroup (its resources applied before it runs) and started. Returns the pause's pid and
    /// how long each step took (`pause_shim`, `pause_spec`, `pause_create`, `pause_cgroup`,
    /// `pause_start`, and for a user-namespaced pod `pause_exec`).
    async fn start_pause(
        self: &Arc<Self>,
        record: &SandboxRecord,
        pod: &PodStart<'_>,
        shm: Option<&Path>,
    ) -> Result<(i32, Phases)> {
        let mut phases = Phases::start();
        let id = &record.id;
        let shim = self.shims.start(id).await?;
        phases.mark("pause_shim");
        self.write_pause_bundle(record, pod, shm)?;
        phases.mark("pause_spec");
        let runtime = pod.handler.oci_runtime();
        let builtin = runtime.is_none();
        let pause = shim
            .create_container(crius_api::shim::CreateContainer {
                id: id.clone(),
                bundle: pod.paths.pause_bundle.clone(),
                stdin: false,
                stdin_once: false,
                tty: false,
                log_path: None,
                runtime,
                restore: None,
            })
            .await?;
        phases.mark("pause_create");
        cgroups::attach(&record.cgroup, id, pause).await?;
        // libcontainer has made the pod cgroup with the pause container: limit it before
        // anything runs in it.
        let (cgroup, pod_config) = (record.cgroup.clone(), pod.config.clone());
        tokio::task::spawn_blocking(move || cgroups::apply_pod_resources(&cgroup, &pod_config))
            .await
            .map_err(|e| Error::internal("apply pod resources", e))??;
        phases.mark("pause_cgroup");
        let (pid, _) = shim.start(id).await?;
        phases.mark("pause_start");
        if pod.id_maps_root().is_some() && builtin {
            self.wait_pause_exec(id, pid).await?;
            phases.mark("pause_exec");
        }
        Ok((pid, phases))
    }

    /// The pause's bundle: its empty rootfs (owned by the pod's root in a user namespace) and
    /// its spec.
    fn write_pause_bundle(
        &self,
        record: &SandboxRecord,
        pod: &PodStart<'_>,
        shm: Option<&Path>,
    ) -> Result<()> {
        let (id, paths) = (&record.id, &pod.paths);
        let rootfs = paths.pause_bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs)
            .map_err(|e| Error::internal(format!("create {}", rootfs.display()), e))?;
        let id_maps_root = pod.id_maps_root();
        if let Some((uid, gid)) = id_maps_root {
            // the pause's root makes its mount points in it
            std::os::unix::fs::chown(&rootfs, Some(uid), Some(gid))
                .map_err(|e| Error::internal(format!("chown {}", rootfs.display()), e))?;
        }
        let etc = |name: &str| paths.dir.join(name);
        let (hosts, resolv, hostname_file) = (etc("hosts"), etc("resolv.conf"), etc("hostname"));
        let runtime = pod.handler.oci_runtime();
        let mut spec = crate::spec::sandbox_spec(&crate::spec::SandboxSpecInput {
            sandbox_id: id,
            config: pod.config,
            rootfs: &rootfs,
            pause_binary: &self.pause_binary,
            netns_path: record.netns.as_deref(),
            cgroups_path: &cgroups::container_cgroup(&record.cgroup, id),
            hostname: &record.hostname,
            resolv_conf: Some(&resolv),
            hosts: Some(&hosts),
            hostname_file: Some(&hostname_file),
            shm_dir: shm,
            userns_path: id_maps_root.is_some().then_some(paths.userns.as_path()),
            builtin: runtime.is_none(),
            host: self.host(),
        })?;
        if runtime.is_some() {
            crate::spec::set_userns_mappings(&mut spec, pod.config)?;
        }
        write_spec(&paths.pause_bundle, &spec, self.host())
    }

    /// Containers join the pause's namespaces from inside the pod's user namespace, which
    /// they cannot do before its exec (`userns::wait_until_running`).
    async fn wait_pause_exec(&self, id: &str, pid: i32) -> Result<()> {
        let program = self.pause_binary.clone();
        let ran = tokio::task::spawn_blocking(move || {
            crate::userns::wait_until_running(pid, &program, PAUSE_EXEC_LIMIT)
        })
        .await
        .map_err(|e| Error::internal("wait for the pause", e))?;
        if !ran {
            tracing::warn!(
                pod = %id,
                pid,
                "the pause has not run crius-pause after {PAUSE_EXEC_LIMIT:?}: it ended or is \
                 stalled, and containers of the pod cannot join it until it runs"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::PodSandboxMetadata;

    fn config(hostname: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web".into(),
                namespace: "default".into(),
                uid: "u1".into(),
                attempt: 0,
            }),
            hostname: hostname.into(),
            ..Default::default()
        }
    }

    #[test]
    fn hostname_longer_than_linux_allows_is_refused() {
        validate(&config(&"h".repeat(64))).unwrap();
        let msg = validate(&config(&"h".repeat(65))).unwrap_err().to_string();
        assert!(msg.contains("config.hostname"), "{msg}");
    }

    #[test]
    fn metadata_fields_are_required_and_named() {
        let mut c = config("");
        c.metadata.as_mut().unwrap().uid.clear();
        let msg = validate(&c).unwrap_err().to_string();
        assert_eq!(msg, "config.metadata.uid is required");
    }
}
