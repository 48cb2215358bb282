//! `ExecSync` and the checks every exec (synchronous or streamed) passes first.

use std::sync::Arc;

use super::{ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::util::check_no_nul;

/// How much output of an `ExecSync` (stdout and stderr together) is returned: the response
/// must fit kubelet's (and crius's) 16 MiB gRPC messages, with room for the framing.
const EXEC_OUTPUT_LIMIT: usize = (16 << 20) - (64 << 10);

/// Cuts exec output to `limit` bytes in all: stderr keeps up to half of it, stdout the rest,
/// and either takes what the other leaves unused.
fn fit_exec_output(stdout: &mut Vec<u8>, stderr: &mut Vec<u8>, limit: usize) {
    let err_share = stderr.len().min(limit / 2);
    let out_keep = stdout.len().min(limit - err_share);
    let err_keep = stderr.len().min(limit - out_keep);
    stdout.truncate(out_keep);
    stderr.truncate(err_keep);
}

impl Daemon {
    /// The running container `id` (else NotFound/FailedPrecondition naming it).
    pub fn running_container(&self, id: &str) -> Result<ContainerRecord> {
        let c = self.container(id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        Ok(c)
    }

    /// What an `ExecSync` or `Exec` of `cmd` runs: the running container and the OCI process.
    pub fn exec_prepare(
        &self,
        id: &str,
        cmd: &[String],
        tty: bool,
    ) -> Result<(ContainerRecord, oci_spec::runtime::Process)> {
        if cmd.first().is_none_or(|c| c.is_empty()) {
            return Err(Error::InvalidArgument("cmd is required".into()));
        }
        check_no_nul("cmd", cmd.iter().map(String::as_str)).map_err(Error::InvalidArgument)?;
        let c = self.running_container(id)?;
        // A container removed while this call ran has no bundle any more: say NotFound.
        let own = self
            .container_process(&c.id)
            .or_else(|e| self.container(&c.id).and(Err(e)))?;
        let process = crate::spec::exec_process(own, cmd, tty)?;
        Ok((c, process))
    }

    /// `ExecSync`: runs `cmd` in a running container and returns its output and status.
    pub async fn exec_sync(
        self: &Arc<Self>,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> Result<crius_api::shim::ExecOutcome> {
        let (c, process) = self.exec_prepare(id, &cmd, false)?;
        let shim = self.shims.get(&c.sandbox_id).await?;
        let outcome = shim
            .exec_sync(crius_api::shim::ExecSync {
                id: c.id.clone(),
                process: serde_json::to_value(&process)
                    .map_err(|e| Error::internal("encode exec process", e))?,
                timeout_ms: u64::try_from(timeout_secs)
                    .unwrap_or(0)
                    .saturating_mul(1000),
                output_limit: EXEC_OUTPUT_LIMIT as u64,
            })
            .await?;
        if outcome.timed_out {
            return Err(Error::DeadlineExceeded(format!(
                "command {cmd:?} in container {} timed out after {timeout_secs}s",
                c.id
            )));
        }
        let mut outcome = outcome;
        fit_exec_output(&mut outcome.stdout, &mut outcome.stderr, EXEC_OUTPUT_LIMIT);
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn exec_output_fits_the_limit() {
        let cut = |out: usize, err: usize| {
            let (mut o, mut e) = (vec![b'o'; out], vec![b'e'; err]);
            fit_exec_output(&mut o, &mut e, 100);
            (o.len(), e.len())
        };
        assert_eq!(cut(10, 10), (10, 10));
        assert_eq!(cut(500, 0), (100, 0));
        assert_eq!(cut(0, 500), (0, 100));
        assert_eq!(cut(500, 500), (50, 50));
        assert_eq!(cut(500, 20), (80, 20));
        assert_eq!(cut(30, 500), (30, 70));
    }
}
