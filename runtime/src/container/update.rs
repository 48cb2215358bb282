//! Changing resources of live cgroups: `UpdateContainerResources` and
//! `UpdatePodSandboxResources`, and where a container's and a pod's cgroups are.

use std::sync::Arc;

use crius_api::v1::{LinuxContainerResources, PodSandboxConfig};
use prost::Message as _;

use crate::cgroups::{self, Hierarchy};
use crate::container::{ContainerPaths, ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::records::SandboxRecord;

impl Daemon {
    /// The cgroupfs path of a container's cgroup, as its OCI spec named it.
    pub fn container_cgroup_path(&self, pod: &SandboxRecord, id: &str) -> Result<String> {
        let path = cgroups::container_cgroups_path(self.config.cgroup.driver, &pod.cgroup, id);
        Ok(cgroups::fs_path(&path)?)
    }

    /// The cgroupfs path of a pod's cgroup.
    pub fn pod_cgroup_path(&self, pod: &SandboxRecord) -> Result<String> {
        Ok(cgroups::fs_path(&pod.cgroup)?)
    }

    /// `UpdateContainerResources`: applies `linux` over the container's current resources
    /// (unset fields keep their values, see [`cgroups::merge_resources`]) to its live cgroup,
    /// all or nothing. Only a created or running container can be updated. The record (and so
    /// `ContainerStatus.resources`) and the bundle's spec change only once the kernel took
    /// every value.
    pub async fn update_container_resources(
        self: &Arc<Self>,
        id: &str,
        linux: Option<LinuxContainerResources>,
    ) -> Result<()> {
        let c = self.container(id)?;
        let Some(mut new) = linux else {
            // A request with Windows resources only has nothing for Linux to do.
            return self.apply_container_resources(&c.id, None).await;
        };
        let mut others = Vec::new();
        if self.nri.active() {
            let merged = cgroups::merge_resources(&c.resources().unwrap_or_default(), &new);
            let updates = self
                .nri
                .update_container(
                    || self.nri_pod(&c.sandbox_id),
                    || self.nri_container(&c),
                    crate::nri::convert::cri_resources(&merged),
                )
                .await?;
            for u in updates {
                match u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                    // what a plugin wants for this very container replaces the request
                    Some(r) if u.container_id == c.id => new = crate::nri::convert::to_cri(r, &new),
                    _ => others.push(u),
                }
            }
        }
        self.apply_container_resources(&c.id, Some(new)).await?;
        if self.nri.active() {
            let failed = self.nri_apply_updates(others).await;
            if !failed.is_empty() {
                tracing::warn!(container = %c.id, "nri: {} updates of other containers failed", failed.len());
            }
            self.nri
                .post(
                    crius_api::nri::api::Event::PostUpdateContainer,
                    || self.nri_pod(&c.sandbox_id),
                    || self.nri_container_id(&c.id),
                )
                .await;
        }
        Ok(())
    }

    /// Applies `linux` over the container's resources (the body of
    /// [`Daemon::update_container_resources`], also used for NRI plugins' updates).
    pub(crate) async fn apply_container_resources(
        self: &Arc<Self>,
        id: &str,
        linux: Option<LinuxContainerResources>,
    ) -> Result<()> {
        let c = self.container(id)?;
        let _lock = self.locks.lock(&c.id).await;
        let c = self.container(&c.id)?;
        if !matches!(c.state, ContainerState::Created | ContainerState::Running) {
            return Err(Error::FailedPrecondition(format!(
                "container {} is {:?}: only a created or running container can be updated",
                c.id, c.state
            )));
        }
        let Some(new) = linux else {
            return Ok(());
        };
        let merged = cgroups::merge_resources(&c.resources().unwrap_or_default(), &new);
        // Same checks as at create time (negative values, sizes).
        let oci = crate::spec::resources_to_oci(&merged)?;
        let pod = self.pod(&c.sandbox_id)?;
        let path = self.container_cgroup_path(&pod, &c.id)?;
        let hierarchy = Hierarchy::host()?;
        let to_apply = merged.clone();
        tokio::task::spawn_blocking(move || hierarchy.apply(&path, &to_apply))
            .await
            .map_err(|e| Error::internal("apply container resources", e))?
            .map_err(|e| annotate(e, &c.id))?;
        self.containers.update(&self.store, &c.id, |r| {
            r.resources = merged.encode_to_vec();
        })?;
        if let Err(e) = self.update_spec_resources(&c, oci) {
            // The cgroup and the record are right; the spec only serves `verbose` status.
            tracing::warn!(container = %c.id, "update resources in the bundle's spec: {e}");
        }
        Ok(())
    }

    /// Writes the new cgroup resources into the container's `config.json`, keeping what else
    /// it had in `linux.resources` (device rules, pids).
    fn update_spec_resources(
        &self,
        c: &ContainerRecord,
        new: oci_spec::runtime::LinuxResources,
    ) -> Result<()> {
        let mut spec = self.container_spec(&c.id)?;
        let Some(linux) = spec.linux_mut() else {
            return Ok(());
        };
        let mut resources = linux.resources().clone().unwrap_or_default();
        resources.set_cpu(new.cpu().clone());
        resources.set_memory(*new.memory());
        resources.set_hugepage_limits(new.hugepage_limits().clone());
        resources.set_unified(new.unified().clone());
        linux.set_resources(Some(resources));
        let bundle = ContainerPaths::new(&self.config.root, &self.config.state, &c.id).bundle;
        crate::layout::write_spec(&bundle, &spec, self.host())
    }

    /// `UpdatePodSandboxResources`: kubelet tells the pod-level resources it has already
    /// applied. The pod's config keeps them, and they are written to the pod cgroup (resources
    /// plus overhead, as at `RunPodSandbox`); CRI makes this best effort, so a refused value is
    /// reported but the config is kept.
    pub async fn update_pod_resources(
        self: &Arc<Self>,
        id: &str,
        overhead: Option<LinuxContainerResources>,
        resources: Option<LinuxContainerResources>,
    ) -> Result<()> {
        let pod = self.pod(id)?;
        let _lock = self.locks.lock(&pod.id).await;
        let pod = self.pod(&pod.id)?;
        let mut config: PodSandboxConfig = pod.config();
        if self.nri.active() {
            let conv = crate::nri::convert::cri_resources;
            self.nri
                .update_pod_sandbox(
                    crate::nri::convert::pod(&pod),
                    overhead.as_ref().map(conv),
                    resources.as_ref().map(conv),
                )
                .await?;
        }
        let linux = config.linux.get_or_insert_with(Default::default);
        linux.overhead = overhead;
        linux.resources = resources;
        let encoded = config.encode_to_vec();
        self.sandboxes.update(&self.store, &pod.id, |r| {
            r.config = encoded;
        })?;
        let path = self.pod_cgroup_path(&pod)?;
        if !Hierarchy::host()?.exists(&path) {
            // A pod whose pause never started (or is gone) has no cgroup to update.
            return Ok(());
        }
        tokio::task::spawn_blocking(move || cgroups::apply_pod_resources(&path, &config))
            .await
            .map_err(|e| Error::internal("apply pod resources", e))?
            .map_err(|e| annotate(e, &pod.id))?;
        if self.nri.active() {
            self.nri
                .post_update_pod_sandbox(self.nri_pod(&pod.id))
                .await;
        }
        Ok(())
    }
}

/// A cgroup error as the client sees it, naming the container or pod.
fn annotate(e: cgroups::CgroupError, id: &str) -> Error {
    match Error::from(e) {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("update {id}: {m}")),
        Error::FailedPrecondition(m) => Error::FailedPrecondition(format!("update {id}: {m}")),
        other => other,
    }
}
