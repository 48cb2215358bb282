//! A container's output: relayed from its pipes (or pty master) into its CRI log and copied to
//! attach sessions, which also get its stdin.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crius_api::shim::{Attach, ErrorKind, Reply, Response, ShimError, StreamFd, Streams};
use tracing::{info, warn};

use super::{err, not_found, pipe, Container, Shim, Token};
use crate::cri_log::Stream;
use crate::helper::set_nonblocking;
use crate::time::now_unix_nanos;

/// Capacity asked for the pipes that carry a container's output to an attach session.
const ATTACH_PIPE_SIZE: libc::c_int = 1 << 20;

/// One attach session: where the container's output is copied for it.
pub(super) struct AttachSink {
    /// The connection that asked for it; closing it ends the session.
    pub(super) token: Token,
    /// Write ends (non-blocking) of its stdout and stderr pipes.
    out: [Option<OwnedFd>; 2],
    /// It was handed the container's stdin.
    stdin: bool,
}

pub(super) enum ReadResult {
    Data(usize),
    WouldBlock,
    Eof,
}

/// One read from a non-blocking descriptor.
pub(super) fn read_fd(fd: RawFd, buf: &mut [u8]) -> ReadResult {
    loop {
        // SAFETY: reading into a buffer we own, of the length we pass.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return ReadResult::Data(n as usize);
        }
        if n == 0 {
            return ReadResult::Eof;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return ReadResult::WouldBlock,
            // EIO: the pty's other side is closed; anything else ends the stream too.
            _ => return ReadResult::Eof,
        }
    }
}

impl Container {
    /// End the attach session of connection `token`, if it has one: its pipes close and, for
    /// a `stdin_once` container attached with stdin, so does the container's stdin.
    pub(super) fn detach(&mut self, token: Token) {
        let Some(i) = self.attaches.iter().position(|a| a.token == token) else {
            return;
        };
        let sink = self.attaches.swap_remove(i);
        if sink.stdin && self.stdin_once && !self.tty {
            info!(target: "crius_shim", container = %self.id, "attach with stdin ended: closing stdin (stdin_once)");
            self.stdin = None;
        }
    }

    /// Copy `bytes` of output stream `i` to every attach session; a session whose pipe is
    /// full loses them, one whose reader is gone loses its pipe.
    fn fan_out(&mut self, i: usize, bytes: &[u8]) {
        for sink in &mut self.attaches {
            let Some(fd) = &sink.out[i] else {
                continue;
            };
            // SAFETY: writing from a buffer we own, of the length we pass.
            let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock {
                    sink.out[i] = None;
                }
            }
        }
    }
}

impl Shim {
    /// Read whatever is buffered in a container's pipes, without waiting for more.
    pub(super) fn drain_outputs(&mut self, id: &str) {
        for i in 0..2 {
            for _ in 0..1024 {
                if !self.on_output(id, i) {
                    break;
                }
            }
        }
    }

    /// One read from a container's output; true if data was read.
    pub(super) fn on_output(&mut self, id: &str, i: usize) -> bool {
        let Some(c) = self.containers.get_mut(id) else {
            return false;
        };
        let Some(fd) = &c.outputs[i] else {
            return false;
        };
        let stream = if i == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        match read_fd(fd.as_raw_fd(), &mut self.buf) {
            ReadResult::Data(n) => {
                if let Some(log) = &mut c.log {
                    if let Err(e) = log.write(stream, &self.buf[..n], now_unix_nanos()) {
                        warn!(target: "crius_shim", container = %id, error = %e, "write log");
                    }
                }
                if !c.attaches.is_empty() {
                    c.fan_out(i, &self.buf[..n]);
                }
                true
            }
            ReadResult::WouldBlock => false,
            ReadResult::Eof => {
                c.outputs[i] = None;
                if let Some(log) = &mut c.log {
                    let _ = log.finish(stream, now_unix_nanos());
                }
                false
            }
        }
    }

    /// `attach`: hand crius the container's stdin and pipes that receive a copy of its
    /// output from now on; see the protocol's "Streaming requests".
    pub(super) fn attach(&mut self, token: Token, req: Attach) -> Result<(), ShimError> {
        let id = req.id.clone();
        let c = self.containers.get_mut(&id).ok_or_else(|| not_found(&id))?;
        let pid = c.phase.can_exec(&id)?;
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            err(
                ErrorKind::Internal,
                format!("attach to container {id}: {what}: {e}"),
            )
        };
        let mut handoff = Vec::new();
        let mut sink = AttachSink {
            token,
            out: [None, None],
            stdin: false,
        };
        if req.stdin {
            if let Some(stdin) = &c.stdin {
                let dup = stdin.try_clone().map_err(|e| internal("dup stdin", &e))?;
                handoff.push((StreamFd::Stdin, dup));
                sink.stdin = true;
            }
        }
        // A tty container has one output, its pty master, logged as stdout.
        let wanted = [req.stdout, req.stderr && !c.tty];
        for (i, kind) in [StreamFd::Stdout, StreamFd::Stderr].into_iter().enumerate() {
            if wanted[i] && c.outputs[i].is_some() {
                let (r, w) = pipe().map_err(|e| internal("output pipe", &e))?;
                set_nonblocking(w.as_raw_fd()).map_err(|e| internal("output pipe", &e))?;
                // Room for a burst while crius relays it: what does not fit is lost to this
                // session (never to the log). The default 64 KiB is little; failing to grow
                // it (pipe-max-size) only keeps the default.
                // SAFETY: F_SETPIPE_SZ on a pipe we own only changes its capacity.
                unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, ATTACH_PIPE_SIZE) };
                sink.out[i] = Some(w);
                handoff.push((kind, r));
            }
        }
        if c.tty {
            if let Some(master) = &c.outputs[0] {
                let dup = master.try_clone().map_err(|e| internal("dup pty", &e))?;
                handoff.push((StreamFd::Pty, dup));
            }
        }
        let with_stdin = sink.stdin;
        c.attaches.push(sink);
        let streams = Streams {
            pid,
            tty: c.tty,
            fds: handoff.iter().map(|(kind, _)| *kind).collect(),
        };
        let fds: Vec<RawFd> = handoff.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
        info!(target: "crius_shim", container = %id, stdin = with_stdin, "attached");
        self.send_with_fds(token, &Response::Ok(Reply::Streams(streams)), &fds);
        Ok(())
    }
}
