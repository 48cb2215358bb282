//! A container's lifecycle in the shim: one enum, its transitions and the checks every request
//! makes against it, in one place.
//!
//! ```text
//!            create helper ok                start (in process)
//! Creating ───────────────────▶ Created ─────────────────────────▶ Running
//!    │ helper fails                │ start helper     ▲ helper ok     │
//!    ▼                             ▼                  │               │
//! (forgotten)                   Starting ─────────────┘               │
//!                                  │ helper fails: back to Created    │
//!           init reaped (from Created, Starting or Running)           │
//!                     ───────────────────────────────▶ Stopped ◀──────┘
//! delete: Stopped ─▶ Deleting(Removing) ─▶ (forgotten), or back to Stopped if it fails;
//!         alive   ─▶ Deleting(AwaitExit) ─▶ (init reaped) ─▶ Deleting(AwaitHelpers | Removing)
//! ```
//!
//! A delete waits for the helpers working on the container (libcontainer rewrites its state
//! file without a lock), so `Deleting` has three steps. What is not a state stays beside it in
//! the container: the count of running helpers, the connections waiting.

use crius_api::shim::{ContainerStatus, ErrorKind, ExitInfo, ShimError};

/// Where a container is in its life.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Its create helper runs. `doomed`: the shim is terminating, so delete it once created.
    Creating {
        doomed: bool,
    },
    /// The init waits for its start message.
    Created {
        pid: i32,
    },
    /// A start helper runs, since `since` (reported as the start time).
    Starting {
        pid: i32,
        since: i64,
    },
    Running {
        pid: i32,
        started_at: i64,
    },
    /// The init was reaped.
    Stopped {
        exit: ExitInfo,
        started_at: Option<i64>,
    },
    /// A delete was asked for; the record goes when it is done.
    Deleting {
        /// What `state` reports until the init is reaped (Created or Running).
        was: ContainerStatus,
        pid: i32,
        exit: Option<ExitInfo>,
        started_at: Option<i64>,
        step: DeleteStep,
    },
}

/// How far a delete is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteStep {
    /// The init was killed (or, created, never started): waiting for it to be reaped.
    AwaitExit,
    /// Waiting for the container's helpers to finish.
    AwaitHelpers,
    /// The cgroup and libcontainer's state are being removed (by a helper).
    Removing,
}

/// What a delete request does, decided by [`Phase::delete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAction {
    /// A delete is under way: wait for it.
    Join,
    /// Kill the init (`pid`), delete once it is reaped.
    KillFirst { pid: i32 },
    /// The init is gone: remove the container now.
    RemoveNow,
}

fn refused(message: String) -> ShimError {
    ShimError::new(ErrorKind::FailedPrecondition, message)
}

impl Phase {
    /// The status the protocol reports.
    pub fn status(&self) -> ContainerStatus {
        match self {
            Self::Creating { .. } => ContainerStatus::Creating,
            Self::Created { .. } | Self::Starting { .. } => ContainerStatus::Created,
            Self::Running { .. } => ContainerStatus::Running,
            Self::Stopped { .. } => ContainerStatus::Stopped,
            Self::Deleting { exit: Some(_), .. } => ContainerStatus::Stopped,
            Self::Deleting { was, .. } => *was,
        }
    }

    /// The init's pid, once created.
    pub fn pid(&self) -> Option<i32> {
        match self {
            Self::Creating { .. } => None,
            Self::Created { pid } | Self::Starting { pid, .. } | Self::Running { pid, .. } => {
                Some(*pid)
            }
            Self::Stopped { exit, .. } => Some(exit.pid),
            Self::Deleting { pid, .. } => Some(*pid),
        }
    }

    /// The init's pid while it is not reaped (so signalling it cannot reach another process).
    pub fn live_pid(&self) -> Option<i32> {
        match self {
            Self::Created { pid } | Self::Starting { pid, .. } | Self::Running { pid, .. } => {
                Some(*pid)
            }
            Self::Deleting {
                pid, exit: None, ..
            } => Some(*pid),
            _ => None,
        }
    }

    pub fn exit(&self) -> Option<&ExitInfo> {
        match self {
            Self::Stopped { exit, .. } => Some(exit),
            Self::Deleting { exit, .. } => exit.as_ref(),
            _ => None,
        }
    }

    pub fn started_at(&self) -> Option<i64> {
        match self {
            Self::Running { started_at, .. } => Some(*started_at),
            Self::Stopped { started_at, .. } | Self::Deleting { started_at, .. } => *started_at,
            _ => None,
        }
    }

    /// The create helper reported the init: `Created`, and true if it must be deleted at once
    /// (the shim began terminating meanwhile).
    pub fn on_created(&mut self, pid: i32) -> bool {
        let doomed = matches!(self, Self::Creating { doomed: true });
        *self = Self::Created { pid };
        doomed
    }

    /// The init may be started: its pid.
    pub fn can_start(&self, id: &str) -> Result<i32, ShimError> {
        match self {
            Self::Created { pid } => Ok(*pid),
            other => {
                let now = match other.status() {
                    ContainerStatus::Creating => "being created",
                    ContainerStatus::Created => "created",
                    ContainerStatus::Running => "running",
                    ContainerStatus::Stopped => "exited",
                };
                Err(refused(format!("container {id} is {now}, not created")))
            }
        }
    }

    /// The shim started the init itself, at `at`.
    pub fn on_started(&mut self, at: i64) {
        if let Self::Created { pid } = *self {
            *self = Self::Running {
                pid,
                started_at: at,
            };
        }
    }

    /// A start helper was launched at `since`.
    pub fn on_start_helper(&mut self, since: i64) {
        if let Self::Created { pid } = *self {
            *self = Self::Starting { pid, since };
        }
    }

    /// The start helper reported (`ok`) or failed. An init that exited meanwhile stays
    /// stopped, with the start time only if the start succeeded.
    pub fn on_start_done(&mut self, ok: bool) {
        match self {
            Self::Starting { pid, since } => {
                *self = if ok {
                    Self::Running {
                        pid: *pid,
                        started_at: *since,
                    }
                } else {
                    Self::Created { pid: *pid }
                };
            }
            Self::Stopped { started_at, .. } | Self::Deleting { started_at, .. } if !ok => {
                *started_at = None;
            }
            _ => {}
        }
    }

    /// Signals may be sent (not while the create runs: there is nothing to signal yet).
    pub fn can_kill(&self, id: &str) -> Result<(), ShimError> {
        match self {
            Self::Creating { .. } => Err(refused(format!("container {id} is being created"))),
            _ => Ok(()),
        }
    }

    /// Exec and attach need a running init: its pid.
    pub fn can_exec(&self, id: &str) -> Result<i32, ShimError> {
        match self {
            Self::Running { pid, .. } => Ok(*pid),
            _ => Err(refused(format!("container {id} is not running"))),
        }
    }

    /// A delete was asked for (`force`: even of a running container): what to do, after which
    /// the phase is `Deleting` unless it was already.
    pub fn delete(&mut self, id: &str, force: bool) -> Result<DeleteAction, ShimError> {
        match self {
            Self::Deleting { .. } => Ok(DeleteAction::Join),
            Self::Creating { .. } => Err(refused(format!("container {id} is being created"))),
            Self::Running { .. } if !force => Err(refused(format!(
                "container {id} is running: stop it first or force the delete"
            ))),
            Self::Stopped { .. } => {
                self.begin_delete(DeleteStep::Removing);
                Ok(DeleteAction::RemoveNow)
            }
            _ => {
                let pid = self.live_pid().unwrap_or(0);
                self.begin_delete(DeleteStep::AwaitExit);
                Ok(DeleteAction::KillFirst { pid })
            }
        }
    }

    /// The shim is terminating: what to do so the container goes, as [`Self::delete`] with
    /// force; `None` while the create runs (it is deleted once created) or a delete runs.
    pub fn terminate(&mut self) -> Option<DeleteAction> {
        match self {
            Self::Creating { doomed } => {
                *doomed = true;
                None
            }
            Self::Deleting { .. } => None,
            _ => self.delete("", true).ok(),
        }
    }

    /// Enter `Deleting` at `step`, keeping what `state` reports.
    fn begin_delete(&mut self, step: DeleteStep) {
        let was = match self.status() {
            ContainerStatus::Running => ContainerStatus::Running,
            _ => ContainerStatus::Created,
        };
        let (pid, exit, started_at) = match &*self {
            Self::Stopped { exit, started_at } => (exit.pid, Some(exit.clone()), *started_at),
            other => (other.pid().unwrap_or(0), None, other.started_at()),
        };
        *self = Self::Deleting {
            was,
            pid,
            exit,
            started_at,
            step,
        };
    }

    /// The init was reaped. True if a delete was waiting for that.
    pub fn on_exit(&mut self, exit: ExitInfo) -> bool {
        match self {
            Self::Created { .. } => {
                *self = Self::Stopped {
                    exit,
                    started_at: None,
                };
                false
            }
            // Recorded as started: the start helper's report decides (see `on_start_done`).
            Self::Starting { since, .. } => {
                let since = *since;
                *self = Self::Stopped {
                    exit,
                    started_at: Some(since),
                };
                false
            }
            Self::Running { started_at, .. } => {
                let started_at = Some(*started_at);
                *self = Self::Stopped { exit, started_at };
                false
            }
            Self::Deleting {
                exit: recorded @ None,
                ..
            } => {
                *recorded = Some(exit);
                true
            }
            _ => false,
        }
    }

    /// Where a delete goes once the init is reaped: wait for `helpers`, or remove now.
    /// Returns true if removal may begin.
    pub fn ready_to_remove(&mut self, helpers: u32) -> bool {
        let Self::Deleting {
            exit: Some(_),
            step,
            ..
        } = self
        else {
            return false;
        };
        if *step == DeleteStep::Removing && helpers == 0 {
            return true;
        }
        *step = if helpers > 0 {
            DeleteStep::AwaitHelpers
        } else {
            DeleteStep::Removing
        };
        helpers == 0
    }

    /// A removal failed: back to `Stopped` so it can be asked again.
    pub fn on_delete_failed(&mut self) {
        if let Self::Deleting {
            exit: Some(exit),
            started_at,
            ..
        } = self
        {
            *self = Self::Stopped {
                exit: exit.clone(),
                started_at: *started_at,
            };
        }
    }

    /// Whether a delete is waiting for helpers to finish.
    pub fn awaits_helpers(&self) -> bool {
        matches!(
            self,
            Self::Deleting {
                step: DeleteStep::AwaitHelpers,
                ..
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(pid: i32) -> ExitInfo {
        ExitInfo {
            pid,
            exit_code: 0,
            signal: None,
            finished_at: String::new(),
            finished_at_unix_nano: 5,
            oom_killed: false,
        }
    }

    #[test]
    fn create_start_exit_delete() {
        let mut p = Phase::Creating { doomed: false };
        assert_eq!(p.status(), ContainerStatus::Creating);
        assert!(p.can_kill("c").is_err());
        assert!(p.can_start("c").is_err());
        assert!(!p.on_created(7));
        assert_eq!(p.can_start("c").unwrap(), 7);
        assert!(p.can_exec("c").is_err());
        p.on_started(3);
        assert_eq!(
            p,
            Phase::Running {
                pid: 7,
                started_at: 3
            }
        );
        assert_eq!(p.can_exec("c").unwrap(), 7);
        assert!(p.delete("c", false).is_err());
        assert!(!p.on_exit(exit(7)));
        assert_eq!(p.status(), ContainerStatus::Stopped);
        assert_eq!(p.started_at(), Some(3));
        assert_eq!(p.live_pid(), None);
        assert_eq!(p.delete("c", false).unwrap(), DeleteAction::RemoveNow);
        assert!(p.ready_to_remove(0));
        assert_eq!(p.delete("c", false).unwrap(), DeleteAction::Join);
    }

    #[test]
    fn a_start_helper_that_fails_leaves_it_created() {
        let mut p = Phase::Created { pid: 7 };
        p.on_start_helper(4);
        assert_eq!(p.status(), ContainerStatus::Created);
        assert!(p.can_start("c").is_err(), "a second start while one runs");
        p.on_start_done(false);
        assert_eq!(p, Phase::Created { pid: 7 });
        p.on_start_helper(5);
        p.on_start_done(true);
        assert_eq!(
            p,
            Phase::Running {
                pid: 7,
                started_at: 5
            }
        );
    }

    #[test]
    fn an_init_that_exits_before_the_start_helper_reports() {
        let mut p = Phase::Starting { pid: 7, since: 4 };
        p.on_exit(exit(7));
        assert_eq!(p.status(), ContainerStatus::Stopped);
        let mut failed = p.clone();
        p.on_start_done(true);
        assert_eq!(p.started_at(), Some(4));
        failed.on_start_done(false);
        assert_eq!(failed.started_at(), None);
    }

    #[test]
    fn forced_delete_kills_then_waits_for_exit_and_helpers() {
        let mut p = Phase::Running {
            pid: 7,
            started_at: 1,
        };
        assert_eq!(
            p.delete("c", true).unwrap(),
            DeleteAction::KillFirst { pid: 7 }
        );
        assert_eq!(p.status(), ContainerStatus::Running, "until reaped");
        assert_eq!(p.live_pid(), Some(7));
        assert!(
            p.can_exec("c").is_err(),
            "no exec into a container being deleted"
        );
        assert!(!p.ready_to_remove(0), "not before the init is reaped");
        assert!(p.on_exit(exit(7)));
        assert_eq!(p.status(), ContainerStatus::Stopped);
        assert!(!p.ready_to_remove(1));
        assert!(p.awaits_helpers());
        assert!(p.ready_to_remove(0));
        p.on_delete_failed();
        assert_eq!(p.status(), ContainerStatus::Stopped);
        assert_eq!(p.started_at(), Some(1));
        assert!(matches!(p, Phase::Stopped { .. }));
    }

    #[test]
    fn a_created_container_is_deleted_after_its_init_is_killed() {
        let mut p = Phase::Created { pid: 7 };
        assert_eq!(
            p.delete("c", false).unwrap(),
            DeleteAction::KillFirst { pid: 7 }
        );
        assert_eq!(p.status(), ContainerStatus::Created);
        assert!(p.can_start("c").is_err());
    }

    #[test]
    fn termination_dooms_a_container_being_created() {
        let mut p = Phase::Creating { doomed: false };
        assert_eq!(p.terminate(), None);
        assert!(p.on_created(9), "deleted once created");
        let mut r = Phase::Running {
            pid: 9,
            started_at: 0,
        };
        assert_eq!(r.terminate(), Some(DeleteAction::KillFirst { pid: 9 }));
        assert_eq!(r.terminate(), None, "already deleting");
    }
}
