//! Helper processes (see [`crate::helper`]): launching them, reading their reports, timing
//! them out; and reaping every child of the shim, which tells helpers, container inits and
//! exec processes apart.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::time::Instant;

use crius_api::shim::{ErrorKind, Reply, Response, HELPER_TIMEOUT};
use tracing::warn;

use super::{decode_status, err, Shim, Token};
use crate::helper::{self, Helper, HelperCall, HelperOp, OciCommand, Outcome};

/// How long exits of not-yet-known pids are kept (a process may be reaped before the helper's
/// report naming it is read, which takes milliseconds); short, as pids get reused.
const ORPHAN_EXIT_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// What a helper's report completes.
pub(super) enum HelperPurpose {
    Create {
        id: String,
        token: Token,
    },
    Exec {
        exec: u64,
    },
    Start {
        id: String,
        token: Token,
    },
    Kill {
        token: Token,
    },
    Delete {
        id: String,
    },
    /// A container's `wait`: its report's pid field is the exit code.
    Wait {
        id: String,
    },
    /// Nobody waits for the outcome.
    Background,
}

pub(super) struct PendingHelper {
    pub(super) pid: i32,
    pub(super) chan: OwnedFd,
    container: String,
    pub(super) purpose: HelperPurpose,
    /// When to kill it (a stuck libcontainer call must not leave a container "creating"
    /// forever); `None` once killed.
    pub(super) deadline: Option<Instant>,
}

/// What a helper reported: the new process's pid and maybe a pty master, or why it failed.
type Report = Result<(i32, Option<OwnedFd>), String>;

impl Shim {
    /// Run `op` on container `id` in a helper with the container's `stdio`; its report is
    /// handled according to `purpose`.
    pub(super) fn spawn_helper(
        &mut self,
        id: &str,
        op: HelperOp,
        stdio: [Option<RawFd>; 3],
        purpose: HelperPurpose,
    ) -> io::Result<()> {
        let runtime = self.containers.get(id).and_then(|c| c.runtime.as_ref());
        let call = HelperCall {
            root: runtime
                .and_then(|rt| rt.root.clone())
                .unwrap_or_else(|| self.runc_root.clone()),
            id: id.to_owned(),
            op,
            runtime: runtime.map(|rt| OciCommand {
                binary: rt.binary.clone(),
                options: rt.options.clone(),
            }),
        };
        // Prepared helpers are kept for creates (and restores), the calls a pod's start waits
        // on: an exec probe taking one would leave the next create to wait for a helper's start.
        let prepared = match call.op {
            HelperOp::Create { .. } | HelperOp::Restore { .. } => self.take_prepared(&call, stdio),
            _ => None,
        };
        let spawned = match prepared {
            Some(helper) => helper,
            None => {
                let helper = self.launcher.spawn(&call, stdio)?;
                self.helper_pids.push(helper.pid);
                helper
            }
        };
        if let Some(c) = self.containers.get_mut(id) {
            c.helpers += 1;
        }
        let key = self.next();
        self.helpers.insert(
            key,
            PendingHelper {
                pid: spawned.pid,
                chan: spawned.chan,
                container: id.to_owned(),
                // A wait lasts as long as the container runs.
                deadline: match purpose {
                    HelperPurpose::Wait { .. } => None,
                    _ => Some(Instant::now() + HELPER_TIMEOUT),
                },
                purpose,
            },
        );
        Ok(())
    }

    /// `prepare`: start a helper that waits for the next create's call, unless one waits
    /// already. crius asks at a pod's start, after every create and at the start of every
    /// create, and creates one container of a pod at a time: one is enough, and asking again
    /// while one waits costs nothing.
    pub(super) fn prepare_helper(&mut self) {
        if self.shutdown_requested || self.terminating || !self.prepared.is_empty() {
            return;
        }
        match self.launcher.prepare() {
            Ok(Some(helper)) => {
                self.helper_pids.push(helper.pid);
                let until = Instant::now() + crius_api::shim::PREPARED_HELPER_TTL;
                self.prepared.push_back((helper, until));
            }
            Ok(None) => {}
            Err(e) => warn!(target: "crius_shim", error = %e, "prepare a helper"),
        }
    }

    /// A prepared helper, handed `call`; `None` when none is left (or it is gone: the call
    /// is then spawned as usual, and its exit reaped as any helper's).
    fn take_prepared(&mut self, call: &HelperCall, stdio: [Option<RawFd>; 3]) -> Option<Helper> {
        while let Some((helper, _)) = self.prepared.pop_front() {
            match helper::hand_over(&helper, call, stdio) {
                Ok(()) => return Some(helper),
                Err(e) => {
                    warn!(target: "crius_shim", pid = helper.pid, error = %e, "prepared helper gone")
                }
            }
        }
        None
    }

    /// End the prepared helpers nobody used in time: they see their socket close and exit.
    pub(super) fn expire_prepared(&mut self, now: Instant) {
        while self
            .prepared
            .front()
            .is_some_and(|(_, until)| now >= *until)
        {
            self.prepared.pop_front();
        }
    }

    /// A helper's report socket is readable, or (`exited`) the helper was reaped: a helper that
    /// exits without a report failed (its children may hold the socket open, so its end is
    /// not seen as EOF).
    pub(super) fn on_helper(&mut self, key: u64, exit_status: Option<i32>) {
        let Some(pending) = self.helpers.get(&key) else {
            return;
        };
        let mut crashed = false;
        if self.buf.len() < helper::REPORT_MAX {
            self.buf = vec![0u8; helper::REPORT_MAX];
        }
        let received = helper::receive(&pending.chan, &mut self.buf);
        let result: Report = match received {
            Ok(None) if exit_status.is_none() => return,
            Ok(None) => {
                crashed = true;
                let (code, signal) = decode_status(exit_status.unwrap_or(0));
                Err(format!(
                    "helper {} exited without a report (status {code}, signal {signal:?})",
                    pending.pid
                ))
            }
            Ok(Some((Outcome::Ok { pid }, fd))) => Ok((pid, fd)),
            Ok(Some((Outcome::Err { message }, _))) => Err(message),
            Err(e) => {
                crashed = true;
                Err(format!("helper {}: {e}", pending.pid))
            }
        };
        let Some(pending) = self.helpers.remove(&key) else {
            return;
        };
        if let Some(c) = self.containers.get_mut(&pending.container) {
            c.helpers = c.helpers.saturating_sub(1);
            if c.helpers == 0 && c.phase.awaits_helpers() {
                self.remove_container(&pending.container);
            }
        }
        match pending.purpose {
            HelperPurpose::Create { id, token } => self.created(&id, token, result, crashed),
            HelperPurpose::Exec { exec } => self.exec_started(exec, result),
            HelperPurpose::Start { id, token } => self.started(&id, token, result.map(|r| r.0)),
            HelperPurpose::Kill { token } => {
                let response = match result {
                    Ok(_) => Response::Ok(Reply::Done),
                    Err(message) => Response::Err(err(ErrorKind::Internal, message)),
                };
                self.complete(token, response);
            }
            HelperPurpose::Delete { id } => self.deleted(&id, result.map(|r| r.0)),
            HelperPurpose::Wait { id } => {
                let code = result.map(|r| r.0).unwrap_or_else(|message| {
                    // The sandbox ended under it, or the runtime lost the container: it has
                    // ended, how is not known.
                    warn!(target: "crius_shim", container = %id, error = %message, "wait failed");
                    255
                });
                // As a wait status: 128 + n is the runtimes' way of saying signal n.
                let status = match code {
                    129..=192 => code - 128,
                    code => (code & 0xff) << 8,
                };
                if self
                    .containers
                    .get(&id)
                    .is_some_and(|c| c.phase.live_pid().is_some())
                {
                    self.container_exited(&id, status);
                }
            }
            HelperPurpose::Background => {
                if let Err(message) = result {
                    warn!(target: "crius_shim", error = %message, "background helper failed");
                }
            }
        }
    }

    /// Kill the helpers that overran their deadline; their requests then fail.
    pub(super) fn check_helper_timers(&mut self, now: Instant) {
        let mut overdue = Vec::new();
        for h in self.helpers.values_mut() {
            if h.deadline.is_some_and(|t| now >= t) {
                warn!(target: "crius_shim", pid = h.pid, container = %h.container, "helper timed out; killing it");
                h.deadline = None;
                overdue.push(h.pid);
            }
        }
        for pid in overdue {
            // Its report socket then closes, or its exit is reaped.
            self.signal(pid, libc::SIGKILL);
        }
    }

    /// Send `signal` to `pid`, an unreaped child of the shim; a process already gone is fine.
    pub(super) fn signal(&mut self, pid: i32, signal: i32) {
        if let Err(e) = self.launcher.signal(pid, signal) {
            if e.raw_os_error() != Some(libc::ESRCH) {
                warn!(target: "crius_shim", pid, signal, error = %e, "kill");
            }
        }
    }

    pub(super) fn take_orphan_exit(&mut self, pid: i32) -> Option<i32> {
        let i = self.orphan_exits.iter().position(|(p, _, _)| *p == pid)?;
        Some(self.orphan_exits.swap_remove(i).1)
    }

    /// Reap every exited child.
    pub(super) fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes only into `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid <= 0 {
                return;
            }
            self.process_exited(pid, status);
        }
    }

    /// Child `pid` was reaped with wait status `status`: a helper, a container's init, an
    /// exec's process, or one not named yet (kept a few seconds for the report naming it).
    /// Public so a test can feed exits to a shim whose processes are fake.
    pub fn process_exited(&mut self, pid: i32, status: i32) {
        if let Some(i) = self.helper_pids.iter().position(|p| *p == pid) {
            self.helper_pids.swap_remove(i);
            // Usually its report was read already; if not, it is read now or the helper failed.
            let pending = self
                .helpers
                .iter()
                .find(|(_, h)| h.pid == pid)
                .map(|(k, _)| *k);
            if let Some(key) = pending {
                self.on_helper(key, Some(status));
            }
            self.flush_outbox();
            return;
        }
        let container = self
            .containers
            .values()
            .find(|c| !c.exit_by_wait && c.phase.live_pid() == Some(pid))
            .map(|c| c.id.clone());
        if let Some(id) = container {
            self.container_exited(&id, status);
            self.flush_outbox();
            return;
        }
        let exec = self.exec_of(pid);
        if let Some(exec) = exec {
            self.exec_exited(exec, status);
            self.flush_outbox();
            return;
        }
        let now = Instant::now();
        self.orphan_exits
            .retain(|(_, _, at)| now.duration_since(*at) < ORPHAN_EXIT_TTL);
        if self.orphan_exits.len() < 1024 {
            self.orphan_exits.push((pid, status, now));
        }
    }
}
