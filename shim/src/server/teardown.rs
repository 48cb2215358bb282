//! Ending containers: signals, deletes and the removal of a container's cgroup and
//! libcontainer state, in the shim when that is safe and through a helper otherwise.

use std::fs;

use crius_api::shim::{ErrorKind, Reply, Response, ShimError};
use tracing::{info, warn};

use super::helpers::HelperPurpose;
use super::lifecycle::DeleteAction;
use super::{err, not_found, Shim, Token};
use crate::cgroup::Hierarchies;
use crate::helper::HelperOp;
use crate::libct_state;

impl Shim {
    pub(super) fn kill(
        &mut self,
        token: Token,
        id: &str,
        signal: i32,
        all: bool,
    ) -> Result<Option<Reply>, ShimError> {
        if !(0..=64).contains(&signal) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("invalid signal {signal}"),
            ));
        }
        let c = self.containers.get(id).ok_or_else(|| not_found(id))?;
        c.phase.can_kill(id)?;
        // A pid shared with the sandbox is not this container's to signal: the runtime does it.
        if !all && !c.exit_by_wait {
            if let Some(pid) = c.phase.live_pid() {
                if let Err(e) = self.launcher.signal(pid, signal) {
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        return Err(err(
                            ErrorKind::Internal,
                            format!("kill container {id} (pid {pid}): {e}"),
                        ));
                    }
                }
            }
            return Ok(Some(Reply::Done));
        }
        match self.kill_all_in_process(id, signal) {
            Ok(()) => return Ok(Some(Reply::Done)),
            Err(reason) => {
                info!(target: "crius_shim", container = %id, %reason, "kill of all processes left to a helper");
            }
        }
        self.spawn_helper(
            id,
            HelperOp::Kill { signal },
            [None; 3],
            HelperPurpose::Kill { token },
        )
        .map_err(|e| {
            err(
                ErrorKind::Internal,
                format!("kill container {id}: spawn helper: {e}"),
            )
        })?;
        Ok(None)
    }

    pub(super) fn delete(&mut self, token: Token, id: &str, force: bool) -> Result<(), ShimError> {
        let c = self.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        let action = c.phase.delete(id, force)?;
        c.delete_waiters.push(token);
        match action {
            DeleteAction::Join => {}
            // A created container's init waits on its start socket, a forced one is killed;
            // both are deleted once the init is reaped.
            DeleteAction::KillFirst { pid } => self.kill_init(id, pid),
            DeleteAction::RemoveNow => self.remove_container(id),
        }
        Ok(())
    }

    /// SIGKILL the init. In its own PID namespace that ends every process of the container;
    /// whatever else is left in its cgroup the delete kills (libcontainer empties the cgroup
    /// before removing it).
    pub(super) fn kill_init(&mut self, id: &str, pid: i32) {
        let Some(c) = self.containers.get(id) else {
            return;
        };
        if c.phase.live_pid() != Some(pid) {
            return;
        }
        if c.exit_by_wait {
            // The pid is the sandbox's: the runtime kills the container, its wait reports.
            let op = HelperOp::Kill {
                signal: libc::SIGKILL,
            };
            if let Err(e) = self.spawn_helper(id, op, [None; 3], HelperPurpose::Background) {
                warn!(target: "crius_shim", container = %id, error = %e, "spawn kill helper");
            }
            // Not started, so no wait runs to report it: a created process that never ran
            // ends with the kill.
            let waited = self
                .helpers
                .values()
                .any(|h| matches!(&h.purpose, HelperPurpose::Wait { id: w } if w.as_str() == id));
            if !waited {
                self.container_exited(id, libc::SIGKILL);
            }
            return;
        }
        self.signal(pid, libc::SIGKILL);
    }

    /// Delete a container nobody asked to delete: one created after the shim began
    /// terminating.
    pub(super) fn delete_now(&mut self, id: &str) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        match c.phase.delete(id, true) {
            Ok(DeleteAction::KillFirst { pid }) => self.kill_init(id, pid),
            Ok(DeleteAction::RemoveNow) => self.remove_container(id),
            Ok(DeleteAction::Join) | Err(_) => {}
        }
    }

    /// Remove the container's cgroup and libcontainer state once its init is reaped and no
    /// helper works on it: in process when that is safe ([`Self::delete_in_process`]), else
    /// through a helper; the record goes when it is done.
    pub(super) fn remove_container(&mut self, id: &str) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        if !c.phase.ready_to_remove(c.helpers) {
            return;
        }
        match self.delete_in_process(id) {
            Ok(()) => {
                self.deleted(id, Ok(0));
                return;
            }
            Err(reason) => {
                info!(target: "crius_shim", container = %id, %reason, "delete left to a helper");
            }
        }
        let purpose = HelperPurpose::Delete { id: id.to_owned() };
        if let Err(e) = self.spawn_helper(id, HelperOp::Delete, [None; 3], purpose) {
            self.deleted(id, Err(format!("spawn helper: {e}")));
        }
    }

    /// Signal every process of the container's cgroup, frozen meanwhile (see
    /// [`Hierarchies::kill_all`]); an error says why a helper must do it instead.
    fn kill_all_in_process(&mut self, id: &str, signal: i32) -> Result<(), String> {
        let cgroup_path = self
            .containers
            .get(id)
            .and_then(|c| c.libct.as_ref())
            .map(|r| r.cgroup_path.clone())
            .ok_or("libcontainer's record of the container was not read")?;
        let hierarchies = self.hierarchies()?;
        let sent = hierarchies
            .kill_all(&cgroup_path, signal)
            .map_err(|e| crius_common::error_chain(&e))?;
        tracing::debug!(target: "crius_shim", container = %id, signal, processes = sent, "signalled the cgroup");
        Ok(())
    }

    /// Delete an exited container without a helper when libcontainer's delete would do no
    /// more than this: remove the cgroup (leaf first, in every hierarchy) and the state
    /// directory. An error says why a helper must do it (hooks, Intel RDT, processes still in
    /// the cgroup, ...); nothing is removed then.
    fn delete_in_process(&mut self, id: &str) -> Result<(), String> {
        let c = self.containers.get(id).ok_or("unknown container")?;
        if c.phase.exit().is_none() {
            return Err("the init has not been reaped".to_owned());
        }
        let recorded = c
            .libct
            .clone()
            .ok_or("libcontainer's record of the container was not read")?;
        if recorded.poststop_hooks {
            return Err("poststop hooks".to_owned());
        }
        let dir = self.runc_root.join(id);
        if !dir.exists() {
            return Ok(());
        }
        libct_state::check_plain_delete(&dir).map_err(|e| crius_common::error_chain(&e))?;
        self.hierarchies()?
            .remove(&recorded.cgroup_path)
            .map_err(|e| crius_common::error_chain(&e))?;
        libct_state::remove(&dir).map_err(|e| crius_common::error_chain(&e))
    }

    /// The host's cgroup hierarchies (looked up once).
    pub(super) fn hierarchies(&mut self) -> Result<&Hierarchies, String> {
        if self.cgroups.is_none() {
            let found = Hierarchies::detect().map_err(|e| crius_common::error_chain(&e))?;
            self.cgroups = Some(found);
        }
        self.cgroups
            .as_ref()
            .ok_or_else(|| "cgroup hierarchies unknown".to_owned())
    }

    /// The removal finished (or failed).
    pub(super) fn deleted(&mut self, id: &str, result: Result<i32, String>) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        if let Err(message) = result {
            warn!(target: "crius_shim", container = %id, error = %message, "delete failed");
            c.phase.on_delete_failed();
            let waiters = std::mem::take(&mut c.delete_waiters);
            if self.terminating {
                // Nobody will retry: forget the container anyway.
                self.containers.remove(id);
            }
            for token in waiters {
                let response = Response::Err(err(
                    ErrorKind::Internal,
                    format!("delete container {id}: {message}"),
                ));
                self.complete(token, response);
            }
            return;
        }
        let Some(c) = self.containers.remove(id) else {
            return;
        };
        for token in c.waiters {
            let response = Response::Err(err(
                ErrorKind::NotFound,
                format!("container {id} was deleted"),
            ));
            self.complete(token, response);
        }
        // On SIGTERM the exit records stay for crius to read; a requested delete removes them.
        if !self.terminating || self.shutdown_requested {
            let _ = fs::remove_dir_all(self.container_dir(id));
        }
        info!(target: "crius_shim", container = %id, "deleted");
        for token in c.delete_waiters {
            self.complete(token, Response::Ok(Reply::Done));
        }
    }
}
