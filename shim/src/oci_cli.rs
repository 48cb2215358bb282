//! Containers run by an OCI runtime's command line (runc, crun, runsc) instead of
//! libcontainer, in `crius-shim-helper` processes like the libcontainer calls ([`crate::libct`]).
//!
//! Each operation runs the runtime once and waits for it:
//!
//! | operation | command line |
//! |---|---|
//! | create | `<rt> [options] --root R --log L --log-format json create --bundle B --pid-file P [--console-socket S] ID` |
//! | start | `... start ID` |
//! | kill (every process) | `... kill --all ID SIGNAL` |
//! | delete | `... delete --force ID` (nothing to do when `R/ID` does not exist) |
//! | exec | `... exec --process J --pid-file P --detach [--console-socket S] ID` |
//! | wait | `... wait ID`, which prints `{"id":..,"exitStatus":N}` when the process ends |
//! | checkpoint | `... checkpoint --leave-running --image-path I --work-path W ID` |
//! | restore | `... restore --detach --bundle B --image-path I --work-path W --pid-file P [--console-socket S] ID` |
//!
//! The container's stdin, stdout and stderr are the runtime's own (the runtime hands them on
//! to the container's process), `/dev/null` where the shim gave none. The runtime's messages go
//! to its `--log` file, from which the last error becomes the helper's error.
//!
//! The processes a create or an exec makes outlive the runtime: when it exits they are
//! re-parented to the shim, the child subreaper, which reaps them as it reaps libcontainer's.
//! A sandboxed runtime (gVisor) runs every container of a pod inside one sandbox process and
//! writes that process's pid for each of them: the shim sees it share the sandbox's pid and
//! learns of the container's exit from a `wait` helper instead.
//!
//! A terminal's master arrives on a console socket the helper listens on. Socket addresses
//! hold at most 108 bytes and state paths are longer, so the runtime is given the socket's
//! path through a descriptor of its directory: `/proc/self/fd/<n>/console.sock`.

use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::helper::OciCommand;
use crate::libct::{chain, receive_master, CONSOLE_SOCKET};

/// The descriptors a container's (or exec's) process gets, and where to listen for the
/// terminal's master when it has one.
pub struct ProcessStdio {
    pub stdio: [Option<OwnedFd>; 3],
    /// For a terminal: the directory for the console socket.
    pub console_dir: Option<PathBuf>,
}

/// One run of the runtime for container `id`, its state under `root`.
struct Run<'a> {
    rt: &'a OciCommand,
    root: &'a Path,
    id: &'a str,
    /// The criu binary the runtime is to run (as `criu` from `$PATH`: its directory goes
    /// first there), when not the one in `$PATH`.
    criu: Option<&'a Path>,
}

impl<'a> Run<'a> {
    /// A run with no criu of its own: the runtime finds `criu` in `$PATH` if it needs one.
    fn plain(rt: &'a OciCommand, root: &'a Path, id: &'a str) -> Run<'a> {
        Run {
            rt,
            root,
            id,
            criu: None,
        }
    }

    /// The runtime's log for this run: beside the container's state directory, not in it
    /// (the runtime makes that one and refuses a create if it exists).
    fn log_path(&self, op: &str) -> PathBuf {
        self.root
            .join(format!("{}.{op}.{}.log", self.id, std::process::id()))
    }

    /// Runs `<rt> [options] --root R --log L --log-format json <args>` with `stdio`; an error
    /// carries the runtime's last logged error, else its exit status.
    /// `<lead...> --pid-file <root>/<id>.pid [--console-socket S] <id>` (`create` or
    /// `restore`): the new init's pid and, with a terminal, the pty master. A failed run
    /// leaves no pid file.
    fn launch(
        &self,
        op: &str,
        lead: &[&OsStr],
        stdio: ProcessStdio,
    ) -> Result<(i32, Option<OwnedFd>), String> {
        let pid_file = self.root.join(format!("{}.pid", self.id));
        let console = stdio
            .console_dir
            .as_deref()
            .map(Console::listen)
            .transpose()?;
        let console_path = console.as_ref().map(Console::path);
        let mut args: Vec<&OsStr> = lead.to_vec();
        args.extend::<[&OsStr; 2]>(["--pid-file".as_ref(), pid_file.as_os_str()]);
        if let Some(path) = &console_path {
            args.extend::<[&OsStr; 2]>(["--console-socket".as_ref(), path.as_ref()]);
        }
        args.push(self.id.as_ref());
        if let Err(e) = self.run(op, &args, stdio.stdio) {
            let _ = fs::remove_file(&pid_file);
            return Err(e);
        }
        let pid = read_pid(&pid_file)?;
        let master = console.map(Console::master).transpose()?;
        Ok((pid, master))
    }

    fn run(&self, op: &str, args: &[&OsStr], stdio: [Option<OwnedFd>; 3]) -> Result<(), String> {
        let log = self.log_path(op);
        let mut cmd = Command::new(&self.rt.binary);
        cmd.args(&self.rt.options)
            .arg("--root")
            .arg(self.root)
            .arg("--log")
            .arg(&log)
            .arg("--log-format")
            .arg("json")
            .args(args);
        if let Some(dir) = self.criu.and_then(Path::parent) {
            let mut path = std::ffi::OsString::from(dir);
            path.push(":");
            path.push(std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin".into()));
            cmd.env("PATH", path);
        }
        let [stdin, stdout, stderr] = stdio;
        // Not /dev/null: crun 1.8 (Debian 12's) hands a user-namespaced container its stdio
        // chowned to the container's root, and fchown on /dev/null changes the node's
        // /dev/null. A pipe already at its end reads the same.
        let stdin = match stdin {
            Some(fd) => Stdio::from(fd),
            None => Stdio::from(empty_pipe().map_err(|e| chain("stdin pipe", &e))?),
        };
        cmd.stdin(stdin)
            .stdout(stdout.map_or_else(Stdio::null, Stdio::from))
            .stderr(stderr.map_or_else(Stdio::null, Stdio::from));
        let name = self.rt.binary.display();
        let status = cmd
            .status()
            .map_err(|e| chain(&format!("run {name} {op}"), &e));
        let logged = fs::read_to_string(&log).unwrap_or_default();
        let _ = fs::remove_file(&log);
        let status = status?;
        if status.success() {
            return Ok(());
        }
        Err(match last_error(&logged) {
            Some(message) => format!("{name} {op}: {message}"),
            None => format!("{name} {op}: {status}"),
        })
    }
}

/// The message of the last error-level line of a runtime's JSON log (runc and crun write
/// `{"level":"error","msg":"..."}`), or of its last line of any kind.
fn last_error(log: &str) -> Option<String> {
    let mut last = None;
    let mut last_error = None;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => {
                let msg = v.get("msg").and_then(|m| m.as_str()).unwrap_or(line);
                let level = v.get("level").and_then(|l| l.as_str()).unwrap_or("");
                if matches!(level, "error" | "fatal" | "panic") {
                    last_error = Some(msg.to_owned());
                }
                last = Some(msg.to_owned());
            }
            Err(_) => last = Some(line.to_owned()),
        }
    }
    last_error.or(last).map(|m| {
        let m = m.trim();
        match m.char_indices().nth(2048) {
            Some((cut, _)) => format!("{}...", &m[..cut]),
            None => m.to_owned(),
        }
    })
}

/// A console socket the runtime can reach by a short path, and the descriptor of its
/// directory that the path goes through (inherited by the runtime).
struct Console {
    listener: UnixListener,
    dir: OwnedFd,
}

impl Console {
    fn listen(dir: &Path) -> Result<Console, String> {
        let listener = crate::libct::bind_console(dir)?;
        let dir = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)
            .map_err(|e| chain("open console dir", &e))?;
        let dir = OwnedFd::from(dir);
        // The runtime must inherit it: clear close-on-exec.
        // SAFETY: F_SETFD on a descriptor we own.
        if unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_SETFD, 0) } < 0 {
            return Err(chain(
                "console dir descriptor",
                &std::io::Error::last_os_error(),
            ));
        }
        Ok(Console { listener, dir })
    }

    fn path(&self) -> String {
        format!("/proc/self/fd/{}/{CONSOLE_SOCKET}", self.dir.as_raw_fd())
    }

    fn master(self) -> Result<OwnedFd, String> {
        let master = receive_master(&self.listener);
        drop(self.dir);
        master
    }
}

/// The pid a runtime wrote to `path`.
fn read_pid(path: &Path) -> Result<i32, String> {
    let text = fs::read_to_string(path).map_err(|e| chain("read pid file", &e))?;
    let _ = fs::remove_file(path);
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("pid file {}: not a pid: {:?}", path.display(), text.trim()))
}

/// `create`: returns the container init's pid and, with a terminal, the pty master.
pub fn create(
    rt: &OciCommand,
    root: &Path,
    id: &str,
    bundle: &Path,
    stdio: ProcessStdio,
) -> Result<(i32, Option<OwnedFd>), String> {
    let run = Run::plain(rt, root, id);
    run.launch(
        "create",
        &["create".as_ref(), "--bundle".as_ref(), bundle.as_os_str()],
        stdio,
    )
}

/// `start`: the created container's process runs. `stdio` is the container's (gVisor gives a
/// container that joins a sandbox the stdio of its start; runc ignores it).
pub fn start(
    rt: &OciCommand,
    root: &Path,
    id: &str,
    stdio: [Option<OwnedFd>; 3],
) -> Result<(), String> {
    Run::plain(rt, root, id).run("start", &["start".as_ref(), id.as_ref()], stdio)
}

/// `kill --all`: `signal` to every process of the container.
pub fn kill_all(rt: &OciCommand, root: &Path, id: &str, signal: i32) -> Result<(), String> {
    let signal = signal.to_string();
    Run::plain(rt, root, id).run(
        "kill",
        &[
            "kill".as_ref(),
            "--all".as_ref(),
            id.as_ref(),
            signal.as_ref(),
        ],
        [None, None, None],
    )
}

/// `delete --force`: the container's processes, cgroup and state gone. A container the
/// runtime has no state of is already deleted.
pub fn delete(rt: &OciCommand, root: &Path, id: &str) -> Result<(), String> {
    if !root.join(id).exists() {
        return Ok(());
    }
    Run::plain(rt, root, id).run(
        "delete",
        &["delete".as_ref(), "--force".as_ref(), id.as_ref()],
        [None, None, None],
    )
}

/// `wait`: blocks until the container's process exits; returns its exit code (128 + the
/// signal for a process a signal ended). gVisor's `runsc wait` prints
/// `{"id":..,"exitStatus":N}`.
pub fn wait(rt: &OciCommand, root: &Path, id: &str) -> Result<i32, String> {
    let out_path = root.join(format!("{id}.wait.{}.out", std::process::id()));
    let out = fs::File::create(&out_path).map_err(|e| chain("wait output file", &e))?;
    let run = Run::plain(rt, root, id).run(
        "wait",
        &["wait".as_ref(), id.as_ref()],
        [None, Some(OwnedFd::from(out)), None],
    );
    let printed = fs::read_to_string(&out_path).unwrap_or_default();
    let _ = fs::remove_file(&out_path);
    run?;
    exit_status_of(&printed).ok_or_else(|| {
        format!(
            "{} wait: no exit status in {printed:?}",
            rt.binary.display()
        )
    })
}

/// The `exitStatus` of a `wait` result.
fn exit_status_of(printed: &str) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_str(printed.trim()).ok()?;
    i32::try_from(v.get("exitStatus")?.as_i64()?).ok()
}

/// `exec --detach`: the process of the OCI `process` JSON in the running container; returns
/// its pid and, with a terminal, the pty master.
pub fn exec(
    rt: &OciCommand,
    root: &Path,
    id: &str,
    process: &Path,
    stdio: ProcessStdio,
) -> Result<(i32, Option<OwnedFd>), String> {
    let run = Run::plain(rt, root, id);
    let pid_file = root.join(format!("{id}.exec.{}.pid", std::process::id()));
    let console = stdio
        .console_dir
        .as_deref()
        .map(Console::listen)
        .transpose()?;
    let console_path = console.as_ref().map(Console::path);
    let mut args: Vec<&OsStr> = vec![
        "exec".as_ref(),
        "--process".as_ref(),
        process.as_os_str(),
        "--pid-file".as_ref(),
        pid_file.as_os_str(),
        "--detach".as_ref(),
    ];
    if let Some(path) = &console_path {
        args.extend::<[&OsStr; 2]>(["--console-socket".as_ref(), path.as_ref()]);
    }
    args.push(id.as_ref());
    let ran = run.run("exec", &args, stdio.stdio);
    if ran.is_err() {
        let _ = fs::remove_file(&pid_file);
    }
    ran?;
    let pid = read_pid(&pid_file)?;
    let master = console.map(Console::master).transpose()?;
    Ok((pid, master))
}

/// `checkpoint --leave-running`: the container's processes dumped by CRIU into `image_path`
/// (the runtime runs `criu` from `$PATH`), CRIU's log in `work_path`; they go on running.
pub fn checkpoint(
    rt: &OciCommand,
    root: &Path,
    id: &str,
    image_path: &Path,
    work_path: &Path,
) -> Result<(), String> {
    Run::plain(rt, root, id).run(
        "checkpoint",
        &[
            "checkpoint".as_ref(),
            "--leave-running".as_ref(),
            "--image-path".as_ref(),
            image_path.as_os_str(),
            "--work-path".as_ref(),
            work_path.as_os_str(),
            id.as_ref(),
        ],
        [None, None, None],
    )
}

/// What a restore makes its container from.
#[derive(Clone, Copy)]
pub struct RestoreFrom<'a> {
    /// The OCI bundle.
    pub bundle: &'a Path,
    /// CRIU's images.
    pub image_path: &'a Path,
    /// Where CRIU writes its log.
    pub work_path: &'a Path,
    /// The criu binary, when not `criu` in `$PATH`.
    pub criu: Option<&'a Path>,
}

/// `restore --detach`: the container made from `bundle` by restoring the CRIU images in
/// `image_path`, in place of `create`. The restored processes get the runtime's stdio for the
/// pipes they had (runc and crun pass them to CRIU as inherited descriptors). Whether they
/// run at once or wait stopped is CRIU's choice from the configuration file the spec's
/// `org.criu.config` annotation names (crius writes `leave-stopped` there, so a restored
/// container does not run before its start). Returns the init's pid and, with a terminal,
/// the pty master.
pub fn restore(
    rt: &OciCommand,
    root: &Path,
    id: &str,
    from: &RestoreFrom<'_>,
    stdio: ProcessStdio,
) -> Result<(i32, Option<OwnedFd>), String> {
    let RestoreFrom {
        bundle,
        image_path,
        work_path,
        criu,
    } = *from;
    let run = Run { rt, root, id, criu };
    let lead: [&OsStr; 8] = [
        "restore".as_ref(),
        "--detach".as_ref(),
        "--bundle".as_ref(),
        bundle.as_os_str(),
        "--image-path".as_ref(),
        image_path.as_os_str(),
        "--work-path".as_ref(),
        work_path.as_os_str(),
    ];
    run.launch("restore", &lead, stdio).map_err(|e| {
        let criu = criu_errors(&work_path.join("restore.log"));
        match criu.is_empty() {
            true => e,
            false => format!("{e} (criu: {criu})"),
        }
    })
}

/// The last few errors of a CRIU log, `; `-joined (without the one about raising its own
/// RLIMIT_NOFILE, which it reports without harm where it may not).
pub fn criu_errors(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error (") && !l.contains("RLIMIT_NOFILE"))
        .map(str::trim)
        .collect();
    let joined = errors[errors.len().saturating_sub(3)..].join("; ");
    match joined.char_indices().nth(2048) {
        Some((cut, _)) => format!("{}...", &joined[..cut]),
        None => joined,
    }
}

/// Whether `process` (an OCI process JSON) asks for a terminal.
pub fn wants_terminal(process: &Path) -> Result<bool, String> {
    let text = fs::read_to_string(process).map_err(|e| chain("read process", &e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| chain("parse process", &e))?;
    Ok(v.get("terminal").and_then(|t| t.as_bool()).unwrap_or(false))
}

/// The read end of a pipe whose write end is closed: reads end at once, as from /dev/null.
fn empty_pipe() -> std::io::Result<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    drop(write);
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_of_a_json_log_is_the_message() {
        let log = r#"{"level":"info","msg":"starting"}
{"level":"error","msg":"container_linux.go: starting container process caused: exec: \"nope\": executable file not found in $PATH","time":"x"}
{"level":"info","msg":"cleanup"}
"#;
        assert_eq!(
            last_error(log).as_deref(),
            Some("container_linux.go: starting container process caused: exec: \"nope\": executable file not found in $PATH")
        );
        assert_eq!(last_error("plain text\n").as_deref(), Some("plain text"));
        assert_eq!(last_error(""), None);
        let long = format!("{{\"level\":\"error\",\"msg\":\"{}\"}}", "x".repeat(5000));
        assert!(last_error(&long).unwrap().len() < 2100);
    }
}
