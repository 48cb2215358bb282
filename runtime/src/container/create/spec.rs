//! The container's OCI spec and bundle: built from the resolved request, the handler's
//! annotations, NRI plugins' adjustments and a restore's CRIU configuration; written with
//! the directories the process needs (its working directory, its log's).

use std::path::PathBuf;
use std::sync::Arc;

use crius_api::v1::{ContainerConfig, PodSandboxConfig};
use oci_spec::runtime::Spec;
use prost::Message as _;

use super::super::{ContainerRecord, ContainerState};
use super::resolved::CreateRequest;
use super::rootfs::dir_error;
use crate::cgroups;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::Handler;
use crate::util::{excerpt, Phases};

/// What a spec input borrows that the request holds in another form.
struct Places {
    /// The image-name annotation: the image as ContainerStatus will name it.
    shown_image: String,
    cgroups_path: String,
    hosts: PathBuf,
    resolv: PathBuf,
    hostname: PathBuf,
}

impl Places {
    fn of(req: &CreateRequest) -> Places {
        let user_specified = req
            .config
            .image
            .as_ref()
            .map(|i| i.user_specified_image.as_str());
        let dir = &req.pod_paths.dir;
        Places {
            shown_image: super::super::shown_image_name(
                user_specified.unwrap_or_default(),
                &req.image_name,
                req.image.repo_tags.first().map(String::as_str),
                &req.image.id,
            ),
            cgroups_path: cgroups::container_cgroup(&req.pod.cgroup, &req.id),
            hosts: dir.join("hosts"),
            resolv: dir.join("resolv.conf"),
            hostname: dir.join("hostname"),
        }
    }
}

impl Daemon {
    /// The container's spec from `staged` (the config with its volumes staged), as the
    /// handler runs it and NRI plugins adjust it (which may change `record`'s resources).
    pub(super) async fn build_spec(
        self: &Arc<Self>,
        req: &CreateRequest,
        record: &mut ContainerRecord,
        staged: &ContainerConfig,
    ) -> Result<Spec> {
        let spec = self.base_spec(req, staged)?;
        let mut spec = handler_annotations(spec, &req.handler, &req.config, &req.pod_config);
        if req.handler.oci_runtime().is_some() {
            crate::spec::set_userns_mappings(&mut spec, &req.pod_config)?;
        }
        // No plugin can connect meanwhile (this create holds off their synchronization).
        if self.nri.active() {
            spec = self.nri_adjust(record, &req.pod, spec).await?;
        } else {
            self.nri.note_created(&req.id);
        }
        if req.restore.is_some() {
            spec = super::super::restore::restore_spec(spec, &req.restore_dir())?;
        }
        Ok(spec)
    }

    /// The spec crius builds: image config + CRI config + containerd's defaults.
    fn base_spec(&self, req: &CreateRequest, staged: &ContainerConfig) -> Result<Spec> {
        let places = Places::of(req);
        let pod = &req.pod;
        let shm = req
            .pod_paths
            .shm
            .exists()
            .then_some(req.pod_paths.shm.as_path());
        Ok(crate::spec::container_spec(
            &crate::spec::ContainerSpecInput {
                container_id: &req.id,
                sandbox_id: &pod.id,
                image_name: &places.shown_image,
                config: staged,
                sandbox_config: &req.pod_config,
                image_config: &req.image_config,
                rootfs: &req.paths.rootfs,
                sandbox_pid: pod.pause_pid,
                netns_path: pod.netns.as_deref(),
                cgroups_path: &places.cgroups_path,
                hostname: &pod.hostname,
                resolv_conf: Some(&places.resolv),
                hosts: Some(&places.hosts),
                hostname_file: Some(&places.hostname),
                shm_dir: shm,
                target_pid: self.target_pid(&req.config)?,
                host_devices_for_privileged: req.handler.host_devices_for_privileged(),
                builtin: req.handler.config.kind == crate::config::HandlerType::Builtin,
                host: self.host(),
            },
        )?)
    }

    /// Writes `config.json` and makes the directories the process needs: a working directory
    /// the image lacks (as runc does under containerd) and its log's.
    pub(super) fn write_bundle(
        &self,
        req: &CreateRequest,
        record: &ContainerRecord,
        spec: &Spec,
        phases: &mut Phases,
    ) -> Result<()> {
        crate::layout::write_spec(&req.paths.bundle, spec, self.host())?;
        if let Some(cwd) = spec.process().as_ref().map(|p| p.cwd()) {
            crate::util::mkdir_in_root(&req.paths.rootfs, cwd, req.owner()).map_err(|e| {
                Error::InvalidArgument(format!(
                    "config.working_dir {:?} cannot be made in the image: {e}",
                    excerpt(&cwd.to_string_lossy())
                ))
            })?;
        }
        if let Some(dir) = record.log_path.as_ref().and_then(|l| l.parent()) {
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
        phases.mark("bundle");
        Ok(())
    }

    /// Asks NRI plugins about the container about to be created and applies what they adjust
    /// to its spec (and its recorded resources); their updates of other containers are
    /// applied in the background, outside this pod's lock.
    async fn nri_adjust(
        self: &Arc<Self>,
        record: &mut ContainerRecord,
        pod: &crate::records::SandboxRecord,
        spec: Spec,
    ) -> Result<Spec> {
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
        let adjusted: Spec = serde_json::from_value(json.clone()).map_err(|e| {
            Error::FailedPrecondition(format!(
                "NRI plugins' adjustments make an invalid OCI spec: {e}"
            ))
        })?;
        let resources = crate::nri::convert::resources(&json["linux"]["resources"]);
        let current = record.resources().unwrap_or_default();
        record.resources = crate::nri::convert::to_cri(&resources, &current).encode_to_vec();
        Ok(adjusted)
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
}

/// The annotations the pod's handler passes: the container's own only where
/// `container_annotations` lets them through, and the pod's that `pod_annotations` names (a
/// sandboxed runtime such as gVisor reads its pod-wide settings from each container's spec).
fn handler_annotations(
    mut spec: Spec,
    handler: &Handler,
    config: &ContainerConfig,
    pod_config: &PodSandboxConfig,
) -> Spec {
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
