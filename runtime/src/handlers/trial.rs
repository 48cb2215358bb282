//! Trial containers for an OCI runtime that has no `features` command (crun 1.8, gVisor's runsc
//! 2022): what it supports is found by asking it to create small containers and looking at
//! what it made, not assumed from its name or version.
//!
//! Each trial is a bundle under `<state>/handler-trials/<name>/` whose rootfs holds only the
//! pause binary, created with `<rt> [options] --root <dir>/state create` (never started) and
//! removed with `delete --force`; the directory goes after. A trial that the runtime refuses
//! outright makes the handler unusable with the runtime's own words: crun 1.8 on a cgroup v1
//! node whose v2 hierarchy holds a controller says "cgroups in hybrid mode not supported".
//!
//! - `rro`: a bind with only `rbind,rro` (no `ro`) must show up read-only in the container's
//!   `/proc/<pid>/mountinfo`. A runtime that ignored the option would leave it writable.
//! - user namespaces: a container with a user namespace and a mapping must run with that
//!   mapping in `/proc/<pid>/uid_map`.
//!
//! A sandboxed runtime (gVisor) shows the host the sandbox's process, not the container's view,
//! so neither check passes for it: it is reported with neither feature, which is what it has
//! as far as crius can tell.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::HandlerConfig;

/// The host id a trial's user namespace maps root to (the same range the user-namespace
/// probe uses).
const TRIAL_ID: u32 = 1 << 20;

/// How long one runtime command of a trial may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(10);

/// How much of a runtime's error message a refusal quotes.
const MESSAGE_CHARS: usize = 300;

/// What the trials found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    pub rro: bool,
    pub user_namespaces: bool,
}

/// Runs the trials of handler `name`; `Err` is why the runtime cannot create containers here.
/// `try_userns`: whether to try a user namespace at all (crius cannot run user-namespaced pods
/// on this node otherwise).
pub(crate) fn run(
    name: &str,
    handler: &HandlerConfig,
    state: &Path,
    pause: &Path,
    try_userns: bool,
) -> Result<Found, String> {
    let dir = state.join("handler-trials").join(name);
    let _ = fs::remove_dir_all(&dir);
    reap_orphans(name);
    let result = Trials::new(name, handler, &dir, pause).and_then(|t| t.run_all(try_userns));
    if let Err(e) = fs::remove_dir_all(&dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), "handler trial directory not removed: {e}");
        }
    }
    // The parent goes with the last handler's trials (another handler's may still be there).
    let _ = fs::remove_dir(state.join("handler-trials"));
    result
}

struct Trials<'a> {
    name: &'a str,
    handler: &'a HandlerConfig,
    dir: PathBuf,
}

impl<'a> Trials<'a> {
    fn new(
        name: &'a str,
        handler: &'a HandlerConfig,
        dir: &Path,
        pause: &Path,
    ) -> Result<Trials<'a>, String> {
        let io = |what: &str, e: std::io::Error| format!("handler trial: {what}: {e}");
        for sub in ["rootfs/mnt", "rootfs/dev", "rootfs/proc", "src", "state"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| io("make its directories", e))?;
        }
        fs::copy(pause, dir.join("rootfs/pause")).map_err(|e| io("copy the pause binary", e))?;
        Ok(Trials {
            name,
            handler,
            dir: dir.to_path_buf(),
        })
    }

    fn run_all(&self, try_userns: bool) -> Result<Found, String> {
        // rro first: when that create works the runtime is usable too; when it fails, a
        // plain create tells "no rro" from "cannot create here".
        let (rro, observable) = match self.trial("rro", true, false) {
            Ok(view) => (view.mount_read_only("/mnt"), view.has_mount("/mnt")),
            // It read the spec and objected to the option itself (gVisor 2022: `unknown mount
            // option "rro"`): it runs, without rro. Its create may be slow (gVisor boots its
            // sandbox in it), so no second trial is made, and none for user namespaces.
            Err(rro_err) if rro_err.contains("\"rro\"") || rro_err.contains(" rro") => {
                (false, false)
            }
            Err(rro_err) => {
                let view = self.trial("plain", false, false).map_err(|_| rro_err)?;
                (false, view.has_mount("/mnt"))
            }
        };
        // A sandboxed runtime shows the host a process that does not see the container's
        // mounts: nothing a trial makes can be observed, so none is tried.
        let user_namespaces = try_userns
            && observable
            && self
                .trial("userns", false, true)
                .is_ok_and(|v| v.maps_root_to(TRIAL_ID));
        Ok(Found {
            rro,
            user_namespaces,
        })
    }

    /// Creates a container with the given parts, reads what the checks need from its init
    /// process, and deletes it.
    fn trial(&self, what: &str, rro: bool, userns: bool) -> Result<PidView, String> {
        let id = format!("crius-trial-{}-{what}-{}", self.name, std::process::id());
        let bundle = self.dir.join(what);
        fs::create_dir_all(&bundle).map_err(|e| format!("handler trial {what}: {e}"))?;
        let spec = spec(&self.dir, rro, userns, &id);
        fs::write(bundle.join("config.json"), spec.to_string())
            .map_err(|e| format!("handler trial {what}: write config.json: {e}"))?;
        let pid_file = bundle.join("pid");
        let created = self.command(&[
            "create".as_ref(),
            "--bundle".as_ref(),
            bundle.as_os_str(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
            id.as_ref(),
        ]);
        let view = created.and_then(|()| {
            let pid = fs::read_to_string(&pid_file)
                .map_err(|e| format!("pid file: {e}"))?
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("pid file: {e}"))?;
            Ok(PidView::read(pid))
        });
        // Deleted whatever happened: a failed create may have left state behind, and a runtime
        // may leave the cgroup it made (runsc does after a failed create).
        let _ = self.command(&["delete".as_ref(), "--force".as_ref(), id.as_ref()]);
        remove_cgroups(&id);
        view
    }

    /// `<rt> [options] --root <dir>/state <args>`; an error carries the runtime's stderr.
    fn command(&self, args: &[&std::ffi::OsStr]) -> Result<(), String> {
        let binary = self.handler.binary.display();
        let mut child = Command::new(&self.handler.binary)
            .args(&self.handler.options)
            .arg("--root")
            .arg(self.dir.join("state"))
            .args(args)
            // Not /dev/null: crun 1.8 chowns the stdio of a user-namespaced container to its
            // root, and fchown on /dev/null would change the node's /dev/null.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run {binary}: {e}"))?;
        // its end at once, as /dev/null's
        drop(child.stdin.take());
        let status = super::wait_bounded(&mut child, COMMAND_LIMIT)
            .map_err(|e| format!("wait for {binary}: {e}"))?
            .ok_or_else(|| format!("{binary} did not answer within {COMMAND_LIMIT:?}"))?;
        if status.success() {
            return Ok(());
        }
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
        }
        let err = err.trim();
        let err = match err.char_indices().nth(MESSAGE_CHARS) {
            Some((end, _)) => format!("{}…", &err[..end]),
            None if err.is_empty() => "no message".to_owned(),
            None => err.to_owned(),
        };
        Err(format!("{binary} create failed ({status}): {err}"))
    }
}

/// The mount points of the host's cgroup hierarchies.
fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(mounts) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            matches!(right.split(' ').next(), Some("cgroup" | "cgroup2"))
                .then(|| left.split(' ').nth(4).map(PathBuf::from))
                .flatten()
        })
        .collect()
}

/// Removes the trial's cgroup `/<id>` from every cgroup hierarchy where it is left (an empty
/// cgroup is removed with rmdir; a missing one is fine).
fn remove_cgroups(id: &str) {
    for point in cgroup_mounts() {
        let _ = fs::remove_dir(point.join(id));
    }
}

/// What a crius killed during its trials left: a trial container created and never deleted
/// (its init waits in its cgroup `/crius-trial-<name>-<what>-<pid>` for a start that never
/// comes) of handler `name`, whose crius (`<pid>`) is gone. Its processes are killed and its
/// cgroups removed; the trials of a crius still running are left alone.
fn reap_orphans(name: &str) {
    let prefix = format!("crius-trial-{name}-");
    let mut orphans = std::collections::BTreeSet::new();
    for point in cgroup_mounts() {
        let Ok(entries) = fs::read_dir(&point) else {
            continue;
        };
        for entry in entries.flatten() {
            let cgroup = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = cgroup.strip_prefix(&prefix) else {
                continue;
            };
            let owner = rest.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
            if owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                orphans.insert(cgroup);
            }
        }
    }
    for id in orphans {
        for point in cgroup_mounts() {
            let procs =
                fs::read_to_string(point.join(&id).join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) on a pid read from the orphaned trial's own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        // The killed init leaves its cgroup once it is reaped (its parent, init, does that).
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            remove_cgroups(&id);
            let left = cgroup_mounts().iter().any(|p| p.join(&id).exists());
            if !left || Instant::now() > deadline {
                if left {
                    tracing::warn!(cgroup = %id, "an orphaned handler trial's cgroup is left");
                } else {
                    tracing::info!(cgroup = %id, "removed an orphaned handler trial");
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The trial's OCI spec: the pause binary as process (never started), a read-only rootfs,
/// `/proc` and a tmpfs `/dev` (a runtime in a user namespace cannot make device nodes; it binds
/// them), a bind of `src` at `/mnt` (with only `rro` when asked), and a user namespace mapping root to
/// [`TRIAL_ID`] when asked.
fn spec(dir: &Path, rro: bool, userns: bool, id: &str) -> serde_json::Value {
    let mut namespaces = vec![
        serde_json::json!({"type": "mount"}),
        serde_json::json!({"type": "pid"}),
        serde_json::json!({"type": "ipc"}),
        serde_json::json!({"type": "uts"}),
        serde_json::json!({"type": "network"}),
    ];
    let mut linux = serde_json::json!({
        "cgroupsPath": format!("/{id}"),
    });
    if userns {
        namespaces.push(serde_json::json!({"type": "user"}));
        let map = serde_json::json!([{"containerID": 0, "hostID": TRIAL_ID, "size": 65536}]);
        linux["uidMappings"] = map.clone();
        linux["gidMappings"] = map;
    }
    linux["namespaces"] = serde_json::Value::Array(namespaces);
    let bind_options = if rro {
        vec!["rbind", "rro"]
    } else {
        vec!["rbind", "ro"]
    };
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": ["/pause"],
            "env": ["PATH=/"],
            "cwd": "/",
            "noNewPrivileges": true,
        },
        "root": {"path": dir.join("rootfs"), "readonly": true},
        "hostname": "trial",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755", "size=64k"]},
            {"destination": "/mnt", "type": "bind", "source": dir.join("src"), "options": bind_options},
        ],
        "linux": linux,
    })
}

/// What the host sees of a trial container's init process.
struct PidView {
    mountinfo: String,
    uid_map: String,
}

impl PidView {
    fn read(pid: u32) -> PidView {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        PidView {
            mountinfo: fs::read_to_string(proc.join("mountinfo")).unwrap_or_default(),
            uid_map: fs::read_to_string(proc.join("uid_map")).unwrap_or_default(),
        }
    }

    /// Whether the process sees a mount at `point`.
    fn has_mount(&self, point: &str) -> bool {
        self.mountinfo
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(point))
    }

    /// Whether the mount at `point` (as the process sees it) has the per-mount `ro` flag.
    fn mount_read_only(&self, point: &str) -> bool {
        self.mountinfo
            .lines()
            .rfind(|l| l.split(' ').nth(4) == Some(point))
            .and_then(|l| l.split(' ').nth(5))
            .is_some_and(|opts| opts.split(',').any(|o| o == "ro"))
    }

    /// Whether the process's user namespace maps its root to `host`.
    fn maps_root_to(&self, host: u32) -> bool {
        self.uid_map.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"0") && f.get(1).and_then(|h| h.parse::<u32>().ok()) == Some(host)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_read() {
        let view = PidView {
            mountinfo: "20 1 0:5 / / ro,relatime - overlay o rw\n\
                        21 20 0:6 /src /mnt ro,nosuid - ext4 /dev/vda rw\n\
                        22 20 0:7 / /tmp rw - tmpfs t rw\n"
                .into(),
            uid_map: "         0    1048576      65536\n".into(),
        };
        assert!(view.mount_read_only("/mnt"));
        assert!(!view.mount_read_only("/tmp"));
        assert!(!view.mount_read_only("/absent"));
        assert!(view.has_mount("/mnt") && !view.has_mount("/absent"));
        assert!(view.maps_root_to(1 << 20));
        assert!(!view.maps_root_to(0));
        let host = PidView {
            mountinfo: String::new(),
            uid_map: "0 0 4294967295\n".into(),
        };
        assert!(!host.maps_root_to(1 << 20));
    }

    #[test]
    fn the_spec_asks_only_for_what_is_tried() {
        let dir = Path::new("/t");
        let plain = spec(dir, false, false, "x");
        assert_eq!(
            plain["mounts"][2]["options"],
            serde_json::json!(["rbind", "ro"])
        );
        assert!(plain["linux"].get("uidMappings").is_none());
        let both = spec(dir, true, true, "x");
        assert_eq!(
            both["mounts"][2]["options"],
            serde_json::json!(["rbind", "rro"])
        );
        assert_eq!(both["linux"]["uidMappings"][0]["hostID"], 1 << 20);
        assert_eq!(both["root"]["path"], "/t/rootfs");
        assert_eq!(both["linux"]["cgroupsPath"], "/x");
    }
}
