//! The shim's event loop: one `poll(2)` over the control socket and its connections, the
//! signalfd, every container's output pipes, exec captures and helper report channels.
//!
//! Requests that complete later (create, exec_sync, wait, a forced delete of a live container)
//! park their connection; the loop answers when the event that completes them arrives, so a
//! long exec never holds up another request. Answers to parked requests go through an outbox
//! that is flushed after each event, so no handler re-enters the request path half-way.
//!
//! The parts, one file each: `conn` (connections, framing, the outbox, request dispatch),
//! [`lifecycle`] (a container's phases and the checks made against them), `container`
//! (create, start, exits), `teardown` (kill, delete), `execs` (exec_sync and exec_stream),
//! `io` (container output, logs and attach), `helpers` (helper processes, reaping). Everything
//! the loop does to other processes goes through a [`Launcher`], so the state machine runs
//! without root against a fake one (`shim/tests/state_machine.rs`).

mod conn;
mod container;
mod execs;
mod helpers;
mod io;
pub mod lifecycle;
mod teardown;

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crius_api::shim::{ErrorKind, Response, ShimError};
use tracing::{debug, info, warn};

use crate::cgroup::Hierarchies;
use crate::helper::{Helper, Launcher, Spawner};
use crate::oom::OomWatch;
use crate::signals::Signals;

use conn::Conn;
use container::Container;
use execs::ExecJob;
use helpers::PendingHelper;

/// Settings of one shim.
#[derive(Debug, Clone)]
pub struct Config {
    pub pod_id: String,
    pub state_dir: PathBuf,
    pub max_log_line: usize,
    /// The `crius-shim-helper` binary that runs libcontainer operations.
    pub helper: PathBuf,
}

/// A connection on the control socket.
type Token = u64;

/// What a ready descriptor in the poll set belongs to.
#[derive(Clone)]
enum Source {
    Helper(u64),
    Signals,
    Output(String, usize),
    Oom(String),
    ExecOut(u64, usize),
    Conn(Token),
    Listener,
}

/// The shim's whole state.
pub struct Shim {
    cfg: Config,
    runc_root: PathBuf,
    listener: UnixListener,
    signals: Signals,
    launcher: Box<dyn Launcher>,
    conns: BTreeMap<Token, Conn>,
    /// Answers to parked requests, sent after the current event (see [`Self::complete`]).
    outbox: VecDeque<(Token, Response)>,
    containers: BTreeMap<String, Container>,
    execs: BTreeMap<u64, ExecJob>,
    helpers: BTreeMap<u64, PendingHelper>,
    /// Helpers not reaped yet (their reports may already be read).
    helper_pids: Vec<i32>,
    /// Helpers started ahead of their call (`prepare`), oldest first, with when they end
    /// unused.
    prepared: VecDeque<(Helper, Instant)>,
    /// Exits of pids no helper has named yet: (pid, wait status, when).
    orphan_exits: Vec<(i32, i32, Instant)>,
    /// The host's cgroup hierarchies, looked up on first use.
    cgroups: Option<Hierarchies>,
    next_id: u64,
    shutdown_requested: bool,
    terminating: bool,
    buf: Vec<u8>,
    /// When to let go of the start's text pages ([`TEXT_RELEASE_AFTER`]), until done.
    text_release: Option<Instant>,
}

/// How long after its start the shim drops the page table entries of its code
/// ([`crius_common::text_pages`]): by then the pod's first containers have usually been made;
/// while a helper or an exec is under way it waits another second. The shim maps nearly all
/// of its text in its first second (fault-around), and a running pod's shim then mostly
/// polls, copies output, spawns an exec's helper and reaps.
pub const TEXT_RELEASE_AFTER: Duration = Duration::from_secs(10);

fn err(kind: ErrorKind, message: impl Into<String>) -> ShimError {
    ShimError::new(kind, message)
}

fn not_found(id: &str) -> ShimError {
    err(ErrorKind::NotFound, format!("container {id} not found"))
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && id != "."
        && id != ".."
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// Exit code and signal from a raw wait status, with 128 + signal as the code for a signal.
fn decode_status(status: i32) -> (i32, Option<i32>) {
    if libc::WIFEXITED(status) {
        (libc::WEXITSTATUS(status), None)
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        (128 + sig, Some(sig))
    } else {
        (255, None)
    }
}

impl Shim {
    /// A shim serving `listener`, with `signals` already blocking SIGCHLD/SIGTERM/SIGINT,
    /// running helpers from `cfg.helper`.
    pub fn new(cfg: Config, listener: UnixListener, signals: Signals) -> std::io::Result<Self> {
        let launcher = Spawner {
            helper: cfg.helper.clone(),
        };
        let mut shim = Self::with_launcher(cfg, listener, signals, Box::new(launcher))?;
        shim.text_release = Some(Instant::now() + TEXT_RELEASE_AFTER);
        Ok(shim)
    }

    /// A shim whose helpers and signals go through `launcher`.
    pub fn with_launcher(
        cfg: Config,
        listener: UnixListener,
        signals: Signals,
        launcher: Box<dyn Launcher>,
    ) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let runc_root = cfg.state_dir.join("runc");
        fs::create_dir_all(&runc_root)?;
        fs::create_dir_all(cfg.state_dir.join("containers"))?;
        // `exec/` is made by the first exec: most pods never exec, and a pod start pays for
        // every directory made here.
        Ok(Self {
            cfg,
            runc_root,
            listener,
            signals,
            launcher,
            conns: BTreeMap::new(),
            outbox: VecDeque::new(),
            containers: BTreeMap::new(),
            execs: BTreeMap::new(),
            helpers: BTreeMap::new(),
            helper_pids: Vec::new(),
            prepared: VecDeque::new(),
            orphan_exits: Vec::new(),
            cgroups: None,
            next_id: 1,
            shutdown_requested: false,
            terminating: false,
            buf: vec![0u8; 64 * 1024],
            text_release: None,
        })
    }

    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Serve until shut down; then remove the state directory.
    pub fn run(mut self) {
        while !self.turn(-1) {}
        self.flush_before_exit();
        info!(target: "crius_shim", pod = %self.cfg.pod_id, "shim exits");
        let state = &self.cfg.state_dir;
        if self.shutdown_requested {
            if let Err(e) = fs::remove_dir_all(state) {
                warn!(target: "crius_shim", error = %e, "remove state dir");
            }
        } else {
            // Terminated by a signal: keep `containers/*/exit.json` and the log, drop what
            // says a shim is serving.
            let _ = fs::remove_file(state.join(crius_api::shim::CONTROL_SOCKET));
            let _ = fs::remove_file(state.join(crius_api::shim::PID_FILE));
            let _ = fs::remove_dir_all(&self.runc_root);
            let _ = fs::remove_dir_all(state.join("exec"));
        }
    }

    /// One round of the loop: wait for events (at most `max_wait_ms`, -1 for no limit beyond
    /// the next timer), handle them, send the answers they produced. True once the shim is
    /// done (shut down or terminated, with nothing left to wait for).
    pub fn turn(&mut self, max_wait_ms: i32) -> bool {
        if self.done() {
            return true;
        }
        let (mut fds, sources) = self.poll_set();
        let timeout = match (self.poll_timeout(), max_wait_ms) {
            (-1, limit) => limit,
            (t, -1) => t,
            (t, limit) => t.min(limit),
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                warn!(target: "crius_shim", error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(10));
            }
            return false;
        }
        for (pfd, source) in fds.iter().zip(sources) {
            if pfd.revents != 0 {
                self.dispatch(source, pfd.revents);
                self.flush_outbox();
            }
        }
        self.check_timers();
        self.flush_outbox();
        self.done()
    }

    fn done(&self) -> bool {
        let idle = self.containers.is_empty() && self.helpers.is_empty() && self.execs.is_empty();
        (self.shutdown_requested || self.terminating) && idle
    }

    fn poll_set(&self) -> (Vec<libc::pollfd>, Vec<Source>) {
        let mut fds = Vec::new();
        let mut sources = Vec::new();
        let mut add = |fd: RawFd, events: i16, source: Source| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            sources.push(source);
        };
        // Helpers first: a helper's report must be read before the exit of the process it
        // names, which can arrive in the same round.
        for (id, h) in &self.helpers {
            add(h.chan.as_raw_fd(), libc::POLLIN, Source::Helper(*id));
        }
        // OOM watches before the signals: an OOM wake-up must read the count before the
        // init's exit, arriving in the same round, lets the cgroup go.
        for c in self.containers.values() {
            if let Some(fd) = c.oom.as_ref().and_then(OomWatch::raw_fd) {
                add(fd, libc::POLLIN, Source::Oom(c.id.clone()));
            }
        }
        add(self.signals.raw_fd(), libc::POLLIN, Source::Signals);
        for c in self.containers.values() {
            for (i, fd) in c.outputs.iter().enumerate() {
                if let Some(fd) = fd {
                    add(
                        fd.as_raw_fd(),
                        libc::POLLIN,
                        Source::Output(c.id.clone(), i),
                    );
                }
            }
        }
        for (id, job) in &self.execs {
            for (i, cap) in job.out.iter().enumerate() {
                if let Some(fd) = &cap.fd {
                    add(fd.as_raw_fd(), libc::POLLIN, Source::ExecOut(*id, i));
                }
            }
        }
        for (token, conn) in &self.conns {
            add(conn.stream.as_raw_fd(), conn.events(), Source::Conn(*token));
        }
        // Still served after a shutdown request: crius deletes the remaining containers.
        add(self.listener.as_raw_fd(), libc::POLLIN, Source::Listener);
        (fds, sources)
    }

    /// Milliseconds until the next timer (exec deadline or drain end, helper deadline, OOM
    /// re-check), -1 for none.
    fn poll_timeout(&self) -> i32 {
        let now = Instant::now();
        let next = self
            .execs
            .values()
            .flat_map(ExecJob::timers)
            .chain(self.helpers.values().map(|h| h.deadline))
            .chain(self.prepared.front().map(|(_, until)| Some(*until)))
            .chain(std::iter::once(self.text_release))
            .chain(
                self.containers
                    .values()
                    .map(|c| c.oom.as_ref().and_then(OomWatch::next_check)),
            )
            .flatten()
            .min();
        match next {
            None => -1,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis() + 1;
                i32::try_from(ms).unwrap_or(i32::MAX)
            }
        }
    }

    fn dispatch(&mut self, source: Source, revents: i16) {
        match source {
            Source::Helper(id) => self.on_helper(id, None),
            Source::Signals => {
                for sig in self.signals.drain() {
                    match sig {
                        libc::SIGCHLD => self.reap(),
                        libc::SIGTERM | libc::SIGINT => self.terminate(),
                        _ => {}
                    }
                }
                // Exits may have been queued before the signal mask was set.
                self.reap();
            }
            Source::Output(id, i) => {
                self.on_output(&id, i);
            }
            Source::Oom(id) => {
                if let Some(w) = self.containers.get_mut(&id).and_then(|c| c.oom.as_mut()) {
                    w.on_ready();
                }
            }
            Source::ExecOut(id, i) => self.on_exec_output(id, i),
            Source::Conn(token) => self.on_conn(token, revents),
            Source::Listener => self.accept(),
        }
    }

    fn check_timers(&mut self) {
        let now = Instant::now();
        self.check_exec_timers(now);
        for c in self.containers.values_mut() {
            if let Some(w) = &mut c.oom {
                w.on_timer(now);
            }
        }
        self.check_helper_timers(now);
        self.expire_prepared(now);
        self.release_text(now);
    }

    /// Once, [`TEXT_RELEASE_AFTER`] into the shim's life and at a moment without a helper or
    /// an exec under way, drop the mapped pages of its code.
    fn release_text(&mut self, now: Instant) {
        let Some(at) = self.text_release else {
            return;
        };
        if now < at {
            return;
        }
        if !self.helpers.is_empty() || !self.execs.is_empty() {
            self.text_release = Some(now + Duration::from_secs(1));
            return;
        }
        self.text_release = None;
        // Logged before: the logging code would fault straight back in.
        debug!(target: "crius_shim", "letting go of the start's text pages");
        if let Err(e) = crius_common::text_pages::release() {
            warn!(target: "crius_shim", error = %e, "release text pages");
        }
    }

    /// SIGTERM/SIGINT: kill every container, record the exits, delete them, then exit.
    fn terminate(&mut self) {
        if self.terminating {
            return;
        }
        info!(target: "crius_shim", "terminating: killing all containers");
        self.terminating = true;
        self.prepared.clear();
        let ids: Vec<String> = self.containers.keys().cloned().collect();
        for id in ids {
            let Some(c) = self.containers.get_mut(&id) else {
                continue;
            };
            match c.phase.terminate() {
                Some(lifecycle::DeleteAction::KillFirst { pid }) => self.kill_init(&id, pid),
                Some(lifecycle::DeleteAction::RemoveNow) => self.remove_container(&id),
                Some(lifecycle::DeleteAction::Join) | None => {}
            }
        }
    }
}

/// Bind the control socket in `dir` by a relative name (state paths may exceed the 108 bytes
/// of a socket address), replacing a stale one.
pub fn bind_control_socket(dir: &Path) -> std::io::Result<UnixListener> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    std::env::set_current_dir(dir)?;
    let _ = fs::remove_file(crius_api::shim::CONTROL_SOCKET);
    let listener = UnixListener::bind(crius_api::shim::CONTROL_SOCKET);
    let _ = std::env::set_current_dir(cwd);
    listener
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(valid_id("abc-1.2_3"));
        assert!(!valid_id(""));
        assert!(!valid_id(".."));
        assert!(!valid_id("a/b"));
        assert!(!valid_id(&"a".repeat(129)));
    }

    #[test]
    fn wait_status_decodes_codes_and_signals() {
        assert_eq!(decode_status(3 << 8), (3, None));
        assert_eq!(decode_status(9), (137, Some(9)));
    }
}
