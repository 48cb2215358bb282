//! The control protocol between crius and a pod's `crius-shim`.
//!
//! # Transport and framing
//!
//! The shim listens on the unix stream socket [`CONTROL_SOCKET`] in its state directory
//! (`<state>/shims/<pod-id>/control.sock`). Every message, either way, is one frame: a 4-byte
//! big-endian length `n` followed by `n` bytes of UTF-8 JSON; `n` is at most [`MAX_FRAME`].
//! A connection carries requests and their responses strictly in turn (one request, then its
//! response, then the next request). The async [`Client`] opens one connection per call, so a
//! long call (`wait`, `exec_sync`) never delays another; the shim serves all connections from
//! one event loop and answers slow requests when they complete. Closing a connection gives up
//! on its pending answer (the operation itself, e.g. a create, still runs to its end).
//!
//! # Versioning
//!
//! Every [`Request`] carries the sender's [`PROTOCOL_VERSION`] in `v`. The shim answers a
//! request of another version with [`ErrorKind::UnsupportedVersion`] and otherwise ignores it.
//! Adding an optional field (with `#[serde(default)]`) or a new request keeps the version;
//! changing the meaning or the shape of an existing one bumps it.
//!
//! # Messages
//!
//! A request is `{"v":1,"op":{"type":"<op>", ...fields}}`; a response is
//! `{"ok":{"type":"<reply>", ...fields}}` or `{"err":{"kind":"<kind>","message":"..."}}`.
//!
//! | op | fields | reply |
//! |---|---|---|
//! | `hello` | — | `hello {version, pid, pod_id}` |
//! | `create_container` | [`CreateContainer`] | `created {pid}`: the container exists, its user process has not run |
//! | `start` | `id` | `started {pid}` |
//! | `kill` | `id, signal, all` | `done`; `all` signals every process in the container's cgroup |
//! | `delete` | `id, force` | `done` once the container's processes are gone and its state removed; without `force` only a created or exited container |
//! | `state` | `id` | `container {..}` ([`ContainerInfo`]) |
//! | `list` | — | `containers {containers}` |
//! | `exec_sync` | [`ExecSync`] | `exec {..}` ([`ExecOutcome`]) when the process has exited or timed out |
//! | `reopen_log` | `id` | `done` |
//! | `wait` | `id` | `exited {..}` ([`ExitInfo`]) when the container's init has exited |
//! | `exec_stream` | [`ExecStream`] | `streams {..}` ([`Streams`], with descriptors), later `process_exited {..}` |
//! | `attach` | [`Attach`] | `streams {..}` ([`Streams`], with descriptors), later `process_exited {..}` |
//! | `shutdown` | — | `done`; the shim exits and removes its state directory as soon as no container is left |
//! | `prepare` | — | `done` at once; unless one waits already, the shim starts a helper that waits for the next create's call (no other operation takes it), so that its start overlaps with what crius does before it asks; an unused one ends after [`PREPARED_HELPER_TTL`] |
//!
//! # Streaming requests
//!
//! `exec_stream` and `attach` answer twice on their connection. The first answer, `streams`,
//! carries the crius ends of the process's stdio as `SCM_RIGHTS` descriptors on the frame's
//! first byte, in the order its `fds` lists them: a pipe to write stdin into, pipes to read
//! stdout and stderr from. With a terminal, an exec's `stdout` (and `stdin`) are the pty
//! master itself and an attach's `stdout` a pipe the shim copies the master's output into;
//! either way `pty` is the master too, for `TIOCSWINSZ`. An exec's pty lives in the
//! container's devpts. The second, `process_exited`, comes when the exec process (or the
//! attached container's init) has exited; for an attach the output pipes are closed just
//! before it. Closing the connection ends an attach session: the shim stops copying output
//! into it, and for a `stdin_once` container that was attached with stdin it closes the
//! container's stdin. An exec process whose connection closes runs on; its stdin and output
//! are then closed ends. An attach sees the container's output from the moment it joins
//! (the CRI log keeps being written); a reader too slow to keep its pipe from filling loses
//! what does not fit.
//!
//! # Files in the shim's state directory
//!
//! - `shim.pid`: the shim's pid, written before it reports ready.
//! - `containers/<id>/exit.json`: an [`ExitInfo`], written atomically when the container's init
//!   exits, for crius to read even after its own restart or the shim's death ([`read_exit_file`]).
//! - `shim.log` (unless `--log` names another file): the shim's own log.
//!
//! # Lifetime
//!
//! After `shutdown` the shim refuses new containers and execs, keeps serving the rest, and
//! exits as soon as no container is left, removing its whole state directory. On SIGTERM or
//! SIGINT it kills every container, records their exits, and exits; then only `shim.log` and
//! `containers/<id>/exit.json` remain, for crius to read and remove.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The version of this protocol; see the module documentation for the rules.
pub const PROTOCOL_VERSION: u32 = 1;

/// How long the shim lets one libcontainer operation (a create, start or delete, run by
/// `crius-shim-helper`) take before it kills the helper and answers with the failure.
pub const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a helper the shim started ahead (`prepare`) waits for a call before the shim ends it.
pub const PREPARED_HELPER_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest frame either side accepts: two full 16 MiB exec outputs in base64 fit with room.
pub const MAX_FRAME: usize = 64 << 20;

/// File name of the control socket inside the shim's state directory.
pub const CONTROL_SOCKET: &str = "control.sock";

/// File name of the shim's pid file inside its state directory.
pub const PID_FILE: &str = "shim.pid";

/// File name of a container's exit record inside `containers/<id>/`.
pub const EXIT_FILE: &str = "exit.json";

/// Default cap on each of stdout and stderr captured by `exec_sync`.
pub const DEFAULT_EXEC_OUTPUT_LIMIT: u64 = 16 << 20;

/// One request from crius to the shim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The sender's [`PROTOCOL_VERSION`].
    pub v: u32,
    /// What to do.
    pub op: Op,
}

impl Request {
    /// A request of the current protocol version.
    pub fn new(op: Op) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            op,
        }
    }
}

/// The operations the shim serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Op {
    /// Check the shim is alive and speaks this version.
    Hello,
    /// Create a container from an OCI bundle; its user process waits for `start`.
    CreateContainer(CreateContainer),
    /// Let a created container's user process run.
    Start { id: String },
    /// Send `signal` to the container's init, or with `all` to every process of its cgroup.
    Kill {
        id: String,
        signal: i32,
        #[serde(default)]
        all: bool,
    },
    /// Forget a container: its cgroup, libcontainer state and `containers/<id>/` (with
    /// `exit.json`) are removed; the log file stays (it belongs to kubelet). A created (never
    /// started) container may be deleted without `force`; its init is killed first.
    Delete {
        id: String,
        /// Kill the container's processes first if they still run.
        #[serde(default)]
        force: bool,
    },
    /// Describe one container.
    State { id: String },
    /// Describe every container of the pod.
    List,
    /// Run a process in a running container and collect its output.
    ExecSync(ExecSync),
    /// Reopen the container's log file (kubelet rotated it).
    ReopenLog { id: String },
    /// Answer when the container's init has exited.
    Wait { id: String },
    /// Exit once no container is left, removing the shim's state directory.
    Shutdown,
    /// Run a process in a running container with its stdio handed to crius (see "Streaming
    /// requests" above).
    ExecStream(ExecStream),
    /// Join a running container's stdio (see "Streaming requests" above).
    Attach(Attach),
    /// Start a helper ahead of the next call that needs one (a create on its way).
    Prepare,
}

/// Fields of [`Op::CreateContainer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateContainer {
    /// Container id, unique within the pod; `[A-Za-z0-9_.-]`, as libcontainer requires.
    pub id: String,
    /// OCI bundle directory holding `config.json`; its `linux.cgroupsPath` must be absolute.
    pub bundle: PathBuf,
    /// Give the container a stdin pipe the shim keeps open (for attach).
    #[serde(default)]
    pub stdin: bool,
    /// Close stdin after the first attach session ends (CRI `stdin_once`).
    #[serde(default)]
    pub stdin_once: bool,
    /// Run the container on a pty (the spec's `process.terminal` must agree); its output is
    /// logged as stdout.
    #[serde(default)]
    pub tty: bool,
    /// Where to write the CRI-format log; no log when absent (output is then discarded).
    #[serde(default)]
    pub log_path: Option<PathBuf>,
    /// Run the container with this OCI runtime's command line instead of libcontainer; every
    /// later operation on the container (start, kill, exec, delete) goes through it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<OciRuntime>,
    /// Restore the container's processes from CRIU images instead of running its process
    /// (`<rt> restore`; needs `runtime`). They wait stopped until the start, which continues
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<Restore>,
}

/// Where a restored container comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restore {
    /// The directory of CRIU images.
    pub images: PathBuf,
    /// The criu binary the runtime runs (as `criu`, its directory first in `$PATH`).
    pub criu: PathBuf,
}

/// An OCI runtime (runc, crun, runsc, ...) the shim drives through its command line, the
/// operations of the OCI runtime spec: `create --bundle --pid-file [--console-socket]`,
/// `start`, `kill [--all]`, `delete --force`, `exec --process --pid-file --detach`. The shim
/// keeps owning the container's stdio, log, exits and attach, whichever runtime runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OciRuntime {
    /// The runtime's executable (absolute).
    pub binary: PathBuf,
    /// Its state directory (`--root`); when absent, `<shim state>/oci/<binary's file name>`,
    /// removed with the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// Global flags put before the operation (e.g. gVisor's `--platform=ptrace`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// Fields of [`Op::ExecSync`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecSync {
    /// The container to run in; it must be running.
    pub id: String,
    /// An OCI runtime-spec `process` object (args, env, cwd, user, capabilities, ...), used as
    /// it is: nothing is merged from the container's own process. `terminal` is forced off.
    pub process: serde_json::Value,
    /// Kill the process (SIGKILL) after this long; `0` means no limit.
    #[serde(default)]
    pub timeout_ms: u64,
    /// Cap on each of stdout and stderr; beyond it output is dropped and the reply says
    /// truncated. `0` means [`DEFAULT_EXEC_OUTPUT_LIMIT`].
    #[serde(default)]
    pub output_limit: u64,
}

/// Fields of [`Op::ExecStream`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecStream {
    /// The container to run in; it must be running.
    pub id: String,
    /// An OCI runtime-spec `process` object, used as it is except `terminal`, which the shim
    /// sets from `tty`.
    pub process: serde_json::Value,
    /// Run the process on a new pty (its stdin, stdout and stderr); crius gets the master.
    #[serde(default)]
    pub tty: bool,
    /// Give the process a stdin crius writes into; without it stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Hand stdout to crius; without it (and without a tty) the output is discarded.
    #[serde(default)]
    pub stdout: bool,
    /// Hand stderr to crius; without it (and without a tty) the output is discarded.
    #[serde(default)]
    pub stderr: bool,
}

/// Fields of [`Op::Attach`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attach {
    /// The container to attach to; it must be running.
    pub id: String,
    /// Write into the container's stdin (only if it was created with stdin).
    #[serde(default)]
    pub stdin: bool,
    /// Copy the container's stdout (a tty container's whole output) to crius.
    #[serde(default)]
    pub stdout: bool,
    /// Copy the container's stderr to crius (nothing for a tty container).
    #[serde(default)]
    pub stderr: bool,
}

/// Which stdio end a descriptor passed with [`Reply::Streams`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamFd {
    /// Write end of the process's stdin.
    Stdin,
    /// Read end of its stdout.
    Stdout,
    /// Read end of its stderr.
    Stderr,
    /// The master of its pty: output, input and window size.
    Pty,
}

/// The first answer to [`Op::ExecStream`] and [`Op::Attach`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Streams {
    /// The exec process, or the attached container's init.
    pub pid: i32,
    /// The process runs on a pty.
    pub tty: bool,
    /// The descriptors that came with this frame, in order.
    pub fds: Vec<StreamFd>,
}

/// One response from the shim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Err(ShimError),
}

/// The successful replies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Hello {
        version: u32,
        /// The shim's pid.
        pid: i32,
        /// The pod this shim serves (its `--id`).
        pod_id: String,
    },
    Created {
        /// Pid of the container's init (in the host pid namespace).
        pid: i32,
    },
    Started {
        pid: i32,
        /// When the shim started it (ns since the epoch), the time `Container` reports too: the
        /// daemon records this one, so what it answers and what a recovery reads agree.
        /// Shims before this field send none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_at: Option<i64>,
    },
    Done,
    Container(ContainerInfo),
    Containers {
        containers: Vec<ContainerInfo>,
    },
    Exec(ExecOutcome),
    Exited(ExitInfo),
    /// First answer of a streaming request; see [`Streams`].
    Streams(Streams),
    /// Last answer of a streaming request: the process has exited.
    ProcessExited {
        /// Exit status, or 128 + the signal.
        exit_code: i32,
        signal: Option<i32>,
    },
}

/// A failed request: a kind crius maps to a gRPC code, and a message naming what failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ShimError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ShimError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Classes of failure, chosen to map one-to-one onto gRPC codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    DeadlineExceeded,
    UnsupportedVersion,
    Internal,
}

/// Lifecycle state of a container as the shim sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerStatus {
    /// `create_container` is in progress.
    Creating,
    /// Created; the user process has not run yet.
    Created,
    Running,
    /// The init has exited (see `exit`).
    Stopped,
}

/// What the shim knows of one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerInfo {
    pub id: String,
    pub status: ContainerStatus,
    /// Pid of the init, once created.
    pub pid: Option<i32>,
    pub bundle: PathBuf,
    pub log_path: Option<PathBuf>,
    pub tty: bool,
    pub stdin: bool,
    pub stdin_once: bool,
    /// When the create finished, nanoseconds since the Unix epoch.
    pub created_at_unix_nano: i64,
    /// When `start` succeeded.
    pub started_at_unix_nano: Option<i64>,
    /// Set once the init has exited.
    pub exit: Option<ExitInfo>,
}

/// How a container's init ended; also the content of `containers/<id>/exit.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub pid: i32,
    /// The exit status, or 128 + the signal number if a signal ended it (as runc reports).
    pub exit_code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// RFC 3339 UTC time with nanoseconds, e.g. `2026-01-02T03:04:05.123456789Z`.
    pub finished_at: String,
    pub finished_at_unix_nano: i64,
    /// The container's cgroup counted an OOM kill while the container ran.
    pub oom_killed: bool,
}

/// Result of [`Op::ExecSync`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// Exit status, or 128 + signal; after a timeout the status of the killed process.
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// The timeout fired and the process was killed.
    pub timed_out: bool,
    #[serde(with = "base64_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "base64_bytes")]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// Errors of the frame codec.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("read or write a frame")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("malformed frame")]
    Json(#[from] serde_json::Error),
}

/// Encode `msg` as one frame (length prefix included).
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg)?;
    let len = buf.len() - 4;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let len = u32::try_from(len).map_err(|_| FrameError::TooLarge(len))?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// Decode the first frame of `buf` if it is complete: the message and the bytes it used.
pub fn decode_frame<T: DeserializeOwned>(buf: &[u8]) -> Result<Option<(T, usize)>, FrameError> {
    let Some(len) = frame_len(buf)? else {
        return Ok(None);
    };
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[4..4 + len])?;
    Ok(Some((msg, 4 + len)))
}

fn frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let mut len = [0u8; 4];
    len.copy_from_slice(prefix);
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(Some(len))
}

/// Write one frame to a blocking writer.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode_frame(msg)?)?;
    w.flush()?;
    Ok(())
}

/// Read one frame from a blocking reader.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<T, FrameError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)?;
    let len = frame_len(&prefix)?.unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

/// Path of a container's exit record under a shim state directory.
pub fn exit_file_path(shim_state_dir: &Path, container_id: &str) -> PathBuf {
    shim_state_dir
        .join("containers")
        .join(container_id)
        .join(EXIT_FILE)
}

/// Read a container's exit record; `Ok(None)` when the container has not exited (no file).
pub fn read_exit_file(
    shim_state_dir: &Path,
    container_id: &str,
) -> Result<Option<ExitInfo>, FrameError> {
    match std::fs::read(exit_file_path(shim_state_dir, container_id)) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Standard base64 (RFC 4648, with padding) for byte fields, so binary output survives JSON
/// at 4/3 of its size rather than the 4x of a number array.
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn encode(data: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(data)
    }

    pub fn decode(text: &str) -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD.decode(text).ok()
    }

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        decode(&text).ok_or_else(|| serde::de::Error::custom("invalid base64"))
    }
}

#[cfg(feature = "client")]
pub use client::{Client, ClientError};

#[cfg(feature = "client")]
mod client {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use super::{
        decode_frame, encode_frame, ContainerInfo, CreateContainer, ExecOutcome, ExecSync,
        ExitInfo, FrameError, Op, Reply, Request, Response, ShimError, MAX_FRAME, PROTOCOL_VERSION,
    };

    /// Time allowed for an ordinary call unless [`Client::with_timeout`] says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Time allowed for a call the shim serves with a helper (create, start, delete): longer
    /// than the shim's own [`super::HELPER_TIMEOUT`], so that crius always hears how it ended
    /// instead of giving up on an operation that goes on (on a loaded node a create took more
    /// than 10 s), and well inside kubelet's 2-minute runtime request timeout.
    pub const HELPER_CALL_TIMEOUT: Duration = Duration::from_secs(75);

    /// Extra time an `exec_sync` call allows past the exec's own timeout, for the shim to kill,
    /// reap and answer.
    const EXEC_MARGIN: Duration = Duration::from_secs(5);

    /// Errors of a shim call.
    #[derive(Debug, thiserror::Error)]
    pub enum ClientError {
        #[error("connect to shim at {path}")]
        Connect {
            path: PathBuf,
            #[source]
            source: std::io::Error,
        },
        #[error("talk to shim at {path}")]
        Io {
            path: PathBuf,
            #[source]
            source: FrameError,
        },
        #[error("shim at {path}: {op} timed out after {after:?}")]
        Timeout {
            path: PathBuf,
            op: &'static str,
            after: Duration,
        },
        #[error("shim at {path} speaks protocol version {theirs}, crius speaks {ours}")]
        Version {
            path: PathBuf,
            theirs: u32,
            ours: u32,
        },
        #[error("shim at {path}: unexpected reply to {op}")]
        UnexpectedReply { path: PathBuf, op: &'static str },
        #[error(transparent)]
        Shim(#[from] ShimError),
    }

    impl ClientError {
        /// The shim's own error, if the shim answered with one.
        pub fn shim_error(&self) -> Option<&ShimError> {
            match self {
                ClientError::Shim(e) => Some(e),
                _ => None,
            }
        }
    }

    /// An async client of one shim's control socket. Cheap to clone; every call opens its own
    /// connection, so calls may run concurrently.
    #[derive(Debug, Clone)]
    pub struct Client {
        path: PathBuf,
        timeout: Duration,
        /// For create, start and delete, which the shim serves with a helper.
        helper_timeout: Duration,
        shim_pid: i32,
        pod_id: String,
    }

    impl Client {
        /// Connect to the shim listening at `path` and check it speaks this protocol version.
        pub async fn connect(path: impl AsRef<Path>) -> Result<Self, ClientError> {
            let mut client = Self {
                path: path.as_ref().to_path_buf(),
                timeout: DEFAULT_TIMEOUT,
                helper_timeout: HELPER_CALL_TIMEOUT,
                shim_pid: 0,
                pod_id: String::new(),
            };
            match client.call("hello", Op::Hello, DEFAULT_TIMEOUT).await? {
                Reply::Hello {
                    version,
                    pid,
                    pod_id,
                } => {
                    if version != PROTOCOL_VERSION {
                        return Err(ClientError::Version {
                            path: client.path,
                            theirs: version,
                            ours: PROTOCOL_VERSION,
                        });
                    }
                    client.shim_pid = pid;
                    client.pod_id = pod_id;
                    Ok(client)
                }
                _ => Err(client.unexpected("hello")),
            }
        }

        /// The same client with another timeout for ordinary calls.
        pub fn with_timeout(mut self, timeout: Duration) -> Self {
            self.timeout = timeout;
            self
        }

        /// Time allowed for create, start and delete instead of `HELPER_CALL_TIMEOUT` (75 s).
        pub fn with_helper_timeout(mut self, timeout: Duration) -> Self {
            self.helper_timeout = timeout;
            self
        }

        /// The socket path.
        pub fn path(&self) -> &Path {
            &self.path
        }

        /// The shim's pid, as it reported in `hello`.
        pub fn shim_pid(&self) -> i32 {
            self.shim_pid
        }

        /// The pod id the shim serves, as it reported in `hello`.
        pub fn pod_id(&self) -> &str {
            &self.pod_id
        }

        /// Check the shim still answers.
        pub async fn hello(&self) -> Result<(), ClientError> {
            match self.call("hello", Op::Hello, self.timeout).await? {
                Reply::Hello { .. } => Ok(()),
                _ => Err(self.unexpected("hello")),
            }
        }

        /// Create a container; returns its init pid.
        pub async fn create_container(&self, req: CreateContainer) -> Result<i32, ClientError> {
            match self
                .call(
                    "create_container",
                    Op::CreateContainer(req),
                    self.helper_timeout,
                )
                .await?
            {
                Reply::Created { pid } => Ok(pid),
                _ => Err(self.unexpected("create_container")),
            }
        }

        /// Have the shim start a helper for the create about to be asked (see `prepare`).
        pub async fn prepare(&self) -> Result<(), ClientError> {
            self.done("prepare", Op::Prepare).await
        }

        /// Start a created container; returns its init pid and the shim's start time (ns
        /// since the epoch; None from an older shim).
        pub async fn start(&self, id: &str) -> Result<(i32, Option<i64>), ClientError> {
            let op = Op::Start { id: id.to_owned() };
            match self.call("start", op, self.helper_timeout).await? {
                Reply::Started { pid, started_at } => Ok((pid, started_at)),
                _ => Err(self.unexpected("start")),
            }
        }

        /// Signal the container's init, or every process in it with `all`.
        pub async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), ClientError> {
            let op = Op::Kill {
                id: id.to_owned(),
                signal,
                all,
            };
            self.done("kill", op).await
        }

        /// Delete a container (with `force`, killing it first if it runs).
        pub async fn delete(&self, id: &str, force: bool) -> Result<(), ClientError> {
            let op = Op::Delete {
                id: id.to_owned(),
                force,
            };
            match self.call("delete", op, self.helper_timeout).await? {
                Reply::Done => Ok(()),
                _ => Err(self.unexpected("delete")),
            }
        }

        /// Describe one container.
        pub async fn state(&self, id: &str) -> Result<ContainerInfo, ClientError> {
            let op = Op::State { id: id.to_owned() };
            match self.call("state", op, self.timeout).await? {
                Reply::Container(info) => Ok(info),
                _ => Err(self.unexpected("state")),
            }
        }

        /// Describe every container of the pod.
        pub async fn list(&self) -> Result<Vec<ContainerInfo>, ClientError> {
            match self.call("list", Op::List, self.timeout).await? {
                Reply::Containers { containers } => Ok(containers),
                _ => Err(self.unexpected("list")),
            }
        }

        /// Run a process in the container and collect its output. The call waits for the
        /// exec's own timeout plus a margin (or without limit if the exec has none).
        pub async fn exec_sync(&self, req: ExecSync) -> Result<ExecOutcome, ClientError> {
            let limit = if req.timeout_ms == 0 {
                Duration::MAX
            } else {
                Duration::from_millis(req.timeout_ms) + EXEC_MARGIN
            };
            match self.call("exec_sync", Op::ExecSync(req), limit).await? {
                Reply::Exec(outcome) => Ok(outcome),
                _ => Err(self.unexpected("exec_sync")),
            }
        }

        /// Reopen the container's log file.
        pub async fn reopen_log(&self, id: &str) -> Result<(), ClientError> {
            self.done("reopen_log", Op::ReopenLog { id: id.to_owned() })
                .await
        }

        /// Wait until the container's init has exited, at most `timeout` (`None`: no limit).
        pub async fn wait(
            &self,
            id: &str,
            timeout: Option<Duration>,
        ) -> Result<ExitInfo, ClientError> {
            let op = Op::Wait { id: id.to_owned() };
            match self
                .call("wait", op, timeout.unwrap_or(Duration::MAX))
                .await?
            {
                Reply::Exited(exit) => Ok(exit),
                _ => Err(self.unexpected("wait")),
            }
        }

        /// Ask the shim to exit once no container is left.
        pub async fn shutdown(&self) -> Result<(), ClientError> {
            self.done("shutdown", Op::Shutdown).await
        }

        async fn done(&self, name: &'static str, op: Op) -> Result<(), ClientError> {
            match self.call(name, op, self.timeout).await? {
                Reply::Done => Ok(()),
                _ => Err(self.unexpected(name)),
            }
        }

        fn unexpected(&self, op: &'static str) -> ClientError {
            ClientError::UnexpectedReply {
                path: self.path.clone(),
                op,
            }
        }

        /// Send one request on a fresh connection and wait for its response.
        pub async fn call(
            &self,
            name: &'static str,
            op: Op,
            timeout: Duration,
        ) -> Result<Reply, ClientError> {
            let exchange = self.exchange(Request::new(op));
            let response = if timeout == Duration::MAX {
                exchange.await?
            } else {
                tokio::time::timeout(timeout, exchange)
                    .await
                    .map_err(|_| ClientError::Timeout {
                        path: self.path.clone(),
                        op: name,
                        after: timeout,
                    })??
            };
            match response {
                Response::Ok(reply) => Ok(reply),
                Response::Err(e) => Err(ClientError::Shim(e)),
            }
        }

        async fn exchange(&self, request: Request) -> Result<Response, ClientError> {
            let mut stream =
                UnixStream::connect(&self.path)
                    .await
                    .map_err(|source| ClientError::Connect {
                        path: self.path.clone(),
                        source,
                    })?;
            let io = |source: FrameError| ClientError::Io {
                path: self.path.clone(),
                source,
            };
            let frame = encode_frame(&request).map_err(io)?;
            stream
                .write_all(&frame)
                .await
                .map_err(|e| io(FrameError::Io(e)))?;
            let mut prefix = [0u8; 4];
            stream
                .read_exact(&mut prefix)
                .await
                .map_err(|e| io(FrameError::Io(e)))?;
            let len = u32::from_be_bytes(prefix) as usize;
            if len > MAX_FRAME {
                return Err(io(FrameError::TooLarge(len)));
            }
            let mut frame = Vec::with_capacity(4 + len);
            frame.extend_from_slice(&prefix);
            frame.resize(4 + len, 0);
            stream
                .read_exact(&mut frame[4..])
                .await
                .map_err(|e| io(FrameError::Io(e)))?;
            match decode_frame::<Response>(&frame).map_err(io)? {
                Some((response, _)) => Ok(response),
                None => Err(io(FrameError::TooLarge(len))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for len in 0..70 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let text = base64_bytes::encode(&data);
            assert_eq!(base64_bytes::decode(&text).unwrap(), data);
        }
        assert_eq!(base64_bytes::encode(b"foob"), "Zm9vYg==");
        assert_eq!(base64_bytes::encode(b"fooba"), "Zm9vYmE=");
        assert!(base64_bytes::decode("Zm9v!mE=").is_none());
        assert!(base64_bytes::decode("Zm=vYmE=").is_none());
    }

    #[test]
    fn frames_round_trip_and_report_incomplete() {
        let req = Request::new(Op::Kill {
            id: "c1".into(),
            signal: 15,
            all: true,
        });
        let frame = encode_frame(&req).unwrap();
        assert_eq!(decode_frame::<Request>(&frame[..3]).unwrap(), None);
        assert_eq!(
            decode_frame::<Request>(&frame[..frame.len() - 1]).unwrap(),
            None
        );
        let (back, used) = decode_frame::<Request>(&frame).unwrap().unwrap();
        assert_eq!(back, req);
        assert_eq!(used, frame.len());
        let mut cursor = std::io::Cursor::new(frame);
        assert_eq!(read_frame::<_, Request>(&mut cursor).unwrap(), req);
    }

    #[test]
    fn wire_format_is_as_documented() {
        let req = Request::new(Op::Start { id: "c1".into() });
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"v":1,"op":{"type":"start","id":"c1"}}"#
        );
        let resp = Response::Err(ShimError::new(
            ErrorKind::NotFound,
            "container c1 not found",
        ));
        assert_eq!(
            serde_json::to_string(&resp).unwrap(),
            r#"{"err":{"kind":"not_found","message":"container c1 not found"}}"#
        );
        let ok: Response = serde_json::from_str(r#"{"ok":{"type":"done"}}"#).unwrap();
        assert_eq!(ok, Response::Ok(Reply::Done));
        let kill: Request =
            serde_json::from_str(r#"{"v":1,"op":{"type":"kill","id":"c","signal":9}}"#).unwrap();
        assert_eq!(
            kill.op,
            Op::Kill {
                id: "c".into(),
                signal: 9,
                all: false
            }
        );
    }

    #[test]
    fn streaming_ops_wire_format() {
        let req: Request = serde_json::from_str(
            r#"{"v":1,"op":{"type":"attach","id":"c1","stdin":true,"stdout":true}}"#,
        )
        .unwrap();
        assert_eq!(
            req.op,
            Op::Attach(Attach {
                id: "c1".into(),
                stdin: true,
                stdout: true,
                stderr: false
            })
        );
        let streams = Response::Ok(Reply::Streams(Streams {
            pid: 42,
            tty: true,
            fds: vec![StreamFd::Stdin, StreamFd::Stdout, StreamFd::Pty],
        }));
        assert_eq!(
            serde_json::to_string(&streams).unwrap(),
            r#"{"ok":{"type":"streams","pid":42,"tty":true,"fds":["stdin","stdout","pty"]}}"#
        );
        let exited = Response::Ok(Reply::ProcessExited {
            exit_code: 3,
            signal: None,
        });
        assert_eq!(
            serde_json::to_string(&exited).unwrap(),
            r#"{"ok":{"type":"process_exited","exit_code":3,"signal":null}}"#
        );
    }

    #[test]
    fn oversized_frame_is_rejected() {
        let prefix = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(
            decode_frame::<Request>(&prefix),
            Err(FrameError::TooLarge(_))
        ));
    }
}
