//! Exec and attach sessions: the Kubernetes remote-command protocol (`channel.k8s.io` up to
//! `v4.channel.k8s.io`) over SPDY, joined to the process's stdio the shim hands over.
//!
//! The client opens one stream per channel, named by its `streamtype` header: `error`, and as
//! the request asked `stdin`, `stdout`, `stderr` (never with a tty) and `resize` (with a tty,
//! from v3 on). Once they are all open, crius asks the shim for the process and relays: the
//! stdin stream into the process, its output into the stdout/stderr streams, each resize (a
//! JSON `{"Width":w,"Height":h}`) onto the pty. At the end the error stream carries the
//! outcome (v4: a JSON `metav1.Status`, with the exit code as a cause when it is not 0; before
//! v4: the error text, nothing on success) and every stream is closed.

use std::time::Duration;

use crius_api::shim::{Op, Reply, Response};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::session::{Incoming, Out, Session};
use super::shim_io::{self, Stdio};
use super::StreamError;

/// The remote-command protocols crius speaks over WebSocket, preferred first (v5 adds the
/// client's half-close of a channel, which only WebSocket needs).
pub const WEBSOCKET_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// The remote-command protocols crius speaks over SPDY, preferred first.
pub const PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// How long the client has to open its streams after the upgrade (kubelet allows 30 s).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// After an exec process exits, how long output still held open by a child of it is relayed.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);

/// How long to wait for the client to close the connection once everything is sent.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// What a session is for.
pub struct Target {
    pub op: Op,
    pub shim_socket: std::path::PathBuf,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    /// An attach: it also ends when the client's stdin ends, and reports no exit code.
    pub attach: bool,
}

/// The streams the client opened.
#[derive(Default)]
struct Channels {
    error: Option<Incoming>,
    stdin: Option<Incoming>,
    stdout: Option<Incoming>,
    stderr: Option<Incoming>,
    resize: Option<Incoming>,
}

/// The streams a session of `target` has under `protocol`, with their WebSocket channels.
pub fn channels(target: &Target, protocol: &str) -> Vec<(&'static str, u8)> {
    let with_resize = matches!(
        protocol,
        "v5.channel.k8s.io" | "v4.channel.k8s.io" | "v3.channel.k8s.io"
    );
    let mut out = Vec::new();
    if target.stdin {
        out.push(("stdin", 0));
    }
    if target.stdout {
        out.push(("stdout", 1));
    }
    if target.stderr && !target.tty {
        out.push(("stderr", 2));
    }
    out.push(("error", 3));
    if target.tty && with_resize {
        out.push(("resize", 4));
    }
    out
}

/// Serve one exec or attach session to its end.
pub async fn serve(mut session: Session, protocol: &str, target: Target) {
    // v4 and v5 report the outcome as a JSON status.
    let v4 = matches!(protocol, "v5.channel.k8s.io" | "v4.channel.k8s.io");
    let wanted: Vec<&str> = channels(&target, protocol)
        .into_iter()
        .map(|(kind, _)| kind)
        .collect();
    let expected = wanted.len();
    let mut ch = Channels::default();
    let mut opened = 0;
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while opened < expected {
        let stream = tokio::select! {
            s = session.incoming.recv() => s,
            _ = &mut deadline => None,
        };
        let Some(stream) = stream else {
            tracing::debug!(
                opened,
                expected,
                "streaming client did not open all its streams"
            );
            session.finish(Duration::ZERO).await;
            return;
        };
        if !wanted.contains(&stream.stream_type()) {
            // Dropping it discards whatever the client sends on it.
            tracing::debug!(
                stream_type = stream.stream_type(),
                "ignoring a stream the request did not ask for"
            );
            continue;
        }
        let slot = match stream.stream_type() {
            "error" => &mut ch.error,
            "stdin" => &mut ch.stdin,
            "stdout" => &mut ch.stdout,
            "stderr" => &mut ch.stderr,
            "resize" => &mut ch.resize,
            other => {
                tracing::debug!(stream_type = other, "ignoring a stream of unknown type");
                continue;
            }
        };
        if slot.is_none() {
            opened += 1;
        }
        *slot = Some(stream);
    }
    let out = session.out.clone();
    let outcome = run(&out, &mut ch, &target, session.gone()).await;
    if let Some(error) = &ch.error {
        let message = status_message(&outcome, v4);
        out.data_fin(error.id, message.as_bytes()).await;
    }
    for id in [&ch.stdin, &ch.stdout, &ch.stderr, &ch.resize]
        .into_iter()
        .flatten()
        .map(|s| s.id)
    {
        out.fin(id).await;
    }
    drop(out);
    session.finish(CLOSE_WAIT).await;
}

/// How a session ended.
enum Outcome {
    /// The process exited with this code (an attach reports 0).
    Exited(i32),
    Failed(String),
}

fn status_message(outcome: &Outcome, v4: bool) -> String {
    match (outcome, v4) {
        (Outcome::Exited(0), true) => r#"{"metadata":{},"status":"Success"}"#.to_owned(),
        (Outcome::Exited(0), false) => String::new(),
        (Outcome::Exited(code), true) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        })
        .to_string(),
        (Outcome::Exited(code), false) => {
            format!("command terminated with non-zero exit code: exit status {code}")
        }
        (Outcome::Failed(message), true) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": message,
        })
        .to_string(),
        (Outcome::Failed(message), false) => message.clone(),
    }
}

async fn run(
    out: &Out,
    ch: &mut Channels,
    target: &Target,
    mut gone: tokio::sync::watch::Receiver<bool>,
) -> Outcome {
    let (mut shim, _streams, stdio) =
        match shim_io::open(&target.shim_socket, target.op.clone()).await {
            Ok(x) => x,
            Err(e) => return Outcome::Failed(crate::error::chain(&e)),
        };
    let Stdio {
        stdin,
        stdout,
        stderr,
        pty,
    } = stdio;
    let mut outputs: Vec<JoinHandle<()>> = Vec::new();
    if let (Some(fd), Some(stream)) = (stdout, &ch.stdout) {
        outputs.push(tokio::spawn(relay_output(fd, out.clone(), stream.id)));
    }
    if let (Some(fd), Some(stream)) = (stderr, &ch.stderr) {
        outputs.push(tokio::spawn(relay_output(fd, out.clone(), stream.id)));
    }
    // Ends when the client's stdin ends: the process's stdin is closed then.
    let (stdin_done_tx, mut stdin_done) = mpsc::channel::<()>(1);
    let stdin_task = match (ch.stdin.as_mut(), stdin) {
        (Some(stream), Some(fd)) => {
            let data = std::mem::replace(&mut stream.data, mpsc::channel(1).1);
            Some(tokio::spawn(relay_input(data, fd, stdin_done_tx)))
        }
        (Some(stream), None) => {
            // Nothing to write into (an attach to a container without stdin): discard.
            let mut data = std::mem::replace(&mut stream.data, mpsc::channel(1).1);
            drop(stdin_done_tx);
            Some(tokio::spawn(
                async move { while data.recv().await.is_some() {} },
            ))
        }
        (None, _) => {
            drop(stdin_done_tx);
            None
        }
    };
    let resize_task = match (ch.resize.as_mut(), pty) {
        (Some(stream), Some(pty)) => {
            let data = std::mem::replace(&mut stream.data, mpsc::channel(1).1);
            Some(tokio::spawn(relay_resizes(data, pty)))
        }
        _ => None,
    };
    let attach_stdin = target.attach && stdin_task.is_some();
    let outcome = tokio::select! {
        answer = shim.next() => exit_of(answer),
        // The client went away: an attach detaches; an exec's process runs on with its stdin
        // closed and its output going nowhere, as it would after a hang-up.
        _ = gone.wait_for(|g| *g) => Outcome::Failed("the client went away".into()),
        Some(()) = stdin_done.recv(), if attach_stdin => {
            // The client's stdin ended: detach (for a stdin_once container the shim then
            // closes its stdin).
            Outcome::Exited(0)
        }
    };
    let outcome = match (outcome, target.attach) {
        (Outcome::Exited(_), true) => Outcome::Exited(0),
        (o, _) => o,
    };
    // Detach from the shim: an attach session ends, an exec has exited.
    drop(shim);
    let drain = async {
        for task in &mut outputs {
            let _ = task.await;
        }
    };
    if tokio::time::timeout(OUTPUT_DRAIN, drain).await.is_err() {
        for task in &outputs {
            task.abort();
        }
    }
    if let Some(task) = stdin_task {
        task.abort();
    }
    if let Some(task) = resize_task {
        task.abort();
    }
    outcome
}

fn exit_of(answer: Result<Option<Response>, StreamError>) -> Outcome {
    match answer {
        Ok(Some(Response::Ok(Reply::ProcessExited { exit_code, .. }))) => {
            Outcome::Exited(exit_code)
        }
        Ok(Some(Response::Err(e))) => Outcome::Failed(e.message),
        Ok(Some(Response::Ok(_))) => Outcome::Failed("unexpected answer from the shim".into()),
        Ok(None) => Outcome::Failed("the shim closed the session".into()),
        Err(e) => Outcome::Failed(crate::error::chain(&e)),
    }
}

async fn relay_output(fd: AsyncFd<std::os::fd::OwnedFd>, out: Out, id: u32) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match shim_io::read(&fd, &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !out.data(id, &buf[..n]).await {
                    break;
                }
            }
        }
    }
}

async fn relay_input(
    mut data: mpsc::Receiver<Vec<u8>>,
    fd: AsyncFd<std::os::fd::OwnedFd>,
    done: mpsc::Sender<()>,
) {
    while let Some(chunk) = data.recv().await {
        if shim_io::write_all(&fd, &chunk).await.is_err() {
            break;
        }
    }
    drop(fd);
    let _ = done.send(()).await;
}

/// A terminal size as the clients send it.
#[derive(serde::Deserialize)]
struct TerminalSize {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

async fn relay_resizes(mut data: mpsc::Receiver<Vec<u8>>, pty: std::os::fd::OwnedFd) {
    let mut pending = Vec::new();
    while let Some(chunk) = data.recv().await {
        pending.extend_from_slice(&chunk);
        // One JSON object per line; anything that does not parse is skipped.
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Ok(size) = serde_json::from_slice::<TerminalSize>(&line) {
                if let Err(e) = shim_io::resize(&pty, size.width, size.height) {
                    tracing::debug!("resize the terminal: {e}");
                }
            }
        }
        if pending.len() > 4096 {
            pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_status_carries_the_exit_code() {
        let ok = status_message(&Outcome::Exited(0), true);
        assert_eq!(ok, r#"{"metadata":{},"status":"Success"}"#);
        let failed: serde_json::Value =
            serde_json::from_str(&status_message(&Outcome::Exited(3), true)).unwrap();
        assert_eq!(failed["status"], "Failure");
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(failed["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(failed["details"]["causes"][0]["message"], "3");
        assert_eq!(status_message(&Outcome::Exited(0), false), "");
        let err: serde_json::Value =
            serde_json::from_str(&status_message(&Outcome::Failed("boom".into()), true)).unwrap();
        assert_eq!(err["message"], "boom");
        assert!(err.get("reason").is_none());
    }
}
