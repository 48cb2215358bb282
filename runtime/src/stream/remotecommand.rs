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
    /// The session is on a terminal (an attach's follows the container's, which `op` lacks).
    pub tty: bool,
}

impl Target {
    /// An attach: it also ends when the client's stdin ends, and reports no exit code.
    pub fn attach(&self) -> bool {
        matches!(self.op, Op::Attach(_))
    }

    /// The stdin, stdout and stderr the shim is asked for.
    fn wanted(&self) -> [bool; 3] {
        match &self.op {
            Op::ExecStream(e) => [e.stdin, e.stdout, e.stderr],
            Op::Attach(a) => [a.stdin, a.stdout, a.stderr],
            _ => [false; 3],
        }
    }
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
    let [stdin, stdout, stderr] = target.wanted();
    let mut out = Vec::new();
    if stdin {
        out.push(("stdin", 0));
    }
    if stdout {
        out.push(("stdout", 1));
    }
    if stderr && !target.tty {
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
    let (mut shim, stdio) = match shim_io::open(&target.shim_socket, target.op.clone()).await {
        Ok(x) => x,
        Err(e) => return Outcome::Failed(crius_common::error_chain(&e)),
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
    let attach_stdin = target.attach() && stdin_task.is_some();
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
    let outcome = match (outcome, target.attach()) {
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
        Err(e) => Outcome::Failed(crius_common::error_chain(&e)),
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
    use crate::stream::spdy::{Decoder, Encoder, Frame, Headers};
    use crius_api::shim::{encode_frame, read_frame, Request, StreamFd, Streams};
    use std::collections::BTreeMap;
    use std::io::Write as _;
    use std::os::fd::{AsRawFd, OwnedFd};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Send `bytes` with `fd` attached (SCM_RIGHTS), as the shim does.
    fn send_with_fd(sock: &std::os::unix::net::UnixStream, bytes: &[u8], fd: &OwnedFd) {
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let mut control = [0u8; 64];
        // SAFETY: test code building a one-descriptor SCM_RIGHTS message in buffers it owns.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd.as_raw_fd());
            assert_eq!(
                libc::sendmsg(sock.as_raw_fd(), &msg, 0),
                bytes.len() as isize
            );
        }
    }

    /// A stand-in for the shim: answers one `exec_stream` with a stdout pipe that carries
    /// `output`, then reports exit code `code`.
    fn fake_shim(listener: std::os::unix::net::UnixListener, output: &'static [u8], code: i32) {
        let (mut conn, _) = listener.accept().unwrap();
        let request: Request = read_frame(&mut conn).unwrap();
        assert!(matches!(request.op, Op::ExecStream(_)));
        let (r, w) = std::io::pipe().unwrap();
        let streams = Response::Ok(Reply::Streams(Streams {
            pid: 1,
            tty: false,
            fds: vec![StreamFd::Stdout],
        }));
        send_with_fd(&conn, &encode_frame(&streams).unwrap(), &OwnedFd::from(r));
        let mut w = w;
        w.write_all(output).unwrap();
        drop(w);
        let exited = Response::Ok(Reply::ProcessExited {
            exit_code: code,
            signal: None,
        });
        conn.write_all(&encode_frame(&exited).unwrap()).unwrap();
    }

    #[tokio::test]
    async fn an_exec_session_over_spdy_relays_output_and_the_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let shim = std::thread::spawn(move || fake_shim(listener, b"hello\n", 3));

        let (mut client, server_io) = tokio::io::duplex(64 * 1024);
        let target = Target {
            op: Op::ExecStream(crius_api::shim::ExecStream {
                id: "c1".into(),
                process: serde_json::json!({}),
                tty: false,
                stdin: false,
                stdout: true,
                stderr: false,
            }),
            shim_socket: socket,
            tty: false,
        };
        let server = tokio::spawn(serve(
            Session::start(server_io),
            "v4.channel.k8s.io",
            target,
        ));

        // The client's side: open error (1) and stdout (3), read until both end.
        let mut enc = Encoder::new();
        let mut wire = Vec::new();
        for (id, kind) in [(1, "error"), (3, "stdout")] {
            let mut headers = Headers::new();
            headers.insert("streamtype".into(), vec![kind.into()]);
            enc.encode(
                &Frame::SynStream {
                    stream: id,
                    fin: false,
                    headers,
                },
                &mut wire,
            )
            .unwrap();
        }
        client.write_all(&wire).await.unwrap();
        let mut dec = Decoder::new();
        let mut buf = Vec::new();
        let (mut replies, mut data, mut ended) = (0, BTreeMap::new(), Vec::new());
        while !(ended.contains(&1) && ended.contains(&3)) {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "the session ended early");
            buf.extend_from_slice(&chunk[..n]);
            while let Some((frame, used)) = dec.decode(&buf).unwrap() {
                buf.drain(..used);
                match frame {
                    Frame::SynReply { .. } => replies += 1,
                    Frame::Data {
                        stream,
                        fin,
                        data: d,
                    } => {
                        data.entry(stream).or_insert_with(Vec::new).extend(d);
                        if fin {
                            ended.push(stream);
                        }
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(replies, 2, "every stream the client opens is answered");
        assert_eq!(data[&3], b"hello\n");
        let status: serde_json::Value = serde_json::from_slice(&data[&1]).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
        drop(client);
        server.await.unwrap();
        shim.join().unwrap();
    }

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
