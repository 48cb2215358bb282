//! The daemon's side of the per-pod shims: starting one, finding it again after a restart,
//! and the clients of their control sockets.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crius_api::shim::{Client, CONTROL_SOCKET};
use tokio::process::Command;

use crate::error::{Error, Result};

/// How long a shim may take to report ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest path a unix socket address holds (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why the end of a followed process cannot be learned from its shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// The shim is gone (the error of the last call to it).
    ShimGone(String),
    /// The shim runs but no longer knows the process: it was deleted while crius was away
    /// (a RemoveContainer the database missed).
    NotInShim,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::ShimGone(why) => write!(f, "the shim is gone: {why}"),
            Lost::NotInShim => f.write_str("the shim no longer knows it"),
        }
    }
}

/// A connected shim client. Derefs to the [`Client`]; when the socket path is too long for a
/// socket address, the client connects through `/proc/self/fd/<dir>/control.sock` and this
/// handle keeps that directory open for as long as any clone of it is in use.
#[derive(Debug, Clone)]
pub struct ShimClient {
    client: Client,
    _dir: Option<Arc<File>>,
}

impl std::ops::Deref for ShimClient {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// The shims of this node, by pod id.
pub struct Shims {
    binary: PathBuf,
    dir: PathBuf,
    /// `--max-log-line` of every shim started from now on.
    max_log_line: u64,
    /// How long a create, start or delete may take in the shim.
    operation_timeout: Duration,
    clients: Mutex<HashMap<String, ShimClient>>,
}

impl Shims {
    /// `binary` is crius-shim; shim state lives under `<state>/shims/<pod-id>`; shims split
    /// container log lines longer than `max_log_line` bytes; their creates, starts and deletes
    /// may take `operation_timeout`.
    pub fn new(
        binary: PathBuf,
        state: &Path,
        max_log_line: u64,
        operation_timeout: Duration,
    ) -> Shims {
        Shims {
            binary,
            dir: state.join("shims"),
            max_log_line,
            operation_timeout,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The state directory of a pod's shim.
    pub fn state_dir(&self, pod_id: &str) -> PathBuf {
        self.dir.join(pod_id)
    }

    /// Writes the static pause binary out of the shim to `dest`.
    pub async fn install_pause(&self, dest: &Path) -> Result<()> {
        let out = Command::new(&self.binary)
            .arg("--install-pause")
            .arg(dest)
            .output()
            .await
            .map_err(|e| Error::internal(format!("run {}", self.binary.display()), e))?;
        if !out.status.success() {
            return Err(Error::Internal {
                context: format!(
                    "install the pause binary to {}: {}",
                    dest.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                source: None,
            });
        }
        Ok(())
    }

    /// Starts the shim of `pod_id` and connects to it. The shim detaches: it is not our child
    /// once the command returns, and outlives crius.
    pub async fn start(&self, pod_id: &str) -> Result<ShimClient> {
        let dir = self.state_dir(pod_id);
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--id")
            .arg(pod_id)
            .arg("--state-dir")
            .arg(&dir)
            .arg("--max-log-line")
            .arg(self.max_log_line.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let run = async {
            cmd.output()
                .await
                .map_err(|e| Error::internal(format!("run {}", self.binary.display()), e))
        };
        let out = tokio::time::timeout(START_TIMEOUT, run)
            .await
            .map_err(|_| {
                Error::DeadlineExceeded(format!(
                    "shim for pod {pod_id} did not report ready in {START_TIMEOUT:?}"
                ))
            })??;
        if !out.status.success() {
            return Err(Error::Internal {
                context: format!(
                    "start shim for pod {pod_id}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                source: None,
            });
        }
        let client = connect(&dir, self.operation_timeout).await?;
        self.lock().insert(pod_id.to_string(), client.clone());
        Ok(client)
    }

    /// The client of a pod's running shim, connecting on first use (after a crius restart).
    pub async fn get(&self, pod_id: &str) -> Result<ShimClient> {
        if let Some(c) = self.lock().get(pod_id) {
            return Ok(c.clone());
        }
        let client = connect(&self.state_dir(pod_id), self.operation_timeout).await?;
        self.lock().insert(pod_id.to_string(), client.clone());
        Ok(client)
    }

    /// Forgets a pod's client (its shim was shut down or is gone).
    pub fn forget(&self, pod_id: &str) {
        self.lock().remove(pod_id);
    }

    /// Asks a pod's shim to exit once its containers are gone, waits for it to go, and
    /// removes its state. A shim that is already gone is fine.
    pub async fn shutdown(&self, pod_id: &str) -> Result<()> {
        let dir = self.state_dir(pod_id);
        match self.get(pod_id).await {
            Ok(client) => {
                let pid = client.shim_pid();
                if let Err(e) = client.shutdown().await {
                    tracing::warn!(pod = pod_id, "shim shutdown: {e}");
                }
                wait_gone(pid, Duration::from_secs(5)).await;
                if pid_alive(pid) {
                    tracing::warn!(pod = pod_id, pid, "shim did not exit; killing it");
                    // SAFETY: kill(2) on the pid the shim itself reported; it is ours.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    wait_gone(pid, Duration::from_secs(2)).await;
                }
            }
            // A shim that runs but does not answer (or cannot be reached) must not outlive
            // its pod: find it by its pid file and make sure it is this pod's shim.
            Err(e) => {
                if let Some(pid) = self.running_pid(pod_id) {
                    tracing::warn!(pod = pod_id, pid, "shim unreachable ({e}); killing it");
                    // SAFETY: kill(2) on a live process whose command line names this pod's
                    // shim state dir (checked by running_pid).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    wait_gone(pid, Duration::from_secs(2)).await;
                }
            }
        }
        self.forget(pod_id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::internal(format!("remove {}", dir.display()), e)),
        }
    }

    /// Follows the init of `id` (a container, or the pause: the pod's own id) in pod
    /// `pod_id`'s shim until it exits. `Some(Ok)` is its exit; `Some(Err)` says why nobody can
    /// tell ([`Lost`]); `None` means `still_watched` turned false first (the object was
    /// stopped or removed by someone else). A shim that lives but fails the call is asked
    /// again a second later.
    pub async fn follow_exit(
        &self,
        pod_id: &str,
        id: &str,
        still_watched: impl Fn() -> bool,
    ) -> Option<std::result::Result<crius_api::shim::ExitInfo, Lost>> {
        use crius_api::shim::{ClientError, ErrorKind};
        loop {
            let waited = match self.get(pod_id).await {
                Ok(shim) => match shim.wait(id, None).await {
                    Ok(exit) => return Some(Ok(exit)),
                    Err(ClientError::Shim(e)) if e.kind == ErrorKind::NotFound => {
                        if !still_watched() {
                            return None;
                        }
                        return Some(Err(Lost::NotInShim));
                    }
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            if !still_watched() {
                return None;
            }
            if self.running_pid(pod_id).is_none() {
                return Some(Err(Lost::ShimGone(waited)));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The pid of the pod's shim from its pid file, if that process is alive and is this pod's
    /// shim (its command line names the pod's state dir: pids get reused).
    pub fn running_pid(&self, pod_id: &str) -> Option<i32> {
        let dir = self.state_dir(pod_id);
        let pid = std::fs::read_to_string(dir.join(crius_api::shim::PID_FILE))
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let ours = cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == dir.as_os_str().as_encoded_bytes());
        (ours && pid_alive(pid)).then_some(pid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ShimClient>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Connects to the control socket in a shim's state dir, through an open fd of the dir when
/// the path does not fit a socket address (the shim binds it by a relative name).
async fn connect(dir: &Path, operation_timeout: Duration) -> Result<ShimClient> {
    let socket = dir.join(CONTROL_SOCKET);
    if socket.as_os_str().len() <= MAX_SOCKET_PATH {
        return Ok(ShimClient {
            client: Client::connect(socket)
                .await?
                .with_helper_timeout(operation_timeout),
            _dir: None,
        });
    }
    let handle = File::open(dir)
        .map_err(|e| Error::internal(format!("open shim dir {}", dir.display()), e))?;
    let short = format!("/proc/self/fd/{}/{CONTROL_SOCKET}", handle.as_raw_fd());
    Ok(ShimClient {
        client: Client::connect(short)
            .await?
            .with_helper_timeout(operation_timeout),
        _dir: Some(Arc::new(handle)),
    })
}

/// Whether a process exists (and is not a zombie we could reap: shims are not our children).
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `pid` to exit. Through a pidfd, readable the moment the process
/// exits (a poll every 10 ms made RemovePodSandbox wait 11 ms for a shim that exits in about
/// one); polling only where a pidfd cannot be had.
async fn wait_gone(pid: i32, limit: Duration) {
    if pid <= 0 {
        return;
    }
    match pidfd(pid) {
        Ok(fd) => {
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and is the same
            // descriptor until the AsyncFd is dropped.
            let registered = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            };
            match registered {
                Ok(fd) => {
                    let _ = tokio::time::timeout(limit, fd.readable()).await;
                    return;
                }
                Err(e) => tracing::debug!(pid, "register pidfd: {e}; polling"),
            }
        }
        // Gone already (ESRCH), or no pidfd_open (before Linux 5.3): the poll settles it.
        Err(e) => tracing::trace!(pid, "pidfd_open: {e}"),
    }
    let deadline = tokio::time::Instant::now() + limit;
    while pid_alive(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn pidfd(pid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor (close-on-exec
    // always) or -1; nothing of ours is touched.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: fd was just returned by pidfd_open and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_gone_wakes_at_the_exit_not_at_the_next_poll() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let started = std::time::Instant::now();
        wait_gone(pid, Duration::from_secs(10)).await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(150),
            "returned before the exit: {took:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "waited past the exit: {took:?}"
        );
        assert!(!pid_alive(pid));
        child.wait().unwrap();
        // gone already: no wait at all
        let started = std::time::Instant::now();
        wait_gone(pid, Duration::from_secs(10)).await;
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn wait_gone_gives_up_at_its_limit() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let started = std::time::Instant::now();
        wait_gone(pid, Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(pid_alive(pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
