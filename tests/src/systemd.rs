//! A real systemd for the systemd cgroup driver's tests, on a machine whose init is not systemd.
//!
//! Debian's systemd runs here as a *user manager* (`systemd --user`, as root): the same binary,
//! D-Bus API (`org.freedesktop.systemd1`) and unit and cgroup code as PID 1, answering on its
//! private socket (`$XDG_RUNTIME_DIR/systemd/private`). A system manager would have to be PID 1
//! of a new PID namespace, where the PIDs crius hands it (host PIDs of containers) mean nothing;
//! a user manager sees the host's PIDs.
//!
//! Its surroundings are made for it: a cgroup of its own, `/crius-systemd-<pid>-<n>` in every
//! hierarchy, which becomes its root (every unit's cgroup is below it, so crius must find that
//! root, as on a host whose systemd runs in a container); a private mount namespace whose `/run`
//! is a fresh tmpfs holding `/run/systemd/system` (a user manager refuses to start unless the
//! system was "booted with systemd"); and a unit path with only two units of the fixture's own
//! (no host unit is ever started). Drop kills it, kills whatever is still in its cgroups and
//! removes them; its mount namespace dies with it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::process::{kill_and_reap, log_tail, spawn_logged};
use crate::{Error, Result, TestDir};

/// Debian's systemd binary (package `systemd`).
pub const SYSTEMD_BIN: &str = "/lib/systemd/systemd";

/// How long the manager gets to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// A running systemd user manager, started by [`Systemd::start`].
#[derive(Debug)]
pub struct Systemd {
    child: Option<Child>,
    /// Its root cgroup, e.g. `/crius-systemd-1234-0`.
    cgroup: String,
    dir: TestDir,
}

impl Systemd {
    /// Starts the manager and waits until it has reached its target.
    pub fn start() -> Result<Systemd> {
        if !Path::new(SYSTEMD_BIN).exists() {
            return Err(Error::MissingProgram {
                program: "systemd",
                package: "systemd",
            });
        }
        let dir = TestDir::new("systemd")?;
        let units = dir.join("units");
        let xdg = dir.join("xdg");
        for d in [&units, &xdg] {
            std::fs::create_dir(d).map_err(|source| Error::io("create dir", d, source))?;
        }
        write(
            &units.join("crius-test.target"),
            "[Unit]\nDescription=crius test target\n",
        )?;
        // SIGTERM makes a user manager start exit.target, and exit when it is done.
        write(
            &units.join("exit.target"),
            "[Unit]\nDescription=Exit\nDefaultDependencies=no\nSuccessAction=exit-force\n",
        )?;

        let cgroup = format!(
            "/crius-systemd-{}-{}",
            std::process::id(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        );
        let mut fixture = Systemd {
            child: None,
            cgroup,
            dir,
        };
        let procs = fixture.make_cgroups()?;

        let script = format!(
            "set -e\n\
             for f in {procs}; do echo $$ > \"$f\"; done\n\
             mount -t tmpfs -o mode=755 crius-systemd-run /run\n\
             mkdir -p /run/systemd/system\n\
             exec {SYSTEMD_BIN} --user --unit=crius-test.target --log-target=console --log-level=info\n",
            procs = procs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
            .arg(script)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", fixture.dir.path())
            .env("XDG_RUNTIME_DIR", &xdg)
            .env("SYSTEMD_UNIT_PATH", &units);
        fixture.child = Some(spawn_logged(command, "systemd", &fixture.log_path())?);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = fixture.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(fixture.start_error(format!("exited with {status}")));
                }
            }
            if fixture
                .show("crius-test.target", &["ActiveState"])
                .is_ok_and(|p| p.get("ActiveState").is_some_and(|s| s == "active"))
            {
                return Ok(fixture);
            }
            if Instant::now() >= deadline {
                return Err(fixture.start_error(format!("not up within {START_TIMEOUT:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The manager's private D-Bus socket (crius's `[cgroup] systemd_socket`).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("xdg/systemd/private")
    }

    /// The manager's root cgroup (`/crius-systemd-…`): every unit's cgroup is below it.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup
    }

    /// What the manager printed.
    pub fn log(&self) -> String {
        log_tail(&self.log_path())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("systemd.log")
    }

    /// `systemctl --user show UNIT -p P…` against this manager: the properties asked for.
    pub fn show(&self, unit: &str, props: &[&str]) -> Result<HashMap<String, String>> {
        let mut command = self.systemctl();
        command.args(["show", unit]);
        for p in props {
            command.args(["-p", p]);
        }
        let out = command
            .output()
            .map_err(|source| Error::io("run systemctl show", unit, source))?;
        if !out.status.success() {
            return Err(Error::io(
                format!(
                    "systemctl show: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                unit,
                std::io::Error::other("systemctl failed"),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// A `systemctl --user` command that talks to this manager.
    pub fn systemctl(&self) -> Command {
        let mut command = Command::new("systemctl");
        command
            .args(["--user", "--no-pager"])
            .env("XDG_RUNTIME_DIR", self.dir.join("xdg"));
        command
    }

    fn start_error(&self, reason: String) -> Error {
        Error::Start {
            name: "systemd",
            reason,
            log: self.log(),
        }
    }

    /// Creates the manager's cgroup in every hierarchy; returns their `cgroup.procs` files.
    fn make_cgroups(&self) -> Result<Vec<PathBuf>> {
        let mut procs = Vec::new();
        for h in hierarchies() {
            let dir = h.join(self.cgroup.trim_start_matches('/'));
            std::fs::create_dir_all(&dir)
                .map_err(|source| Error::io("create cgroup", &dir, source))?;
            // A new v1 cpuset has no CPUs and takes no process until it is given some.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let own = dir.join(f);
                if own.exists() && std::fs::read_to_string(&own).is_ok_and(|s| s.trim().is_empty())
                {
                    let parent = std::fs::read_to_string(h.join(f))
                        .map_err(|source| Error::io("read", h.join(f), source))?;
                    write(&own, parent.trim())?;
                }
            }
            procs.push(dir.join("cgroup.procs"));
        }
        Ok(procs)
    }

    /// Kills what is left in the manager's cgroups and removes them, for up to 5 s.
    fn remove_cgroups(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for h in hierarchies() {
            let dir = h.join(self.cgroup.trim_start_matches('/'));
            loop {
                kill_tree(&dir);
                match remove_tree(&dir) {
                    Ok(()) => break,
                    Err(err) if Instant::now() >= deadline => {
                        eprintln!("crius-tests: remove cgroup {}: {err}", dir.display());
                        break;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

impl Drop for Systemd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Err(err) = kill_and_reap(&mut child, "systemd") {
                eprintln!("crius-tests: stop systemd: {err}");
            }
        }
        self.remove_cgroups();
        if std::thread::panicking() {
            eprintln!("--- systemd log ---\n{}", self.log());
        }
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::io("write", path, source))
}

/// Mount points of every cgroup hierarchy (v1 controllers, named ones, the v2 tree).
fn hierarchies() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let mount_point = left.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect()
}

fn kill_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            kill_tree(&e.path());
        }
    }
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
