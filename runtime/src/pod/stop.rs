//! `StopPodSandbox`: the pod's containers and pause process stopped, its network released.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crius_api::v1::ContainerEventType;

use super::{PodPaths, SandboxRecord, SandboxState};
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::mounts;
use crate::util::LockGuard;

impl Daemon {
    /// `StopPodSandbox`: stops the pod's containers and its pause process, releases its
    /// network. Idempotent; an unknown id is success.
    pub async fn stop_pod(self: &Arc<Self>, id: &str) -> Result<()> {
        let Some(id) = self.resolve_pod_id(id)? else {
            return Ok(());
        };
        let lock = self.locks.lock(&id).await;
        self.stop_pod_locked(&lock).await
    }

    /// Stops the pod whose lock `held` is.
    pub(super) async fn stop_pod_locked(self: &Arc<Self>, held: &LockGuard<'_>) -> Result<()> {
        let id = held.id();
        let Some(record) = self.sandboxes.get(id) else {
            return Ok(());
        };
        let stopped_cleanly = record.state == SandboxState::NotReady
            && record.netns.is_none()
            && record.network_error.is_none();
        if stopped_cleanly {
            return Ok(());
        }
        let mut phases = crate::util::Phases::start();
        // Each under its own lock (pod lock first, then container's, the one order used), so
        // a concurrent StopContainer or RemoveContainer finishes before this looks.
        for c in self.containers_of(id) {
            let lock = self.locks.lock(&c.id).await;
            self.stop_container_locked(&lock, 0).await?;
        }
        // Plugins hear of the stop with the containers stopped and the pod still there.
        self.nri
            .stop_pod_sandbox(id, || crate::nri::convert::pod(&record))
            .await;
        phases.mark("containers_nri");
        // The pause is killed while the network is released: the CNI DEL needs the pinned
        // netns, not the pause, which holds nothing the plugins release (the containers are
        // stopped already, and the bridge plugin removes the pod's link before its address).
        let pause = async {
            let began = Instant::now();
            if let Ok(shim) = self.shims.get(id).await {
                if record.pause_pid.is_some() {
                    let _ = shim.kill(id, libc::SIGKILL, true).await;
                    let _ = shim.wait(id, Some(Duration::from_secs(5))).await;
                }
            }
            let killed = began.elapsed();
            // Whatever is still in the cgroups of the pod's containers and pause has no shim
            // to stop it (the shim died and its processes went to init): kill it there. Only
            // those cgroups, not the whole pod cgroup: a client may (wrongly) give two pods
            // one parent.
            let mut leftovers: Vec<String> = self
                .containers_of(id)
                .iter()
                .map(|c| cgroups::container_cgroup(&record.cgroup, &c.id))
                .collect();
            leftovers.push(cgroups::container_cgroup(&record.cgroup, id));
            for cgroup in &leftovers {
                if !cgroups::reap::empty_cgroup_tree(cgroup, Duration::from_secs(5)).await {
                    tracing::warn!(pod = id, cgroup = %cgroup, "processes survive SIGKILL");
                }
            }
            (killed, began.elapsed() - killed)
        };
        let network = async {
            let began = Instant::now();
            (self.release_network(&record).await, began.elapsed())
        };
        let ((killed, reaped), (released, del)) = tokio::join!(pause, network);
        phases.mark("pause_and_network");
        phases.add("pause_kill", killed);
        phases.add("cgroup_reap", reaped);
        phases.add("cni_del", del);
        released?;
        mounts::unmount(&PodPaths::new(&self.config.state, id).shm)?;
        let mut stopped_now = false;
        self.sandboxes.update(&self.store, id, |r| {
            if r.state != SandboxState::Creating {
                stopped_now = r.state == SandboxState::Ready;
                r.state = SandboxState::NotReady;
            }
            r.network_error = None;
            r.netns = None;
            r.ips.clear();
        })?;
        if stopped_now {
            self.events
                .emit(ContainerEventType::ContainerStoppedEvent, id, id);
        }
        phases.mark("shm_record");
        tracing::debug!(pod = id, phases = %phases, "stop phases");
        Ok(())
    }

    /// CNI DEL (of whatever the attachment cache holds for the pod) and removal of the netns
    /// pin, both derived from the id so that a pod whose start was cut short is released too.
    /// A failure is kept on the record and retried by the next Stop or Remove.
    pub(super) async fn release_network(&self, record: &SandboxRecord) -> Result<()> {
        if record.host_network {
            return Ok(());
        }
        let timer = crate::telemetry::Timer::start();
        let result = self.network.teardown(&record.id).await;
        let metrics = crate::telemetry::metrics();
        let (ok, took) = (result.is_ok(), timer.elapsed());
        metrics.network_operation("tear_down_pod", ok, took, &metrics.sandbox_delete_network);
        if let Err(e) = result {
            let msg = crate::error::chain(&e);
            self.sandboxes.update(&self.store, &record.id, |r| {
                r.network_error = Some(msg.clone())
            })?;
            // A plugin's failure is the node's (FailedPrecondition and the like, see
            // `Error::from`); crius's own steps stay Internal.
            return Err(Error::from(e));
        }
        let paths = PodPaths::new(&self.config.state, &record.id);
        crius_cni::netns::remove(&paths.netns_dir.join(&record.id))?;
        crius_cni::netns::remove(&paths.userns)?;
        Ok(())
    }

    /// Retries, in the background, releasing network attachments that pods crius no longer
    /// has still hold (an undo whose CNI DEL failed): after 1 s, then twice as long each time
    /// up to a minute, for an hour; the next start of crius tries again after that. One retry
    /// loop at a time.
    pub(crate) fn release_network_later(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.network_release_pending.swap(true, Ordering::SeqCst) {
            return;
        }
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            let give_up = tokio::time::Instant::now() + Duration::from_secs(3600);
            let mut delay = Duration::from_secs(1);
            loop {
                tokio::time::sleep(delay).await;
                let valid = daemon.sandboxes.all().into_iter().map(|r| r.id).collect();
                match daemon.network.gc(&valid).await {
                    Ok(()) => {
                        tracing::info!("released the network attachments failed undos had left");
                        break;
                    }
                    Err(e) if tokio::time::Instant::now() < give_up => {
                        tracing::debug!("network release, will retry: {}", crate::error::chain(&e));
                        delay = (delay * 2).min(Duration::from_secs(60));
                    }
                    Err(e) => {
                        tracing::warn!(
                            "network attachments still not released after an hour (the next \
                             start tries again): {}",
                            crate::error::chain(&e)
                        );
                        break;
                    }
                }
            }
            daemon
                .network_release_pending
                .store(false, Ordering::SeqCst);
        });
    }
}
