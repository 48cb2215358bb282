//! The calls into youki's libcontainer, made only in `crius-shim-helper` processes (see
//! [`crate::helper`]), never in the long-lived shim.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::Spec;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

/// Name of the console socket in a container's state directory (tty containers).
pub const CONSOLE_SOCKET: &str = "console.sock";

/// The descriptors a new container's init gets.
pub struct InitStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// For a tty container: the directory in which to listen for the pty master.
    pub console_dir: Option<PathBuf>,
}

/// Create a container (in a helper): returns the init's pid and, for a tty, the pty master.
pub fn create(
    id: &str,
    bundle: &Path,
    root: &Path,
    stdio: InitStdio,
) -> Result<(i32, Option<OwnedFd>), String> {
    let console = match &stdio.console_dir {
        Some(dir) => Some(bind_console(dir)?),
        None => None,
    };
    let mut builder = ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_root_path(root)
        .map_err(|e| chain("libcontainer root", &e))?
        .validate_id()
        .map_err(|e| chain("container id", &e))?;
    if let Some(fd) = stdio.stdin {
        builder = builder.with_stdin(fd);
    }
    if let Some(fd) = stdio.stdout {
        builder = builder.with_stdout(fd);
    }
    if let Some(fd) = stdio.stderr {
        builder = builder.with_stderr(fd);
    }
    let console_path = stdio.console_dir.as_ref().map(|d| d.join(CONSOLE_SOCKET));
    let container = builder
        .with_executor(Executor)
        .with_console_socket(console_path.as_deref())
        .as_init(bundle)
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(|e| chain("libcontainer create", &e))?;
    let pid = container
        .pid()
        .ok_or_else(|| "libcontainer create: no init pid in state".to_owned())?
        .as_raw();
    let master = match console {
        Some(listener) => Some(receive_master(&listener)?),
        None => None,
    };
    Ok((pid, master))
}

/// libcontainer's default executor with another check of the command before the start.
/// libcontainer's own wants the execute bit for others (`mode & 0o001`), so an image's
/// root-owned 0750 or 0700 entrypoint, which runc (and so containerd and CRI-O) runs, was
/// refused. Here any execute bit will do, as it does for root under runc; for another user
/// the kernel's `execve` decides, as under runc.
#[derive(Clone)]
struct Executor;

impl libcontainer::workload::Executor for Executor {
    fn exec(&self, spec: &Spec) -> Result<(), libcontainer::workload::ExecutorError> {
        libcontainer::workload::default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), libcontainer::workload::ExecutorValidationError> {
        use libcontainer::workload::ExecutorValidationError::ArgValidationError;
        let Some(process) = spec.process() else {
            return Err(ArgValidationError("the spec has no process".into()));
        };
        let Some(command) = process.args().as_ref().and_then(|a| a.first()) else {
            return Ok(());
        };
        let path_var = process
            .env()
            .iter()
            .flatten()
            .find_map(|e| e.strip_prefix("PATH="));
        if path_var.is_none() && !command.contains('/') {
            return Err(ArgValidationError(
                "PATH environment variable is not set".into(),
            ));
        }
        // The exec helper's lookup: a path as given, else the first executable file of that
        // name in PATH (which it has checked already).
        let not_found = || ArgValidationError(format!("executable '{command}' not found in $PATH"));
        let path = crate::exec::find_executable(command, path_var.unwrap_or_default())
            .map_err(|_| not_found())?;
        if !command.contains('/') {
            return Ok(());
        }
        let meta = std::fs::metadata(&path).map_err(|_| not_found())?;
        let runnable = meta.is_file()
            && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0;
        if !runnable {
            return Err(ArgValidationError(format!(
                "executable '{command}' at path {path:?} does not have correct permissions"
            )));
        }
        Ok(())
    }
}

/// Let a created container's init exec the user process.
pub fn start(root: &Path, id: &str) -> Result<(), String> {
    let mut container =
        Container::load(root.join(id)).map_err(|e| chain("load container state", &e))?;
    container
        .start()
        .map_err(|e| chain("libcontainer start", &e))
}

/// Signal every process in the container's cgroup.
pub fn kill_all(root: &Path, id: &str, signal: i32) -> Result<(), String> {
    let signal = Signal::try_from(signal).map_err(|e| chain("signal", &e))?;
    let mut container =
        Container::load(root.join(id)).map_err(|e| chain("load container state", &e))?;
    container
        .kill(signal, true)
        .map_err(|e| chain("libcontainer kill", &e))
}

/// Dump the running container's processes with CRIU (libcontainer runs `criu` from `$PATH`)
/// into `image_path`, CRIU's log into `work_path`, and leave them running. TCP connections,
/// external unix sockets, file locks and shell jobs are not dumped: a container holding one
/// fails to checkpoint, as with runc's defaults.
pub fn checkpoint(
    root: &Path,
    id: &str,
    image_path: &Path,
    work_path: &Path,
) -> Result<(), String> {
    let mut container =
        Container::load(root.join(id)).map_err(|e| chain("load container state", &e))?;
    let opts = libcontainer::container::CheckpointOptions {
        ext_unix_sk: false,
        file_locks: false,
        image_path: image_path.to_path_buf(),
        leave_running: true,
        shell_job: false,
        tcp_established: false,
        work_path: Some(work_path.to_path_buf()),
        manage_cgroups_mode: rust_criu::CgMode::SOFT,
        link_remap: false,
    };
    container
        .checkpoint(&opts)
        .map_err(|e| chain("libcontainer checkpoint", &e))
}

/// Remove the container's cgroup and libcontainer state (killing what is left in the cgroup).
pub fn delete(root: &Path, id: &str) -> Result<(), String> {
    let dir = root.join(id);
    if !dir.exists() {
        return Ok(());
    }
    let mut container = Container::load(dir).map_err(|e| chain("load container state", &e))?;
    container
        .delete(true)
        .map_err(|e| chain("libcontainer delete", &e))
}

/// Listen on `<dir>/console.sock`, binding by a relative name so that long state paths do not
/// hit the 108-byte limit of socket addresses.
pub fn bind_console(dir: &Path) -> Result<UnixListener, String> {
    std::env::set_current_dir(dir).map_err(|e| chain("enter container state dir", &e))?;
    let _ = std::fs::remove_file(CONSOLE_SOCKET);
    let listener =
        UnixListener::bind(CONSOLE_SOCKET).map_err(|e| chain("bind console socket", &e))?;
    let _ = std::env::set_current_dir("/");
    Ok(listener)
}

/// Take the pty master the container's init sent over the console socket during create.
pub fn receive_master(listener: &UnixListener) -> Result<OwnedFd, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| chain("console socket", &e))?;
    let (conn, _) = listener
        .accept()
        .map_err(|e| chain("accept console connection", &e))?;
    let mut buf = [0u8; 4096];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| chain("receive pty master", &e))?;
    for c in msg.cmsgs().map_err(|e| chain("receive pty master", &e))? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&raw) = fds.first() {
                // SAFETY: SCM_RIGHTS handed us a new descriptor that nothing else owns.
                return Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) });
            }
        }
    }
    Err("receive pty master: no descriptor in the message".to_owned())
}

/// `context: error: cause: cause...`
pub fn chain(context: &str, err: &dyn std::error::Error) -> String {
    format!("{context}: {}", crius_common::error_chain(err))
}
