//! `Exec`, `Attach` and `PortForward`: validate the request, prepare what the session needs,
//! and answer the one-time URL of the streaming server (see [`crate::stream`]).

use std::sync::Arc;

use crius_api::v1::*;

use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::pod::SandboxState;
use crate::stream::{PendingStream, Target};

fn check_streams(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Result<()> {
    if !(stdin || stdout || stderr) {
        return Err(Error::InvalidArgument(
            "one of stdin, stdout or stderr must be set".into(),
        ));
    }
    if tty && stderr {
        return Err(Error::InvalidArgument(
            "tty and stderr cannot both be set: a terminal has one output".into(),
        ));
    }
    Ok(())
}

/// Hand `pending` to the streaming server and answer the one-time URL its client connects to
/// (usable once, within [`crate::stream::TOKEN_TTL`]); Unavailable while the server is not
/// listening yet. The checks on the container or pod come before, in each caller.
fn register(d: &Daemon, pending: PendingStream) -> Result<String> {
    d.streams.register(pending).map_err(Error::from)
}

pub async fn exec(d: &Arc<Daemon>, req: ExecRequest) -> Result<ExecResponse> {
    check_streams(req.stdin, req.stdout, req.stderr, req.tty)?;
    let (c, process) = d.exec_prepare(&req.container_id, &req.cmd, req.tty)?;
    let shim = d.shims.get(&c.sandbox_id).await?;
    let op = crius_api::shim::Op::ExecStream(crius_api::shim::ExecStream {
        id: c.id.clone(),
        process: serde_json::to_value(&process)
            .map_err(|e| Error::internal("encode exec process", e))?,
        tty: req.tty,
        stdin: req.stdin,
        stdout: req.stdout,
        stderr: req.stderr,
    });
    let url = register(
        d,
        PendingStream::Command(Target {
            op,
            shim_socket: shim.path().to_path_buf(),
            tty: req.tty,
        }),
    )?;
    Ok(ExecResponse { url })
}

pub async fn attach(d: &Arc<Daemon>, req: AttachRequest) -> Result<AttachResponse> {
    check_streams(req.stdin, req.stdout, req.stderr, req.tty)?;
    let c = d.running_container(&req.container_id)?;
    let config = c.config();
    // A container created without stdin has none to attach: the session's stdin is
    // discarded. The session follows the container's terminal, whatever the request says.
    let tty = config.tty;
    let shim = d.shims.get(&c.sandbox_id).await?;
    let op = crius_api::shim::Op::Attach(crius_api::shim::Attach {
        id: c.id.clone(),
        stdin: req.stdin,
        stdout: req.stdout,
        stderr: req.stderr && !tty,
    });
    let url = register(
        d,
        PendingStream::Command(Target {
            op,
            shim_socket: shim.path().to_path_buf(),
            tty,
        }),
    )?;
    Ok(AttachResponse { url })
}

pub async fn port_forward(d: &Arc<Daemon>, req: PortForwardRequest) -> Result<PortForwardResponse> {
    let pod = d.pod(&req.pod_sandbox_id)?;
    if pod.state != SandboxState::Ready {
        return Err(Error::FailedPrecondition(format!(
            "pod sandbox {} is not ready",
            pod.id
        )));
    }
    if let Some(port) = req.port.iter().find(|p| **p <= 0 || **p > 65535) {
        return Err(Error::InvalidArgument(format!(
            "port {port} is out of range"
        )));
    }
    let netns = if pod.host_network {
        None
    } else {
        pod.netns.clone()
    };
    if !pod.host_network && netns.is_none() {
        return Err(Error::FailedPrecondition(format!(
            "pod sandbox {} has no network namespace",
            pod.id
        )));
    }
    let url = register(
        d,
        PendingStream::PortForward {
            pod_id: pod.id.clone(),
            netns,
        },
    )?;
    Ok(PortForwardResponse { url })
}
