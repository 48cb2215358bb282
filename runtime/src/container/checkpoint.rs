//! `CheckpointContainer`: the running container's processes dumped by CRIU (left running) and
//! written with its spec, writable layer and log into one archive at `location`.
//!
//! The dump runs in a `crius-shim-helper checkpoint` that crius starts itself (it makes no
//! process the pod's shim would have to reap): libcontainer's `checkpoint` for the built-in
//! handler, `<rt> checkpoint --leave-running` for runc and crun. Both run `criu` from `$PATH`,
//! so the helper gets the configured `criu_path`'s directory first in its `$PATH`.
//!
//! The archive is an uncompressed tar in the layout CRI-O and containerd write and
//! `checkpointctl` reads ([`archive`]). It is written to a temporary name beside `location`
//! and renamed into place, so `location` is either absent or whole. If the timeout passes
//! first, the call answers `DeadlineExceeded` and the dump is left to finish in the
//! background (killing CRIU while it holds the processes could leave them stopped or with its
//! parasite inside): its output is then removed, and the container lock is held until then,
//! so no stop or removal overlaps it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ContainerPaths, ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::handlers::CheckpointSupport;
use crate::util::excerpt;

/// The timeout of a request that gives none (0).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest `location` (PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;

/// What `config.dump` holds: the fields `checkpointctl` shows (CRI-O's names), and what a
/// restore needs to find the image the container ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigDump {
    pub id: String,
    pub name: String,
    /// The image id the container ran (`sha256:...`).
    #[serde(rename = "rootfsImage", default)]
    pub rootfs_image: String,
    #[serde(rename = "rootfsImageRef", default)]
    pub rootfs_image_ref: String,
    #[serde(rename = "rootfsImageName", default)]
    pub rootfs_image_name: String,
    /// The OCI runtime: `crius` for the built-in one, else the runtime's binary name.
    #[serde(rename = "runtime", default)]
    pub runtime: String,
    #[serde(rename = "createdTime", default)]
    pub created_time: String,
    #[serde(rename = "checkpointedTime", default)]
    pub checkpointed_time: String,
}

/// The archive's layout (the names CRI-O, containerd and `checkpointctl` use).
pub mod names {
    /// CRIU's images.
    pub const CHECKPOINT_DIR: &str = "checkpoint";
    pub const CONFIG_DUMP: &str = "config.dump";
    /// The container's OCI spec.
    pub const SPEC_DUMP: &str = "spec.dump";
    /// The writable layer: what the container added or changed.
    pub const ROOTFS_DIFF: &str = "rootfs-diff.tar";
    /// JSON list of the paths the container deleted from its image.
    pub const DELETED_FILES: &str = "deleted.files";
    /// The container's CRI log up to the checkpoint.
    pub const CONTAINER_LOG: &str = "container.log";
    /// CRIU's statistics of the dump.
    pub const STATS_DUMP: &str = "stats-dump";
}

/// Where `contrib/criu/install` (which `make run` and `make test` run) puts a newer criu when
/// the distribution's does not work on the kernel.
const PROJECT_CRIU: &str = "/opt/crius/criu/bin/criu";

/// The criu binary `criu_path` names, checked with `criu check` (a criu too old for the
/// kernel fails there, before any container is touched), or why it cannot be used. With the
/// default `criu_path` ("criu" in `$PATH`) failing, the criu of `contrib/criu/install` is
/// tried next, so that a node set up by `make run` checkpoints with the built-in defaults. A
/// criu that passed is remembered for its configured path; a failure is not, so installing
/// criu needs no restart.
pub async fn criu_binary(configured: &Path) -> std::result::Result<PathBuf, String> {
    static PASSED: std::sync::Mutex<Option<(PathBuf, PathBuf)>> = std::sync::Mutex::new(None);
    if let Some((path, found)) = PASSED.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        if path == configured {
            return Ok(found.clone());
        }
    }
    let found = match probe_criu(configured).await {
        Err(e)
            if configured == Path::new(crate::config::DEFAULT_CRIU)
                && Path::new(PROJECT_CRIU).exists() =>
        {
            probe_criu(Path::new(PROJECT_CRIU))
                .await
                .map_err(|also| format!("{e}; and {also}"))?
        }
        found => found?,
    };
    *PASSED.lock().unwrap_or_else(|p| p.into_inner()) =
        Some((configured.to_path_buf(), found.clone()));
    Ok(found)
}

async fn probe_criu(configured: &Path) -> std::result::Result<PathBuf, String> {
    const INSTALL: &str = "install the criu package (Debian: apt-get install criu; Linux 6.13 and \
                           later need criu 4.1 or later) or set runtime.criu_path";
    let path = match configured.components().count() > 1 || configured.is_absolute() {
        true => configured.to_path_buf(),
        false => std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join(configured))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "criu not found: no {} in $PATH: {INSTALL}",
                    configured.display()
                )
            })?,
    };
    let out = tokio::process::Command::new(&path)
        .arg("check")
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), out)
        .await
        .map_err(|_| format!("{} check did not answer within 10 s", path.display()))?
        .map_err(|e| format!("criu not usable: run {}: {e}: {INSTALL}", path.display()))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Error"))
            .take(3)
            .collect();
        return Err(format!(
            "{} check fails on this kernel ({}): {INSTALL}",
            path.display(),
            excerpt(&errors.join("; "))
        ));
    }
    Ok(path)
}

/// The `location` of a request: an absolute path of a file to be, in an existing directory.
fn check_location(location: &str) -> Result<PathBuf> {
    let bad =
        |why: &str| Error::InvalidArgument(format!("location {:?}: {why}", excerpt(location)));
    if location.is_empty() {
        return Err(Error::InvalidArgument("location is required".into()));
    }
    if location.contains('\0') || location.len() > MAX_PATH_BYTES {
        return Err(bad("not a path (NUL, or longer than 4096 bytes)"));
    }
    let path = PathBuf::from(location);
    if !path.is_absolute() || location.ends_with('/') {
        return Err(bad(
            "must be the absolute path of the archive file to write",
        ));
    }
    if !path.parent().is_some_and(Path::is_dir) {
        return Err(bad("its directory does not exist"));
    }
    if path.is_dir() {
        return Err(bad("is a directory"));
    }
    // The archive is renamed into place: whatever is there is replaced, a device node such
    // as /dev/null included. Only an earlier archive (a regular file) may be.
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if !meta.is_file() {
            return Err(bad(
                "exists and is not a regular file (a device, a symbolic link, a socket), which \
                 the archive would replace",
            ));
        }
    }
    Ok(path)
}

/// A request's `timeout` in seconds: 0 for [`DEFAULT_TIMEOUT`].
fn check_timeout(seconds: i64) -> Result<Duration> {
    match seconds {
        0 => Ok(DEFAULT_TIMEOUT),
        // At most a day: far enough, and no overflow adding it to now.
        s if s > 0 => Ok(Duration::from_secs(s.unsigned_abs().min(86_400))),
        s => Err(Error::InvalidArgument(format!(
            "timeout {s}: must be 0 (the default) or a number of seconds"
        ))),
    }
}

impl Daemon {
    /// `CheckpointContainer`.
    pub async fn checkpoint_container(
        self: &Arc<Self>,
        id: &str,
        location: &str,
        timeout: i64,
    ) -> Result<()> {
        let location = check_location(location)?;
        let timeout = check_timeout(timeout)?;
        let c = self.container(id)?;
        let pod = self.pod(&c.sandbox_id)?;
        let handler = self.handlers().get(&pod.runtime_handler)?.clone();
        if handler.checkpoint_support() == CheckpointSupport::None {
            return Err(Error::Unsupported(format!(
                "checkpoint container {}: runtime handler {:?} ({}) cannot checkpoint with CRIU \
                 (it has no checkpoint command, as a crun built without CRIU; gVisor has its own \
                 mechanism, which crius does not drive)",
                c.id,
                handler.name,
                handler.config.binary.display()
            )));
        }
        let criu = criu_binary(&self.config.runtime.criu_path)
            .await
            .map_err(Error::FailedPrecondition)?;
        let started = std::time::Instant::now();
        let daemon = Arc::clone(self);
        let id = c.id.clone();
        // Its own task holding the container's lock: it finishes (and cleans up) even when the
        // caller has stopped waiting.
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let commit = archive::Commit::default();
        let commit2 = commit.clone();
        tokio::spawn(async move {
            let lock = daemon.locks.lock(&id).await;
            let result = daemon
                .checkpoint_locked(lock.id(), &location, &criu, &commit2)
                .await;
            if let Err(e) = &result {
                tracing::warn!(container = %id, "checkpoint failed: {e}");
            }
            let _ = tx.send(result);
        });
        let answer = match tokio::time::timeout(timeout, &mut rx).await {
            Ok(answer) => Some(answer),
            // Too late, unless the archive is already in place (then the answer is at hand).
            Err(_) => match commit.abandon() {
                true => None,
                false => Some((&mut rx).await),
            },
        };
        match answer {
            Some(Ok(result)) => {
                if result.is_ok() {
                    tracing::info!(container = %c.id, elapsed_ms = started.elapsed().as_millis() as u64, "checkpointed");
                }
                result
            }
            Some(Err(_)) => Err(Error::internal(
                format!("checkpoint container {}", c.id),
                "the checkpoint task ended without an answer",
            )),
            None => Err(Error::DeadlineExceeded(format!(
                "checkpoint container {}: not done within the timeout of {} s; the container \
                 runs on, and no archive is written",
                c.id,
                timeout.as_secs()
            ))),
        }
    }

    async fn checkpoint_locked(
        &self,
        id: &str,
        location: &Path,
        criu: &Path,
        commit: &archive::Commit,
    ) -> Result<()> {
        let c = self.container(id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is {:?}, not running",
                c.id, c.state
            )));
        }
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, &c.id);
        let staging = paths
            .layer
            .join(format!("checkpoint-{}", crate::util::now_nanos()));
        let result = self
            .checkpoint_into(&c, &staging, location, criu, commit)
            .await;
        if let Err(e) = std::fs::remove_dir_all(&staging) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(container = %c.id, "remove {}: {e}", staging.display());
            }
        }
        result
    }

    async fn checkpoint_into(
        &self,
        c: &ContainerRecord,
        staging: &Path,
        location: &Path,
        criu: &Path,
        commit: &archive::Commit,
    ) -> Result<()> {
        let dumped = self.dump_into(c, staging, criu, None).await?;
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, &c.id);
        let upper = paths.layer.join("upper");
        let log = c.log_path.clone();
        let (staging, location) = (staging.to_path_buf(), location.to_path_buf());
        let commit = commit.clone();
        tokio::task::spawn_blocking(move || {
            archive::write(
                &archive::Contents {
                    staging: &staging,
                    upper: &upper,
                    config_dump: &dumped.config_dump,
                    spec: &dumped.spec,
                    log: log.as_deref(),
                    location: &location,
                },
                &commit,
            )
        })
        .await
        .map_err(|e| Error::internal("checkpoint archive task", e))?
        .map_err(|e| Error::internal(format!("write checkpoint archive of {}", c.id), e))
    }

    /// Dumps the running container's processes with CRIU into `<staging>/checkpoint` (CRIU's
    /// log into `<staging>/work`), leaving them running, and returns what its archive
    /// describes it with. `frozen`: the freezer cgroup directory the container was frozen in
    /// by the caller (CheckpointPod); CRIU is told to take the processes from it and to
    /// leave it frozen.
    pub(crate) async fn dump_into(
        &self,
        c: &ContainerRecord,
        staging: &Path,
        criu: &Path,
        frozen: Option<&Path>,
    ) -> Result<Dumped> {
        let pod = self.pod(&c.sandbox_id)?;
        let handler = self.handlers().get(&pod.runtime_handler)?.clone();
        let paths = ContainerPaths::new(&self.config.root, &self.config.state, &c.id);
        let images = staging.join(names::CHECKPOINT_DIR);
        let work = staging.join("work");
        for dir in [&images, &work] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::internal(format!("create {}", dir.display()), e))?;
        }
        let shim_dir = self.shims.state_dir(&c.sandbox_id);
        let root_of = |rt: &Option<crius_api::shim::OciRuntime>| match rt {
            None => shim_dir.join("runc"),
            Some(rt) => rt.root.clone().unwrap_or_else(|| {
                let name = rt.binary.file_name().unwrap_or("runtime".as_ref());
                shim_dir.join("oci").join(name)
            }),
        };
        let mut runtime = handler.oci_runtime();
        // A container restored in a built-in pod runs under runc (`Handlers::restorer`): the
        // runtime whose state it has is the one that dumps it.
        if runtime.is_none() && !root_of(&None).join(&c.id).exists() {
            let restorer = self
                .handlers()
                .restorer(&handler)
                .and_then(|h| h.oci_runtime());
            if restorer
                .as_ref()
                .is_some_and(|rt| root_of(&Some(rt.clone())).join(&c.id).exists())
            {
                runtime = restorer;
            }
        }
        let root = root_of(&runtime);
        let helper = self
            .config
            .shim_binary()
            .with_file_name("crius-shim-helper");
        let mut cmd = tokio::process::Command::new(&helper);
        cmd.arg("checkpoint")
            .arg("--root")
            .arg(&root)
            .arg("--id")
            .arg(&c.id)
            .arg("--image-path")
            .arg(&images)
            .arg("--work-path")
            .arg(&work);
        if let Some(rt) = &runtime {
            cmd.arg("--runtime").arg(&rt.binary);
            for o in &rt.options {
                cmd.arg("--runtime-option").arg(o);
            }
        }
        if let Some(dir) = frozen {
            // Without it CRIU stops the tasks with ptrace, which a frozen task never answers.
            // runc names the container's freezer cgroup to CRIU itself; libcontainer 0.7 does
            // not, and CRIU reads its options from this file too (options of the request win).
            let conf = staging.join("criu-dump.conf");
            std::fs::write(&conf, format!("freeze-cgroup {}\n", dir.display()))
                .map_err(|e| Error::internal(format!("write {}", conf.display()), e))?;
            cmd.env("CRIU_CONFIG_FILE", &conf);
        }
        let mut path_var = std::ffi::OsString::new();
        if let Some(dir) = criu.parent() {
            path_var.push(dir);
            path_var.push(":");
        }
        path_var.push(
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        );
        cmd.env("PATH", path_var)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let preserved = crate::cgroups::root_options::preserve();
        let out = cmd.output().await;
        drop(preserved);
        let out = out.map_err(|e| Error::internal(format!("run {}", helper.display()), e))?;
        let report = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let message = serde_json::from_str::<serde_json::Value>(report.trim())
                .ok()
                .and_then(|v| v["Err"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("helper exited with {}", out.status));
            let log = last_criu_errors(&work.join("dump.log"));
            return Err(Error::FailedPrecondition(format!(
                "checkpoint container {}: {message}{}",
                c.id,
                if log.is_empty() {
                    String::new()
                } else {
                    format!(" (criu: {log})")
                }
            )));
        }
        let spec = std::fs::read(paths.bundle.join("config.json"))
            .map_err(|e| Error::internal(format!("read spec of {}", c.id), e))?;
        let dump = ConfigDump {
            id: c.id.clone(),
            name: c.name.clone(),
            rootfs_image: c.image_id.clone(),
            rootfs_image_ref: c.image_ref.clone(),
            rootfs_image_name: c.image_name.clone(),
            runtime: match &runtime {
                None => "crius".to_owned(),
                Some(rt) => rt
                    .binary
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            },
            created_time: archive::rfc3339(c.created_at),
            checkpointed_time: archive::rfc3339(crate::util::now_nanos()),
        };
        let config_dump = serde_json::to_vec_pretty(&dump)
            .map_err(|e| Error::internal("serialize config.dump", e))?;
        Ok(Dumped { config_dump, spec })
    }
}

/// What a dump leaves for the archive besides CRIU's images: `config.dump` and `spec.dump`.
pub(crate) struct Dumped {
    pub config_dump: Vec<u8>,
    pub spec: Vec<u8>,
}

/// The last few `Error` lines of a CRIU log, `; `-joined, at most 1024 characters (without
/// the one about raising its own RLIMIT_NOFILE, which it reports without harm where it may
/// not). The log itself goes with the staging directory.
fn last_criu_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error (") && !l.contains("RLIMIT_NOFILE"))
        .collect();
    let tail = &errors[errors.len().saturating_sub(3)..];
    excerpt_long(&tail.join("; "))
}

fn excerpt_long(s: &str) -> String {
    match s.char_indices().nth(1024) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s.to_owned(),
    }
}

pub mod archive {
    //! Writing and reading checkpoint archives.

    use std::fs::File;
    use std::io::{self, Write as _};
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
    use std::path::{Path, PathBuf};

    use super::names;

    /// What goes into an archive.
    pub struct Contents<'a> {
        /// Holds `checkpoint/` (CRIU's images); scratch files go here too.
        pub staging: &'a Path,
        /// The container's overlay upper directory.
        pub upper: &'a Path,
        pub config_dump: &'a [u8],
        pub spec: &'a [u8],
        pub log: Option<&'a Path>,
        pub location: &'a Path,
    }

    /// Decides, once, between an archive put in place and a caller that stopped waiting.
    #[derive(Clone, Default)]
    pub struct Commit(std::sync::Arc<std::sync::Mutex<Option<bool>>>);

    impl Commit {
        /// The caller gives up: true unless the archive is already in place.
        pub fn abandon(&self) -> bool {
            let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
            match *state {
                Some(committed) => !committed,
                None => {
                    *state = Some(false);
                    true
                }
            }
        }

        /// Whether the caller has given up.
        pub fn is_abandoned(&self) -> bool {
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) == Some(false)
        }

        /// Runs `rename` unless the caller has given up; true if it ran and succeeded.
        pub fn put_in_place(&self, rename: impl FnOnce() -> io::Result<()>) -> io::Result<bool> {
            let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if *state == Some(false) {
                return Ok(false);
            }
            rename()?;
            *state = Some(true);
            Ok(true)
        }
    }

    /// Writes the archive to a temporary name beside `location`, syncs it and renames it into
    /// place, unless `commit` was abandoned meanwhile; on failure or abandonment nothing is
    /// left at either name.
    pub fn write(c: &Contents<'_>, commit: &Commit) -> io::Result<()> {
        let deleted = rootfs_diff(c.upper, &c.staging.join(names::ROOTFS_DIFF))?;
        write_prepared(c, &deleted, commit, commit)
    }

    /// [`write()`] with the writable layer already in `<staging>/rootfs-diff.tar` (taken while
    /// the container was frozen) and `deleted` its whiteouts. The writing stops as soon as
    /// `cancel` is abandoned; `commit` decides the rename.
    pub fn write_prepared(
        c: &Contents<'_>,
        deleted: &[String],
        commit: &Commit,
        cancel: &Commit,
    ) -> io::Result<()> {
        let diff = c.staging.join(names::ROOTFS_DIFF);
        let dir = c.location.parent().unwrap_or(Path::new("/"));
        let name = c
            .location
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.crius-{}", std::process::id()));
        let written = write_tar(c, &diff, deleted, &tmp, cancel);
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        match commit.put_in_place(|| std::fs::rename(&tmp, c.location)) {
            Ok(true) => {}
            Ok(false) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(io::Error::other("the caller stopped waiting"));
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn write_tar(
        c: &Contents<'_>,
        diff: &Path,
        deleted: &[String],
        tmp: &Path,
        cancel: &Commit,
    ) -> io::Result<()> {
        // It holds every page of the processes' memory: root's alone, as kubelet's
        // checkpoint documentation asks.
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        let file = Cancellable { file, cancel };
        let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 20, file));
        tar.follow_symlinks(false);
        tar.mode(tar::HeaderMode::Complete);
        tar.append_dir_all(names::CHECKPOINT_DIR, c.staging.join(names::CHECKPOINT_DIR))?;
        let stats = c
            .staging
            .join(names::CHECKPOINT_DIR)
            .join(names::STATS_DUMP);
        if stats.is_file() {
            tar.append_path_with_name(&stats, names::STATS_DUMP)?;
        }
        append_bytes(&mut tar, names::CONFIG_DUMP, c.config_dump)?;
        append_bytes(&mut tar, names::SPEC_DUMP, c.spec)?;
        tar.append_path_with_name(diff, names::ROOTFS_DIFF)?;
        if !deleted.is_empty() {
            let json = serde_json::to_vec(deleted).map_err(io::Error::other)?;
            append_bytes(&mut tar, names::DELETED_FILES, &json)?;
        }
        if let Some(log) = c.log.filter(|l| l.is_file()) {
            tar.append_path_with_name(log, names::CONTAINER_LOG)?;
        }
        let file = tar.into_inner()?.into_inner().map_err(|e| e.into_error())?;
        file.file.sync_all()
    }

    /// A file whose writes fail once the caller has stopped waiting, so a large archive
    /// nobody will read is not finished.
    struct Cancellable<'a> {
        file: File,
        cancel: &'a Commit,
    }

    impl io::Write for Cancellable<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.cancel.is_abandoned() {
                return Err(io::Error::other("the caller stopped waiting"));
            }
            self.file.write(buf)
        }

        fn flush(&mut self) -> io::Result<()> {
            self.file.flush()
        }
    }

    fn append_bytes<W: io::Write>(
        tar: &mut tar::Builder<W>,
        name: &str,
        data: &[u8],
    ) -> io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o600);
        // Owner fields filled in: a header with empty ones is not a valid tar to strict
        // readers (an image layer made of the archive is unpacked by such a reader).
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        );
        header.set_cksum();
        tar.append_data(&mut header, name, data)
    }

    /// Tars the upper layer into `out`, leaving out overlayfs whiteouts (0/0 character
    /// devices), whose paths it returns (as `/`-rooted paths in the container) for
    /// `deleted.files`.
    pub fn rootfs_diff(upper: &Path, out: &Path) -> io::Result<Vec<String>> {
        let file = File::create(out)?;
        let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 20, file));
        tar.follow_symlinks(false);
        tar.mode(tar::HeaderMode::Complete);
        let mut deleted = Vec::new();
        if upper.is_dir() {
            walk(upper, Path::new(""), &mut tar, &mut deleted)?;
        }
        let mut w = tar.into_inner()?;
        w.flush()?;
        Ok(deleted)
    }

    fn walk<W: io::Write>(
        dir: &Path,
        rel: &Path,
        tar: &mut tar::Builder<W>,
        deleted: &mut Vec<String>,
    ) -> io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let name = rel.join(entry.file_name());
            let meta = std::fs::symlink_metadata(&path)?;
            let kind = meta.file_type();
            if kind.is_char_device() && meta.rdev() == 0 {
                deleted.push(format!("/{}", name.display()));
            } else if kind.is_dir() {
                tar.append_dir(&name, &path)?;
                walk(&path, &name, tar, deleted)?;
            } else if kind.is_file() || kind.is_symlink() {
                tar.append_path_with_name(&path, &name)?;
            }
            // Sockets, FIFOs and devices a container made are not carried over.
        }
        Ok(())
    }

    /// Unpacks the archive at `archive` into `dest` (a new, empty directory); an archive that
    /// is a directory (a checkpoint image's unpacked layer) is copied.
    pub fn unpack(archive: &Path, dest: &Path) -> io::Result<()> {
        if archive.is_dir() {
            return copy_tree(archive, dest);
        }
        let mut ar = tar::Archive::new(io::BufReader::with_capacity(1 << 20, File::open(archive)?));
        ar.set_preserve_permissions(true);
        ar.set_overwrite(false);
        ar.unpack(dest)
    }

    /// Copies the directories, regular files and symlinks under `from` into `to` (which
    /// exists), with their permission bits; anything else is skipped, as `pack` skips it.
    fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let (src, dst) = (entry.path(), to.join(entry.file_name()));
            let kind = entry.file_type()?;
            if kind.is_dir() {
                std::fs::create_dir(&dst)?;
                copy_tree(&src, &dst)?;
                let mode = entry.metadata()?.permissions().mode();
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode))?;
            } else if kind.is_file() {
                std::fs::copy(&src, &dst)?;
            } else if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
            }
        }
        Ok(())
    }

    /// Applies an unpacked archive's writable layer to a container's mounted `rootfs`: the
    /// files of `rootfs-diff.tar`, then the deletions of `deleted.files`.
    pub fn apply_rootfs_diff(unpacked: &Path, rootfs: &Path) -> io::Result<()> {
        let diff = unpacked.join(names::ROOTFS_DIFF);
        if diff.is_file() {
            let mut ar = tar::Archive::new(io::BufReader::new(File::open(&diff)?));
            ar.set_preserve_permissions(true);
            ar.set_preserve_ownerships(true);
            ar.set_overwrite(true);
            ar.unpack(rootfs)?;
        }
        let list = unpacked.join(names::DELETED_FILES);
        let root = std::fs::canonicalize(rootfs)?;
        if list.is_file() {
            let paths: Vec<String> =
                serde_json::from_slice(&std::fs::read(&list)?).map_err(io::Error::other)?;
            for p in paths {
                let rel: PathBuf = Path::new(&p)
                    .components()
                    .filter(|c| matches!(c, std::path::Component::Normal(_)))
                    .collect();
                if rel.as_os_str().is_empty() {
                    continue;
                }
                let target = root.join(rel);
                // A symlink on the way must not lead out of the rootfs.
                let inside = target
                    .parent()
                    .and_then(|p| std::fs::canonicalize(p).ok())
                    .is_some_and(|p| p.starts_with(&root));
                if !inside {
                    continue;
                }
                match std::fs::symlink_metadata(&target) {
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(&target)?,
                    Ok(_) => std::fs::remove_file(&target)?,
                    Err(_) => {}
                }
            }
        }
        Ok(())
    }

    /// `nanos` since the epoch as RFC 3339 UTC (`2006-01-02T15:04:05Z`).
    pub fn rfc3339(nanos: i64) -> String {
        let secs = nanos.div_euclid(1_000_000_000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = crius_common::civil_from_days(days);
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(archive::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            archive::rfc3339(1_700_000_000_000_000_000),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            archive::rfc3339(951_782_400 * 1_000_000_000),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn locations_and_timeouts_are_checked() {
        assert!(check_location("").is_err());
        assert!(check_location("relative.tar").is_err());
        assert!(check_location("/tmp/").is_err());
        assert!(check_location("/no/such/dir/x.tar").is_err());
        assert!(check_location("/tmp").is_err());
        assert!(check_location("/tmp/x.tar").is_ok());
        // never renamed over a device node or a link
        assert!(check_location("/dev/null")
            .is_err_and(|e| e.to_string().contains("not a regular file")));
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.tar");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        assert!(check_location(link.to_str().unwrap()).is_err());
        let earlier = dir.path().join("earlier.tar");
        std::fs::write(&earlier, b"x").unwrap();
        assert!(check_location(earlier.to_str().unwrap()).is_ok());
        assert_eq!(check_timeout(0).ok(), Some(DEFAULT_TIMEOUT));
        assert_eq!(check_timeout(3).ok(), Some(Duration::from_secs(3)));
        assert_eq!(
            check_timeout(i64::MAX).ok(),
            Some(Duration::from_secs(86_400))
        );
        assert!(check_timeout(-1).is_err());
    }

    #[test]
    fn the_rootfs_diff_keeps_files_and_lists_whiteouts() {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        std::fs::create_dir_all(upper.join("data")).unwrap();
        std::fs::write(upper.join("data/kept"), b"hello").unwrap();
        std::os::unix::fs::symlink("kept", upper.join("data/link")).unwrap();
        let out = dir.path().join("diff.tar");
        let deleted = archive::rootfs_diff(&upper, &out).unwrap();
        assert!(deleted.is_empty());
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::write(rootfs.join("etc/gone"), b"x").unwrap();
        let unpacked = dir.path().join("unpacked");
        std::fs::create_dir_all(&unpacked).unwrap();
        std::fs::copy(&out, unpacked.join(names::ROOTFS_DIFF)).unwrap();
        std::fs::write(
            unpacked.join(names::DELETED_FILES),
            br#"["/etc/gone","/../x"]"#,
        )
        .unwrap();
        archive::apply_rootfs_diff(&unpacked, &rootfs).unwrap();
        assert_eq!(std::fs::read(rootfs.join("data/kept")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read_link(rootfs.join("data/link")).unwrap(),
            Path::new("kept")
        );
        assert!(!rootfs.join("etc/gone").exists());
    }
}
