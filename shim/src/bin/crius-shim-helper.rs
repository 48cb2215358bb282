//! `crius-shim-helper`: runs one libcontainer operation for `crius-shim` and reports on fd 3.
//! See `crius_shim::helper` for the command line and descriptors.
//!
//! Without fd 3 it reports on stdout (`{"Ok":{"pid":0}}` or `{"Err":{"message":"..."}}`, exit
//! status 0 or 1), so what a shim that died left behind can be cleaned up by hand, e.g.
//! `crius-shim-helper delete --root <shim-state>/runc --id <container>` (kills what is left in
//! the container's cgroup, removes the cgroup and libcontainer's state). crius itself does not
//! run it: it kills a dead shim's processes through their cgroups (`runtime/src/cgroups/reap.rs`).

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use std::path::Path;

use crius_shim::helper::{
    self, HelperCall, HelperOp, OciCommand, Outcome, LOG_FD, REPORT_FD, SPAWNED_ENV, STDIO_FDS,
};
use crius_shim::libct::{self, InitStdio};
use crius_shim::oci_cli::{self, ProcessStdio};

fn main() {
    // Rust's runtime ignores SIGPIPE before main; the container processes libcontainer clones
    // from here (exec processes in particular) would inherit that, and a container's program
    // expects the default: die on a write to a closed pipe. The default would kill the helper
    // itself, though, when libcontainer writes the state to a hook that exited without
    // reading it (a poststart or poststop hook like `echo done > file`). A handler that does
    // nothing serves both: here the write fails with EPIPE, which libcontainer expects, and
    // exec resets a handled signal to the default in the container.
    // SAFETY: the handler does nothing, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGPIPE,
            ignore_sigpipe as *const () as libc::sighandler_t,
        )
    };
    if shim_fd_is_open(LOG_FD) {
        // SAFETY: the shim placed its log file on LOG_FD for us; nothing else owns it.
        crius_shim::shim_log::init(unsafe { File::from_raw_fd(LOG_FD) });
    }
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == helper::STANDBY) && shim_fd_is_open(REPORT_FD) {
        // Started ahead of its call (see `helper::STANDBY`): the call comes on fd 3. Rust's
        // CPU-feature detection runs here, before it, and is inherited by the processes
        // libcontainer forks for the call: otherwise the container's init ran it (memchr's
        // first `memrchr`) on the create's path, a few dozen `cpuid`s, each a trip to the
        // hypervisor in a virtual machine.
        #[cfg(target_arch = "x86_64")]
        let _ = std::arch::is_x86_feature_detected!("avx2");
        match helper::await_call() {
            Ok(Some(call)) => args = call,
            // The shim did not need us.
            Ok(None) => std::process::exit(0),
            Err(e) => {
                tracing::warn!(target: "crius_shim::helper", error = %e, "standby helper: no call");
                std::process::exit(2);
            }
        }
    }
    let op = args.first().map(|a| a.to_string_lossy().into_owned());
    let result = run(args);
    if let Err(message) = &result {
        tracing::warn!(target: "crius_shim::helper", op = ?op, error = %message, "helper failed");
    }
    let (outcome, fd, code) = match result {
        Ok((pid, fd)) => (Outcome::Ok { pid }, fd, 0),
        Err(message) => (Outcome::Err { message }, None, 1),
    };
    if !shim_fd_is_open(REPORT_FD) {
        // Run by hand (to clean up after a dead shim; crius never does): report on stdout.
        println!("{}", serde_json::to_string(&outcome).unwrap_or_default());
        std::process::exit(code);
    }
    let code = match helper::report(&outcome, fd.as_ref()) {
        Ok(()) => code,
        Err(_) => 2,
    };
    std::process::exit(code);
}

extern "C" fn ignore_sigpipe(_: libc::c_int) {}

/// Whether the shim placed `fd` for us: it spawned this helper (see [`SPAWNED_ENV`]) and the
/// descriptor is open. Run by hand, descriptors at these numbers are someone else's.
fn shim_fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only queries the descriptor's flags.
    std::env::var_os(SPAWNED_ENV).is_some() && unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// The container stdio fd `i` (0 stdin, 1 stdout, 2 stderr), if the shim passed one.
fn stdio(i: usize) -> Option<OwnedFd> {
    let fd = STDIO_FDS[i];
    // SAFETY: the shim placed this fd for us; we are its only owner.
    shim_fd_is_open(fd).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn run(args: Vec<OsString>) -> Result<(i32, Option<OwnedFd>), String> {
    let call = HelperCall::parse(args)?;
    let (root, id) = (&call.root, call.id.as_str());
    if let Some(rt) = &call.runtime {
        return run_oci(rt, root, id, call.op);
    }
    match call.op {
        HelperOp::Create {
            bundle,
            console_dir,
        } => {
            let stdio = InitStdio {
                stdin: stdio(0),
                stdout: stdio(1),
                stderr: stdio(2),
                console_dir,
            };
            libct::create(id, &bundle, root, stdio)
        }
        HelperOp::Exec {
            process,
            cgroup_mounts,
        } => crius_shim::exec::exec(
            root,
            id,
            &process,
            &cgroup_mounts,
            [stdio(0), stdio(1), stdio(2)],
        )
        .map_err(|e| libct::chain("exec", &e)),
        HelperOp::Start => libct::start(root, id).map(|()| (0, None)),
        HelperOp::Kill { signal } => libct::kill_all(root, id, signal).map(|()| (0, None)),
        HelperOp::Delete => libct::delete(root, id).map(|()| (0, None)),
        // libcontainer's inits are the shim's own children: their exits are reaped.
        HelperOp::Wait => Err("wait: only for an OCI runtime".to_owned()),
        HelperOp::Checkpoint {
            image_path,
            work_path,
        } => libct::checkpoint(root, id, &image_path, &work_path).map(|()| (0, None)),
        HelperOp::Restore { .. } => Err(
            "restore: libcontainer 0.7 cannot restore a checkpoint; only an OCI runtime handler (runc, crun) can"
                .to_owned(),
        ),
    }
}

/// The operation through an OCI runtime's command line (see `crius_shim::oci_cli`).
fn run_oci(
    rt: &OciCommand,
    root: &Path,
    id: &str,
    op: HelperOp,
) -> Result<(i32, Option<OwnedFd>), String> {
    let stdio = || [stdio(0), stdio(1), stdio(2)];
    match op {
        HelperOp::Create {
            bundle,
            console_dir,
        } => {
            let stdio = ProcessStdio {
                stdio: stdio(),
                console_dir,
            };
            oci_cli::create(rt, root, id, &bundle, stdio)
        }
        HelperOp::Exec { process, .. } => {
            // A directory of its own for the console socket: execs run side by side.
            let console_dir = match oci_cli::wants_terminal(&process)? {
                true => {
                    let dir = process.with_extension("console");
                    std::fs::create_dir_all(&dir).map_err(|e| libct::chain("console dir", &e))?;
                    Some(dir)
                }
                false => None,
            };
            let stdio = ProcessStdio {
                stdio: stdio(),
                console_dir: console_dir.clone(),
            };
            let result = oci_cli::exec(rt, root, id, &process, stdio);
            if let Some(dir) = console_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            result
        }
        HelperOp::Start => oci_cli::start(rt, root, id, stdio()).map(|()| (0, None)),
        HelperOp::Kill { signal } => oci_cli::kill_all(rt, root, id, signal).map(|()| (0, None)),
        HelperOp::Delete => oci_cli::delete(rt, root, id).map(|()| (0, None)),
        // The report's pid field carries the exit code.
        HelperOp::Wait => oci_cli::wait(rt, root, id).map(|code| (code, None)),
        HelperOp::Checkpoint {
            image_path,
            work_path,
        } => oci_cli::checkpoint(rt, root, id, &image_path, &work_path).map(|()| (0, None)),
        HelperOp::Restore {
            bundle,
            image_path,
            work_path,
            console_dir,
            criu,
        } => {
            let stdio = ProcessStdio {
                stdio: stdio(),
                console_dir,
            };
            let from = oci_cli::RestoreFrom {
                bundle: &bundle,
                image_path: &image_path,
                work_path: &work_path,
                criu: criu.as_deref(),
            };
            oci_cli::restore(rt, root, id, &from, stdio)
        }
    }
}
