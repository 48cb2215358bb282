//! `CreateContainer`: validation, then the record, the image lease, the rootfs, volumes and
//! the OCI bundle, and the container in the pod's shim; one teardown undoes a failed step.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crius_api::v1::{ContainerConfig, ContainerEventType, PodSandboxConfig};
use prost::Message as _;
use tokio::task::JoinHandle;

/// How long after a RunPodSandbox or StartContainer has returned crius asks for the helper
/// of the pod's next create: enough for the reply to be written. A create that comes sooner
/// asks for its helper itself. Lifecycle bench: StartContainer 0.82 -> 0.72 ms; the next
/// create, 8 ms after the start, still found its helper waiting (its `shim_create` phase did
/// not grow).
const AHEAD_AFTER_REPLY: Duration = Duration::from_millis(1);

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

use super::{image_volumes, volumes, ContainerPaths, ContainerRecord, ContainerState};
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::layout::write_spec;
use crate::records::SandboxState;
use crate::store::Flush;
use crate::util::{check_name, check_no_nul, excerpt, new_id, now_nanos};

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

/// What a create starts before its rootfs and spec and waits for before it asks the shim
/// (and, when it fails before that, before its undo, which must come after it).
pub(super) struct Ahead {
    /// The shim's `prepare` (see [`Daemon::prepare_shim_helper`]): asked first, so the create
    /// finds its helper waiting.
    helper: Option<JoinHandle<()>>,
    /// The disk flush of the container's record.
    record: Option<JoinHandle<crate::store::Result<()>>>,
    /// The directories of the container's cgroup (`cgroups::make_container_dirs_ahead`).
    cgroup: Option<JoinHandle<()>>,
}

impl Ahead {
    /// Waits for whatever of it is still running; fails when the record's flush did.
    async fn done(&mut self) -> Result<()> {
        if let Some(helper) = self.helper.take() {
            let _ = helper.await;
        }
        if let Some(cgroup) = self.cgroup.take() {
            let _ = cgroup.await;
        }
        if let Some(record) = self.record.take() {
            record
                .await
                .map_err(|e| Error::internal("flush the container's record", e))??;
        }
        Ok(())
    }
}

impl Daemon {
    /// `CreateContainer`: the container exists, stopped before its process runs.
    pub async fn create_container(
        self: &Arc<Self>,
        pod_id: &str,
        config: ContainerConfig,
    ) -> Result<String> {
        let mut phases = crate::util::Phases::start();
        validate(&config)?;
        let pod = self.pod(pod_id)?;
        // A pod still starting is refused at once, not after its start (which may be waiting
        // for an NRI plugin) releases the lock.
        if pod.state == SandboxState::Creating {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready: it is still starting",
                pod.id
            )));
        }
        // Held to the end: a plugin synchronizing meanwhile sees this container in its
        // snapshot or as an event, never neither nor both.
        let _nri_sync = self.nri.block_sync().await;
        let _pod_lock = self.locks.lock(&pod.id).await;
        let pod = self.pod(&pod.id)?;
        if pod.state != SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let pod_config = pod.config();
        let handler = self.handlers().get(&pod.runtime_handler)?;
        if !handler.recursive_read_only {
            if let Some(i) = config.mounts.iter().position(|m| m.recursive_read_only) {
                return Err(Error::InvalidArgument(format!(
                    "config.mounts[{i}].recursive_read_only: runtime handler {:?} does not \
                     support recursive read-only mounts",
                    handler.name
                )));
            }
        }
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
        // An image that is an absolute path is a checkpoint archive to restore, and so is an
        // image marked as one (as CRI-O takes both): the container runs the image it was
        // checkpointed from.
        let restore = match image_name.starts_with('/') {
            true => Some(self.restore_source(&image_name, handler).await?),
            false => self.checkpoint_image(&image_name, handler).await?,
        };
        if restore.is_some() {
            super::restore::check_restorable(&config, &pod_config)?;
        }
        let (image_name, image) = match &restore {
            Some(r) => (r.image_name.clone(), r.image.clone()),
            None => {
                let image = self.images.get(&image_name)?.ok_or_else(|| {
                    Error::NotFound(format!("image {:?} not found", excerpt(&image_name)))
                })?;
                (image_name, image)
            }
        };
        // The request is good and its image here: the shim starts this create's helper now,
        // while the record is written and the rootfs and spec are made, so its exec and start
        // are off the create's path.
        phases.mark("checks");
        let prepared = self.prepare_shim_helper(&pod.id);
        let id = new_id().map_err(|e| Error::internal("draw a container id", e))?;
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
        // The name and the record in one commit, flushed to disk on a blocking thread while
        // the rootfs and spec are made, and on disk before the shim is asked: no container
        // runs that a crash could leave without its record. What a crash before the flush
        // leaves (the rootfs, the container's directories, the lease) the next start removes
        // (`remove_unrecorded_containers`, `release_orphan_leases`).
        if let Some(holder) =
            self.containers
                .put_named(&self.store, &id, record.clone(), &name, Flush::Later)?
        {
            return Err(Error::AlreadyExists(format!(
                "container name {name:?} is reserved for {holder}"
            )));
        }
        let flushed = {
            let daemon = Arc::clone(self);
            tokio::task::spawn_blocking(move || daemon.store.flush())
        };
        let ahead = Ahead {
            helper: Some(prepared),
            record: Some(flushed),
            cgroup: None,
        };
        phases.mark("record");
        let from = restore
            .as_ref()
            .map(|r| (r.archive.as_path(), r.criu.as_path()));
        match self
            .setup_container(record, &config, &pod_config, from, ahead, &mut phases)
            .await
        {
            Ok(()) => {
                // Followed from now on, not only once started: a created container whose shim
                // dies is reported exited, with the reason.
                self.watch_exit(pod.id.clone(), id.clone());
                self.events
                    .emit(ContainerEventType::ContainerCreatedEvent, &id, &pod.id);
                self.nri
                    .post(
                        crius_api::nri::api::Event::PostCreateContainer,
                        || self.nri_pod(&pod.id),
                        || self.nri_container_id(&id),
                    )
                    .await;
                phases.mark("after");
                tracing::debug!(container = %id, phases = %phases, "create phases");
                Ok(id)
            }
            Err(e) => {
                tracing::warn!(container = %id, "create failed, undoing: {e}");
                let undone = {
                    let lock = self.locks.lock(&id).await;
                    self.remove_container_locked(&lock).await
                };
                if let Err(undo) = undone {
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

    pub(super) async fn setup_container(
        self: &Arc<Self>,
        mut record: ContainerRecord,
        config: &ContainerConfig,
        pod_config: &PodSandboxConfig,
        restore: Option<(&Path, &Path)>,
        mut ahead: Ahead,
        phases: &mut crate::util::Phases,
    ) -> Result<()> {
        let id = record.id.clone();
        let pod = self.pod(&record.sandbox_id)?;
        let mut handler = self.handlers().get(&pod.runtime_handler)?.clone();
        if restore.is_some() {
            // A built-in pod's restored container runs under runc (see `restore.rs`).
            if let Some(restorer) = self.handlers().restorer(&handler) {
                handler = restorer.clone();
            }
        }
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, &id);
        let staging = volumes::staging_dir(&paths.bundle);
        let userns = self.pod_userns(&pod.id, pod_config)?;
        // The lease holds the layers from here on; its file (two disk flushes) is written on a
        // blocking thread meanwhile, and is on disk before the container is recorded created.
        let (lowerdirs, lease_file) = self.images.lease_deferred(&id, &record.image_id)?;
        let persist_lease = tokio::task::spawn_blocking(move || lease_file.persist());
        if handler.config.kind == crate::config::HandlerType::Builtin {
            let (pod_cgroup, id) = (pod.cgroup.clone(), id.clone());
            ahead.cgroup = Some(tokio::task::spawn_blocking(move || {
                cgroups::make_container_dirs_ahead(&pod_cgroup, &id)
            }));
        }
        let made = self
            .make_container(
                &mut record,
                phases,
                &mut ahead,
                &lowerdirs,
                (config, pod_config, restore),
                (&pod, &handler, &paths, &staging, userns.as_ref()),
            )
            .await;
        // A create that failed before it asked the shim waits here for what it started: the
        // undo removes the cgroup directories, which a late `mkdir` would bring back.
        let _ = ahead.done().await;
        // Awaited on failure too: the undo releases the lease, after which a late file would
        // stay until the next start.
        let persisted = match persist_lease.await {
            Ok(done) => done.map_err(Error::from),
            Err(e) => Err(Error::internal("write the image lease", e)),
        };
        let pid = made?;
        persisted?;
        record.pid = u32::try_from(pid).ok();
        phases.mark("shim_create");
        record.state = ContainerState::Created;
        // Not flushed: after a crash the durable record says creating, and recovery adopts a
        // container its shim has created and whose image lease is on disk (what this write
        // waited for), as this one is (`adopt_created`).
        self.containers.put_unflushed(&self.store, &id, record)?;
        phases.mark("created");
        Ok(())
    }

    /// Asks the pod's shim to start a helper for the pod's next create (the shim protocol's
    /// `prepare`; it starts none while one waits). Only a head start: whatever fails here,
    /// the shim still spawns the helper at the create. Asked at the start of each create,
    /// and ahead of one: when a pod has started and when a container has (see
    /// [`Daemon::prepare_shim_helper_after_reply`]).
    pub(crate) fn prepare_shim_helper(self: &Arc<Self>, pod_id: &str) -> JoinHandle<()> {
        self.prepare_helper_after(pod_id, Duration::ZERO)
    }

    /// [`Daemon::prepare_shim_helper`] for a create that may come: called as a RunPodSandbox
    /// or a StartContainer returns, as kubelet then creates the pod's next container, and a
    /// helper started only when that create is asked for is not ready before crius has the
    /// rootfs and spec (its exec and start take longer than they do). Asked
    /// [`AHEAD_AFTER_REPLY`] later: the helper's exec and start (0.8 ms of CPU) would
    /// otherwise run beside the reply of the call that is returning, which a client waits
    /// for now, for a create that may never come.
    pub(crate) fn prepare_shim_helper_after_reply(self: &Arc<Self>, pod_id: &str) {
        drop(self.prepare_helper_after(pod_id, AHEAD_AFTER_REPLY));
    }

    fn prepare_helper_after(self: &Arc<Self>, pod_id: &str, delay: Duration) -> JoinHandle<()> {
        let daemon = Arc::clone(self);
        let pod_id = pod_id.to_owned();
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let prepared = match daemon.shims.get(&pod_id).await {
                Ok(shim) => shim.prepare().await.map_err(Error::from),
                Err(e) => Err(e),
            };
            if let Err(e) = prepared {
                tracing::debug!(pod = %pod_id, "prepare a shim helper: {e}");
            }
        })
    }

    /// The rootfs, volumes, spec and bundle of a container whose image is leased, and the
    /// container in its shim: its init's pid.
    async fn make_container(
        self: &Arc<Self>,
        record: &mut ContainerRecord,
        phases: &mut crate::util::Phases,
        ahead: &mut Ahead,
        lowerdirs: &[PathBuf],
        (config, pod_config, restore): (
            &ContainerConfig,
            &PodSandboxConfig,
            Option<(&Path, &Path)>,
        ),
        (pod, handler, paths, staging, userns): (
            &crate::records::SandboxRecord,
            &crate::handlers::Handler,
            &ContainerPaths,
            &Path,
            Option<&volumes::PodUserns>,
        ),
    ) -> Result<i32> {
        let id = record.id.clone();
        volumes::mount_rootfs(
            lowerdirs,
            &paths.layer.join("upper"),
            &paths.layer.join("work"),
            &paths.rootfs,
            staging,
            userns,
        )?;
        phases.mark("rootfs");
        let restore_dir = paths.layer.join("restore");
        if let Some((archive, _)) = restore {
            self.unpack_checkpoint(archive, &restore_dir, &paths.rootfs)
                .await?;
            phases.mark("unpack_checkpoint");
        }
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
        for (i, m) in config.mounts.iter().enumerate() {
            let host = Path::new(&m.host_path);
            if host.is_absolute() && !host.exists() {
                std::fs::create_dir_all(host).map_err(|e| missing_host_path(i, m, e))?;
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
        phases.mark("image_config");
        let staged_config = self.stage_volumes(&id, mount_config, staging, userns)?;
        phases.mark("volumes");
        // The image-name annotation names the image as ContainerStatus will.
        let user_specified = config
            .image
            .as_ref()
            .map(|i| i.user_specified_image.as_str());
        let shown = super::shown_image_name(
            user_specified.unwrap_or_default(),
            &record.image_name,
            image_record.repo_tags.first().map(String::as_str),
            &record.image_id,
        );
        let spec = crate::spec::container_spec(&crate::spec::ContainerSpecInput {
            container_id: &id,
            sandbox_id: &pod.id,
            image_name: &shown,
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
            host_devices_for_privileged: handler.host_devices_for_privileged(),
            builtin: handler.config.kind == crate::config::HandlerType::Builtin,
            host: self.host(),
        })?;
        let mut spec = handler_annotations(spec, handler, config, pod_config);
        if handler.oci_runtime().is_some() {
            crate::spec::set_userns_mappings(&mut spec, pod_config)?;
        }
        // No plugin can connect meanwhile (this create holds off their synchronization).
        if self.nri.active() {
            spec = self.nri_adjust(record, pod, spec).await?;
        } else {
            self.nri.note_created(&id);
        }
        if restore.is_some() {
            spec = super::restore::restore_spec(spec, &restore_dir)?;
        }
        phases.mark("spec");
        write_spec(&paths.bundle, &spec, self.host())?;
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
                    dir_error(
                        format!(
                            "log directory {} (the pod's log_directory with log_path) cannot be \
                             made",
                            excerpt(&dir.to_string_lossy())
                        ),
                        e,
                    )
                })?;
            }
        }
        phases.mark("bundle");
        ahead.done().await?;
        let shim = self.shims.get(&pod.id).await?;
        // A restore runs CRIU, which resets the cgroup2 mount's options.
        let preserved = restore.map(|_| crate::cgroups::root_options::preserve());
        let pid = shim
            .create_container(crius_api::shim::CreateContainer {
                id: id.clone(),
                bundle: paths.bundle.clone(),
                stdin: config.stdin,
                stdin_once: config.stdin_once,
                tty: config.tty,
                log_path: record.log_path.clone(),
                runtime: handler.oci_runtime(),
                restore: restore.map(|(_, criu)| crius_api::shim::Restore {
                    images: restore_dir.join(super::checkpoint::names::CHECKPOINT_DIR),
                    criu: criu.to_path_buf(),
                }),
            })
            .await;
        drop(preserved);
        let pid = pid.map_err(|e| super::diagnose::explain(e.into(), &spec, &paths.rootfs))?;
        if restore.is_some() {
            // The processes are restored (stopped until the start): the images are not needed.
            if let Err(e) = std::fs::remove_dir_all(&restore_dir) {
                tracing::warn!(container = %id, "remove {}: {e}", restore_dir.display());
            }
        }
        cgroups::attach(&pod.cgroup, &id, pid).await?;
        Ok(pid)
    }

    /// Asks NRI plugins about the container about to be created and applies what they adjust
    /// to its spec (and its recorded resources); their updates of other containers are
    /// applied in the background, outside this pod's lock.
    async fn nri_adjust(
        self: &Arc<Self>,
        record: &mut ContainerRecord,
        pod: &crate::records::SandboxRecord,
        spec: oci_spec::runtime::Spec,
    ) -> Result<oci_spec::runtime::Spec> {
        let mut json =
            serde_json::to_value(&spec).map_err(|e| Error::internal("spec as JSON for NRI", e))?;
        let nri_pod = crate::nri::convert::pod(pod);
        let nri_container = crate::nri::convert::container(record, Some(&json));
        let (adjustment, updates) = self.nri.create_container(&nri_pod, &nri_container).await?;
        self.nri_apply_later(updates);
        if adjustment.is_empty() {
            return Ok(spec);
        }
        adjustment.apply(&mut json);
        let adjusted: oci_spec::runtime::Spec =
            serde_json::from_value(json.clone()).map_err(|e| {
                Error::FailedPrecondition(format!(
                    "NRI plugins' adjustments make an invalid OCI spec: {e}"
                ))
            })?;
        let resources = crate::nri::convert::resources(&json["linux"]["resources"]);
        let current = record.resources().unwrap_or_default();
        record.resources = crate::nri::convert::to_cri(&resources, &current).encode_to_vec();
        Ok(adjusted)
    }

    /// The pod's user namespace, when it has one, for the container's idmapped mounts.
    pub(super) fn pod_userns(
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
    pub(super) fn target_pid(&self, config: &ContainerConfig) -> Result<Option<u32>> {
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
}

/// The annotations the pod's handler passes: the container's own only where
/// `container_annotations` lets them through, and the pod's that `pod_annotations` names (a
/// sandboxed runtime such as gVisor reads its pod-wide settings from each container's spec).
fn handler_annotations(
    mut spec: oci_spec::runtime::Spec,
    handler: &crate::handlers::Handler,
    config: &ContainerConfig,
    pod_config: &PodSandboxConfig,
) -> oci_spec::runtime::Spec {
    let mut notes = spec.annotations().clone().unwrap_or_default();
    for key in config.annotations.keys() {
        if !key.starts_with("io.kubernetes.cri.") && !handler.passes_container_annotation(key) {
            notes.remove(key);
        }
    }
    for (k, v) in handler.pod_annotations_for_containers(&pod_config.annotations) {
        notes.entry(k.clone()).or_insert_with(|| v.clone());
    }
    spec.set_annotations(Some(notes));
    spec
}

/// Why the directory for a mount's missing host path could not be made (see [`dir_error`]).
fn missing_host_path(i: usize, m: &crius_api::v1::Mount, e: std::io::Error) -> Error {
    dir_error(
        format!(
            "mounts[{i}] ({}): host_path {} does not exist and cannot be made a directory",
            excerpt(&m.container_path),
            excerpt(&m.host_path)
        ),
        e,
    )
}

/// A directory a request names that could not be made: the path's fault (something there
/// that cannot be followed or is not a directory, a file on the way, too long, a file system
/// such as procfs that makes no directories and answers ENOENT) is InvalidArgument; a node
/// that refuses it (read-only, full, permissions) FailedPrecondition.
fn dir_error(what: String, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EEXIST | libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP | libc::ENOENT) => {
            Error::InvalidArgument(format!("{what}: {e}"))
        }
        Some(libc::EROFS | libc::EACCES | libc::EPERM | libc::ENOSPC | libc::EDQUOT) => {
            Error::FailedPrecondition(format!("{what}: {e}"))
        }
        _ => Error::internal(what, e),
    }
}
