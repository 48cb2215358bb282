//! The shim's event loop: one `poll(2)` over the control socket and its connections, the
//! signalfd, every container's output pipes, exec captures and fork-helper channels.
//!
//! Requests that complete later (create, exec_sync, wait, a forced delete of a live container)
//! park their connection; the loop answers when the event that completes them arrives, so a
//! long exec never holds up another request.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crius_api::shim::{
    decode_frame, encode_frame, Attach, ContainerInfo, ContainerStatus, CreateContainer, ErrorKind,
    ExecOutcome, ExecStream, ExecSync, ExitInfo, Op, Reply, Request, Response, ShimError, StreamFd,
    Streams, DEFAULT_EXEC_OUTPUT_LIMIT, MAX_FRAME, PROTOCOL_VERSION,
};
use tracing::{info, warn};

use crate::cgroup::Hierarchies;
use crate::cri_log::{CriLog, Stream};
use crate::exit_record;
use crate::helper::{self, set_nonblocking, Outcome};
use crate::libct_state::{self, Recorded};
use crate::oom::OomWatch;
use crate::signals::Signals;
use crate::time::{now_unix_nanos, rfc3339_nanos};

/// After an exec's process exits, how long to keep reading output that a background child of
/// it may still write to the inherited pipes.
const EXEC_DRAIN_GRACE: Duration = Duration::from_millis(100);

/// How long exits of not-yet-known pids are kept (a process may be reaped before the helper's
/// report naming it is read, which takes milliseconds); short, as pids get reused.
const ORPHAN_EXIT_TTL: Duration = Duration::from_secs(5);

/// A helper that has not reported after this long is killed (its request then fails), so a
/// stuck libcontainer call cannot leave a container "creating" forever.
use crius_api::shim::HELPER_TIMEOUT;

/// Capacity asked for the pipes that carry a container's output to an attach session.
const ATTACH_PIPE_SIZE: libc::c_int = 1 << 20;

/// On shutdown, how long to try to deliver the last replies.
const FLUSH_ON_EXIT: Duration = Duration::from_secs(1);

/// Settings of one shim.
#[derive(Debug, Clone)]
pub struct Config {
    pub pod_id: String,
    pub state_dir: PathBuf,
    pub max_log_line: usize,
    /// The `crius-shim-helper` binary that runs libcontainer operations.
    pub helper: PathBuf,
}

type Token = u64;

struct Conn {
    stream: UnixStream,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    /// A request of this connection is being served; later frames wait.
    busy: bool,
    /// The peer closed its side.
    eof: bool,
}

struct Container {
    id: String,
    bundle: PathBuf,
    log_path: Option<PathBuf>,
    tty: bool,
    stdin_requested: bool,
    stdin_once: bool,
    status: ContainerStatus,
    pid: Option<i32>,
    /// Our end of the container's stdin, kept open for attach.
    stdin: Option<OwnedFd>,
    /// Read ends of stdout and stderr (index = `Stream`); for a tty, the pty master as stdout.
    outputs: [Option<OwnedFd>; 2],
    log: Option<CriLog>,
    /// OOM kills in its memory cgroup, watched from create until the init exits.
    oom: Option<OomWatch>,
    created_at: i64,
    started_at: Option<i64>,
    exit: Option<ExitInfo>,
    waiters: Vec<Token>,
    /// Connections waiting for a delete that runs once the init is reaped.
    delete_waiters: Vec<Token>,
    /// Delete once the init is reaped, even with nobody waiting (shim termination).
    delete_on_exit: bool,
    /// A start helper runs, since this time (reported as the start time: the process may
    /// even have exited before the helper reports).
    starting: Option<i64>,
    /// A delete helper runs.
    deleting: bool,
    /// Helpers working on this container; a delete waits until none is left, as libcontainer
    /// rewrites its state file without a lock.
    helpers: u32,
    /// A delete waits for `helpers` to reach 0.
    delete_queued: bool,
    /// What libcontainer recorded of the spec at create (cgroup, hooks); `None` if it could
    /// not be read, and then every operation goes through a helper.
    libct: Option<Recorded>,
    /// Attach sessions receiving a copy of the output.
    attaches: Vec<AttachSink>,
}

/// One attach session: where the container's output is copied for it.
struct AttachSink {
    /// The connection that asked for it; closing it ends the session.
    token: Token,
    /// Write ends (non-blocking) of its stdout and stderr pipes.
    out: [Option<OwnedFd>; 2],
    /// It was handed the container's stdin.
    stdin: bool,
}

impl Container {
    fn info(&self) -> ContainerInfo {
        ContainerInfo {
            id: self.id.clone(),
            status: self.status,
            pid: self.pid,
            bundle: self.bundle.clone(),
            log_path: self.log_path.clone(),
            tty: self.tty,
            stdin: self.stdin_requested,
            stdin_once: self.stdin_once,
            created_at_unix_nano: self.created_at,
            started_at_unix_nano: self.started_at,
            exit: self.exit.clone(),
        }
    }

    fn alive(&self) -> bool {
        self.pid.is_some() && self.exit.is_none()
    }

    /// End the attach session of connection `token`, if it has one: its pipes close and, for
    /// a `stdin_once` container attached with stdin, so does the container's stdin.
    fn detach(&mut self, token: Token) {
        let Some(i) = self.attaches.iter().position(|a| a.token == token) else {
            return;
        };
        let sink = self.attaches.swap_remove(i);
        if sink.stdin && self.stdin_once && !self.tty {
            info!(target: "crius_shim", container = %self.id, "attach with stdin ended: closing stdin (stdin_once)");
            self.stdin = None;
        }
    }

    /// Copy `bytes` of output stream `i` to every attach session; a session whose pipe is
    /// full loses them, one whose reader is gone loses its pipe.
    fn fan_out(&mut self, i: usize, bytes: &[u8]) {
        for sink in &mut self.attaches {
            let Some(fd) = &sink.out[i] else {
                continue;
            };
            // SAFETY: writing from a buffer we own, of the length we pass.
            let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock {
                    sink.out[i] = None;
                }
            }
        }
    }
}

struct Capture {
    fd: Option<OwnedFd>,
    data: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Capture {
    fn new(fd: OwnedFd, limit: usize) -> Self {
        Self {
            fd: Some(fd),
            data: Vec::new(),
            limit,
            truncated: false,
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = self.limit.saturating_sub(self.data.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

struct ExecJob {
    token: Token,
    container: String,
    pid: Option<i32>,
    out: [Capture; 2],
    /// Raw wait status once reaped.
    status: Option<i32>,
    deadline: Option<Instant>,
    timed_out: bool,
    drain_until: Option<Instant>,
    process_file: PathBuf,
    /// An `exec_stream`: its stdio belongs to crius and its answer is `process_exited`.
    streaming: bool,
    /// For `exec_stream`: the crius ends of the process's stdio, handed over with the
    /// `streams` answer once the process runs (the captures then stay empty).
    stream: Option<StreamHandoff>,
}

struct StreamHandoff {
    /// With a tty: hand over the master as stdin too.
    stdin: bool,
    fds: Vec<(StreamFd, OwnedFd)>,
}

enum HelperPurpose {
    Create {
        id: String,
        token: Token,
    },
    Exec {
        exec: u64,
    },
    Start {
        id: String,
        token: Token,
    },
    Kill {
        token: Token,
    },
    Delete {
        id: String,
    },
    /// Nobody waits for the outcome.
    Background,
}

struct PendingHelper {
    pid: i32,
    chan: OwnedFd,
    container: String,
    purpose: HelperPurpose,
    /// When to kill it; `None` once killed.
    deadline: Option<Instant>,
}

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
    conns: BTreeMap<Token, Conn>,
    containers: BTreeMap<String, Container>,
    execs: BTreeMap<u64, ExecJob>,
    helpers: BTreeMap<u64, PendingHelper>,
    /// Helpers not reaped yet (their reports may already be read).
    helper_pids: Vec<i32>,
    orphan_exits: Vec<(i32, i32, Instant)>,
    /// The host's cgroup hierarchies, looked up on first use.
    cgroups: Option<Hierarchies>,
    next_id: u64,
    shutdown_requested: bool,
    terminating: bool,
    buf: Vec<u8>,
}

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

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
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

enum ReadResult {
    Data(usize),
    WouldBlock,
    Eof,
}

fn read_fd(fd: RawFd, buf: &mut [u8]) -> ReadResult {
    loop {
        // SAFETY: reading into a buffer we own, of the length we pass.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return ReadResult::Data(n as usize);
        }
        if n == 0 {
            return ReadResult::Eof;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return ReadResult::WouldBlock,
            // EIO: the pty's other side is closed; anything else ends the stream too.
            _ => return ReadResult::Eof,
        }
    }
}

impl Shim {
    /// A shim serving `listener`, with `signals` already blocking SIGCHLD/SIGTERM/SIGINT.
    pub fn new(cfg: Config, listener: UnixListener, signals: Signals) -> io::Result<Self> {
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
            conns: BTreeMap::new(),
            containers: BTreeMap::new(),
            execs: BTreeMap::new(),
            helpers: BTreeMap::new(),
            helper_pids: Vec::new(),
            orphan_exits: Vec::new(),
            cgroups: None,
            next_id: 1,
            shutdown_requested: false,
            terminating: false,
            buf: vec![0u8; 64 * 1024],
        })
    }

    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Serve until shut down; then remove the state directory.
    pub fn run(mut self) {
        loop {
            if self.done() {
                break;
            }
            let (mut fds, sources) = self.poll_set();
            let timeout = self.poll_timeout();
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    warn!(target: "crius_shim", error = %e, "poll failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for (pfd, source) in fds.iter().zip(sources) {
                if pfd.revents != 0 {
                    self.dispatch(source, pfd.revents);
                }
            }
            self.check_timers();
        }
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
            let mut events = 0;
            if !conn.eof {
                events |= libc::POLLIN;
            }
            if !conn.outbuf.is_empty() {
                events |= libc::POLLOUT;
            }
            add(conn.stream.as_raw_fd(), events, Source::Conn(*token));
        }
        // Still served after a shutdown request: crius deletes the remaining containers.
        add(self.listener.as_raw_fd(), libc::POLLIN, Source::Listener);
        (fds, sources)
    }

    /// Milliseconds until the next timer (exec deadline or drain end), -1 for none.
    fn poll_timeout(&self) -> i32 {
        let now = Instant::now();
        let next = self
            .execs
            .values()
            .flat_map(|j| {
                let deadline = if j.timed_out || j.status.is_some() {
                    None
                } else {
                    j.deadline
                };
                [deadline, j.drain_until]
            })
            .chain(self.helpers.values().map(|h| h.deadline))
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

    // ----- connections -------------------------------------------------------------------

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let token = self.next();
                    self.conns.insert(
                        token,
                        Conn {
                            stream,
                            inbuf: Vec::new(),
                            outbuf: Vec::new(),
                            busy: false,
                            eof: false,
                        },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!(target: "crius_shim", error = %e, "accept on control socket");
                    return;
                }
            }
        }
    }

    fn on_conn(&mut self, token: Token, revents: i16) {
        let mut buf = std::mem::take(&mut self.buf);
        if let Some(conn) = self.conns.get_mut(&token) {
            if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                loop {
                    match conn.stream.read(&mut buf) {
                        Ok(0) => {
                            conn.eof = true;
                            break;
                        }
                        Ok(n) => {
                            conn.inbuf.extend_from_slice(&buf[..n]);
                            if conn.inbuf.len() > MAX_FRAME + 4 {
                                conn.eof = true;
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => {
                            conn.eof = true;
                            conn.outbuf.clear();
                            break;
                        }
                    }
                }
            }
            if revents & libc::POLLOUT != 0 {
                flush(conn);
            }
        }
        self.buf = buf;
        self.serve_conn(token);
    }

    /// Serve the complete requests buffered on `token`, one at a time.
    fn serve_conn(&mut self, token: Token) {
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            if conn.busy {
                break;
            }
            match decode_frame::<Request>(&conn.inbuf) {
                Ok(Some((request, used))) => {
                    conn.inbuf.drain(..used);
                    conn.busy = true;
                    if let Some(response) = self.handle(token, request) {
                        self.reply(token, response);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    conn.inbuf.clear();
                    conn.busy = true;
                    let response = Response::Err(err(
                        ErrorKind::InvalidArgument,
                        format!("malformed request: {e}"),
                    ));
                    self.reply(token, response);
                    if let Some(conn) = self.conns.get_mut(&token) {
                        conn.eof = true;
                    }
                    break;
                }
            }
        }
        if let Some(conn) = self.conns.get(&token) {
            // A peer that closed wants no more answers (a client that gave up on a `wait`, say):
            // drop the connection, and its place among a container's waiters. A parked
            // operation itself runs on; its answer goes nowhere.
            if conn.eof && (conn.busy || conn.outbuf.is_empty()) {
                self.conns.remove(&token);
                for c in self.containers.values_mut() {
                    c.waiters.retain(|t| *t != token);
                    c.detach(token);
                }
                self.abandon_execs(token);
            }
        }
    }

    fn reply(&mut self, token: Token, response: Response) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.busy = false;
        match encode_frame(&response) {
            Ok(frame) => conn.outbuf.extend_from_slice(&frame),
            Err(e) => {
                let fallback =
                    Response::Err(err(ErrorKind::Internal, format!("encode reply: {e}")));
                if let Ok(frame) = encode_frame(&fallback) {
                    conn.outbuf.extend_from_slice(&frame);
                }
            }
        }
        flush(conn);
    }

    /// Answer a parked request and go on with that connection's next one.
    fn complete(&mut self, token: Token, response: Response) {
        self.reply(token, response);
        self.serve_conn(token);
    }

    fn flush_before_exit(&mut self) {
        let until = Instant::now() + FLUSH_ON_EXIT;
        while Instant::now() < until {
            let mut pending = false;
            for conn in self.conns.values_mut() {
                flush(conn);
                pending |= !conn.outbuf.is_empty();
            }
            if !pending {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    // ----- requests ----------------------------------------------------------------------

    /// Serve one request; `None` when the answer comes later.
    fn handle(&mut self, token: Token, request: Request) -> Option<Response> {
        if request.v != PROTOCOL_VERSION {
            return Some(Response::Err(err(
                ErrorKind::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported, this shim speaks {PROTOCOL_VERSION}",
                    request.v
                ),
            )));
        }
        let result = match request.op {
            Op::Hello => Ok(Some(Reply::Hello {
                version: PROTOCOL_VERSION,
                pid: std::process::id() as i32,
                pod_id: self.cfg.pod_id.clone(),
            })),
            Op::CreateContainer(req) => self.create(token, req).map(|()| None),
            Op::Start { id } => self.start(token, &id),
            Op::Kill { id, signal, all } => self.kill(token, &id, signal, all),
            Op::Delete { id, force } => self.delete(token, &id, force).map(|()| None),
            Op::State { id } => self
                .containers
                .get(&id)
                .map(|c| Some(Reply::Container(c.info())))
                .ok_or_else(|| not_found(&id)),
            Op::List => Ok(Some(Reply::Containers {
                containers: self.containers.values().map(Container::info).collect(),
            })),
            Op::ExecSync(req) => self.exec(token, req).map(|()| None),
            Op::ReopenLog { id } => self.reopen_log(&id).map(Some),
            Op::Wait { id } => match self.containers.get_mut(&id) {
                None => Err(not_found(&id)),
                Some(c) => match &c.exit {
                    Some(exit) => Ok(Some(Reply::Exited(exit.clone()))),
                    None => {
                        c.waiters.push(token);
                        Ok(None)
                    }
                },
            },
            Op::Shutdown => {
                info!(target: "crius_shim", remaining = self.containers.len(), "shutdown requested");
                self.shutdown_requested = true;
                Ok(Some(Reply::Done))
            }
            Op::ExecStream(req) => self.exec_stream(token, req).map(|()| None),
            Op::Attach(req) => self.attach(token, req).map(|()| None),
        };
        match result {
            Ok(Some(reply)) => Some(Response::Ok(reply)),
            Ok(None) => None,
            Err(e) => Some(Response::Err(e)),
        }
    }

    fn refuse_if_stopping(&self) -> Result<(), ShimError> {
        if self.shutdown_requested || self.terminating {
            return Err(err(
                ErrorKind::FailedPrecondition,
                format!("shim of pod {} is shutting down", self.cfg.pod_id),
            ));
        }
        Ok(())
    }

    fn container_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("containers").join(id)
    }

    fn create(&mut self, token: Token, req: CreateContainer) -> Result<(), ShimError> {
        self.refuse_if_stopping()?;
        let id = req.id.clone();
        if !valid_id(&id) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("invalid container id {id:?}: use 1-128 of [A-Za-z0-9_.-]"),
            ));
        }
        if self.containers.contains_key(&id) || self.runc_root.join(&id).exists() {
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
        let mut args = vec!["create".to_owned(), "--bundle".to_owned()];
        args.push(req.bundle.to_string_lossy().into_owned());
        if req.tty {
            args.push("--console-dir".to_owned());
            args.push(dir.to_string_lossy().into_owned());
        }
        let stdio = [0, 1, 2].map(|i| child[i].as_ref().map(|f| f.as_raw_fd()));
        let purpose = HelperPurpose::Create {
            id: id.clone(),
            token,
        };
        if let Err(e) = self.spawn_helper(&id, args, stdio, purpose) {
            let _ = fs::remove_dir_all(&dir);
            return Err(internal("spawn helper", e));
        }
        // The container's ends now live in the helper.
        drop(child);
        info!(target: "crius_shim", container = %id, "creating container");

        self.containers.insert(
            id.clone(),
            Container {
                id: id.clone(),
                bundle: req.bundle,
                log_path: req.log_path,
                tty: req.tty,
                stdin_requested: req.stdin,
                stdin_once: req.stdin_once,
                status: ContainerStatus::Creating,
                pid: None,
                stdin: stdin_writer,
                outputs,
                log,
                oom: None,
                created_at: 0,
                started_at: None,
                exit: None,
                waiters: Vec::new(),
                delete_waiters: Vec::new(),
                delete_on_exit: false,
                starting: None,
                deleting: false,
                helpers: 1,
                delete_queued: false,
                libct: None,
                attaches: Vec::new(),
            },
        );
        Ok(())
    }

    /// Run `crius-shim-helper <args[0]> --root <runc root> --id <id> <args[1..]>`; its report
    /// is handled according to `purpose`.
    fn spawn_helper(
        &mut self,
        id: &str,
        mut args: Vec<String>,
        stdio: [Option<RawFd>; 3],
        purpose: HelperPurpose,
    ) -> io::Result<()> {
        let rest = args.split_off(1.min(args.len()));
        args.push("--root".to_owned());
        args.push(self.runc_root.to_string_lossy().into_owned());
        args.push("--id".to_owned());
        args.push(id.to_owned());
        args.extend(rest);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let spawned = helper::spawn(&self.cfg.helper, &argv, stdio)?;
        self.helper_pids.push(spawned.pid);
        if let Some(c) = self.containers.get_mut(id) {
            c.helpers += 1;
        }
        let key = self.next();
        self.helpers.insert(
            key,
            PendingHelper {
                pid: spawned.pid,
                chan: spawned.chan,
                container: id.to_owned(),
                purpose,
                deadline: Some(Instant::now() + HELPER_TIMEOUT),
            },
        );
        Ok(())
    }

    /// Let a created container run: in the plain case the shim sends the init its start
    /// message itself (see [`libct_state::start`]); hooks, or anything unexpected in
    /// libcontainer's files, go to libcontainer in a helper.
    fn start(&mut self, token: Token, id: &str) -> Result<Option<Reply>, ShimError> {
        self.refuse_if_stopping()?;
        let c = self.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        if c.status != ContainerStatus::Created
            || c.exit.is_some()
            || c.starting.is_some()
            || c.deleting
        {
            return Err(err(
                ErrorKind::FailedPrecondition,
                format!("container {id} is {:?}, not created", c.status),
            ));
        }
        let began = now_unix_nanos();
        let plain = c.libct.as_ref().is_some_and(|r| !r.poststart_hooks);
        if let (true, true, Some(pid)) = (plain, c.alive(), c.pid) {
            match libct_state::start(&self.runc_root.join(id), pid) {
                Ok(()) => {
                    c.status = ContainerStatus::Running;
                    c.started_at = Some(began);
                    info!(target: "crius_shim", container = %id, "started");
                    return Ok(Some(Reply::Started { pid }));
                }
                Err(e) => {
                    info!(target: "crius_shim", container = %id, reason = %crate::daemon::error_chain(&e), "start left to a helper");
                }
            }
        }
        c.starting = Some(began);
        let purpose = HelperPurpose::Start {
            id: id.to_owned(),
            token,
        };
        if let Err(e) = self.spawn_helper(id, vec!["start".to_owned()], [None; 3], purpose) {
            if let Some(c) = self.containers.get_mut(id) {
                c.starting = None;
            }
            return Err(err(
                ErrorKind::Internal,
                format!("start container {id}: spawn helper: {e}"),
            ));
        }
        Ok(None)
    }

    fn started(&mut self, id: &str, token: Token, result: Result<i32, String>) {
        let Some(c) = self.containers.get_mut(id) else {
            let response = Response::Err(not_found(id));
            self.complete(token, response);
            return;
        };
        let began = c.starting.take().unwrap_or_else(now_unix_nanos);
        let response = match result {
            Ok(_) => {
                // An init that died meanwhile is already recorded as stopped.
                if c.status == ContainerStatus::Created {
                    c.status = ContainerStatus::Running;
                }
                c.started_at = Some(began);
                info!(target: "crius_shim", container = %id, "started");
                Response::Ok(Reply::Started {
                    pid: c.pid.unwrap_or(0),
                })
            }
            Err(message) => Response::Err(err(
                ErrorKind::Internal,
                format!("start container {id}: {message}"),
            )),
        };
        self.complete(token, response);
    }

    fn kill(
        &mut self,
        token: Token,
        id: &str,
        signal: i32,
        all: bool,
    ) -> Result<Option<Reply>, ShimError> {
        if !(0..=64).contains(&signal) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("invalid signal {signal}"),
            ));
        }
        let c = self.containers.get(id).ok_or_else(|| not_found(id))?;
        if c.status == ContainerStatus::Creating {
            return Err(err(
                ErrorKind::FailedPrecondition,
                format!("container {id} is being created"),
            ));
        }
        if all {
            match self.kill_all_in_process(id, signal) {
                Ok(()) => return Ok(Some(Reply::Done)),
                Err(reason) => {
                    info!(target: "crius_shim", container = %id, %reason, "kill of all processes left to a helper");
                }
            }
            let args = vec!["kill".to_owned(), "--signal".to_owned(), signal.to_string()];
            self.spawn_helper(id, args, [None; 3], HelperPurpose::Kill { token })
                .map_err(|e| {
                    err(
                        ErrorKind::Internal,
                        format!("kill container {id}: spawn helper: {e}"),
                    )
                })?;
            return Ok(None);
        } else if let (true, Some(pid)) = (c.alive(), c.pid) {
            // The init is not reaped yet, so the pid cannot have been reused.
            // SAFETY: kill(2) with a pid and a validated signal number.
            if unsafe { libc::kill(pid, signal) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(err(
                        ErrorKind::Internal,
                        format!("kill container {id} (pid {pid}): {e}"),
                    ));
                }
            }
        }
        Ok(Some(Reply::Done))
    }

    fn delete(&mut self, token: Token, id: &str, force: bool) -> Result<(), ShimError> {
        let c = self.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        if c.deleting {
            c.delete_waiters.push(token);
            return Ok(());
        }
        match c.status {
            ContainerStatus::Creating => {
                return Err(err(
                    ErrorKind::FailedPrecondition,
                    format!("container {id} is being created"),
                ))
            }
            ContainerStatus::Running if c.alive() && !force => {
                return Err(err(
                    ErrorKind::FailedPrecondition,
                    format!("container {id} is running: stop it first or force the delete"),
                ))
            }
            _ => {}
        }
        c.delete_waiters.push(token);
        if c.alive() {
            // A created container's init waits on its start socket, a forced one is killed;
            // both are deleted once the init is reaped.
            self.kill_for_delete(id);
        } else {
            self.begin_delete(id);
        }
        Ok(())
    }

    /// Signal every process of the container's cgroup, frozen meanwhile (see
    /// [`Hierarchies::kill_all`]); an error says why a helper must do it instead.
    fn kill_all_in_process(&mut self, id: &str, signal: i32) -> Result<(), String> {
        let cgroup_path = self
            .containers
            .get(id)
            .and_then(|c| c.libct.as_ref())
            .map(|r| r.cgroup_path.clone())
            .ok_or("libcontainer's record of the container was not read")?;
        let hierarchies = self.hierarchies()?;
        let sent = hierarchies
            .kill_all(&cgroup_path, signal)
            .map_err(|e| crate::daemon::error_chain(&e))?;
        tracing::debug!(target: "crius_shim", container = %id, signal, processes = sent, "signalled the cgroup");
        Ok(())
    }

    /// Delete an exited container without a helper when libcontainer's delete would do no
    /// more than this: remove the cgroup (leaf first, in every hierarchy) and the state
    /// directory. An error says why a helper must do it (hooks, Intel RDT, processes still in
    /// the cgroup, ...); nothing is removed then.
    fn delete_in_process(&mut self, id: &str) -> Result<(), String> {
        let c = self.containers.get(id).ok_or("unknown container")?;
        if c.exit.is_none() {
            return Err("the init has not been reaped".to_owned());
        }
        let recorded = c
            .libct
            .clone()
            .ok_or("libcontainer's record of the container was not read")?;
        if recorded.poststop_hooks {
            return Err("poststop hooks".to_owned());
        }
        let dir = self.runc_root.join(id);
        if !dir.exists() {
            return Ok(());
        }
        libct_state::check_plain_delete(&dir).map_err(|e| crate::daemon::error_chain(&e))?;
        self.hierarchies()?
            .remove(&recorded.cgroup_path)
            .map_err(|e| crate::daemon::error_chain(&e))?;
        libct_state::remove(&dir).map_err(|e| crate::daemon::error_chain(&e))
    }

    /// The host's cgroup hierarchies (looked up once).
    fn hierarchies(&mut self) -> Result<&Hierarchies, String> {
        if self.cgroups.is_none() {
            let found = Hierarchies::detect().map_err(|e| crate::daemon::error_chain(&e))?;
            self.cgroups = Some(found);
        }
        self.cgroups
            .as_ref()
            .ok_or_else(|| "cgroup hierarchies unknown".to_owned())
    }

    /// SIGKILL the init. In its own PID namespace that ends every process of the container;
    /// whatever else is left in its cgroup the delete kills (libcontainer empties the cgroup
    /// before removing it).
    fn kill_for_delete(&mut self, id: &str) {
        let Some(c) = self.containers.get(id) else {
            return;
        };
        if let (true, Some(pid)) = (c.alive(), c.pid) {
            // SAFETY: kill(2) of our unreaped child with SIGKILL.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// Remove the container's cgroup and libcontainer state, in process when that is safe
    /// ([`Self::delete_in_process`]), else through a helper; the record goes when it is done.
    fn begin_delete(&mut self, id: &str) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        if c.deleting {
            return;
        }
        if c.helpers > 0 {
            c.delete_queued = true;
            return;
        }
        c.delete_queued = false;
        match self.delete_in_process(id) {
            Ok(()) => {
                self.deleted(id, Ok(0));
                return;
            }
            Err(reason) => {
                info!(target: "crius_shim", container = %id, %reason, "delete left to a helper");
            }
        }
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        c.deleting = true;
        let purpose = HelperPurpose::Delete { id: id.to_owned() };
        if let Err(e) = self.spawn_helper(id, vec!["delete".to_owned()], [None; 3], purpose) {
            self.deleted(id, Err(format!("spawn helper: {e}")));
        }
    }

    fn deleted(&mut self, id: &str, result: Result<i32, String>) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        c.deleting = false;
        if let Err(message) = result {
            warn!(target: "crius_shim", container = %id, error = %message, "delete failed");
            let waiters = std::mem::take(&mut c.delete_waiters);
            if self.terminating {
                // Nobody will retry: forget the container anyway.
                self.containers.remove(id);
            }
            for token in waiters {
                let response = Response::Err(err(
                    ErrorKind::Internal,
                    format!("delete container {id}: {message}"),
                ));
                self.complete(token, response);
            }
            return;
        }
        let Some(c) = self.containers.remove(id) else {
            return;
        };
        for token in c.waiters {
            let response = Response::Err(err(
                ErrorKind::NotFound,
                format!("container {id} was deleted"),
            ));
            self.complete(token, response);
        }
        // On SIGTERM the exit records stay for crius to read; a requested delete removes them.
        if !self.terminating || self.shutdown_requested {
            let _ = fs::remove_dir_all(self.container_dir(id));
        }
        info!(target: "crius_shim", container = %id, "deleted");
        for token in c.delete_waiters {
            self.complete(token, Response::Ok(Reply::Done));
        }
    }

    fn reopen_log(&mut self, id: &str) -> Result<Reply, ShimError> {
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

    fn exec(&mut self, token: Token, req: ExecSync) -> Result<(), ShimError> {
        let id = req.id.clone();
        // Output is captured through pipes; a terminal would need a console socket.
        let process = self.exec_process(&id, req.process, false)?;
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            err(
                ErrorKind::Internal,
                format!("exec in container {id}: {what}: {e}"),
            )
        };
        let (out_r, out_w) = pipe().map_err(|e| internal("stdout pipe", &e))?;
        let (err_r, err_w) = pipe().map_err(|e| internal("stderr pipe", &e))?;
        set_nonblocking(out_r.as_raw_fd()).map_err(|e| internal("pipe", &e))?;
        set_nonblocking(err_r.as_raw_fd()).map_err(|e| internal("pipe", &e))?;
        let stdio = [None, Some(out_w), Some(err_w)];
        let (exec_id, process_file) = self.spawn_exec(&id, &process, stdio)?;
        let limit = match req.output_limit {
            0 => DEFAULT_EXEC_OUTPUT_LIMIT,
            n => n,
        };
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let deadline =
            (req.timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(req.timeout_ms));
        self.execs.insert(
            exec_id,
            ExecJob {
                token,
                container: id,
                pid: None,
                out: [Capture::new(out_r, limit), Capture::new(err_r, limit)],
                status: None,
                deadline,
                timed_out: false,
                drain_until: None,
                process_file,
                streaming: false,
                stream: None,
            },
        );
        Ok(())
    }

    /// The OCI process of an exec in container `id`, which must be running, with its
    /// `terminal` set to `terminal`.
    fn exec_process(
        &self,
        id: &str,
        mut process: serde_json::Value,
        terminal: bool,
    ) -> Result<serde_json::Value, ShimError> {
        self.refuse_if_stopping()?;
        let c = self.containers.get(id).ok_or_else(|| not_found(id))?;
        if c.status != ContainerStatus::Running || !c.alive() {
            return Err(err(
                ErrorKind::FailedPrecondition,
                format!("container {id} is not running"),
            ));
        }
        let Some(obj) = process.as_object_mut() else {
            return Err(err(
                ErrorKind::InvalidArgument,
                "exec process must be a JSON object (an OCI process)",
            ));
        };
        obj.insert("terminal".into(), serde_json::Value::Bool(terminal));
        Ok(process)
    }

    /// Start the helper that runs `process` in container `id` with `stdio` (closed here once
    /// the helper has them): the exec's id and process file, which a failure removes.
    fn spawn_exec(
        &mut self,
        id: &str,
        process: &serde_json::Value,
        stdio: [Option<OwnedFd>; 3],
    ) -> Result<(u64, PathBuf), ShimError> {
        let exec_id = self.next();
        let process_file = self.write_process_file(exec_id, process, id)?;
        let args = vec![
            "exec".to_owned(),
            "--process".to_owned(),
            process_file.to_string_lossy().into_owned(),
        ];
        let raw = [0, 1, 2].map(|i| stdio[i].as_ref().map(|f| f.as_raw_fd()));
        let purpose = HelperPurpose::Exec { exec: exec_id };
        if let Err(e) = self.spawn_helper(id, args, raw, purpose) {
            let _ = fs::remove_file(&process_file);
            return Err(err(
                ErrorKind::Internal,
                format!("exec in container {id}: spawn helper: {e}"),
            ));
        }
        Ok((exec_id, process_file))
    }

    /// Write an exec's OCI process where its helper reads it: `exec/<n>.json`.
    fn write_process_file(
        &self,
        exec_id: u64,
        process: &serde_json::Value,
        id: &str,
    ) -> Result<PathBuf, ShimError> {
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            err(
                ErrorKind::Internal,
                format!("exec in container {id}: {what}: {e}"),
            )
        };
        let process_file = self
            .cfg
            .state_dir
            .join("exec")
            .join(format!("{exec_id}.json"));
        let bytes = serde_json::to_vec(process).map_err(|e| internal("encode process", &e))?;
        let written = match fs::write(&process_file, &bytes) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(self.cfg.state_dir.join("exec"))
                    .and_then(|()| fs::write(&process_file, &bytes))
            }
            other => other,
        };
        written.map_err(|e| internal("write process file", &e))?;
        Ok(process_file)
    }

    /// `exec_stream`: start a process whose stdio crius relays; see the protocol's
    /// "Streaming requests".
    fn exec_stream(&mut self, token: Token, req: ExecStream) -> Result<(), ShimError> {
        let id = req.id.clone();
        let process = self.exec_process(&id, req.process, req.tty)?;
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            err(
                ErrorKind::Internal,
                format!("exec in container {id}: {what}: {e}"),
            )
        };
        // The process's ends (stdin, stdout, stderr) and crius's.
        let mut child: [Option<OwnedFd>; 3] = [None, None, None];
        let mut handoff = Vec::new();
        // With a tty the helper opens the pty in the container's devpts and reports its master.
        if !req.tty {
            if req.stdin {
                let (r, w) = pipe().map_err(|e| internal("stdin pipe", &e))?;
                child[0] = Some(r);
                handoff.push((StreamFd::Stdin, w));
            }
            for (i, (wanted, kind)) in [
                (req.stdout, StreamFd::Stdout),
                (req.stderr, StreamFd::Stderr),
            ]
            .into_iter()
            .enumerate()
            {
                if wanted {
                    let (r, w) = pipe().map_err(|e| internal("output pipe", &e))?;
                    child[i + 1] = Some(w);
                    handoff.push((kind, r));
                } else {
                    let null = fs::OpenOptions::new()
                        .write(true)
                        .open("/dev/null")
                        .map_err(|e| internal("open /dev/null", &e))?;
                    child[i + 1] = Some(null.into());
                }
            }
        }
        let (exec_id, process_file) = self.spawn_exec(&id, &process, child)?;
        let empty = || Capture {
            fd: None,
            data: Vec::new(),
            limit: 0,
            truncated: false,
        };
        self.execs.insert(
            exec_id,
            ExecJob {
                token,
                container: id,
                pid: None,
                out: [empty(), empty()],
                status: None,
                deadline: None,
                timed_out: false,
                drain_until: None,
                process_file,
                streaming: true,
                stream: Some(StreamHandoff {
                    stdin: req.stdin,
                    fds: handoff,
                }),
            },
        );
        Ok(())
    }

    /// `attach`: hand crius the container's stdin and pipes that receive a copy of its
    /// output from now on; see the protocol's "Streaming requests".
    fn attach(&mut self, token: Token, req: Attach) -> Result<(), ShimError> {
        let id = req.id.clone();
        let c = self.containers.get_mut(&id).ok_or_else(|| not_found(&id))?;
        let pid = match c.pid {
            Some(pid) if c.status == ContainerStatus::Running && c.alive() => pid,
            _ => {
                return Err(err(
                    ErrorKind::FailedPrecondition,
                    format!("container {id} is not running"),
                ))
            }
        };
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            err(
                ErrorKind::Internal,
                format!("attach to container {id}: {what}: {e}"),
            )
        };
        let mut handoff = Vec::new();
        let mut sink = AttachSink {
            token,
            out: [None, None],
            stdin: false,
        };
        if req.stdin {
            if let Some(stdin) = &c.stdin {
                let dup = stdin.try_clone().map_err(|e| internal("dup stdin", &e))?;
                handoff.push((StreamFd::Stdin, dup));
                sink.stdin = true;
            }
        }
        // A tty container has one output, its pty master, logged as stdout.
        let wanted = [req.stdout, req.stderr && !c.tty];
        for (i, kind) in [StreamFd::Stdout, StreamFd::Stderr].into_iter().enumerate() {
            if wanted[i] && c.outputs[i].is_some() {
                let (r, w) = pipe().map_err(|e| internal("output pipe", &e))?;
                set_nonblocking(w.as_raw_fd()).map_err(|e| internal("output pipe", &e))?;
                // Room for a burst while crius relays it: what does not fit is lost to this
                // session (never to the log). The default 64 KiB is little; failing to grow
                // it (pipe-max-size) only keeps the default.
                // SAFETY: F_SETPIPE_SZ on a pipe we own only changes its capacity.
                unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, ATTACH_PIPE_SIZE) };
                sink.out[i] = Some(w);
                handoff.push((kind, r));
            }
        }
        if c.tty {
            if let Some(master) = &c.outputs[0] {
                let dup = master.try_clone().map_err(|e| internal("dup pty", &e))?;
                handoff.push((StreamFd::Pty, dup));
            }
        }
        c.attaches.push(sink);
        let streams = Streams {
            pid,
            tty: c.tty,
            fds: handoff.iter().map(|(kind, _)| *kind).collect(),
        };
        let fds: Vec<RawFd> = handoff.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
        info!(target: "crius_shim", container = %id, stdin = sink_stdin(c, token), "attached");
        self.send_with_fds(token, &Response::Ok(Reply::Streams(streams)), &fds);
        Ok(())
    }

    /// Send a response with descriptors on its first byte, leaving the connection's request
    /// in progress (a streaming request answers again later). A connection that cannot take
    /// the frame at once is given up: crius sees it close.
    fn send_with_fds(&mut self, token: Token, response: &Response, fds: &[RawFd]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let frame = match encode_frame(response) {
            Ok(frame) => frame,
            Err(e) => {
                warn!(target: "crius_shim", error = %e, "encode streams answer");
                conn.eof = true;
                return;
            }
        };
        if !conn.outbuf.is_empty() {
            conn.eof = true;
            return;
        }
        let iov = [io::IoSlice::new(&frame)];
        let cmsgs = [nix::sys::socket::ControlMessage::ScmRights(fds)];
        let cmsgs: &[nix::sys::socket::ControlMessage<'_>] =
            if fds.is_empty() { &[] } else { &cmsgs };
        match nix::sys::socket::sendmsg::<()>(
            conn.stream.as_raw_fd(),
            &iov,
            cmsgs,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => conn.outbuf.extend_from_slice(&frame[n..]),
            Err(e) => {
                warn!(target: "crius_shim", error = %e, "send streams answer");
                conn.eof = true;
            }
        }
        flush(conn);
    }

    // ----- helpers, exits, output --------------------------------------------------------

    /// A helper's report socket is readable, or (`exited`) the helper was reaped: a helper that
    /// exits without a report failed (its children may hold the socket open, so its end is
    /// not seen as EOF).
    fn on_helper(&mut self, key: u64, exit_status: Option<i32>) {
        let Some(helper) = self.helpers.get(&key) else {
            return;
        };
        let mut crashed = false;
        let result = match helper::receive(&helper.chan) {
            Ok(None) if exit_status.is_none() => return,
            Ok(None) => {
                crashed = true;
                let (code, signal) = decode_status(exit_status.unwrap_or(0));
                Err(format!(
                    "helper {} exited without a report (status {code}, signal {signal:?})",
                    helper.pid
                ))
            }
            Ok(Some((outcome, fd))) => match outcome {
                Outcome::Ok { pid } => Ok((pid, fd)),
                Outcome::Err { message } => Err(message),
            },
            Err(e) => {
                crashed = true;
                Err(format!("helper {}: {e}", helper.pid))
            }
        };
        let Some(helper) = self.helpers.remove(&key) else {
            return;
        };
        let mut queued_delete = false;
        if let Some(c) = self.containers.get_mut(&helper.container) {
            c.helpers = c.helpers.saturating_sub(1);
            queued_delete = c.delete_queued && c.helpers == 0;
        }
        if queued_delete {
            self.begin_delete(&helper.container);
        }
        if let HelperPurpose::Create { id, token } = &helper.purpose {
            self.created(id, *token, result, crashed);
            return;
        }
        if let HelperPurpose::Exec { exec } = &helper.purpose {
            self.exec_started(*exec, result);
            return;
        }
        let pid_only = result.map(|(pid, _)| pid);
        match helper.purpose {
            HelperPurpose::Create { .. } => {}
            HelperPurpose::Exec { .. } => {}
            HelperPurpose::Start { id, token } => self.started(&id, token, pid_only),
            HelperPurpose::Kill { token } => {
                let response = match pid_only {
                    Ok(_) => Response::Ok(Reply::Done),
                    Err(message) => Response::Err(err(ErrorKind::Internal, message)),
                };
                self.complete(token, response);
            }
            HelperPurpose::Delete { id } => self.deleted(&id, pid_only),
            HelperPurpose::Background => {
                if let Err(message) = pid_only {
                    warn!(target: "crius_shim", error = %message, "background helper failed");
                }
            }
        }
    }

    fn created(
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
                    let args = vec!["delete".to_owned()];
                    let _ = self.spawn_helper(id, args, [None; 3], HelperPurpose::Background);
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
        // helper; without it those go through helpers, as before.
        let recorded = match libct_state::read_recorded(&self.runc_root.join(id)) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!(target: "crius_shim", container = %id, error = %crate::daemon::error_chain(&e), "libcontainer's record unreadable");
                None
            }
        };
        if let Some(c) = self.containers.get_mut(id) {
            c.pid = Some(pid);
            c.libct = recorded;
            c.status = ContainerStatus::Created;
            c.created_at = now_unix_nanos();
            c.oom = OomWatch::for_pid(pid);
            if let Some(master) = master {
                if set_nonblocking(master.as_raw_fd()).is_ok() {
                    if c.stdin_requested {
                        c.stdin = master.try_clone().ok();
                    }
                    c.outputs[Stream::Stdout as usize] = Some(master);
                }
            }
        }
        info!(target: "crius_shim", container = %id, pid, "created");
        self.complete(token, Response::Ok(Reply::Created { pid }));
        if self.containers.get(id).is_some_and(|c| c.delete_on_exit) {
            self.kill_for_delete(id);
        }
        if let Some(status) = self.take_orphan_exit(pid) {
            self.container_exited(id, status);
        }
    }

    fn exec_started(&mut self, exec: u64, result: Result<(i32, Option<OwnedFd>), String>) {
        let Some(job) = self.execs.get_mut(&exec) else {
            return;
        };
        match result {
            Ok((pid, master)) => {
                job.pid = Some(pid);
                if let Some(mut handoff) = job.stream.take() {
                    // The helper reports a master only for a process on a terminal.
                    let tty = master.is_some();
                    if let Some(master) = master {
                        // A terminal: the master is the process's input and output.
                        let wanted = [(handoff.stdin, StreamFd::Stdin), (true, StreamFd::Stdout)];
                        for (_, kind) in wanted.into_iter().filter(|(w, _)| *w) {
                            if let Ok(dup) = master.try_clone() {
                                handoff.fds.push((kind, dup));
                            }
                        }
                        handoff.fds.push((StreamFd::Pty, master));
                    }
                    let token = job.token;
                    let streams = Streams {
                        pid,
                        tty,
                        fds: handoff.fds.iter().map(|(kind, _)| *kind).collect(),
                    };
                    let fds: Vec<RawFd> =
                        handoff.fds.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
                    self.send_with_fds(token, &Response::Ok(Reply::Streams(streams)), &fds);
                    // Our copies close here: the process and crius hold the only ends.
                    drop(handoff);
                }
                let Some(job) = self.execs.get_mut(&exec) else {
                    return;
                };
                if job.timed_out {
                    // SAFETY: kill(2) of our unreaped child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                if let Some(status) = self.take_orphan_exit(pid) {
                    self.exec_exited(exec, status);
                }
            }
            Err(message) => {
                let Some(job) = self.execs.remove(&exec) else {
                    return;
                };
                let _ = fs::remove_file(&job.process_file);
                let response = Response::Err(err(
                    ErrorKind::Internal,
                    format!("exec in container {}: {message}", job.container),
                ));
                self.complete(job.token, response);
            }
        }
    }

    fn take_orphan_exit(&mut self, pid: i32) -> Option<i32> {
        let i = self.orphan_exits.iter().position(|(p, _, _)| *p == pid)?;
        Some(self.orphan_exits.swap_remove(i).1)
    }

    /// Reap every exited child.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes only into `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid <= 0 {
                return;
            }
            self.on_exit(pid, status);
        }
    }

    fn on_exit(&mut self, pid: i32, status: i32) {
        if let Some(i) = self.helper_pids.iter().position(|p| *p == pid) {
            self.helper_pids.swap_remove(i);
            // Usually its report was read already; if not, it is read now or the helper failed.
            let pending = self
                .helpers
                .iter()
                .find(|(_, h)| h.pid == pid)
                .map(|(k, _)| *k);
            if let Some(key) = pending {
                self.on_helper(key, Some(status));
            }
            return;
        }
        let container = self
            .containers
            .values()
            .find(|c| c.pid == Some(pid) && c.exit.is_none())
            .map(|c| c.id.clone());
        if let Some(id) = container {
            self.container_exited(&id, status);
            return;
        }
        let exec = self
            .execs
            .iter()
            .find(|(_, j)| j.pid == Some(pid) && j.status.is_none())
            .map(|(k, _)| *k);
        if let Some(exec) = exec {
            self.exec_exited(exec, status);
            return;
        }
        let now = Instant::now();
        self.orphan_exits
            .retain(|(_, _, at)| now.duration_since(*at) < ORPHAN_EXIT_TTL);
        if self.orphan_exits.len() < 1024 {
            self.orphan_exits.push((pid, status, now));
        }
    }

    fn container_exited(&mut self, id: &str, status: i32) {
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
            pid: c.pid.unwrap_or(0),
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
        c.exit = Some(exit.clone());
        c.status = ContainerStatus::Stopped;
        // Closing the sessions' pipes ends their output; then they hear of the exit.
        let sessions: Vec<Token> = c.attaches.drain(..).map(|a| a.token).collect();
        for token in sessions {
            let response = Response::Ok(Reply::ProcessExited { exit_code, signal });
            self.complete(token, response);
        }
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        let waiters = std::mem::take(&mut c.waiters);
        let delete_now = c.delete_on_exit || !c.delete_waiters.is_empty();
        for token in waiters {
            self.complete(token, Response::Ok(Reply::Exited(exit.clone())));
        }
        if delete_now {
            self.begin_delete(id);
        }
    }

    /// Read whatever is buffered in a container's pipes, without waiting for more.
    fn drain_outputs(&mut self, id: &str) {
        for i in 0..2 {
            for _ in 0..1024 {
                if !self.on_output(id, i) {
                    break;
                }
            }
        }
    }

    /// One read from a container's output; true if data was read.
    fn on_output(&mut self, id: &str, i: usize) -> bool {
        let Some(c) = self.containers.get_mut(id) else {
            return false;
        };
        let Some(fd) = &c.outputs[i] else {
            return false;
        };
        let stream = if i == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        match read_fd(fd.as_raw_fd(), &mut self.buf) {
            ReadResult::Data(n) => {
                if let Some(log) = &mut c.log {
                    if let Err(e) = log.write(stream, &self.buf[..n], now_unix_nanos()) {
                        warn!(target: "crius_shim", container = %id, error = %e, "write log");
                    }
                }
                if !c.attaches.is_empty() {
                    c.fan_out(i, &self.buf[..n]);
                }
                true
            }
            ReadResult::WouldBlock => false,
            ReadResult::Eof => {
                c.outputs[i] = None;
                if let Some(log) = &mut c.log {
                    let _ = log.finish(stream, now_unix_nanos());
                }
                false
            }
        }
    }

    fn on_exec_output(&mut self, exec: u64, i: usize) {
        if let Some(job) = self.execs.get_mut(&exec) {
            read_capture(&mut job.out[i], &mut self.buf, 1);
        }
        self.maybe_finish_exec(exec);
    }

    fn exec_exited(&mut self, exec: u64, status: i32) {
        let Some(job) = self.execs.get_mut(&exec) else {
            return;
        };
        job.status = Some(status);
        for cap in &mut job.out {
            read_capture(cap, &mut self.buf, usize::MAX);
        }
        if job.out.iter().any(|c| c.fd.is_some()) {
            // A background child still holds the pipes: give it a moment, not forever.
            job.drain_until = Some(Instant::now() + EXEC_DRAIN_GRACE);
        }
        self.maybe_finish_exec(exec);
    }

    fn maybe_finish_exec(&mut self, exec: u64) {
        let Some(job) = self.execs.get(&exec) else {
            return;
        };
        let Some(status) = job.status else {
            return;
        };
        let drained = job.out.iter().all(|c| c.fd.is_none());
        let grace_over = job.drain_until.is_some_and(|t| Instant::now() >= t);
        if !drained && !grace_over {
            return;
        }
        let Some(mut job) = self.execs.remove(&exec) else {
            return;
        };
        let _ = fs::remove_file(&job.process_file);
        let (exit_code, signal) = decode_status(status);
        if job.streaming {
            let response = Response::Ok(Reply::ProcessExited { exit_code, signal });
            self.complete(job.token, response);
            return;
        }
        let [out, errs] = &mut job.out;
        let outcome = ExecOutcome {
            exit_code,
            signal,
            timed_out: job.timed_out,
            stdout: std::mem::take(&mut out.data),
            stderr: std::mem::take(&mut errs.data),
            stdout_truncated: out.truncated,
            stderr_truncated: errs.truncated,
        };
        self.complete(job.token, Response::Ok(Reply::Exec(outcome)));
    }

    /// Kills the processes of the exec_sync calls whose requester went away (its client
    /// cancelled or its deadline passed): nobody will read their output. Streaming execs belong
    /// to crius's stream once handed over and are left alone.
    fn abandon_execs(&mut self, token: Token) {
        for job in self.execs.values_mut() {
            if job.token != token || job.streaming || job.timed_out || job.status.is_some() {
                continue;
            }
            // Marked like a timeout: a pid not known yet is killed when the helper reports it.
            job.timed_out = true;
            if let Some(pid) = job.pid {
                // SAFETY: kill(2) of our unreaped child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }

    fn check_timers(&mut self) {
        let now = Instant::now();
        let mut finish = Vec::new();
        for (id, job) in &mut self.execs {
            if let Some(deadline) = job.deadline {
                if !job.timed_out && job.status.is_none() && now >= deadline {
                    job.timed_out = true;
                    if let Some(pid) = job.pid {
                        // SAFETY: kill(2) of our unreaped child.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            if job.drain_until.is_some_and(|t| now >= t) {
                finish.push(*id);
            }
        }
        for id in finish {
            self.maybe_finish_exec(id);
        }
        for c in self.containers.values_mut() {
            if let Some(w) = &mut c.oom {
                w.on_timer(now);
            }
        }
        for h in self.helpers.values_mut() {
            if h.deadline.is_some_and(|t| now >= t) {
                warn!(target: "crius_shim", pid = h.pid, container = %h.container, "helper timed out; killing it");
                h.deadline = None;
                // SAFETY: kill(2) of our unreaped child; its report socket then closes.
                unsafe { libc::kill(h.pid, libc::SIGKILL) };
            }
        }
    }

    /// SIGTERM/SIGINT: kill every container, record the exits, delete them, then exit.
    fn terminate(&mut self) {
        if self.terminating {
            return;
        }
        info!(target: "crius_shim", "terminating: killing all containers");
        self.terminating = true;
        let ids: Vec<String> = self.containers.keys().cloned().collect();
        for id in ids {
            let Some(c) = self.containers.get_mut(&id) else {
                continue;
            };
            if c.alive() {
                c.delete_on_exit = true;
                self.kill_for_delete(&id);
            } else if c.status == ContainerStatus::Creating {
                c.delete_on_exit = true;
            } else if !c.deleting {
                self.begin_delete(&id);
            }
        }
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

/// Read from an exec's pipe: up to `rounds` reads, until it would block or ends.
fn read_capture(cap: &mut Capture, buf: &mut [u8], rounds: usize) {
    for _ in 0..rounds {
        let Some(fd) = &cap.fd else {
            return;
        };
        match read_fd(fd.as_raw_fd(), buf) {
            ReadResult::Data(n) => cap.take(&buf[..n]),
            ReadResult::WouldBlock => return,
            ReadResult::Eof => {
                cap.fd = None;
                return;
            }
        }
    }
}

fn flush(conn: &mut Conn) {
    while !conn.outbuf.is_empty() {
        match conn.stream.write(&conn.outbuf) {
            Ok(0) => return,
            Ok(n) => {
                conn.outbuf.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => {
                conn.outbuf.clear();
                conn.eof = true;
                return;
            }
        }
    }
}

/// Whether the attach session of `token` got the container's stdin (for the log).
fn sink_stdin(c: &Container, token: Token) -> bool {
    c.attaches.iter().any(|a| a.token == token && a.stdin)
}

/// Bind the control socket in `dir` by a relative name (state paths may exceed the 108 bytes
/// of a socket address), replacing a stale one.
pub fn bind_control_socket(dir: &Path) -> io::Result<UnixListener> {
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

    #[test]
    fn capture_truncates_at_its_limit() {
        let (r, _w) = pipe().unwrap();
        let mut cap = Capture::new(r, 5);
        cap.take(b"abc");
        cap.take(b"defg");
        assert_eq!(cap.data, b"abcde");
        assert!(cap.truncated);
    }
}
