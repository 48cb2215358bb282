//! Fixtures for the shim tests: a pod (a real `crius-shim` in a temp state dir) and OCI bundles
//! over a busybox rootfs. Everything they create carries "crius" in its name and is removed in
//! `Drop`, also when a test fails half-way.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crius_api::shim::{Client, CreateContainer};
use oci_spec::runtime::{
    HookBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, MountBuilder, ProcessBuilder,
    RootBuilder, Spec,
};

pub const SHIM: &str = env!("CARGO_BIN_EXE_crius-shim");

/// The `crius-shim` pods run: `CRIUS_SHIM_BIN` if set (to compare two builds with
/// `tests/measure.rs`), else this package's; its helper is the file next to it.
pub fn shim_bin() -> PathBuf {
    std::env::var_os("CRIUS_SHIM_BIN").map_or_else(|| PathBuf::from(SHIM), PathBuf::from)
}

/// Parent cgroup of every test container, as `/crius-test/<id>`.
pub const CGROUP_PARENT: &str = "crius-test";

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A pod: its temp dir, its shim, and what to clean up.
pub struct Pod {
    pub id: String,
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub shim_pid: i32,
    containers: Mutex<BTreeSet<String>>,
    pids: Mutex<Vec<i32>>,
}

impl Pod {
    /// Start a shim for a pod named after the test, logging at debug level.
    pub fn start(name: &str) -> Pod {
        Pod::start_logging(name, "debug")
    }

    /// Start a shim for a pod named after the test, logging at `level`.
    pub fn start_logging(name: &str, level: &str) -> Pod {
        Pod::start_with(name, level, &[])
    }

    /// Start a shim with extra command-line arguments.
    pub fn start_with(name: &str, level: &str, extra: &[&str]) -> Pod {
        let id = format!("crius-{name}");
        let dir = tempfile::Builder::new()
            .prefix(&format!("crius-shim-{name}-"))
            .tempdir_in("/tmp")
            .unwrap();
        let state = dir.path().join("shims").join(&id);
        let out = Command::new(shim_bin())
            .args(["--id", &id, "--state-dir"])
            .arg(&state)
            .args(extra)
            .env("CRIUS_SHIM_LOG", level)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "shim failed to start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let shim_pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        Pod {
            id,
            dir,
            state,
            shim_pid,
            containers: Mutex::new(BTreeSet::new()),
            pids: Mutex::new(Vec::new()),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.state.join(crius_api::shim::CONTROL_SOCKET)
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.socket()).await.unwrap()
    }

    /// A bundle for container `name` running `args` in a busybox rootfs.
    pub fn bundle(&self, name: &str, args: &[&str]) -> Bundle {
        let id = format!("{}-{name}", self.id);
        self.containers.lock().unwrap().insert(id.clone());
        Bundle::busybox(self.dir.path(), &id, args)
    }

    /// Remember a pid to kill on drop.
    pub fn track(&self, pid: i32) {
        self.pids.lock().unwrap().push(pid);
    }

    /// Create and start `bundle`'s container; its init's pid, killed on drop.
    pub async fn run(&self, client: &Client, bundle: &Bundle) -> i32 {
        let pid = client
            .create_container(self.create_request(bundle))
            .await
            .unwrap();
        self.track(pid);
        client.start(&bundle.id).await.unwrap();
        pid
    }

    /// The create request for a bundle, logging to `<dir>/<id>.log`.
    pub fn create_request(&self, bundle: &Bundle) -> CreateContainer {
        CreateContainer {
            id: bundle.id.clone(),
            bundle: bundle.path.clone(),
            stdin: false,
            stdin_once: false,
            tty: false,
            log_path: Some(self.log_path(&bundle.id)),
            runtime: None,
            restore: None,
        }
    }

    pub fn log_path(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.log"))
    }

    pub fn shim_alive(&self) -> bool {
        alive(self.shim_pid)
    }

    pub fn shim_log(&self) -> String {
        fs::read_to_string(self.state.join("shim.log")).unwrap_or_default()
    }
}

pub fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0); look at its state too.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Wait until `cond` holds, at most `limit`.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid we started (directly or through the shim).
    unsafe { libc::kill(pid, sig) };
}

/// Every cgroup directory of `rel` (e.g. `crius-test/x`) over all mounted hierarchies.
fn cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir("/sys/fs/cgroup") {
        for e in entries.flatten() {
            let p = e.path().join(rel);
            if p.is_dir() {
                out.push(p);
            }
        }
    }
    let p = Path::new("/sys/fs/cgroup").join(rel);
    if p.is_dir() {
        out.push(p);
    }
    out
}

fn remove_cgroup(rel: &str) {
    for dir in cgroup_dirs(rel) {
        for _ in 0..50 {
            for procs in ["cgroup.procs", "tasks"] {
                if let Ok(text) = fs::read_to_string(dir.join(procs)) {
                    for pid in text.lines().filter_map(|l| l.trim().parse().ok()) {
                        kill(pid, libc::SIGKILL);
                    }
                }
            }
            // Thaw a frozen v1 cgroup so SIGKILL can land.
            let _ = fs::write(dir.join("freezer.state"), "THAWED");
            if fs::remove_dir(&dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("CRIUS_SHIM_TEST_LOG").is_some() {
            eprintln!("--- shim log of {} ---\n{}", self.id, self.shim_log());
        }
        kill(self.shim_pid, libc::SIGKILL);
        for pid in self.pids.lock().unwrap().iter() {
            kill(*pid, libc::SIGKILL);
        }
        for id in self.containers.lock().unwrap().iter() {
            remove_cgroup(&format!("{CGROUP_PARENT}/{id}"));
        }
        // The shared parent goes when the last test using it is done.
        for dir in cgroup_dirs(CGROUP_PARENT) {
            let _ = fs::remove_dir(dir);
        }
        // Mounts a test made under its dir (the container's own mounts live in its namespace).
        if let Ok(info) = fs::read_to_string("/proc/self/mountinfo") {
            let base = self.dir.path().to_string_lossy().to_string();
            let mut points: Vec<&str> = info
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(&base))
                .collect();
            points.sort();
            for p in points.iter().rev() {
                let c = std::ffi::CString::new(*p).unwrap();
                // SAFETY: umount2 of a path string we own.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// An OCI bundle in `<base>/bundles/<id>`.
pub struct Bundle {
    pub id: String,
    pub path: PathBuf,
    pub spec: Spec,
}

impl Bundle {
    /// rootfs with `/bin/busybox` and its applet links; the process runs `args`.
    pub fn busybox(base: &Path, id: &str, args: &[&str]) -> Bundle {
        let path = base.join("bundles").join(id);
        let rootfs = path.join("rootfs");
        fs::create_dir_all(rootfs.join("bin")).unwrap();
        for d in ["proc", "dev", "sys", "tmp", "etc"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for applet in [
            "sh", "echo", "sleep", "cat", "true", "false", "ls", "ps", "head", "tr", "test", "yes",
        ] {
            symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let mut spec = Spec::default();
        spec.set_hostname(Some("crius-test".into()));
        spec.set_root(Some(
            RootBuilder::default()
                .path("rootfs")
                .readonly(false)
                .build()
                .unwrap(),
        ));
        let process = ProcessBuilder::default()
            .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .env(vec!["PATH=/bin".to_string()])
            .cwd("/")
            .terminal(false)
            .build()
            .unwrap();
        spec.set_process(Some(process));
        let namespaces = [
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Ipc,
            LinuxNamespaceType::Uts,
            LinuxNamespaceType::Mount,
            LinuxNamespaceType::Network,
        ]
        .into_iter()
        .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build().unwrap())
        .collect::<Vec<_>>();
        let mut linux = spec.linux().clone().unwrap_or_default();
        linux.set_namespaces(Some(namespaces));
        linux.set_cgroups_path(Some(PathBuf::from(format!("/{CGROUP_PARENT}/{id}"))));
        spec.set_linux(Some(linux));
        let bundle = Bundle {
            id: id.to_owned(),
            path,
            spec,
        };
        bundle.save();
        bundle
    }

    pub fn save(&self) {
        self.spec.save(self.path.join("config.json")).unwrap();
    }

    pub fn rootfs(&self) -> PathBuf {
        self.path.join("rootfs")
    }

    pub fn set_terminal(&mut self, on: bool) {
        let mut process = self.spec.process().clone().unwrap();
        process.set_terminal(Some(on));
        self.spec.set_process(Some(process));
        self.save();
    }

    /// Bind-mount `source` read-only at `dest` in the container.
    pub fn add_ro_bind(&mut self, source: &Path, dest: &str) {
        let mut mounts = self.spec.mounts().clone().unwrap_or_default();
        mounts.push(
            MountBuilder::default()
                .destination(dest)
                .typ("bind")
                .source(source)
                .options(vec!["rbind".to_string(), "ro".to_string()])
                .build()
                .unwrap(),
        );
        self.spec.set_mounts(Some(mounts));
        self.save();
    }

    /// Join the pid namespace of `pid` instead of a new one.
    pub fn join_pid_ns(&mut self, pid: i32) {
        let mut linux = self.spec.linux().clone().unwrap();
        let namespaces = linux
            .namespaces()
            .clone()
            .unwrap()
            .into_iter()
            .map(|mut ns| {
                if ns.typ() == LinuxNamespaceType::Pid {
                    ns.set_path(Some(PathBuf::from(format!("/proc/{pid}/ns/pid"))));
                }
                ns
            })
            .collect();
        linux.set_namespaces(Some(namespaces));
        self.spec.set_linux(Some(linux));
        self.save();
    }

    /// Add a `poststart` or `poststop` hook running `sh -c <script>` in the runtime namespace.
    pub fn add_hook(&mut self, kind: &str, script: &str) {
        let hook = HookBuilder::default()
            .path("/bin/sh")
            .args(vec!["sh".to_string(), "-c".to_string(), script.to_string()])
            .build()
            .unwrap();
        let mut hooks = self.spec.hooks().clone().unwrap_or_default();
        match kind {
            "poststart" => hooks.set_poststart(Some(vec![hook])),
            "poststop" => hooks.set_poststop(Some(vec![hook])),
            other => panic!("no {other} hooks in these tests"),
        };
        self.spec.set_hooks(Some(hooks));
        self.save();
    }

    /// Limit memory (bytes).
    pub fn set_memory_limit(&mut self, bytes: i64) {
        let mut linux = self.spec.linux().clone().unwrap();
        let mut resources = linux.resources().clone().unwrap_or_default();
        resources.set_memory(Some(
            oci_spec::runtime::LinuxMemoryBuilder::default()
                .limit(bytes)
                .build()
                .unwrap(),
        ));
        linux.set_resources(Some(resources));
        self.spec.set_linux(Some(linux));
        self.save();
    }
}

/// A `--helper` for a shim that notes each operation it is run for, then runs the real
/// `crius-shim-helper` (with the descriptors the shim gave it).
pub struct RecordingHelper {
    dir: tempfile::TempDir,
}

impl RecordingHelper {
    pub fn new() -> RecordingHelper {
        let dir = tempfile::Builder::new()
            .prefix("crius-shim-helper-")
            .tempdir_in("/tmp")
            .unwrap();
        let real = shim_bin().with_file_name("crius-shim-helper");
        let script = format!(
            "#!/bin/sh\necho \"$1\" >> '{}'\nexec '{}' \"$@\"\n",
            dir.path().join("ops").display(),
            real.display()
        );
        let path = dir.path().join("helper");
        fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        RecordingHelper { dir }
    }

    /// The script, for `--helper`.
    pub fn path(&self) -> String {
        self.dir
            .path()
            .join("helper")
            .to_string_lossy()
            .into_owned()
    }

    /// The operations run so far, in order.
    pub fn ops(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("ops"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The directories of cgroup `rel` (e.g. `crius-test/x`) that exist in any hierarchy.
pub fn existing_cgroups(rel: &str) -> Vec<PathBuf> {
    cgroup_dirs(rel)
}

/// CRI log lines as (stream, tag, content), checking the timestamp format on the way.
pub fn parse_log(path: &Path) -> Vec<(String, String, String)> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let ts = parts.next().unwrap();
            assert_eq!(ts.len(), 30, "timestamp {ts:?} in {line:?}");
            assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts:?}");
            let stream = parts.next().unwrap().to_owned();
            let tag = parts.next().unwrap().to_owned();
            let content = parts.next().unwrap_or("").to_owned();
            (stream, tag, content)
        })
        .collect()
}

/// Use a ProcessBuilder-made OCI process as exec JSON.
pub fn exec_process(args: &[&str]) -> serde_json::Value {
    let process = ProcessBuilder::default()
        .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .env(vec!["PATH=/bin".to_string()])
        .cwd("/")
        .terminal(false)
        .build()
        .unwrap();
    serde_json::to_value(process).unwrap()
}

/// ExecLimits for readability.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
