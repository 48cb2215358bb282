//! `CreateContainer`: validation, then the record, the image lease, the rootfs, volumes and
//! the OCI bundle, and the container in the pod's shim; one teardown undoes a failed step.
//!
//! The request is resolved once (`resolved.rs`: the pod, its handler, the image and its
//! config, the user namespace, the restore source, the paths), checked (`validate.rs`), and
//! the steps below read it top-down: the rootfs and volumes (`rootfs.rs`), the spec and
//! bundle (`spec.rs`), the shim's create.

mod resolved;
mod rootfs;
mod spec;
mod validate;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crius_api::v1::{ContainerConfig, ContainerEventType};
use tokio::task::JoinHandle;

use super::{ContainerRecord, ContainerState};
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::store::Flush;
use crate::util::Phases;
use resolved::CreateRequest;

/// How long after a RunPodSandbox or StartContainer has returned crius asks for the helper
/// of the pod's next create: enough for the reply to be written. A create that comes sooner
/// asks for its helper itself. Lifecycle bench: StartContainer 0.82 -> 0.72 ms; the next
/// create, 8 ms after the start, still found its helper waiting (its `shim_create` phase did
/// not grow).
const AHEAD_AFTER_REPLY: Duration = Duration::from_millis(1);

/// What a create starts before its rootfs and spec and waits for before it asks the shim
/// (and, when it fails before that, before its undo, which must come after it).
struct Ahead {
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
        let mut phases = Phases::start();
        validate::request(&config)?;
        let pod_id = self.pod_not_starting(pod_id)?;
        // Held to the end: a plugin synchronizing meanwhile sees this container in its
        // snapshot or as an event, never neither nor both.
        let _nri_sync = self.nri.block_sync().await;
        let _pod_lock = self.locks.lock(&pod_id).await;
        let req = self.resolve_create(&pod_id, config).await?;
        // The request is good and its image here: the shim starts this create's helper now,
        // while the record is written and the rootfs and spec are made, so its exec and start
        // are off the create's path.
        phases.mark("checks");
        let prepared = self.prepare_shim_helper(&req.pod.id);
        let record = req.record();
        let flushed = self.put_creating(&req, record.clone())?;
        let ahead = Ahead {
            helper: Some(prepared),
            record: Some(flushed),
            cgroup: None,
        };
        phases.mark("record");
        if let Err(e) = self.setup_container(&req, record, ahead, &mut phases).await {
            self.undo_create(&req.id, &e).await;
            return Err(e);
        }
        // Followed from now on, not only once started: a created container whose shim dies
        // is reported exited, with the reason.
        self.watch_exit(req.pod.id.clone(), req.id.clone());
        self.events.emit(
            ContainerEventType::ContainerCreatedEvent,
            &req.id,
            &req.pod.id,
        );
        self.nri
            .post(
                crius_api::nri::api::Event::PostCreateContainer,
                || self.nri_pod(&req.pod.id),
                || self.nri_container_id(&req.id),
            )
            .await;
        phases.mark("after");
        tracing::debug!(container = %req.id, phases = %phases, "create phases");
        Ok(req.id)
    }

    /// Reserves the name and writes the record in one commit, flushed to disk on a blocking
    /// thread (the returned task) while the rootfs and spec are made, and on disk before the
    /// shim is asked: no container runs that a crash could leave without its record. What a
    /// crash before the flush leaves (the rootfs, the container's directories, the lease) the
    /// next start removes (`remove_unrecorded_containers`, `release_orphan_leases`).
    fn put_creating(
        self: &Arc<Self>,
        req: &CreateRequest,
        record: ContainerRecord,
    ) -> Result<JoinHandle<crate::store::Result<()>>> {
        let name = &req.name;
        if let Some(holder) =
            self.containers
                .put_named(&self.store, &req.id, record, name, Flush::Later)?
        {
            return Err(Error::AlreadyExists(format!(
                "container name {name:?} is reserved for {holder}"
            )));
        }
        let daemon = Arc::clone(self);
        Ok(tokio::task::spawn_blocking(move || daemon.store.flush()))
    }

    /// Undoes a create that failed after its record was written.
    async fn undo_create(self: &Arc<Self>, id: &str, e: &Error) {
        tracing::warn!(container = %id, "create failed, undoing: {e}");
        let undone = {
            let lock = self.locks.lock(id).await;
            self.remove_container_locked(&lock).await
        };
        if let Err(undo) = undone {
            // The shim may still be busy with the create (crius gave up waiting): the undo is
            // retried until the shim has settled it, never forgotten.
            tracing::warn!(container = %id, "undo of a failed create, retrying: {undo}");
            let (daemon, id) = (Arc::clone(self), id.to_owned());
            tokio::spawn(async move { daemon.remove_interrupted(&id).await });
        }
    }

    /// Everything after the record: the image lease, the container made, the record
    /// `Created`.
    async fn setup_container(
        self: &Arc<Self>,
        req: &CreateRequest,
        mut record: ContainerRecord,
        mut ahead: Ahead,
        phases: &mut Phases,
    ) -> Result<()> {
        // The lease holds the layers from here on; its file (two disk flushes) is written on a
        // blocking thread meanwhile, and is on disk before the container is recorded created.
        let (lowerdirs, lease_file) = self.images.lease_deferred(&req.id, &req.image.id)?;
        let persist_lease = tokio::task::spawn_blocking(move || lease_file.persist());
        if req.handler.config.kind == crate::config::HandlerType::Builtin {
            let (pod_cgroup, id) = (req.pod.cgroup.clone(), req.id.clone());
            ahead.cgroup = Some(tokio::task::spawn_blocking(move || {
                cgroups::make_container_dirs_ahead(&pod_cgroup, &id)
            }));
        }
        let made = self
            .make_container(req, &mut record, &mut ahead, &lowerdirs, phases)
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
        self.containers
            .put_unflushed(&self.store, &req.id, record)?;
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
        req: &CreateRequest,
        record: &mut ContainerRecord,
        ahead: &mut Ahead,
        lowerdirs: &[PathBuf],
        phases: &mut Phases,
    ) -> Result<i32> {
        let staged = self.make_rootfs(req, lowerdirs, phases).await?;
        let spec = self.build_spec(req, record, &staged).await?;
        phases.mark("spec");
        self.write_bundle(req, record, &spec, phases)?;
        ahead.done().await?;
        let pid = self.shim_create(req, record, &spec).await?;
        cgroups::attach(&req.pod.cgroup, &req.id, pid).await?;
        Ok(pid)
    }

    /// The shim's create (for a restore, CRIU's): the container's init's pid. A refusal is
    /// examined for a cause the request can fix (`diagnose.rs`).
    async fn shim_create(
        &self,
        req: &CreateRequest,
        record: &ContainerRecord,
        spec: &oci_spec::runtime::Spec,
    ) -> Result<i32> {
        let shim = self.shims.get(&req.pod.id).await?;
        let restore_dir = req.restore_dir();
        // A restore runs CRIU, which resets the cgroup2 mount's options.
        let preserved = req
            .restore
            .as_ref()
            .map(|_| cgroups::root_options::preserve());
        let pid = shim
            .create_container(crius_api::shim::CreateContainer {
                id: req.id.clone(),
                bundle: req.paths.bundle.clone(),
                stdin: req.config.stdin,
                stdin_once: req.config.stdin_once,
                tty: req.config.tty,
                log_path: record.log_path.clone(),
                runtime: req.handler.oci_runtime(),
                restore: req.restore.as_ref().map(|r| crius_api::shim::Restore {
                    images: restore_dir.join(super::checkpoint::names::CHECKPOINT_DIR),
                    criu: r.criu.clone(),
                }),
            })
            .await;
        drop(preserved);
        let pid = pid.map_err(|e| super::diagnose::explain(e.into(), spec, &req.paths.rootfs))?;
        if req.restore.is_some() {
            // The processes are restored (stopped until the start): the images are not needed.
            if let Err(e) = std::fs::remove_dir_all(&restore_dir) {
                tracing::warn!(container = %req.id, "remove {}: {e}", restore_dir.display());
            }
        }
        Ok(pid)
    }
}
