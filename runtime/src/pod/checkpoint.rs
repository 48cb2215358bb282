//! `CheckpointPod`: one consistent checkpoint of some running containers of a pod, written
//! into an empty directory the caller gives (`output_path`).
//!
//! Every selected container's cgroup is frozen before any is dumped and stays frozen until
//! the last dump is done, so the containers are caught at one moment: nothing one of them
//! does after its dump can reach another before that one's dump. Each dump is the one of
//! `CheckpointContainer` (the `crius-shim-helper checkpoint` of [`crate::container::checkpoint`],
//! CRIU told to take the processes from the frozen cgroup and to leave it frozen), then its
//! writable layer is taken, still frozen. Then all are thawed and the archives written:
//!
//! | file | what |
//! |---|---|
//! | `<container-id>.tar` | one container archive per selected container, in the layout of `CheckpointContainer` |
//! | `pod.json` | [`PodDump`]: the format version, the pod's id, handler and `PodSandboxConfig`, and each container's name, id, image and archive |
//!
//! `pod.json` is renamed into place last: a directory without it holds no checkpoint. A
//! failure, or the client's deadline, thaws every container and removes every file the call
//! wrote (never the directory). A dump under way when the deadline comes cannot be cut short
//! (CRIU holds the processes): the other containers are thawed before the answer, that one
//! as soon as CRIU lets go of it, and its files are then removed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crius_api::v1::CheckpointPodRequest;
use serde::{Deserialize, Serialize};

use super::SandboxState;
use crate::cgroups::{FreezerState, Hierarchy};
use crate::container::checkpoint::{archive, criu_binary, names, Dumped};
use crate::container::{ContainerPaths, ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::CheckpointSupport;
use crate::util::excerpt;

/// The file of a pod checkpoint that describes it.
pub const POD_JSON: &str = "pod.json";
/// The version of [`PodDump`] this crius writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Longest path a request may name (PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;

/// `pod.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodDump {
    pub version: u32,
    #[serde(rename = "podSandboxId")]
    pub pod_sandbox_id: String,
    #[serde(rename = "runtimeHandler")]
    pub runtime_handler: String,
    /// The pod's `PodSandboxConfig`, protobuf-encoded (base64).
    #[serde(rename = "podConfig", with = "crate::records::b64")]
    pub pod_config: Vec<u8>,
    #[serde(rename = "checkpointedTime")]
    pub checkpointed_time: String,
    pub containers: Vec<PodDumpContainer>,
}

/// One container of a pod checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodDumpContainer {
    /// Its metadata name, by which RestorePod matches the configs.
    pub name: String,
    pub id: String,
    /// Its archive's file name in the checkpoint directory.
    pub archive: String,
    /// The image id it ran (`sha256:...`).
    #[serde(rename = "imageId")]
    pub image_id: String,
    #[serde(rename = "imageName")]
    pub image_name: String,
    /// The checkpointed process's arguments and working directory (its spec's), which the
    /// restore's config must describe.
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub cwd: String,
}

/// Refuses any key of a request's `options`: crius defines none, and the CRI asks that an
/// unknown key be refused rather than ignored.
pub fn check_no_options(field: &str, options: &HashMap<String, String>) -> Result<()> {
    match options.keys().min() {
        None => Ok(()),
        Some(key) => Err(Error::InvalidArgument(format!(
            "{field}: unknown key {:?} (crius defines no {field})",
            excerpt(key)
        ))),
    }
}

/// An absolute path in a request: no NUL, at most PATH_MAX.
pub fn check_absolute(field: &str, value: &str) -> Result<PathBuf> {
    if value.is_empty() {
        return Err(Error::InvalidArgument(format!("{field} is required")));
    }
    if value.contains('\0') || value.len() > MAX_PATH_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{field} {:?}: not a path (NUL, or longer than {MAX_PATH_BYTES} bytes)",
            excerpt(value)
        )));
    }
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "{field} {:?}: must be an absolute path",
            excerpt(value)
        )));
    }
    Ok(path)
}

/// `output_path`: an absolute path of an existing, empty directory.
fn check_output_path(value: &str) -> Result<PathBuf> {
    let path = check_absolute("output_path", value)?;
    let bad =
        |why: &str| Error::InvalidArgument(format!("output_path {:?}: {why}", excerpt(value)));
    if !path.is_dir() {
        return Err(bad(if path.exists() {
            "is not a directory"
        } else {
            "does not exist (the caller makes the directory)"
        }));
    }
    let mut entries = std::fs::read_dir(&path).map_err(|e| bad(&format!("cannot list it: {e}")))?;
    if entries.next().is_some() {
        return Err(bad(
            "is not empty (a pod checkpoint goes into an empty directory)",
        ));
    }
    Ok(path)
}

/// `container_ids`: not empty, no id twice.
fn check_container_ids(ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Err(Error::InvalidArgument(
            "container_ids: at least one container is required".into(),
        ));
    }
    for (i, id) in ids.iter().enumerate() {
        if let Some(first) = ids[..i].iter().position(|x| x == id) {
            return Err(Error::InvalidArgument(format!(
                "container_ids[{i}] {:?} is container_ids[{first}] again",
                excerpt(id)
            )));
        }
    }
    Ok(())
}

/// `process.args` and `process.cwd` of an OCI spec (empty where it has none).
fn process_of(spec: &[u8]) -> (Vec<String>, String) {
    let spec: serde_json::Value = serde_json::from_slice(spec).unwrap_or_default();
    let args = spec["process"]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let cwd = spec["process"]["cwd"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (args, cwd)
}

/// How long before its answer is due the work must stop, to leave time to thaw and clean up:
/// a fifth of the time left, between 100 ms and 2 s, and never more than half of it.
pub fn work_by(answer_by: Instant) -> Instant {
    let left = answer_by.saturating_duration_since(Instant::now());
    let reserve = (left / 5)
        .clamp(Duration::from_millis(100), Duration::from_secs(2))
        .min(left / 2);
    answer_by - reserve
}

/// The selected containers' cgroups this call froze, shared by the work and the caller
/// waiting for it, so that whoever stops first thaws them; dropping it thaws what is left.
struct Frozen {
    hierarchy: &'static Hierarchy,
    inner: Mutex<FrozenInner>,
}

#[derive(Default)]
struct FrozenInner {
    /// Container id → its cgroup, frozen by this call.
    cgroups: BTreeMap<String, String>,
    /// The container CRIU is dumping: it cannot be thawed until CRIU lets go.
    dumping: Option<String>,
}

impl Frozen {
    fn lock(&self) -> std::sync::MutexGuard<'_, FrozenInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Freezes `cgroup`, container `id`'s, and waits for it, at most until `until`.
    async fn freeze(&self, id: &str, cgroup: &str, until: Instant) -> Result<()> {
        // Listed first: a thaw from the caller that meanwhile gave up reaches it too.
        self.lock().cgroups.insert(id.to_owned(), cgroup.to_owned());
        if self.hierarchy.freeze(cgroup, until).await? {
            return Ok(());
        }
        Err(Error::DeadlineExceeded(format!(
            "container {id}: its cgroup did not freeze in time (a task in uninterruptible \
             sleep?)"
        )))
    }

    /// Marks `id` as being dumped, unless `cancel` was abandoned: then false.
    fn begin_dump(&self, id: &str, cancel: &archive::Commit) -> bool {
        let mut inner = self.lock();
        if cancel.is_abandoned() {
            return false;
        }
        inner.dumping = Some(id.to_owned());
        true
    }

    fn end_dump(&self) {
        self.lock().dumping = None;
    }

    /// Thaws every cgroup but the one being dumped; the first failure is returned, every
    /// cgroup is still tried. Thawed ones are forgotten.
    fn thaw_idle(&self) -> Result<()> {
        let mut inner = self.lock();
        let dumping = inner.dumping.clone();
        let mut first_err = None;
        let mut kept = BTreeMap::new();
        for (id, cgroup) in std::mem::take(&mut inner.cgroups) {
            if dumping.as_deref() == Some(id.as_str()) {
                kept.insert(id, cgroup);
                continue;
            }
            if let Err(e) = self.thaw_one(&cgroup) {
                tracing::error!(container = %id, "thaw {cgroup}: {e}");
                first_err.get_or_insert(e);
                kept.insert(id, cgroup);
            }
        }
        inner.cgroups = kept;
        first_err.map_or(Ok(()), Err)
    }

    fn thaw_one(&self, cgroup: &str) -> Result<()> {
        match self.hierarchy.set_frozen(cgroup, false) {
            Ok(()) => Ok(()),
            // Gone with its container: nothing left frozen there.
            Err(_) if !self.hierarchy.exists(cgroup) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        inner.dumping = None;
        for (id, cgroup) in std::mem::take(&mut inner.cgroups) {
            if let Err(e) = self.thaw_one(&cgroup) {
                tracing::error!(container = %id, "thaw {cgroup} at the end of a pod checkpoint: {e}");
            }
        }
    }
}

/// One container of the checkpoint under way.
struct Selected {
    record: ContainerRecord,
    name: String,
    cgroup: String,
    staging: PathBuf,
}

impl Daemon {
    /// At start: thaws a running container's cgroup found frozen. The CRI has no pause, so
    /// only a CheckpointPod whose crius died before its thaw leaves one so.
    pub(crate) fn thaw_left_frozen(&self, c: &ContainerRecord) {
        let Ok(hierarchy) = Hierarchy::host() else {
            return;
        };
        let Some(cgroup) = self
            .sandboxes
            .get(&c.sandbox_id)
            .and_then(|pod| self.container_cgroup_path(&pod, &c.id).ok())
        else {
            return;
        };
        match hierarchy.freezer_state(&cgroup) {
            Ok(FreezerState::Frozen | FreezerState::Freezing) => {
                tracing::warn!(container = %c.id, "thawing the cgroup a pod checkpoint left frozen");
                if let Err(e) = hierarchy.set_frozen(&cgroup, false) {
                    tracing::error!(container = %c.id, "thaw {cgroup}: {e}");
                }
            }
            // Thawed, or no freezer to ask: nothing to do.
            Ok(FreezerState::Thawed) | Err(_) => {}
        }
    }

    /// `CheckpointPod`. `answer_by`: when the client's deadline needs the answer (the CRI
    /// asks for one; a call without is refused).
    pub async fn checkpoint_pod(
        self: &Arc<Self>,
        req: CheckpointPodRequest,
        answer_by: Option<Instant>,
    ) -> Result<()> {
        check_no_options("options", &req.options)?;
        let answer_by = answer_by.ok_or_else(|| {
            Error::InvalidArgument(
                "CheckpointPod needs a deadline: set a timeout on the call".into(),
            )
        })?;
        let output = check_output_path(&req.output_path)?;
        check_container_ids(&req.container_ids)?;
        let pod = self.pod(&req.pod_sandbox_id)?;
        if pod.state != SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let mut ids: Vec<String> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (i, raw) in req.container_ids.iter().enumerate() {
            let c = self.container(raw).map_err(|e| match e {
                Error::NotFound(_) => Error::NotFound(format!(
                    "container_ids[{i}] {:?}: no such container",
                    excerpt(raw)
                )),
                other => other,
            })?;
            if c.sandbox_id != pod.id {
                return Err(Error::InvalidArgument(format!(
                    "container_ids[{i}] {:?}: container {} is of pod {}, not of {}",
                    excerpt(raw),
                    c.id,
                    c.sandbox_id,
                    pod.id
                )));
            }
            if ids.contains(&c.id) {
                return Err(Error::InvalidArgument(format!(
                    "container_ids[{i}] {:?}: container {} is listed twice",
                    excerpt(raw),
                    c.id
                )));
            }
            if c.state != ContainerState::Running {
                return Err(Error::FailedPrecondition(format!(
                    "container_ids[{i}]: container {} is {:?}, not running",
                    c.id, c.state
                )));
            }
            let name = c.config().metadata.unwrap_or_default().name;
            if names.contains(&name) {
                return Err(Error::InvalidArgument(format!(
                    "container_ids[{i}]: container {} is named {:?} like another one listed; \
                     RestorePod tells them apart by name",
                    c.id,
                    excerpt(&name)
                )));
            }
            ids.push(c.id);
            names.push(name);
        }
        let handler = self.handlers().get(&pod.runtime_handler)?.clone();
        if handler.checkpoint_support() == CheckpointSupport::None {
            return Err(Error::Unsupported(format!(
                "checkpoint pod {}: runtime handler {:?} ({}) cannot checkpoint with CRIU \
                 (gVisor has its own mechanism, which crius does not drive)",
                pod.id,
                handler.name,
                handler.config.binary.display()
            )));
        }
        let criu = criu_binary(&self.config.runtime.criu_path)
            .await
            .map_err(Error::FailedPrecondition)?;
        let hierarchy = Hierarchy::host()?;
        if hierarchy.mode() == crate::cgroups::Mode::V1 && !hierarchy.has_controller("freezer") {
            return Err(Error::FailedPrecondition(format!(
                "checkpoint pod {}: the cgroup v1 freezer is not mounted on this node, and \
                 CheckpointPod holds the containers still with it",
                pod.id
            )));
        }

        let work_by = work_by(answer_by);
        let started = Instant::now();
        let commit = archive::Commit::default();
        let frozen = Arc::new(Frozen {
            hierarchy,
            inner: Mutex::new(FrozenInner::default()),
        });
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let daemon = Arc::clone(self);
        let (pod_id, commit2, frozen2) = (pod.id.clone(), commit.clone(), Arc::clone(&frozen));
        // Its own task holding the locks: it finishes (thaws, cleans up) even when the caller
        // has stopped waiting.
        tokio::spawn(async move {
            let _pod_lock = daemon.locks.lock(&pod_id).await;
            let mut sorted = ids.clone();
            sorted.sort();
            let mut held = Vec::new();
            for id in &sorted {
                held.push(daemon.locks.lock(id).await);
            }
            let result = daemon
                .checkpoint_pod_locked(&pod_id, &ids, &output, &criu, work_by, &commit2, &frozen2)
                .await;
            // Thawed before the locks go, whatever happened.
            if let Err(e) = frozen2.thaw_idle() {
                tracing::error!(pod = %pod_id, "thaw after the checkpoint: {e}");
            }
            if let Err(e) = &result {
                tracing::warn!(pod = %pod_id, "pod checkpoint failed: {e}");
            }
            let _ = tx.send(result);
        });
        let too_late = |what: &str| {
            Error::DeadlineExceeded(format!(
                "checkpoint pod {}: not done within the deadline; {what}, and no checkpoint is \
                 left in output_path",
                pod.id
            ))
        };
        let answer = match tokio::time::timeout_at(work_by.into(), &mut rx).await {
            Ok(answer) => answer,
            Err(_) if !commit.abandon() => (&mut rx).await,
            Err(_) => {
                // Whatever is not under CRIU at this moment runs again before the answer.
                if let Err(e) = frozen.thaw_idle() {
                    tracing::error!(pod = %pod.id, "thaw at the deadline: {e}");
                }
                let grace = answer_by - Duration::from_millis(10);
                return Err(match tokio::time::timeout_at(grace.into(), &mut rx).await {
                    Ok(_) => too_late("every container runs on"),
                    Err(_) => too_late(
                        "every container runs on but the one CRIU is dumping, which runs \
                         again as soon as its dump ends",
                    ),
                });
            }
        };
        let result = answer.unwrap_or_else(|_| {
            Err(Error::internal(
                format!("checkpoint pod {}", pod.id),
                "the checkpoint task ended without an answer",
            ))
        });
        if result.is_ok() {
            tracing::info!(pod = %pod.id, containers = req.container_ids.len(), elapsed_ms = started.elapsed().as_millis() as u64, "pod checkpointed");
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn checkpoint_pod_locked(
        self: &Arc<Self>,
        pod_id: &str,
        ids: &[String],
        output: &Path,
        criu: &Path,
        work_by: Instant,
        commit: &archive::Commit,
        frozen: &Frozen,
    ) -> Result<()> {
        // Again under the locks: a stop may have come first.
        let pod = self.pod(pod_id)?;
        if pod.state != SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let mut selected = Vec::new();
        for id in ids {
            let record = self.container(id)?;
            if record.state != ContainerState::Running {
                return Err(Error::FailedPrecondition(format!(
                    "container {} is {:?}, not running",
                    record.id, record.state
                )));
            }
            let paths = ContainerPaths::new(&self.config.root, &self.config.state, id);
            selected.push(Selected {
                name: record.config().metadata.unwrap_or_default().name,
                cgroup: self.container_cgroup_path(&pod, id)?,
                staging: paths
                    .layer
                    .join(format!("checkpoint-{}", crate::util::now_nanos())),
                record,
            });
        }
        let mut written = Vec::new();
        let result = self
            .checkpoint_selected(
                &pod,
                &selected,
                output,
                criu,
                work_by,
                commit,
                frozen,
                &mut written,
            )
            .await;
        if result.is_err() {
            for path in &written {
                if let Err(e) = std::fs::remove_file(path) {
                    tracing::warn!(pod = %pod.id, "remove {}: {e}", path.display());
                }
            }
        }
        for s in &selected {
            if let Err(e) = std::fs::remove_dir_all(&s.staging) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(container = %s.record.id, "remove {}: {e}", s.staging.display());
                }
            }
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn checkpoint_selected(
        self: &Arc<Self>,
        pod: &super::SandboxRecord,
        selected: &[Selected],
        output: &Path,
        criu: &Path,
        work_by: Instant,
        commit: &archive::Commit,
        frozen: &Frozen,
        written: &mut Vec<PathBuf>,
    ) -> Result<()> {
        let abandoned = || Error::DeadlineExceeded("the caller stopped waiting".into());
        for s in selected {
            if commit.is_abandoned() {
                return Err(abandoned());
            }
            frozen.freeze(&s.record.id, &s.cgroup, work_by).await?;
        }
        let mut dumps: Vec<(Dumped, Vec<String>)> = Vec::new();
        for s in selected {
            let dir = frozen
                .hierarchy
                .freezer_dir(&s.cgroup)
                .ok_or(crate::cgroups::CgroupError::NoController("freezer"))?;
            if !frozen.begin_dump(&s.record.id, commit) {
                return Err(abandoned());
            }
            let dumped = self
                .dump_into(&s.record, &s.staging, criu, Some(&dir))
                .await;
            frozen.end_dump();
            let dumped = dumped?;
            if commit.is_abandoned() {
                return Err(abandoned());
            }
            // The writable layer too, while nothing in the pod can change it.
            let upper = ContainerPaths::new(&self.config.root, &self.config.state, &s.record.id)
                .layer
                .join("upper");
            let diff = s.staging.join(names::ROOTFS_DIFF);
            let deleted = tokio::task::spawn_blocking(move || archive::rootfs_diff(&upper, &diff))
                .await
                .map_err(|e| Error::internal("rootfs diff task", e))?
                .map_err(|e| {
                    Error::internal(format!("take the writable layer of {}", s.record.id), e)
                })?;
            dumps.push((dumped, deleted));
        }
        // Every container caught: all run again before anything is written.
        for s in selected {
            let state = frozen.hierarchy.freezer_state(&s.cgroup)?;
            if state != FreezerState::Frozen {
                tracing::warn!(container = %s.record.id, ?state, "not frozen at the end of the dumps");
            }
        }
        frozen.thaw_idle()?;

        let mut entries = Vec::new();
        for (s, (dumped, deleted)) in selected.iter().zip(dumps) {
            if commit.is_abandoned() {
                return Err(abandoned());
            }
            let file = format!("{}.tar", s.record.id);
            let location = output.join(&file);
            let (staging, upper, log) = (
                s.staging.clone(),
                ContainerPaths::new(&self.config.root, &self.config.state, &s.record.id)
                    .layer
                    .join("upper"),
                s.record.log_path.clone(),
            );
            let (args, cwd) = process_of(&dumped.spec);
            let (location2, cancel) = (location.clone(), commit.clone());
            tokio::task::spawn_blocking(move || {
                archive::write_prepared(
                    &archive::Contents {
                        staging: &staging,
                        upper: &upper,
                        config_dump: &dumped.config_dump,
                        spec: &dumped.spec,
                        log: log.as_deref(),
                        location: &location2,
                    },
                    &deleted,
                    &archive::Commit::default(),
                    &cancel,
                )
            })
            .await
            .map_err(|e| Error::internal("checkpoint archive task", e))?
            .map_err(|e| {
                if commit.is_abandoned() {
                    abandoned()
                } else {
                    Error::internal(format!("write checkpoint archive of {}", s.record.id), e)
                }
            })?;
            written.push(location);
            entries.push(PodDumpContainer {
                name: s.name.clone(),
                id: s.record.id.clone(),
                archive: file,
                image_id: s.record.image_id.clone(),
                image_name: s.record.image_name.clone(),
                args,
                cwd,
            });
        }
        let dump = PodDump {
            version: FORMAT_VERSION,
            pod_sandbox_id: pod.id.clone(),
            runtime_handler: pod.runtime_handler.clone(),
            pod_config: pod.config.clone(),
            checkpointed_time: archive::rfc3339(crate::util::now_nanos()),
            containers: entries,
        };
        let json = serde_json::to_vec_pretty(&dump)
            .map_err(|e| Error::internal("serialize pod.json", e))?;
        let tmp = output.join(format!(".{POD_JSON}.crius-{}", std::process::id()));
        let target = output.join(POD_JSON);
        let put = (|| -> std::io::Result<bool> {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::File::options()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            commit.put_in_place(|| std::fs::rename(&tmp, &target))
        })();
        match put {
            Ok(true) => {
                if let Ok(d) = std::fs::File::open(output) {
                    let _ = d.sync_all();
                }
                Ok(())
            }
            Ok(false) => {
                let _ = std::fs::remove_file(&tmp);
                Err(abandoned())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(Error::internal(format!("write {}", target.display()), e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let msg = |r: Result<PathBuf>| r.unwrap_err().to_string();
        assert!(msg(check_output_path("")).contains("output_path is required"));
        assert!(msg(check_output_path("relative")).contains("absolute"));
        assert!(msg(check_output_path("/no/such/dir")).contains("does not exist"));
        assert!(
            msg(check_output_path(dir.path().join("file").to_str().unwrap()))
                .contains("not a directory")
        );
        assert!(msg(check_output_path(dir.path().to_str().unwrap())).contains("not empty"));
        assert_eq!(check_output_path(empty.to_str().unwrap()).unwrap(), empty);

        assert!(check_container_ids(&[]).is_err());
        let twice = check_container_ids(&["a".into(), "b".into(), "a".into()]).unwrap_err();
        assert!(twice.to_string().contains("container_ids[2]"), "{twice}");
        assert!(check_container_ids(&["a".into(), "b".into()]).is_ok());

        assert!(check_no_options("options", &HashMap::new()).is_ok());
        let opts = HashMap::from([("zz".to_string(), String::new()), ("aa".into(), "1".into())]);
        let e = check_no_options("options", &opts).unwrap_err();
        assert!(e.to_string().contains("\"aa\""), "{e}");
    }

    #[test]
    fn the_work_stops_before_the_answer_is_due() {
        let now = Instant::now();
        let due = now + Duration::from_secs(10);
        let by = work_by(due);
        assert!(by <= due - Duration::from_secs(2) + Duration::from_millis(5));
        let short = now + Duration::from_millis(100);
        assert!(work_by(short) <= short - Duration::from_millis(40));
        // Already late: no time at all, no panic.
        let _ = work_by(now);
    }

    #[test]
    fn a_caller_giving_up_thaws_all_but_the_container_under_criu() {
        let dir = tempfile::tempdir().unwrap();
        let state = |c: &str| dir.path().join(format!("crius/p/{c}/freezer.state"));
        for c in ["a", "b"] {
            std::fs::create_dir_all(dir.path().join(format!("crius/p/{c}"))).unwrap();
            std::fs::write(state(c), "FROZEN").unwrap();
        }
        let hierarchy: &'static Hierarchy =
            Box::leak(Box::new(Hierarchy::V1(crate::cgroups::v1::V1::new(
                HashMap::from([("freezer".to_string(), dir.path().to_path_buf())]),
            ))));
        let frozen = Frozen {
            hierarchy,
            inner: Mutex::new(FrozenInner::default()),
        };
        for c in ["a", "b"] {
            frozen
                .lock()
                .cgroups
                .insert(c.to_string(), format!("/crius/p/{c}"));
        }
        let commit = archive::Commit::default();
        assert!(frozen.begin_dump("a", &commit));
        assert!(commit.abandon());
        frozen.thaw_idle().unwrap();
        let read = |c: &str| std::fs::read_to_string(state(c)).unwrap();
        assert_eq!(
            (read("a").as_str(), read("b").as_str()),
            ("FROZEN", "THAWED")
        );
        // Given up: no next dump; once CRIU is done with "a", it is thawed too.
        assert!(!frozen.begin_dump("b", &commit));
        frozen.end_dump();
        frozen.thaw_idle().unwrap();
        assert_eq!(read("a"), "THAWED");
        // And whatever is still listed is thawed when it goes.
        std::fs::write(state("b"), "FROZEN").unwrap();
        frozen
            .lock()
            .cgroups
            .insert("b".to_string(), "/crius/p/b".to_string());
        drop(frozen);
        assert_eq!(read("b"), "THAWED");
    }

    #[test]
    fn pod_json_round_trips() {
        let dump = PodDump {
            version: FORMAT_VERSION,
            pod_sandbox_id: "p".into(),
            runtime_handler: "runc".into(),
            pod_config: vec![1, 2, 3],
            checkpointed_time: archive::rfc3339(0),
            containers: vec![PodDumpContainer {
                name: "a".into(),
                id: "c".into(),
                archive: "c.tar".into(),
                image_id: "sha256:x".into(),
                image_name: "busybox".into(),
                args: vec!["sh".into()],
                cwd: "/".into(),
            }],
        };
        let json = serde_json::to_string(&dump).unwrap();
        assert!(json.contains("\"podConfig\":\"AQID\""), "{json}");
        let back: PodDump = serde_json::from_str(&json).unwrap();
        assert_eq!(back.containers[0].archive, "c.tar");
        assert_eq!(
            process_of(br#"{"process":{"args":["sh","-c","x"],"cwd":"/w"}}"#),
            (vec!["sh".into(), "-c".into(), "x".into()], "/w".into())
        );
        assert_eq!(process_of(b"not json"), (vec![], String::new()));
    }
}
