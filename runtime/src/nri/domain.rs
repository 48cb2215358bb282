//! The daemon as NRI sees it: pods and containers for plugins' snapshots and events, and the
//! resource updates plugins ask for.

use std::sync::Arc;

use crius_api::nri::api;
use futures::future::BoxFuture;

use super::convert;
use crate::container::{ContainerPaths, ContainerRecord};
use crate::daemon::Daemon;
use crate::records::{SandboxRecord, SandboxState};

impl Daemon {
    /// The pod `id` in NRI form (an empty one, with the id, if it is gone).
    pub(crate) fn nri_pod(&self, id: &str) -> api::PodSandbox {
        match self.sandboxes.get(id) {
            Some(r) => convert::pod(&r),
            None => api::PodSandbox {
                id: id.to_string(),
                ..Default::default()
            },
        }
    }

    /// `record` in NRI form, with what its bundle's `config.json` says.
    pub(crate) fn nri_container(&self, record: &ContainerRecord) -> api::Container {
        let path = ContainerPaths::new(&self.config.root, &self.config.state, &record.id)
            .bundle
            .join("config.json");
        let spec = std::fs::read(&path)
            .ok()
            .and_then(|data| serde_json::from_slice::<serde_json::Value>(&data).ok());
        convert::container(record, spec.as_ref())
    }

    /// The container `id` in NRI form, from its record now.
    pub(crate) fn nri_container_id(&self, id: &str) -> api::Container {
        match self.containers.get(id) {
            Some(r) => self.nri_container(&r),
            None => api::Container {
                id: id.to_string(),
                ..Default::default()
            },
        }
    }

    /// Applies updates plugins ask for, each as `UpdateContainerResources` would (without
    /// asking plugins again); returns those that failed and were not marked `ignore_failure`.
    pub(crate) async fn nri_apply_updates(
        self: &Arc<Self>,
        updates: Vec<api::ContainerUpdate>,
    ) -> Vec<api::ContainerUpdate> {
        let mut failed = Vec::new();
        for u in updates {
            let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
                continue;
            };
            let current = self
                .containers
                .get(&u.container_id)
                .and_then(|c| c.resources())
                .unwrap_or_default();
            let new = convert::to_cri(res, &current);
            if let Err(e) = self
                .apply_container_resources(&u.container_id, Some(new))
                .await
            {
                tracing::warn!(container = %u.container_id, "nri: update from a plugin: {e}");
                if !u.ignore_failure {
                    failed.push(u);
                }
            }
        }
        failed
    }

    /// [`Daemon::nri_apply_updates`] in a task of its own: the caller may hold locks the
    /// updates need (the stop, removal or creation of another container).
    pub(crate) fn nri_apply_later(self: &Arc<Self>, updates: Vec<api::ContainerUpdate>) {
        if updates.is_empty() {
            return;
        }
        let daemon = Arc::clone(self);
        tokio::spawn(async move {
            let failed = daemon.nri_apply_updates(updates).await;
            if !failed.is_empty() {
                tracing::warn!("nri: {} updates plugins asked for failed", failed.len());
            }
        });
    }

    /// Starts NRI: the socket, the pre-installed plugins, and what plugins were told exists.
    pub(crate) fn start_nri(self: &Arc<Self>) {
        let known: Vec<String> = self
            .sandboxes
            .all()
            .into_iter()
            .map(|p| p.id)
            .chain(self.containers.all().into_iter().map(|c| c.id))
            .collect();
        let domain: Arc<dyn super::Domain> = Arc::new(DaemonDomain(Arc::downgrade(self)));
        self.nri.start(domain, known);
    }
}

/// The daemon behind a weak reference (the daemon owns the NRI state).
struct DaemonDomain(std::sync::Weak<Daemon>);

impl super::Domain for DaemonDomain {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        let Some(d) = self.0.upgrade() else {
            return (Vec::new(), Vec::new());
        };
        let pods: Vec<SandboxRecord> = d
            .sandboxes
            .all()
            .into_iter()
            .filter(|p| p.state != SandboxState::Creating)
            .collect();
        let containers = d
            .containers
            .all()
            .into_iter()
            .filter(|c| c.state != crate::records::ContainerState::Creating)
            .map(|c| d.nri_container(&c))
            .collect();
        (pods.iter().map(convert::pod).collect(), containers)
    }

    fn update_containers(
        self: Arc<Self>,
        updates: Vec<api::ContainerUpdate>,
    ) -> BoxFuture<'static, Vec<api::ContainerUpdate>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(d) => d.nri_apply_updates(updates).await,
                None => updates,
            }
        })
    }
}
