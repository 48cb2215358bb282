//! `RestorePod`: a pod checkpoint written by `CheckpointPod` ([`super::checkpoint`]) made into
//! a new pod with its containers created from their archives, waiting for `StartContainer`.
//!
//! It is a `RunPodSandbox` with the request's config and handler, then for each container the
//! restore of `CreateContainer` (its image the container's archive in the checkpoint, see
//! `crate::container::restore`), which leaves the restored processes stopped until the
//! start. The checkpoint directory is only read. Anything that fails, the client's deadline
//! included, removes the pod and every container the call made before the answer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crius_api::v1::{ContainerConfig, RestorePodRequest};

use super::checkpoint::{
    check_absolute, check_no_options, work_by, PodDump, PodDumpContainer, FORMAT_VERSION, POD_JSON,
};
use crate::container::checkpoint::criu_binary;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::CheckpointSupport;
use crate::util::{check_name, excerpt};

/// Largest `pod.json` read.
const MAX_POD_JSON: u64 = 16 << 20;

/// The `pod.json` of the checkpoint at `dir`.
fn read_pod_dump(dir: &Path, shown: &str) -> Result<PodDump> {
    let bad = |why: String| {
        Error::InvalidArgument(format!("checkpoint_path {:?}: {why}", excerpt(shown)))
    };
    let path = dir.join(POD_JSON);
    let data = crate::util::read_regular(&path, MAX_POD_JSON).map_err(|e| {
        bad(format!(
            "no readable {POD_JSON} ({e}): not a pod checkpoint written by crius"
        ))
    })?;
    let dump: PodDump =
        serde_json::from_slice(&data).map_err(|e| bad(format!("{POD_JSON}: {e}")))?;
    if dump.version != FORMAT_VERSION {
        return Err(bad(format!(
            "{POD_JSON} has format version {}, this crius reads {FORMAT_VERSION}",
            dump.version
        )));
    }
    for c in &dump.containers {
        let plain = Path::new(&c.archive)
            .file_name()
            .is_some_and(|n| n == c.archive.as_str());
        if !plain || !dir.join(&c.archive).is_file() {
            return Err(bad(format!(
                "the archive {:?} of container {:?} is missing",
                excerpt(&c.archive),
                excerpt(&c.name)
            )));
        }
    }
    Ok(dump)
}

/// `container_configs`: not empty, every name given once, and the names those of the
/// checkpoint's containers, no more, no fewer.
fn check_names(configs: &[ContainerConfig], dump: &PodDump) -> Result<()> {
    if configs.is_empty() {
        return Err(Error::InvalidArgument(
            "container_configs: at least one container config is required".into(),
        ));
    }
    let mut given = BTreeSet::new();
    for (i, c) in configs.iter().enumerate() {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        check_name(&format!("container_configs[{i}].metadata.name"), name)
            .map_err(Error::InvalidArgument)?;
        if !given.insert(name) {
            return Err(Error::InvalidArgument(format!(
                "container_configs[{i}].metadata.name {:?} is given twice",
                excerpt(name)
            )));
        }
    }
    let checkpointed: BTreeSet<&str> = dump.containers.iter().map(|c| c.name.as_str()).collect();
    if given != checkpointed {
        let list = |s: Vec<&&str>| {
            s.iter()
                .map(|n| format!("{:?}", excerpt(n)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::InvalidArgument(format!(
            "container_configs: the names must be those of the checkpoint's containers; \
             missing: [{}], not in the checkpoint: [{}]",
            list(checkpointed.difference(&given).collect()),
            list(given.difference(&checkpointed).collect())
        )));
    }
    Ok(())
}

impl Daemon {
    /// `RestorePod`: the new pod's id and, for each config, its name and its container's id.
    /// `answer_by`: when the client's deadline needs the answer (the CRI asks for one; a call
    /// without is refused).
    pub async fn restore_pod(
        self: &Arc<Self>,
        req: RestorePodRequest,
        answer_by: Option<Instant>,
    ) -> Result<(String, Vec<(String, String)>)> {
        check_no_options("options", &req.options)?;
        let answer_by = answer_by.ok_or_else(|| {
            Error::InvalidArgument("RestorePod needs a deadline: set a timeout on the call".into())
        })?;
        let dir = check_absolute("checkpoint_path", &req.checkpoint_path)?;
        if !dir.is_dir() {
            return Err(Error::NotFound(format!(
                "checkpoint_path {:?}: no such directory",
                excerpt(&req.checkpoint_path)
            )));
        }
        let config = req
            .config
            .ok_or_else(|| Error::InvalidArgument("config is required".into()))?;
        let handler = self.handlers().get(&req.runtime_handler)?.clone();
        if self.handlers().restorer(&handler).is_none() {
            let why = match handler.checkpoint_support() {
                CheckpointSupport::None => "cannot restore CRIU checkpoints",
                _ => "cannot restore a checkpoint, and no usable runc handler can instead",
            };
            return Err(Error::Unsupported(format!(
                "restore pod: runtime handler {:?} ({}) {why}",
                handler.name,
                handler.config.binary.display()
            )));
        }
        let dump = read_pod_dump(&dir, &req.checkpoint_path)?;
        check_names(&req.container_configs, &dump)?;
        // Each config in the checkpoint's order, its image the container's archive.
        let mut creates: Vec<(String, ContainerConfig)> = Vec::new();
        for c in &dump.containers {
            let Some((i, given)) = req
                .container_configs
                .iter()
                .enumerate()
                .find(|(_, g)| g.metadata.as_ref().is_some_and(|m| m.name == c.name))
            else {
                continue;
            };
            let image = given.image.as_ref().map_or("", |i| i.image.as_str());
            let found = match image.is_empty() {
                true => self.images.get(&c.image_id)?.ok_or_else(|| {
                    Error::NotFound(format!(
                        "image {} that container {:?} was checkpointed with is not on this \
                         node: pull it first",
                        c.image_id,
                        excerpt(&c.name)
                    ))
                })?,
                false => self.images.get(image)?.ok_or_else(|| {
                    Error::NotFound(format!(
                        "container_configs[{i}].image.image {:?} not found",
                        excerpt(image)
                    ))
                })?,
            };
            // The image must be the one the checkpointed process ran.
            if found.id != c.image_id {
                return Err(Error::InvalidArgument(format!(
                    "container_configs[{i}].image.image {:?} ({}) is not the image container \
                     {:?} was checkpointed with ({})",
                    excerpt(image),
                    found.id,
                    excerpt(&c.name),
                    c.image_id
                )));
            }
            self.check_process(i, given, &found, c)?;
            crate::container::check_restorable(given, &config)?;
            let mut given = given.clone();
            given.image.get_or_insert_with(Default::default).image =
                dir.join(&c.archive).display().to_string();
            creates.push((c.name.clone(), given));
        }
        criu_binary(&self.config.runtime.criu_path)
            .await
            .map_err(Error::FailedPrecondition)?;

        let work_by = work_by(answer_by);
        let pod_id = self.run_pod(config, req.runtime_handler.clone()).await?;
        match self.restore_containers(&pod_id, creates, work_by).await {
            Ok(restored) => Ok((pod_id, restored)),
            Err(e) => {
                tracing::warn!(pod = %pod_id, "restore failed, removing the pod: {e}");
                if let Err(undo) = self.remove_pod(&pod_id).await {
                    tracing::error!(pod = %pod_id, "remove the pod of a failed restore: {undo}");
                }
                Err(e)
            }
        }
    }

    /// The command, arguments and working directory of `config` must describe the
    /// checkpointed process (they cannot change it: the process comes from the checkpoint).
    fn check_process(
        &self,
        i: usize,
        config: &ContainerConfig,
        image: &crius_image::ImageRecord,
        checkpointed: &PodDumpContainer,
    ) -> Result<()> {
        if checkpointed.args.is_empty() {
            return Ok(());
        }
        let image_config: serde_json::Value =
            serde_json::from_str(&self.images.config_json(image)?)
                .map_err(|e| Error::internal(format!("parse config of image {}", image.id), e))?;
        let (args, cwd) = crate::spec::process_args_cwd(config, &image_config).map_err(|e| {
            Error::InvalidArgument(format!(
                "container_configs[{i}]: {}",
                crate::error::chain(&e)
            ))
        })?;
        if args != checkpointed.args {
            return Err(Error::InvalidArgument(format!(
                "container_configs[{i}].command/args: they make {:?}, the checkpointed process \
                 of {:?} runs {:?}",
                excerpt(&args.join(" ")),
                excerpt(&checkpointed.name),
                excerpt(&checkpointed.args.join(" "))
            )));
        }
        if !checkpointed.cwd.is_empty() && cwd != Path::new(&checkpointed.cwd) {
            return Err(Error::InvalidArgument(format!(
                "container_configs[{i}].working_dir: {:?}, the checkpointed process of {:?} \
                 works in {:?}",
                excerpt(&cwd.display().to_string()),
                excerpt(&checkpointed.name),
                excerpt(&checkpointed.cwd)
            )));
        }
        Ok(())
    }

    async fn restore_containers(
        self: &Arc<Self>,
        pod_id: &str,
        creates: Vec<(String, ContainerConfig)>,
        work_by: Instant,
    ) -> Result<Vec<(String, String)>> {
        let late = || {
            Error::DeadlineExceeded(format!(
                "restore pod: not done within the deadline; pod {pod_id} and its containers \
                 are removed"
            ))
        };
        let mut restored = Vec::new();
        for (name, config) in creates {
            if Instant::now() >= work_by {
                return Err(late());
            }
            let archive: PathBuf = config
                .image
                .as_ref()
                .map(|i| PathBuf::from(&i.image))
                .unwrap_or_default();
            let id = self.create_container(pod_id, config).await.map_err(|e| {
                tracing::warn!(pod = %pod_id, "restore {}: {e}", archive.display());
                e
            })?;
            restored.push((name, id));
        }
        // Done too late, the client has its DeadlineExceeded already: it will never know
        // these ids, so they go.
        if Instant::now() >= work_by {
            return Err(late());
        }
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::ContainerMetadata;

    fn dump(names: &[&str]) -> PodDump {
        PodDump {
            version: FORMAT_VERSION,
            pod_sandbox_id: "p".into(),
            runtime_handler: String::new(),
            pod_config: Vec::new(),
            checkpointed_time: String::new(),
            containers: names
                .iter()
                .map(|n| PodDumpContainer {
                    name: n.to_string(),
                    id: format!("id-{n}"),
                    archive: format!("id-{n}.tar"),
                    image_id: String::new(),
                    image_name: String::new(),
                    args: Vec::new(),
                    cwd: String::new(),
                })
                .collect(),
        }
    }

    fn config(name: &str) -> ContainerConfig {
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_names_must_be_the_checkpoints() {
        let d = dump(&["a", "b"]);
        assert!(check_names(&[config("b"), config("a")], &d).is_ok());
        let e = check_names(&[], &d).unwrap_err().to_string();
        assert!(e.contains("at least one"), "{e}");
        let e = check_names(&[config("a")], &d).unwrap_err().to_string();
        assert!(e.contains("missing: [\"b\"]"), "{e}");
        let e = check_names(&[config("a"), config("b"), config("c")], &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the checkpoint: [\"c\"]"), "{e}");
        let e = check_names(&[config("a"), config("a")], &d)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("container_configs[1]") && e.contains("twice"),
            "{e}"
        );
        let e = check_names(&[config(""), config("b")], &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains("container_configs[0].metadata.name"), "{e}");
    }

    #[test]
    fn a_checkpoint_needs_its_pod_json_and_archives() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_pod_dump(dir.path(), "/x").unwrap_err().to_string();
        assert!(e.contains("pod.json"), "{e}");
        let mut d = dump(&["a"]);
        std::fs::write(dir.path().join(POD_JSON), serde_json::to_vec(&d).unwrap()).unwrap();
        let e = read_pod_dump(dir.path(), "/x").unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::write(dir.path().join("id-a.tar"), b"").unwrap();
        assert!(read_pod_dump(dir.path(), "/x").is_ok());
        d.containers[0].archive = "../id-a.tar".into();
        std::fs::write(dir.path().join(POD_JSON), serde_json::to_vec(&d).unwrap()).unwrap();
        assert!(read_pod_dump(dir.path(), "/x").is_err());
        d.containers[0].archive = "id-a.tar".into();
        d.version = 99;
        std::fs::write(dir.path().join(POD_JSON), serde_json::to_vec(&d).unwrap()).unwrap();
        let e = read_pod_dump(dir.path(), "/x").unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
    }
}
