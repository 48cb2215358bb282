#![allow(clippy::unwrap_used)]
//! The `crius` binary as an operator meets it: flags, `--help`, config errors and `crius config
//! check`, the socket claim and the orderly stop. gRPC behaviour (and `crius status`, which
//! needs a crius with pods) is tested end to end in the `tests/` crate.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_crius");

struct Dirs {
    dir: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            dir: tempfile::Builder::new()
                .prefix("crius-cli")
                .tempdir()
                .unwrap(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn socket(&self) -> PathBuf {
        self.path("run/crius.sock")
    }
    fn command(&self) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--root")
            .arg(self.path("root"))
            .arg("--state")
            .arg(self.path("state"))
            .arg("--listen")
            .arg(format!("unix://{}", self.socket().display()))
            .arg("--config")
            .arg(self.path("config.toml"));
        c
    }
    fn write_config(&self, text: &str) {
        std::fs::write(self.path("config.toml"), text).unwrap();
    }
}

impl Drop for Dirs {
    /// crius mounts its exec tmpfs at `<state>/bin` (there until reboot on a node): taken off
    /// before the directory goes, lazily, so a daemon still running does not keep it.
    fn drop(&mut self) {
        let bin = self.path("state/bin");
        if let Ok(c) = std::ffi::CString::new(bin.as_os_str().as_encoded_bytes()) {
            // SAFETY: `c` is a valid NUL-terminated path; umount2 touches nothing else.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// A started daemon, killed in Drop if the test did not stop it.
struct Daemon(Option<Child>);

impl Daemon {
    fn start(dirs: &Dirs) -> Daemon {
        let child = dirs.command().stderr(Stdio::piped()).spawn().unwrap();
        let mut d = Daemon(Some(child));
        let serving = poll(|| {
            std::fs::symlink_metadata(dirs.socket()).is_ok_and(|m| m.file_type().is_socket())
                && std::os::unix::net::UnixStream::connect(dirs.socket()).is_ok()
        });
        if !serving {
            let mut child = d.0.take().unwrap();
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "crius did not serve within 10 s; its stderr:\n{}",
                stderr(&out)
            );
        }
        d
    }
    fn signal(&self, sig: libc::c_int) {
        let pid = self.0.as_ref().unwrap().id() as libc::pid_t;
        // SAFETY: kill on the PID of a child this test spawned and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }
    fn wait(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `f` every 20 ms for up to 10 s; whether it came true.
fn poll(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn wait_for(f: impl FnMut() -> bool) {
    assert!(poll(f), "timed out");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_flag() {
    let o = Command::new(BIN).arg("--version").output().unwrap();
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("crius {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn config_default_prints_a_config_that_loads() {
    let o = Command::new(BIN)
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    for key in [
        "root =",
        "state =",
        "listen =",
        "log_level =",
        "config_path =",
        "conf_dir =",
        "bin_dirs =",
        "driver =",
        "address =",
        "port =",
    ] {
        assert!(text.contains(key), "{key} missing from the default config");
    }
    let dirs = Dirs::new();
    dirs.write_config(&text);
    let d = Daemon::start(&dirs);
    d.signal(libc::SIGTERM);
    assert!(d.wait().status.success());
}

#[test]
fn unknown_key_stops_startup_naming_file_line_and_key() {
    let dirs = Dirs::new();
    dirs.write_config("log_level = \"info\"\n[cni]\nbin_dir = [\"/x\"]\n");
    let o = dirs.command().output().unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    let want = format!(
        "{}:3: cni.bin_dir: unknown field `bin_dir`",
        dirs.path("config.toml").display()
    );
    assert!(err.contains(&want), "{err}");
    assert!(
        !dirs.socket().exists(),
        "a failed start must not leave a socket"
    );
}

#[test]
fn wrong_type_stops_startup() {
    let dirs = Dirs::new();
    dirs.write_config("[stream]\nport = \"ten\"\n");
    let o = dirs.command().output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("config.toml:2: stream.port: invalid type"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_named_config_file_must_exist() {
    let dirs = Dirs::new();
    let o = dirs.command().output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("read config"), "{}", stderr(&o));
}

#[test]
fn socket_is_0660_and_removed_on_sigterm() {
    let dirs = Dirs::new();
    dirs.write_config("");
    let d = Daemon::start(&dirs);
    let mode = std::fs::metadata(dirs.socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660);
    d.signal(libc::SIGTERM);
    let o = d.wait();
    assert!(
        o.status.success(),
        "exit on SIGTERM: {:?} {}",
        o.status,
        stderr(&o)
    );
    assert!(!dirs.socket().exists());
}

#[test]
fn sigint_also_stops_cleanly() {
    let dirs = Dirs::new();
    dirs.write_config("");
    let d = Daemon::start(&dirs);
    d.signal(libc::SIGINT);
    assert!(d.wait().status.success());
}

#[test]
fn second_crius_on_a_served_socket_refuses() {
    let dirs = Dirs::new();
    dirs.write_config("");
    let first = Daemon::start(&dirs);
    // Another root, so only the socket is shared.
    let o = Command::new(BIN)
        .arg("--root")
        .arg(dirs.path("root2"))
        .arg("--state")
        .arg(dirs.path("state2"))
        .arg("--listen")
        .arg(format!("unix://{}", dirs.socket().display()))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("another crius is already serving"), "{err}");
    assert!(err.contains(&dirs.socket().display().to_string()), "{err}");
    // The first one is unharmed.
    assert!(std::os::unix::net::UnixStream::connect(dirs.socket()).is_ok());
    drop(first);
}

#[test]
fn a_start_waits_a_moment_for_the_lock_of_a_process_about_to_let_go() {
    let dirs = Dirs::new();
    dirs.write_config("");
    std::fs::create_dir_all(dirs.socket().parent().unwrap()).unwrap();
    // The lock held for 500 ms, as a child that a killed crius was starting holds its copy
    // until it execs.
    let lock = std::fs::File::create(format!("{}.lock", dirs.socket().display())).unwrap();
    // SAFETY: flock on a descriptor this test owns; no memory is involved.
    let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0);
    let held = Duration::from_millis(500);
    let release = std::thread::spawn(move || {
        std::thread::sleep(held);
        drop(lock);
    });
    let started = Instant::now();
    let d = Daemon::start(&dirs);
    assert!(started.elapsed() >= held, "served while the lock was held");
    release.join().unwrap();
    d.signal(libc::SIGTERM);
    let out = d.wait();
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
}

#[test]
fn stale_socket_from_a_killed_crius_is_replaced() {
    let dirs = Dirs::new();
    dirs.write_config("");
    let d = Daemon::start(&dirs);
    d.signal(libc::SIGKILL);
    let _ = d.wait();
    assert!(dirs.socket().exists(), "SIGKILL leaves the socket file");
    // A child crius was forking at the kill holds the listener until it execs: only once
    // nobody listens is a connection proof that the new crius serves.
    wait_for(|| std::os::unix::net::UnixStream::connect(dirs.socket()).is_err());
    let d = Daemon::start(&dirs);
    d.signal(libc::SIGTERM);
    let out = d.wait();
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
}

#[test]
fn a_non_socket_at_the_socket_path_is_not_removed() {
    let dirs = Dirs::new();
    dirs.write_config("");
    std::fs::create_dir_all(dirs.socket().parent().unwrap()).unwrap();
    std::fs::write(dirs.socket(), "precious").unwrap();
    let o = dirs.command().output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not a socket"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(dirs.socket()).unwrap(), "precious");
}

#[test]
fn database_is_created_under_root() {
    let dirs = Dirs::new();
    dirs.write_config("");
    let d = Daemon::start(&dirs);
    // The socket is claimed before the database is opened: wait for the file, not the socket.
    assert!(poll(|| Path::new(&dirs.path("root/crius.db")).is_file()));
    d.signal(libc::SIGTERM);
    assert!(d.wait().status.success());
}

/// Runs the crius binary with `args` alone (no daemon flags).
fn crius(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_lists_the_subcommands() {
    let out = crius(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for sub in ["config", "status"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(sub)),
            "{sub} missing from:\n{help}"
        );
    }
    let help = text(&crius(&["config", "--help"]).stdout);
    for sub in ["default", "check"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(sub)),
            "config {sub} missing from:\n{help}"
        );
    }
}

#[test]
fn config_check_says_ok_or_names_the_file_line_and_key() {
    let dirs = Dirs::new();
    let config = dirs.path("config.toml");
    let config_s = config.to_str().unwrap();
    let drop_ins = dirs.path("config.d");
    std::fs::create_dir(&drop_ins).unwrap();
    std::fs::write(&config, "log_level = \"debug\"\n[stream]\nport = 10010\n").unwrap();
    std::fs::write(drop_ins.join("10-log.toml"), "log_format = \"json\"\n").unwrap();

    let out = crius(&["config", "check", config_s]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{config_s}: OK\n"));

    // The default configuration checks too: what `make install` writes is loadable.
    let default = dirs.path("default.toml");
    std::fs::write(&default, crius(&["config", "default"]).stdout).unwrap();
    let out = crius(&["config", "check", default.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // A bad key in a drop-in: named with its file and line; nothing on stdout.
    let bad = drop_ins.join("20-typo.toml");
    std::fs::write(&bad, "\n[stream]\nidle_timeout = 60\n").unwrap();
    let out = crius(&["config", "check", config_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "crius: {}:3: stream.idle_timeout: unknown field `idle_timeout`",
            bad.display()
        )),
        "{err}"
    );
    std::fs::remove_file(&bad).unwrap();

    // A value the types allow but crius does not.
    std::fs::write(&config, "root = \"var/lib/crius\"\n").unwrap();
    let out = crius(&["config", "check", config_s]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("root: must be absolute"), "{err}");

    // --config names the file when no argument does; a missing file is an error.
    let missing = dirs.path("missing.toml");
    let out = crius(&["--config", missing.to_str().unwrap(), "config", "check"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("read config {}", missing.display())),
        "{err}"
    );
}
