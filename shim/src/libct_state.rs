//! libcontainer's state directory of one container (`<state>/runc/<id>/`), read and written by
//! the shim itself for what needs no libcontainer code: starting a created container, and
//! removing the state of one that has exited.
//!
//! What libcontainer 0.7 keeps there, and what its `start` and `delete` do with it:
//!
//! - `state.json`: `{"status": "created" | "running" | "stopped" | ..., "pid": <init>,
//!   "useSystemd": .., "intelRdtDir": .., ...}` (camelCase). `start` refuses unless the status
//!   is `created` and the init lives, and saves `running` once the init was told to go; its
//!   tenant builder (exec) later refuses a container whose status is not `running`.
//! - `youki_config.json`: `{"hooks": <OCI hooks or null>, "cgroup_path": "<cgroupsPath>"}`.
//!   `start` runs the `poststart` hooks, `delete` the `poststop` hooks after removing the
//!   cgroup at `cgroup_path`.
//! - `notify.sock`: a unix stream socket the init listens on between create and start; it
//!   reads one connection to its end (the start message is `start container`), then execs the
//!   user process. `start` connects by a relative name after a `chdir` (paths exceed the 108
//!   bytes of a socket address); the shim connects through `/proc/self/fd/<dir>/notify.sock`
//!   instead, which keeps its working directory.
//!
//! The shim does these itself only in the plain case (no hooks, no systemd cgroup, no Intel
//! RDT); anything else, or anything unexpected in the files, is left to `crius-shim-helper`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

/// libcontainer's record of a container's state.
pub const STATE_FILE: &str = "state.json";
/// What libcontainer keeps of the spec for later operations.
pub const CONFIG_FILE: &str = "youki_config.json";
/// The socket a created container's init waits on for the start message.
pub const NOTIFY_SOCKET: &str = "notify.sock";
/// The message that lets the init exec the user process.
const START_MESSAGE: &[u8] = b"start container";

/// Failures reading or writing libcontainer's files, or a case left to libcontainer.
#[derive(Debug, thiserror::Error)]
pub enum LibctStateError {
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parse {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {what}")]
    Unexpected { path: PathBuf, what: String },
    #[error("write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("send the start message on {path}")]
    Notify {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, LibctStateError>;

/// What the shim needs of `youki_config.json`, read once after a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The container's cgroup, as in the spec's `linux.cgroupsPath`.
    pub cgroup_path: PathBuf,
    /// The spec has `poststart` hooks (only libcontainer's start runs them).
    pub poststart_hooks: bool,
    /// The spec has `poststop` hooks (only libcontainer's delete runs them).
    pub poststop_hooks: bool,
}

/// Read `youki_config.json` of the container whose state directory is `dir`.
pub fn read_recorded(dir: &Path) -> Result<Recorded> {
    let (path, config) = read_json(dir, CONFIG_FILE)?;
    let cgroup_path = config
        .get("cgroup_path")
        .and_then(Value::as_str)
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| LibctStateError::Unexpected {
            path: path.clone(),
            what: "no absolute cgroup_path".to_owned(),
        })?;
    let hooks = config.get("hooks").unwrap_or(&Value::Null);
    let has = |kind: &str| match hooks.get(kind) {
        None | Some(Value::Null) => false,
        Some(Value::Array(list)) => !list.is_empty(),
        // Anything else is unexpected: count it as hooks, so libcontainer deals with it.
        Some(_) => true,
    };
    if !hooks.is_null() && !hooks.is_object() {
        return Err(LibctStateError::Unexpected {
            path,
            what: "hooks is neither null nor an object".to_owned(),
        });
    }
    Ok(Recorded {
        cgroup_path: PathBuf::from(cgroup_path),
        poststart_hooks: has("poststart"),
        poststop_hooks: has("poststop"),
    })
}

/// Start the created container whose state directory is `dir` and whose init is `init_pid`
/// (alive: the caller has not reaped it): record it as running, then send the start message.
/// If the message cannot be sent, the old state is put back.
///
/// The state is saved before the message (libcontainer saves after it): that way a failed
/// save leaves the init waiting and the start can still be handed to libcontainer, rather
/// than a running container that libcontainer's exec would refuse as not running.
pub fn start(dir: &Path, init_pid: i32) -> Result<()> {
    let (path, mut state) = read_json(dir, STATE_FILE)?;
    let unexpected = |what: String| LibctStateError::Unexpected {
        path: path.clone(),
        what,
    };
    let status = state.get("status").and_then(Value::as_str).unwrap_or("");
    if status != "created" {
        return Err(unexpected(format!("status {status:?}, not \"created\"")));
    }
    let pid = state.get("pid").and_then(Value::as_i64);
    if pid != Some(i64::from(init_pid)) {
        return Err(unexpected(format!("pid {pid:?}, not the init {init_pid}")));
    }
    if state.get("useSystemd").and_then(Value::as_bool) == Some(true) {
        return Err(unexpected("systemd cgroups".to_owned()));
    }
    let original = serde_json::to_vec(&state).map_err(|source| LibctStateError::Parse {
        path: path.clone(),
        source,
    })?;
    state["status"] = Value::from("running");
    write_json(dir, STATE_FILE, &state)?;
    if let Err(e) = notify(dir) {
        // Put back what libcontainer wrote, so that it can try the start itself.
        let _ = write_bytes(dir, STATE_FILE, &original);
        return Err(e);
    }
    Ok(())
}

/// Check that deleting the exited container whose state directory is `dir` needs nothing but
/// removing its cgroup and the directory (no Intel RDT group, no systemd unit).
pub fn check_plain_delete(dir: &Path) -> Result<()> {
    let (path, state) = read_json(dir, STATE_FILE)?;
    let set = |key: &str| !matches!(state.get(key), None | Some(Value::Null));
    if set("intelRdtDir") || set("intelRdtMonitoringDir") {
        return Err(LibctStateError::Unexpected {
            path,
            what: "an Intel RDT group".to_owned(),
        });
    }
    if state.get("useSystemd").and_then(Value::as_bool) == Some(true) {
        return Err(LibctStateError::Unexpected {
            path,
            what: "systemd cgroups".to_owned(),
        });
    }
    Ok(())
}

/// Remove the state directory; one that is gone is fine.
pub fn remove(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(LibctStateError::Remove {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Connect to the init's notify socket through an `O_PATH` descriptor of `dir` and send the
/// start message; closing the connection ends what the init reads.
fn notify(dir: &Path) -> Result<()> {
    let path = dir.join(NOTIFY_SOCKET);
    let err = |source: io::Error| LibctStateError::Notify {
        path: path.clone(),
        source,
    };
    let handle = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .map_err(err)?;
    let short = format!("/proc/self/fd/{}/{NOTIFY_SOCKET}", handle.as_raw_fd());
    let mut stream = UnixStream::connect(&short).map_err(err)?;
    // The message fits any socket buffer, so this does not wait for the init; the timeout only
    // bounds the unexpected.
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .map_err(err)?;
    stream.write_all(START_MESSAGE).map_err(err)?;
    Ok(())
}

fn read_json(dir: &Path, name: &str) -> Result<(PathBuf, Value)> {
    let path = dir.join(name);
    let bytes = fs::read(&path).map_err(|source| LibctStateError::Read {
        path: path.clone(),
        source,
    })?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|source| LibctStateError::Parse {
        path: path.clone(),
        source,
    })?;
    if !value.is_object() {
        return Err(LibctStateError::Unexpected {
            path,
            what: "not a JSON object".to_owned(),
        });
    }
    Ok((path, value))
}

fn write_json(dir: &Path, name: &str, value: &Value) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|source| LibctStateError::Parse {
        path: dir.join(name),
        source,
    })?;
    write_bytes(dir, name, &bytes)
}

/// Replace `<dir>/<name>` through a temp file and a rename, so that libcontainer never reads
/// half a file. Not synced: the state describes live processes and means nothing after a
/// reboot (it lives under the runtime state directory, a tmpfs on a real node).
fn write_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    crius_common::fs::write_atomic(&path, bytes, None, crius_common::fs::Durability::None)
        .map_err(|source| LibctStateError::Write { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    fn state(dir: &Path, status: &str, pid: i32) {
        let text = format!(
            r#"{{"ociVersion":"1.2.0","id":"c1","status":"{status}","pid":{pid},"bundle":"/b","annotations":{{}},"created":"2026-01-01T00:00:00Z","creator":0,"useSystemd":false,"intelRdtDir":null}}"#
        );
        fs::write(dir.join(STATE_FILE), text).unwrap();
    }

    #[test]
    fn reads_the_cgroup_and_hooks() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(CONFIG_FILE),
            r#"{"hooks":null,"cgroup_path":"/crius/c1"}"#,
        )
        .unwrap();
        let r = read_recorded(dir.path()).unwrap();
        assert_eq!(r.cgroup_path, PathBuf::from("/crius/c1"));
        assert!(!r.poststart_hooks && !r.poststop_hooks);

        fs::write(
            dir.path().join(CONFIG_FILE),
            r#"{"hooks":{"poststart":[],"poststop":[{"path":"/bin/true"}]},"cgroup_path":"/c"}"#,
        )
        .unwrap();
        let r = read_recorded(dir.path()).unwrap();
        assert!(!r.poststart_hooks && r.poststop_hooks);

        fs::write(
            dir.path().join(CONFIG_FILE),
            r#"{"hooks":null,"cgroup_path":":youki:c1"}"#,
        )
        .unwrap();
        assert!(read_recorded(dir.path()).is_err());
    }

    #[test]
    fn start_sends_the_message_and_records_running() {
        let dir = tempfile::tempdir().unwrap();
        state(dir.path(), "created", 42);
        let listener = UnixListener::bind(dir.path().join(NOTIFY_SOCKET)).unwrap();
        start(dir.path(), 42).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = String::new();
        conn.read_to_string(&mut got).unwrap();
        assert_eq!(got, "start container");
        let (_, saved) = read_json(dir.path(), STATE_FILE).unwrap();
        assert_eq!(saved["status"], "running");
        // The rest is kept as libcontainer wrote it.
        assert_eq!(saved["created"], "2026-01-01T00:00:00Z");
        assert_eq!(saved["pid"], 42);
    }

    #[test]
    fn start_refuses_the_unexpected_and_keeps_the_state() {
        let dir = tempfile::tempdir().unwrap();
        state(dir.path(), "running", 42);
        assert!(matches!(
            start(dir.path(), 42),
            Err(LibctStateError::Unexpected { .. })
        ));
        state(dir.path(), "created", 41);
        assert!(start(dir.path(), 42).is_err());
        // Nobody listens: the state goes back to created.
        state(dir.path(), "created", 42);
        assert!(matches!(
            start(dir.path(), 42),
            Err(LibctStateError::Notify { .. })
        ));
        let (_, saved) = read_json(dir.path(), STATE_FILE).unwrap();
        assert_eq!(saved["status"], "created");
    }

    #[test]
    fn plain_deletes_only() {
        let dir = tempfile::tempdir().unwrap();
        state(dir.path(), "stopped", 42);
        check_plain_delete(dir.path()).unwrap();
        fs::write(
            dir.path().join(STATE_FILE),
            r#"{"status":"stopped","useSystemd":false,"intelRdtDir":"/sys/fs/resctrl/c1"}"#,
        )
        .unwrap();
        assert!(check_plain_delete(dir.path()).is_err());
        remove(dir.path()).unwrap();
        assert!(!dir.path().exists());
        remove(dir.path()).unwrap();
    }
}
