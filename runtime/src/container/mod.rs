//! Containers: their records and their lifecycle through the pod's shim.
//!
//! A container is: a record (written before any side effect), a lease on its image's
//! snapshots, an overlay rootfs (`<root>/containers/<id>/{upper,work}` mounted on
//! `<state>/containers/<id>/rootfs`), an OCI bundle beside it, and the container in the pod's
//! shim. As for pods, one idempotent teardown undoes a failed create, serves
//! `RemoveContainer` and cleans up after a crius killed mid-way.

mod image_volumes;
mod update;
mod volumes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crius_api::shim::{
    ContainerInfo as ShimContainerInfo, ContainerStatus as ShimStatus, ExitInfo,
};
use crius_api::v1::{ContainerConfig, ContainerEventType, PodSandboxConfig};
use prost::Message as _;

use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::layout::write_spec;
pub use crate::layout::ContainerPaths;
use crate::mounts;
use crate::records::SandboxState;
pub use crate::records::{ContainerRecord, ContainerState};
use crate::util::{check_name, check_no_nul, excerpt, new_id, now_nanos};

/// How long crius keeps trying to remove a container whose create a crash interrupted (a
/// shim gives up on a create after 60 s).
const INTERRUPTED_CREATE_PATIENCE: Duration = Duration::from_secs(90);

/// How much output of an `ExecSync` (stdout and stderr together) is returned: the response
/// must fit kubelet's (and crius's) 16 MiB gRPC messages, with room for the framing.
const EXEC_OUTPUT_LIMIT: usize = (16 << 20) - (64 << 10);

/// Cuts exec output to `limit` bytes in all: stderr keeps up to half of it, stdout the rest,
/// and either takes what the other leaves unused.
fn fit_exec_output(stdout: &mut Vec<u8>, stderr: &mut Vec<u8>, limit: usize) {
    let err_share = stderr.len().min(limit / 2);
    let out_keep = stdout.len().min(limit - err_share);
    let err_keep = stderr.len().min(limit - out_keep);
    stdout.truncate(out_keep);
    stderr.truncate(err_keep);
}

/// CRI's reason for an exit.
fn exit_reason(exit: &ExitInfo) -> &'static str {
    if exit.oom_killed {
        "OOMKilled"
    } else if exit.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

fn validate(config: &ContainerConfig) -> Result<()> {
    let name = config
        .metadata
        .as_ref()
        .map(|m| m.name.as_str())
        .unwrap_or("");
    check_name("config.metadata.name", name).map_err(Error::InvalidArgument)?;
    check_no_nul("config.command", config.command.iter().map(String::as_str))
        .and_then(|()| check_no_nul("config.args", config.args.iter().map(String::as_str)))
        .and_then(|()| {
            check_no_nul(
                "config.envs.key",
                config.envs.iter().map(|e| e.key.as_str()),
            )
        })
        .and_then(|()| check_no_nul("config.working_dir", [config.working_dir.as_str()]))
        .map_err(Error::InvalidArgument)?;
    if let Some(i) = config.envs.iter().position(|e| e.value.contains(&0)) {
        return Err(Error::InvalidArgument(format!(
            "config.envs[{i}].value of {:?} contains a NUL byte",
            excerpt(&config.envs[i].key)
        )));
    }
    if let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        crate::cgroups::check_resources("config.linux.resources", r)?;
    }
    for (i, m) in config.mounts.iter().enumerate() {
        check_mount_paths(i, m)?;
    }
    let image = config
        .image
        .as_ref()
        .map(|i| i.image.as_str())
        .unwrap_or("");
    if image.is_empty() {
        return Err(Error::InvalidArgument(
            "config.image.image is required".into(),
        ));
    }
    if config.log_path.starts_with('/') || config.log_path.split('/').any(|c| c == "..") {
        return Err(Error::InvalidArgument(format!(
            "config.log_path {:?} must be relative to the pod's log_directory",
            config.log_path
        )));
    }
    Ok(())
}

/// Longest path a mount may name (PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;

/// What below `/proc` a CRI mount may cover: the files lxcfs-style tools replace with views of
/// the container's own limits (runc allows the same). Anything else there would hide or fake
/// the kernel's view of the container.
const PROC_MOUNTS_ALLOWED: &[&str] = &[
    "/proc/cpuinfo",
    "/proc/diskstats",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/swaps",
    "/proc/uptime",
    "/proc/loadavg",
    "/proc/slabinfo",
    "/proc/net/dev",
    "/proc/sys/kernel/ns_last_pid",
];

/// The paths of `config.mounts[i]`: no NUL, at most PATH_MAX, and no mount over `/proc` but
/// the files [`PROC_MOUNTS_ALLOWED`] names.
fn check_mount_paths(i: usize, m: &crius_api::v1::Mount) -> Result<()> {
    for (field, value) in [
        ("container_path", &m.container_path),
        ("host_path", &m.host_path),
    ] {
        if value.contains('\0') || value.len() > MAX_PATH_BYTES {
            return Err(Error::InvalidArgument(format!(
                "config.mounts[{i}].{field} {:?} is not a path (NUL, or longer than {MAX_PATH_BYTES} bytes)",
                excerpt(value)
            )));
        }
    }
    let dest = Path::new(&m.container_path);
    let clean: PathBuf = dest
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    if clean.starts_with("/proc") && !PROC_MOUNTS_ALLOWED.iter().any(|p| clean == Path::new(p)) {
        return Err(Error::InvalidArgument(format!(
            "config.mounts[{i}].container_path {:?}: nothing may be mounted over /proc but {}",
            excerpt(&m.container_path),
            PROC_MOUNTS_ALLOWED.join(", ")
        )));
    }
    Ok(())
}

impl Daemon {
    /// `CreateContainer`: the container exists, stopped before its process runs.
    pub async fn create_container(
        self: &Arc<Self>,
        pod_id: &str,
        config: ContainerConfig,
    ) -> Result<String> {
        validate(&config)?;
        let pod = self.pod(pod_id)?;
        let _pod_lock = self.locks.lock(&pod.id).await;
        let pod = self.pod(&pod.id)?;
        if pod.state != SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let pod_config = pod.config();
        // A directory may have been closed since the pod started: a user-namespaced pod's ids
        // must still reach crius's root, state and pause binary, or the create fails inside.
        if let Some((uid, gid)) = crate::spec::pod_id_maps(&pod_config)?.and_then(|m| m.host_root())
        {
            let dirs = [self.config.root.as_path(), self.config.state.as_path()];
            crate::userns::reachable(&dirs, &self.pause_binary, uid, gid).map_err(|why| {
                Error::FailedPrecondition(format!("pod {} has a user namespace: {why}", pod.id))
            })?;
        }
        let pod_meta = pod_config.metadata.clone().unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let name = format!(
            "{}_{}_{}_{}_{}",
            meta.name, pod_meta.name, pod_meta.namespace, pod_meta.uid, meta.attempt
        );
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let image = self.images.get(&image_name)?.ok_or_else(|| {
            Error::NotFound(format!("image {:?} not found", excerpt(&image_name)))
        })?;
        let id = new_id().map_err(|e| Error::internal("draw a container id", e))?;
        if let Some(holder) = self.store.reserve_name(&name, &id)? {
            return Err(Error::AlreadyExists(format!(
                "container name {name:?} is reserved for {holder}"
            )));
        }
        let log_path = match (
            pod_config.log_directory.is_empty(),
            config.log_path.is_empty(),
        ) {
            (false, false) => Some(Path::new(&pod_config.log_directory).join(&config.log_path)),
            _ => None,
        };
        let record = ContainerRecord {
            id: id.clone(),
            name: name.clone(),
            sandbox_id: pod.id.clone(),
            config: config.encode_to_vec(),
            image_id: image.id.clone(),
            image_name,
            image_ref: image
                .repo_digests
                .first()
                .cloned()
                .unwrap_or_else(|| image.id.clone()),
            state: ContainerState::Creating,
            created_at: now_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: None,
            log_path,
            stop_signal: libc::SIGTERM,
            resources: config
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .map(|r| r.encode_to_vec())
                .unwrap_or_default(),
        };
        if let Err(e) = self.containers.put(&self.store, &id, record.clone()) {
            let _ = self.store.release_name(&name, &id);
            return Err(e);
        }
        match self.setup_container(record, &config, &pod_config).await {
            Ok(()) => {
                // Followed from now on, not only once started: a created container whose shim
                // dies is reported exited, with the reason.
                self.watch_exit(pod.id.clone(), id.clone());
                self.events
                    .emit(ContainerEventType::ContainerCreatedEvent, &id, &pod.id);
                Ok(id)
            }
            Err(e) => {
                tracing::warn!(container = %id, "create failed, undoing: {e}");
                if let Err(undo) = self.remove_container_by_id(&id).await {
                    // The shim may still be busy with the create (crius gave up waiting): the
                    // undo is retried until the shim has settled it, never forgotten.
                    tracing::warn!(container = %id, "undo of a failed create, retrying: {undo}");
                    let daemon = Arc::clone(self);
                    tokio::spawn(async move { daemon.remove_interrupted(&id).await });
                }
                Err(e)
            }
        }
    }

    async fn setup_container(
        self: &Arc<Self>,
        mut record: ContainerRecord,
        config: &ContainerConfig,
        pod_config: &PodSandboxConfig,
    ) -> Result<()> {
        let id = record.id.clone();
        let pod = self.pod(&record.sandbox_id)?;
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, &id);
        let staging = volumes::staging_dir(&paths.bundle);
        let userns = self.pod_userns(&pod.id, pod_config)?;
        let lowerdirs = self.images.lease(&id, &record.image_id)?;
        volumes::mount_rootfs(
            &lowerdirs,
            &paths.layer.join("upper"),
            &paths.layer.join("work"),
            &paths.rootfs,
            &staging,
            userns.as_ref(),
        )?;
        let image_record = self
            .images
            .get(&record.image_id)?
            .ok_or_else(|| Error::NotFound(format!("image {} not found", record.image_id)))?;
        let image_config: serde_json::Value =
            serde_json::from_str(&self.images.config_json(&image_record)?).map_err(|e| {
                Error::internal(format!("parse config of image {}", record.image_id), e)
            })?;
        record.stop_signal = crate::spec::stop_signal(config, &image_config)?;

        // A bind mount of a missing host path gets a directory, as kubelet users expect.
        for m in &config.mounts {
            let host = Path::new(&m.host_path);
            if host.is_absolute() && !host.exists() {
                std::fs::create_dir_all(host)
                    .map_err(|e| Error::internal(format!("create {}", host.display()), e))?;
            }
        }
        let pod_paths = crate::layout::PodPaths::new(&self.config.state, &pod.id);
        let shm = pod_paths.shm.exists().then_some(pod_paths.shm.as_path());
        let (hosts, resolv, hostname_file) = (
            pod_paths.dir.join("hosts"),
            pod_paths.dir.join("resolv.conf"),
            pod_paths.dir.join("hostname"),
        );
        // The image's own VOLUMEs, as containerd gives them, unless the node turned them off.
        let with_image_volumes;
        let mount_config = match image_volumes::declared(&image_config) {
            declared if declared.is_empty() || self.config.runtime.ignore_image_defined_volumes => {
                config
            }
            declared => {
                let owner = userns
                    .as_ref()
                    .and_then(|u| u.maps.host_root())
                    .unwrap_or((0, 0));
                let extra = image_volumes::stage(
                    &declared,
                    config,
                    &paths.rootfs,
                    &paths.layer.join("volumes"),
                    owner,
                )?;
                let mut c = config.clone();
                c.mounts.extend(extra);
                with_image_volumes = c;
                &with_image_volumes
            }
        };
        let staged_config = self.stage_volumes(&id, mount_config, &staging, userns.as_ref())?;
        let spec = crate::spec::container_spec(&crate::spec::ContainerSpecInput {
            container_id: &id,
            sandbox_id: &pod.id,
            image_name: &record.image_name,
            config: &staged_config,
            sandbox_config: pod_config,
            image_config: &image_config,
            rootfs: &paths.rootfs,
            sandbox_pid: pod.pause_pid,
            netns_path: pod.netns.as_deref(),
            cgroups_path: &cgroups::container_cgroup(&pod.cgroup, &id),
            hostname: &pod.hostname,
            resolv_conf: Some(&resolv),
            hosts: Some(&hosts),
            hostname_file: Some(&hostname_file),
            shm_dir: shm,
            target_pid: self.target_pid(config)?,
        })?;
        write_spec(&paths.bundle, &spec)?;
        // A working directory the image lacks is made, as runc does under containerd.
        if let Some(cwd) = spec.process().as_ref().map(|p| p.cwd()) {
            let owner = userns.as_ref().and_then(|u| u.maps.host_root());
            crate::util::mkdir_in_root(&paths.rootfs, cwd, owner).map_err(|e| {
                Error::InvalidArgument(format!(
                    "config.working_dir {:?} cannot be made in the image: {e}",
                    crate::util::excerpt(&cwd.to_string_lossy())
                ))
            })?;
        }
        if let Some(log) = &record.log_path {
            if let Some(dir) = log.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::internal(format!("create log directory {}", dir.display()), e)
                })?;
            }
        }
        let shim = self.shims.get(&pod.id).await?;
        let pid = shim
            .create_container(crius_api::shim::CreateContainer {
                id: id.clone(),
                bundle: paths.bundle.clone(),
                stdin: config.stdin,
                stdin_once: config.stdin_once,
                tty: config.tty,
                log_path: record.log_path.clone(),
            })
            .await?;
        cgroups::attach(&pod.cgroup, &id, pid).await?;
        record.pid = u32::try_from(pid).ok();
        record.state = ContainerState::Created;
        self.containers.put(&self.store, &id, record)?;
        Ok(())
    }

    /// The pod's user namespace, when it has one, for the container's idmapped mounts.
    fn pod_userns(
        &self,
        pod_id: &str,
        pod_config: &PodSandboxConfig,
    ) -> Result<Option<volumes::PodUserns>> {
        let Some(maps) = crate::spec::pod_id_maps(pod_config)? else {
            return Ok(None);
        };
        let pin = crate::layout::PodPaths::new(&self.config.state, pod_id).userns;
        let fd = crate::userns::open(&pin).map_err(|e| {
            Error::FailedPrecondition(format!(
                "pod {pod_id} has no user namespace any more: {}",
                crate::error::chain(&e)
            ))
        })?;
        Ok(Some(volumes::PodUserns { fd, maps }))
    }

    /// The pid of the container a `TARGET` pid namespace points at.
    fn target_pid(&self, config: &ContainerConfig) -> Result<Option<u32>> {
        let target = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .filter(|n| n.pid == crius_api::v1::NamespaceMode::Target as i32)
            .map(|n| n.target_id.clone())
            // an empty target_id is refused by the spec with a message naming the field
            .filter(|t| !t.is_empty());
        let Some(target) = target else {
            return Ok(None);
        };
        let c = self.container(&target)?;
        match (c.state, c.pid) {
            (ContainerState::Running, Some(pid)) => Ok(Some(pid)),
            _ => Err(Error::FailedPrecondition(format!(
                "namespace_options.target_id {target}: container is not running"
            ))),
        }
    }

    /// `StartContainer`.
    pub async fn start_container(self: &Arc<Self>, id: &str) -> Result<()> {
        let c = self.container(id)?;
        let _lock = self.locks.lock(&c.id).await;
        let c = self.container(&c.id)?;
        if c.state != ContainerState::Created {
            return Err(Error::FailedPrecondition(format!(
                "container {} is {:?}, not created",
                c.id, c.state
            )));
        }
        let shim = self.shims.get(&c.sandbox_id).await?;
        // Taken before the start: a quick process may be done before the call returns, and
        // its finish time must not come before its start time.
        let started_at = now_nanos();
        let pid = shim.start(&c.id).await?;
        self.containers.update(&self.store, &c.id, |r| {
            // The watcher started at create follows the init through its start to its exit,
            // and may already have recorded the exit of a quick process: never undo that.
            if r.state == ContainerState::Created {
                r.state = ContainerState::Running;
            }
            r.started_at = started_at;
            r.pid = u32::try_from(pid).ok();
        })?;
        self.events.emit(
            ContainerEventType::ContainerStartedEvent,
            &c.id,
            &c.sandbox_id,
        );
        Ok(())
    }

    /// Brings a record that says created in line with its shim: a container the shim started
    /// (crius died before recording it) becomes running and is followed; one that has already
    /// exited gets its start and exit recorded. Returns whether the record changed.
    fn adopt_shim_state(self: &Arc<Self>, c: &ContainerRecord, info: &ShimContainerInfo) -> bool {
        if c.state != ContainerState::Created
            || !matches!(info.status, ShimStatus::Running | ShimStatus::Stopped)
        {
            return false;
        }
        if info.status == ShimStatus::Stopped && info.started_at_unix_nano.is_none() {
            // Never started (its init was killed while created): only the exit is news.
            if let Some(exit) = &info.exit {
                self.record_exit(&c.id, exit);
            }
            return true;
        }
        let started_at = info.started_at_unix_nano.unwrap_or_else(now_nanos);
        let updated = self.containers.update(&self.store, &c.id, |r| {
            if r.state == ContainerState::Created {
                r.state = ContainerState::Running;
            }
            r.started_at = started_at;
            r.pid = info.pid.and_then(|p| u32::try_from(p).ok());
        });
        if let Err(e) = updated {
            tracing::error!(container = %c.id, "record the start the shim reports: {e}");
            return false;
        }
        tracing::info!(container = %c.id, "the shim started this container before crius recorded it");
        match (&info.status, &info.exit) {
            (ShimStatus::Stopped, Some(exit)) => self.record_exit(&c.id, exit),
            _ => self.watch_exit(c.sandbox_id.clone(), c.id.clone()),
        }
        true
    }

    /// Follows a created or running container until its init exits, then records how.
    pub fn watch_exit(self: &Arc<Self>, pod_id: String, id: String) {
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            let running = || {
                daemon.containers.get(&id).is_some_and(|c| {
                    matches!(c.state, ContainerState::Created | ContainerState::Running)
                })
            };
            match daemon.shims.follow_exit(&pod_id, &id, running).await {
                Some(Ok(exit)) => daemon.record_exit(&id, &exit),
                Some(Err(crate::shims::Lost::ShimGone(why))) => {
                    daemon.settle_lost(&pod_id, &id, &why);
                }
                Some(Err(crate::shims::Lost::NotInShim)) => {
                    // Deleted by the shim while crius was away (a removal the database
                    // missed): it has ended; kubelet's next RemoveContainer finishes the job.
                    daemon.record_lost_exit(
                        &id,
                        "the pod's shim no longer has this container: it was removed while \
                         crius was not running",
                    );
                }
                None => {}
            }
        });
    }

    /// When the shim cannot tell how a container ended: read its exit file, or, if the shim is
    /// gone without one, record the container as exited with the reason. Returns whether the
    /// container's end is now recorded.
    fn settle_lost(&self, pod_id: &str, id: &str, why: &str) -> bool {
        let shim_dir = self.shims.state_dir(pod_id);
        if let Ok(Some(exit)) = crius_api::shim::read_exit_file(&shim_dir, id) {
            self.record_exit(id, &exit);
            return true;
        }
        // The same liveness test as everywhere else: the pid file's process, checked to be
        // this pod's shim (a pid reused by another process does not count).
        if self.shims.running_pid(pod_id).is_some() {
            return false;
        }
        // Without its shim nobody reaps or stops the container: its processes were reparented
        // to init and may still run. Kill them so "exited" is true.
        if let Some(pod) = self.sandboxes.get(pod_id) {
            cgroups::reap::kill_cgroup_tree(&cgroups::container_cgroup(&pod.cgroup, id));
        }
        self.record_lost_exit(
            id,
            &format!("the pod's shim is gone and left no exit record ({why})"),
        );
        true
    }

    /// Records that container `id` ended in a way nobody saw (exit code 255, reason `Error`,
    /// `message` saying why), unless its exit is recorded already.
    fn record_lost_exit(&self, id: &str, message: &str) {
        let mut ended_in = None;
        let written = self.containers.update(&self.store, id, |r| {
            if r.state == ContainerState::Exited {
                return;
            }
            ended_in = Some(r.sandbox_id.clone());
            r.state = ContainerState::Exited;
            r.finished_at = now_nanos();
            r.exit_code = 255;
            r.reason = "Error".to_string();
            r.message = message.to_string();
        });
        if let Err(e) = written {
            tracing::error!(container = id, "record an exit nobody saw ({message}): {e}");
        }
        if let Some(pod) = ended_in {
            self.events
                .emit(ContainerEventType::ContainerStoppedEvent, id, &pod);
        }
    }

    fn record_exit(&self, id: &str, exit: &ExitInfo) {
        let mut ended_in = None;
        let res = self.containers.update(&self.store, id, |r| {
            if r.state == ContainerState::Exited {
                return;
            }
            ended_in = Some(r.sandbox_id.clone());
            r.state = ContainerState::Exited;
            r.finished_at = exit.finished_at_unix_nano;
            r.exit_code = exit.exit_code;
            r.reason = exit_reason(exit).to_string();
            if let Some(sig) = exit.signal {
                r.message = format!("killed by signal {sig}");
            }
        });
        if let Err(e) = res {
            tracing::error!(container = id, "record exit: {e}");
        }
        if let Some(pod) = ended_in {
            self.events
                .emit(ContainerEventType::ContainerStoppedEvent, id, &pod);
        }
    }

    /// `StopContainer`: the stop signal, `timeout` seconds, then SIGKILL. Idempotent; an
    /// unknown id is success.
    pub async fn stop_container(self: &Arc<Self>, id: &str, timeout: i64) -> Result<()> {
        let Some(id) = self.resolve_container_id(id)? else {
            return Ok(());
        };
        let _lock = self.locks.lock(&id).await;
        self.stop_container_by_id(&id, timeout).await
    }

    pub(crate) async fn stop_container_by_id(
        self: &Arc<Self>,
        id: &str,
        timeout: i64,
    ) -> Result<()> {
        let Some(mut c) = self.containers.get(id) else {
            return Ok(());
        };
        // A record that says created may hide a process its shim started: stop what runs.
        if c.state == ContainerState::Created {
            if let Ok(shim) = self.shims.get(&c.sandbox_id).await {
                if let Ok(info) = shim.state(id).await {
                    if self.adopt_shim_state(&c, &info) {
                        c = self.containers.get(id).unwrap_or(c);
                    }
                }
            }
        }
        if c.state != ContainerState::Running {
            return Ok(());
        }
        let shim = match self.shims.get(&c.sandbox_id).await {
            Ok(s) => s,
            Err(e) => {
                self.settle_lost(&c.sandbox_id, id, &e.to_string());
                return Ok(());
            }
        };
        let stopped = async {
            if timeout > 0 {
                shim.kill(id, c.stop_signal, false).await?;
                if let Ok(exit) = shim
                    .wait(id, Some(Duration::from_secs(timeout as u64)))
                    .await
                {
                    return Ok(exit);
                }
            }
            shim.kill(id, libc::SIGKILL, true).await?;
            shim.wait(id, Some(Duration::from_secs(10))).await
        };
        match stopped.await {
            Ok(exit) => {
                self.record_exit(id, &exit);
                Ok(())
            }
            // The shim died (its client was still cached): the container is lost, not stuck.
            Err(e) if self.settle_lost(&c.sandbox_id, id, &e.to_string()) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// `RemoveContainer`: kills it if it runs, then removes everything it had. Idempotent.
    pub async fn remove_container(self: &Arc<Self>, id: &str) -> Result<()> {
        let Some(id) = self.resolve_container_id(id)? else {
            return Ok(());
        };
        let _lock = self.locks.lock(&id).await;
        self.remove_container_by_id(&id).await
    }

    pub(crate) async fn remove_container_by_id(self: &Arc<Self>, id: &str) -> Result<()> {
        let Some(c) = self.containers.get(id) else {
            return Ok(());
        };
        self.stop_container_by_id(id, 0).await?;
        if let Ok(shim) = self.shims.get(&c.sandbox_id).await {
            match shim.delete(id, true).await {
                Ok(()) => {}
                Err(e)
                    if e.shim_error()
                        .is_some_and(|s| s.kind == crius_api::shim::ErrorKind::NotFound) => {}
                // A dead shim has nothing to delete; what it left is removed below.
                Err(e) if self.shims.running_pid(&c.sandbox_id).is_none() => {
                    tracing::warn!(container = id, "shim gone, removing without it: {e}");
                }
                Err(e) => return Err(e.into()),
            }
        }
        // libcontainer's delete removes the container cgroup, but not when the shim is dead;
        // under a kubelet pod cgroup nobody else would.
        if let Some(pod) = self.sandboxes.get(&c.sandbox_id) {
            let cgroup = cgroups::container_cgroup(&pod.cgroup, id);
            let patience = cgroups::REMOVE_PATIENCE;
            if let Err(e) = cgroups::reap::remove_cgroup(&cgroup, patience).await {
                tracing::warn!(container = id, "remove container cgroup: {e}");
            }
        }
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, id);
        volumes::unstage(&volumes::staging_dir(&paths.bundle))?;
        mounts::unmount(&paths.rootfs)?;
        for dir in [&paths.bundle, &paths.layer] {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::internal(format!("remove {}", dir.display()), e)),
            }
        }
        self.images.release(id).await?;
        for (i, m) in c.config().mounts.iter().enumerate() {
            if m.image.as_ref().is_some_and(|s| !s.image.is_empty()) {
                self.images.release(&volumes::image_lease(id, i)).await?;
            }
        }
        self.store.release_name(&c.name, id)?;
        self.containers.remove(&self.store, id)?;
        if c.state != ContainerState::Creating {
            self.events
                .emit(ContainerEventType::ContainerDeletedEvent, id, &c.sandbox_id);
        }
        Ok(())
    }

    /// The running container `id` (else NotFound/FailedPrecondition naming it).
    pub fn running_container(&self, id: &str) -> Result<ContainerRecord> {
        let c = self.container(id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        Ok(c)
    }

    /// What an `ExecSync` or `Exec` of `cmd` runs: the running container and the OCI process.
    pub fn exec_prepare(
        &self,
        id: &str,
        cmd: &[String],
        tty: bool,
    ) -> Result<(ContainerRecord, oci_spec::runtime::Process)> {
        if cmd.first().is_none_or(|c| c.is_empty()) {
            return Err(Error::InvalidArgument("cmd is required".into()));
        }
        check_no_nul("cmd", cmd.iter().map(String::as_str)).map_err(Error::InvalidArgument)?;
        let c = self.running_container(id)?;
        // A container removed while this call ran has no bundle any more: say NotFound.
        let spec = self
            .container_spec(&c.id)
            .or_else(|e| self.container(&c.id).and(Err(e)))?;
        let process = crate::spec::exec_process(&spec, cmd, tty)?;
        Ok((c, process))
    }

    /// `ExecSync`: runs `cmd` in a running container and returns its output and status.
    pub async fn exec_sync(
        self: &Arc<Self>,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> Result<crius_api::shim::ExecOutcome> {
        let (c, process) = self.exec_prepare(id, &cmd, false)?;
        let shim = self.shims.get(&c.sandbox_id).await?;
        let outcome = shim
            .exec_sync(crius_api::shim::ExecSync {
                id: c.id.clone(),
                process: serde_json::to_value(&process)
                    .map_err(|e| Error::internal("encode exec process", e))?,
                timeout_ms: u64::try_from(timeout_secs)
                    .unwrap_or(0)
                    .saturating_mul(1000),
                output_limit: EXEC_OUTPUT_LIMIT as u64,
            })
            .await?;
        if outcome.timed_out {
            return Err(Error::DeadlineExceeded(format!(
                "command {cmd:?} in container {} timed out after {timeout_secs}s",
                c.id
            )));
        }
        let mut outcome = outcome;
        fit_exec_output(&mut outcome.stdout, &mut outcome.stderr, EXEC_OUTPUT_LIMIT);
        Ok(outcome)
    }

    /// `ReopenContainerLog`: only for a running container.
    pub async fn reopen_log(self: &Arc<Self>, id: &str) -> Result<()> {
        let c = self.container(id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        let shim = self.shims.get(&c.sandbox_id).await?;
        shim.reopen_log(&c.id).await?;
        Ok(())
    }

    /// The OCI spec a container was created with.
    pub fn container_spec(&self, id: &str) -> Result<oci_spec::runtime::Spec> {
        let path = ContainerPaths::new(&self.config.root, &self.config.state, id)
            .bundle
            .join("config.json");
        let data = std::fs::read(&path)
            .map_err(|e| Error::internal(format!("read {}", path.display()), e))?;
        serde_json::from_slice(&data)
            .map_err(|e| Error::internal(format!("parse {}", path.display()), e))
    }

    /// The full id of a container from an id or a unique prefix of one.
    pub fn resolve_container_id(&self, id: &str) -> Result<Option<String>> {
        self.containers.resolve("container_id", "containers", id)
    }

    /// The record of a container that must exist.
    pub fn container(&self, id: &str) -> Result<ContainerRecord> {
        self.resolve_container_id(id)?
            .and_then(|id| self.containers.get(&id))
            .ok_or_else(|| Error::NotFound(format!("container {:?} not found", excerpt(id))))
    }

    /// The containers of a pod.
    pub fn containers_of(&self, pod_id: &str) -> Vec<ContainerRecord> {
        self.containers
            .all()
            .into_iter()
            .filter(|c| c.sandbox_id == pod_id)
            .collect()
    }

    /// Removes a container whose create crius did not see through. Its shim may still be
    /// creating it (the shim outlived crius and refuses a delete until the create is done), so
    /// this retries for a while.
    async fn remove_interrupted(self: &Arc<Self>, id: &str) {
        let deadline = tokio::time::Instant::now() + INTERRUPTED_CREATE_PATIENCE;
        let mut delay = Duration::from_millis(50);
        loop {
            let result = {
                let _lock = self.locks.lock(id).await;
                self.remove_container_by_id(id).await
            };
            match result {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(container = id, "interrupted create not removable yet: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::error!(container = id, "clean up interrupted container: {e}");
                    return;
                }
            }
        }
    }

    /// At start: cleans up interrupted creates and follows running containers again, finding
    /// out how those that ended while crius was away ended.
    pub async fn recover_containers(self: &Arc<Self>) {
        for c in self.containers.all() {
            match c.state {
                ContainerState::Creating => {
                    tracing::info!(container = %c.id, "removing a container whose create was interrupted");
                    let daemon = Arc::clone(self);
                    tokio::spawn(async move { daemon.remove_interrupted(&c.id).await });
                }
                ContainerState::Running => self.watch_exit(c.sandbox_id.clone(), c.id.clone()),
                ContainerState::Created => {
                    // The shim has the truth: a crius killed between the shim's start and the
                    // database write left a record that says created for a process that runs
                    // (or ran).
                    if let Ok(shim) = self.shims.get(&c.sandbox_id).await {
                        if let Ok(info) = shim.state(&c.id).await {
                            if !self.adopt_shim_state(&c, &info) {
                                self.watch_exit(c.sandbox_id.clone(), c.id.clone());
                            }
                        }
                    } else {
                        self.settle_lost(&c.sandbox_id, &c.id, "shim not reachable at start");
                    }
                }
                ContainerState::Exited => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_output_fits_the_limit() {
        let cut = |out: usize, err: usize| {
            let (mut o, mut e) = (vec![b'o'; out], vec![b'e'; err]);
            fit_exec_output(&mut o, &mut e, 100);
            (o.len(), e.len())
        };
        assert_eq!(cut(10, 10), (10, 10));
        assert_eq!(cut(500, 0), (100, 0));
        assert_eq!(cut(0, 500), (0, 100));
        assert_eq!(cut(500, 500), (50, 50));
        assert_eq!(cut(500, 20), (80, 20));
        assert_eq!(cut(30, 500), (30, 70));
    }
}
