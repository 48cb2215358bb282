//! Container requests (create, start, reopen_log) and what completes them: the helpers'
//! reports and the init's exit. Signals and deletes are in [`super::teardown`]; the checks
//! against a container's phase live in [`super::lifecycle`].

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crius_api::shim::{
    ContainerInfo, CreateContainer, ErrorKind, ExitInfo, OciRuntime, Reply, Response, ShimError,
};
use tracing::{info, warn};

use super::helpers::HelperPurpose;
use super::io::AttachSink;
use super::lifecycle::Phase;
use super::{decode_status, err, not_found, pipe, valid_id, Shim, Token};
use crate::cri_log::{CriLog, Stream};
use crate::exit_record;
use crate::helper::{set_nonblocking, HelperOp};
use crate::libct_state::{self, Recorded};
use crate::oom::OomWatch;
use crate::time::{now_unix_nanos, rfc3339_nanos};

pub(super) struct Container {
    pub(super) id: String,
    bundle: PathBuf,
    log_path: Option<PathBuf>,
    pub(super) tty: bool,
    pub(super) stdin_requested: bool,
    pub(super) stdin_once: bool,
    pub(super) phase: Phase,
    /// Our end of the container's stdin, kept open for attach.
    pub(super) stdin: Option<OwnedFd>,
    /// Read ends of stdout and stderr (index = `Stream`); for a tty, the pty master as stdout.
    pub(super) outputs: [Option<OwnedFd>; 2],
    pub(super) log: Option<CriLog>,
    /// OOM kills in its memory cgroup, watched from create until the init exits.
    pub(super) oom: Option<OomWatch>,
    created_at: i64,
    /// Connections waiting for the init's exit.
    pub(super) waiters: Vec<Token>,
    /// Connections waiting for the delete.
    pub(super) delete_waiters: Vec<Token>,
    /// Helpers working on this container; a delete waits until none is left, as libcontainer
    /// rewrites its state file without a lock.
    pub(super) helpers: u32,
    /// What libcontainer recorded of the spec at create (cgroup, hooks); `None` if it could
    /// not be read, and then every operation goes through a helper.
    pub(super) libct: Option<Recorded>,
    /// Attach sessions receiving a copy of the output.
    pub(super) attaches: Vec<AttachSink>,
    /// The OCI runtime that runs the container (its root resolved), or `None` for
    /// libcontainer.
    pub(super) runtime: Option<OciRuntime>,
    /// The runtime gave the pid of a process another container has too (the pod's sandbox
    /// process, under gVisor): that pid's exit is not this container's, which a `wait` helper
    /// reports instead.
    pub(super) exit_by_wait: bool,
    /// The container's own ends of its stdio, kept until it starts when an OCI runtime runs
    /// it: gVisor hands a container that joins a sandbox the stdio of `runsc start`, not of
    /// `runsc create` (runc ignores them there).
    pub(super) start_stdio: [Option<OwnedFd>; 3],
    /// Made by restoring a checkpoint: its processes wait stopped, and its start continues
    /// them (`<rt> kill --all CONT`) instead of starting a process.
    pub(super) restored: bool,
}

impl Container {
    pub(super) fn info(&self) -> ContainerInfo {
        ContainerInfo {
            id: self.id.clone(),
            status: self.phase.status(),
            pid: self.phase.pid(),
            bundle: self.bundle.clone(),
            log_path: self.log_path.clone(),
            tty: self.tty,
            stdin: self.stdin_requested,
            stdin_once: self.stdin_once,
            created_at_unix_nano: self.created_at,
            started_at_unix_nano: self.phase.started_at(),
            exit: self.phase.exit().cloned(),
        }
    }
}

impl Shim {
    pub(super) fn container_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("containers").join(id)
    }

    pub(super) fn create(&mut self, token: Token, req: CreateContainer) -> Result<(), ShimError> {
        self.refuse_if_stopping()?;
        let id = req.id.clone();
        if !valid_id(&id) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("invalid container id {id:?}: use 1-128 of [A-Za-z0-9_.-]"),
            ));
        }
        let runtime = req.runtime.clone().map(|mut rt| {
            let name = rt.binary.file_name().map(|n| n.to_os_string());
            rt.root.get_or_insert_with(|| {
                self.cfg
                    .state_dir
                    .join("oci")
                    .join(name.unwrap_or_else(|| "runtime".into()))
            });
            rt
        });
        if req.restore.is_some() && runtime.is_none() {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("restore container {id}: only an OCI runtime restores a checkpoint"),
            ));
        }
        if let Some(rt) = &runtime {
            if !rt.binary.is_absolute() {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    format!("runtime {}: not an absolute path", rt.binary.display()),
                ));
            }
        }
        let root = runtime
            .as_ref()
            .and_then(|rt| rt.root.clone())
            .unwrap_or_else(|| self.runc_root.clone());
        if self.containers.contains_key(&id) || root.join(&id).exists() {
            return Err(err(
                ErrorKind::AlreadyExists,
                format!("container {id} already exists"),
            ));
        }
        if !req.bundle.is_absolute() || !req.bundle.join("config.json").is_file() {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "bundle {}: not an absolute directory with a config.json",
                    req.bundle.display()
                ),
            ));
        }
        check_spec(&req.bundle, req.tty).map_err(|m| {
            err(
                ErrorKind::InvalidArgument,
                format!("create container {id}: {m}"),
            )
        })?;
        let internal = |what: &str, e: io::Error| {
            err(
                ErrorKind::Internal,
                format!("create container {id}: {what}: {e}"),
            )
        };
        let log = match &req.log_path {
            Some(path) => Some(CriLog::open(path, self.cfg.max_log_line).map_err(|e| {
                err(
                    ErrorKind::InvalidArgument,
                    format!("create container {id}: open log {}: {e}", path.display()),
                )
            })?),
            None => None,
        };
        let dir = self.container_dir(&id);
        fs::create_dir_all(&dir).map_err(|e| internal("state dir", e))?;
        fs::create_dir_all(&root).map_err(|e| internal("runtime root", e))?;
        let _ = fs::remove_file(dir.join(crius_api::shim::EXIT_FILE));

        // Our ends and the container's ends of its stdio.
        let mut outputs: [Option<OwnedFd>; 2] = [None, None];
        let mut stdin_writer = None;
        // The container's ends: stdin, stdout, stderr.
        let mut child: [Option<OwnedFd>; 3] = [None, None, None];
        if !req.tty {
            let (r, w) = pipe().map_err(|e| internal("stdout pipe", e))?;
            outputs[0] = Some(r);
            child[1] = Some(w);
            let (r, w) = pipe().map_err(|e| internal("stderr pipe", e))?;
            outputs[1] = Some(r);
            child[2] = Some(w);
            if req.stdin {
                let (r, w) = pipe().map_err(|e| internal("stdin pipe", e))?;
                child[0] = Some(r);
                stdin_writer = Some(w);
            }
        }
        for fd in outputs.iter().flatten() {
            set_nonblocking(fd.as_raw_fd()).map_err(|e| internal("output pipe", e))?;
        }
        let op = match &req.restore {
            Some(restore) => HelperOp::Restore {
                bundle: req.bundle.clone(),
                image_path: restore.images.clone(),
                work_path: dir.join("restore-work"),
                console_dir: req.tty.then(|| dir.clone()),
                criu: Some(restore.criu.clone()),
            },
            None => HelperOp::Create {
                bundle: req.bundle.clone(),
                console_dir: req.tty.then(|| dir.clone()),
            },
        };
        let stdio = [0, 1, 2].map(|i| child[i].as_ref().map(|f| f.as_raw_fd()));
        let purpose = HelperPurpose::Create {
            id: id.clone(),
            token,
        };
        // Recorded first, so the helper is counted against it.
        self.containers.insert(
            id.clone(),
            Container {
                id: id.clone(),
                bundle: req.bundle,
                log_path: req.log_path,
                tty: req.tty,
                stdin_requested: req.stdin,
                stdin_once: req.stdin_once,
                phase: Phase::Creating { doomed: false },
                stdin: stdin_writer,
                outputs,
                log,
                oom: None,
                created_at: 0,
                waiters: Vec::new(),
                delete_waiters: Vec::new(),
                helpers: 0,
                libct: None,
                attaches: Vec::new(),
                runtime,
                exit_by_wait: false,
                start_stdio: [None, None, None],
                restored: req.restore.is_some(),
            },
        );
        if let Err(e) = self.spawn_helper(&id, op, stdio, purpose) {
            self.containers.remove(&id);
            let _ = fs::remove_dir_all(&dir);
            return Err(internal("spawn helper", e));
        }
        // The container's ends now live in the helper; an OCI runtime's start may need them.
        if let Some(c) = self.containers.get_mut(&id).filter(|c| c.runtime.is_some()) {
            c.start_stdio = child;
        }
        info!(target: "crius_shim", container = %id, "creating container");
        Ok(())
    }

    /// The create helper reported.
    pub(super) fn created(
        &mut self,
        id: &str,
        token: Token,
        result: Result<(i32, Option<OwnedFd>), String>,
        crashed: bool,
    ) {
        let (pid, master) = match result {
            Ok(ok) => ok,
            Err(message) => {
                warn!(target: "crius_shim", container = %id, error = %message, "create failed");
                if let Some(c) = self.containers.remove(id) {
                    for waiter in c.waiters {
                        let response = Response::Err(err(
                            ErrorKind::NotFound,
                            format!("container {id} failed to be created"),
                        ));
                        self.complete(waiter, response);
                    }
                }
                // libcontainer removes what it made when a create fails; a helper that died
                // half-way may have left state, which a background delete clears.
                if crashed {
                    let purpose = HelperPurpose::Background;
                    let _ = self.spawn_helper(id, HelperOp::Delete, [None; 3], purpose);
                }
                let _ = fs::remove_dir_all(self.container_dir(id));
                let response = Response::Err(err(
                    ErrorKind::Internal,
                    format!("create container {id}: {message}"),
                ));
                self.complete(token, response);
                return;
            }
        };
        // libcontainer's record of the spec, for starting, signalling and deleting without a
        // helper; without it (and always for an OCI runtime) those go through helpers.
        let by_libcontainer = self.containers.get(id).is_some_and(|c| c.runtime.is_none());
        let recorded = match by_libcontainer {
            false => None,
            true => match libct_state::read_recorded(&self.runc_root.join(id)) {
                Ok(r) => Some(r),
                Err(e) => {
                    warn!(target: "crius_shim", container = %id, error = %crius_common::error_chain(&e), "libcontainer's record unreadable");
                    None
                }
            },
        };
        let shared = self
            .containers
            .values()
            .any(|o| o.id != id && !o.exit_by_wait && o.phase.live_pid() == Some(pid));
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        let doomed = c.phase.on_created(pid);
        c.libct = recorded;
        c.created_at = now_unix_nanos();
        c.exit_by_wait = shared && c.runtime.is_some();
        if !c.exit_by_wait {
            c.oom = OomWatch::for_pid(pid);
        }
        if let Some(master) = master {
            if set_nonblocking(master.as_raw_fd()).is_ok() {
                if c.stdin_requested {
                    c.stdin = master.try_clone().ok();
                }
                c.outputs[Stream::Stdout as usize] = Some(master);
            }
        }
        info!(target: "crius_shim", container = %id, pid, "created");
        self.complete(token, Response::Ok(Reply::Created { pid }));
        if let Some(status) = self.take_orphan_exit(pid) {
            self.container_exited(id, status);
        }
        if doomed {
            self.delete_now(id);
        }
    }

    /// Let a created container run: in the plain case the shim sends the init its start
    /// message itself (see [`libct_state::start`]); hooks, or anything unexpected in
    /// libcontainer's files, go to libcontainer in a helper.
    pub(super) fn start(&mut self, token: Token, id: &str) -> Result<Option<Reply>, ShimError> {
        self.refuse_if_stopping()?;
        let c = self.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        let pid = c.phase.can_start(id)?;
        let began = now_unix_nanos();
        if c.libct.as_ref().is_some_and(|r| !r.poststart_hooks) {
            match libct_state::start(&self.runc_root.join(id), pid) {
                Ok(()) => {
                    c.phase.on_started(began);
                    info!(target: "crius_shim", container = %id, "started");
                    return Ok(Some(Reply::Started {
                        pid,
                        started_at: Some(began),
                    }));
                }
                Err(e) => {
                    info!(target: "crius_shim", container = %id, reason = %crius_common::error_chain(&e), "start left to a helper");
                }
            }
        }
        c.phase.on_start_helper(began);
        let purpose = HelperPurpose::Start {
            id: id.to_owned(),
            token,
        };
        // Given once, then closed here: a write end left open would keep the output open.
        let stdio = std::mem::take(&mut c.start_stdio);
        let fds = [0, 1, 2].map(|i| stdio[i].as_ref().map(|f| f.as_raw_fd()));
        // A restored container's processes exist, stopped: continuing all of them is its start.
        let op = match c.restored {
            true => HelperOp::Kill {
                signal: libc::SIGCONT,
            },
            false => HelperOp::Start,
        };
        let spawned = self.spawn_helper(id, op, fds, purpose);
        drop(stdio);
        if let Err(e) = spawned {
            if let Some(c) = self.containers.get_mut(id) {
                c.phase.on_start_done(false);
            }
            return Err(err(
                ErrorKind::Internal,
                format!("start container {id}: spawn helper: {e}"),
            ));
        }
        Ok(None)
    }

    /// The start helper reported.
    pub(super) fn started(&mut self, id: &str, token: Token, result: Result<i32, String>) {
        let Some(c) = self.containers.get_mut(id) else {
            self.complete(token, Response::Err(not_found(id)));
            return;
        };
        c.phase.on_start_done(result.is_ok());
        let wait = result.is_ok() && c.exit_by_wait;
        if wait {
            let purpose = HelperPurpose::Wait { id: id.to_owned() };
            if let Err(e) = self.spawn_helper(id, HelperOp::Wait, [None; 3], purpose) {
                // Without it the exit would go unseen: the container counts as ended.
                warn!(target: "crius_shim", container = %id, error = %e, "spawn wait helper");
                self.container_exited(id, 255 << 8);
            }
        }
        let Some(c) = self.containers.get_mut(id) else {
            self.complete(token, Response::Err(not_found(id)));
            return;
        };
        let response = match result {
            Ok(_) => {
                info!(target: "crius_shim", container = %id, "started");
                Response::Ok(Reply::Started {
                    pid: c.phase.pid().unwrap_or(0),
                    started_at: c.phase.started_at(),
                })
            }
            Err(message) => Response::Err(err(
                ErrorKind::Internal,
                format!("start container {id}: {message}"),
            )),
        };
        self.complete(token, response);
    }

    /// The init was reaped: log what it wrote last, record the exit, tell the waiters and
    /// attach sessions, and go on with a delete that waited for it.
    pub(super) fn container_exited(&mut self, id: &str, status: i32) {
        let now = now_unix_nanos();
        // Everything the init wrote before exiting is in the pipes now: log it before anyone
        // hears of the exit.
        self.drain_outputs(id);
        let dir = self.container_dir(id);
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        let (exit_code, signal) = decode_status(status);
        let oom_killed = c.oom.take().is_some_and(|mut w| w.finish());
        let exit = ExitInfo {
            pid: c.phase.pid().unwrap_or(0),
            exit_code,
            signal,
            finished_at: rfc3339_nanos(now),
            finished_at_unix_nano: now,
            oom_killed,
        };
        if let Err(e) = exit_record::write(&dir, &exit) {
            warn!(target: "crius_shim", container = %id, error = %e, "write exit record");
        }
        info!(target: "crius_shim", container = %id, exit_code, ?signal, oom_killed, "exited");
        let delete_now = c.phase.on_exit(exit.clone());
        // Closing the sessions' pipes ends their output; then they hear of the exit.
        for sink in c.attaches.drain(..) {
            let response = Response::Ok(Reply::ProcessExited { exit_code, signal });
            self.outbox.push_back((sink.token, response));
        }
        for token in std::mem::take(&mut c.waiters) {
            self.outbox
                .push_back((token, Response::Ok(Reply::Exited(exit.clone()))));
        }
        if delete_now {
            self.remove_container(id);
        }
    }

    pub(super) fn reopen_log(&mut self, id: &str) -> Result<Reply, ShimError> {
        let c = self.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        let log = c.log.as_mut().ok_or_else(|| {
            err(
                ErrorKind::FailedPrecondition,
                format!("container {id} has no log path"),
            )
        })?;
        log.reopen().map_err(|e| {
            err(
                ErrorKind::Internal,
                format!("reopen log {} of container {id}: {e}", log.path().display()),
            )
        })?;
        Ok(Reply::Done)
    }
}

/// Catch the spec mistakes libcontainer turns into surprises: without an absolute
/// `linux.cgroupsPath` it creates a literal `:youki:<id>` cgroup, and a `process.terminal` that
/// disagrees with the `tty` flag fails deep inside the create.
fn check_spec(bundle: &Path, tty: bool) -> Result<(), String> {
    let path = bundle.join("config.json");
    let text = fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let spec: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("parse {}: {e}", path.display()))?;
    let cgroups_path = spec
        .pointer("/linux/cgroupsPath")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if !cgroups_path.starts_with('/') {
        return Err(format!(
            "{}: linux.cgroupsPath must be an absolute path, not {cgroups_path:?}",
            path.display()
        ));
    }
    let terminal = spec
        .pointer("/process/terminal")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if terminal != tty {
        return Err(format!(
            "{}: process.terminal is {terminal} but tty is {tty}",
            path.display()
        ));
    }
    Ok(())
}
