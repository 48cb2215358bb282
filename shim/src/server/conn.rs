//! Connections on the control socket: accepting, reading frames, serving requests one at a
//! time per connection, and writing answers (some with descriptors) without blocking.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crius_api::shim::{
    decode_frame, encode_frame, ErrorKind, Op, Reply, Request, Response, ShimError, MAX_FRAME,
    PROTOCOL_VERSION,
};
use tracing::{info, warn};

use super::{err, not_found, Container, Shim, Token};

/// On shutdown, how long to try to deliver the last answers.
const FLUSH_ON_EXIT: Duration = Duration::from_secs(1);

pub(super) struct Conn {
    pub(super) stream: UnixStream,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    /// A request of this connection is being served; later frames wait.
    busy: bool,
    /// The peer closed its side.
    eof: bool,
}

impl Conn {
    /// What to poll it for.
    pub(super) fn events(&self) -> i16 {
        let mut events = 0;
        if !self.eof {
            events |= libc::POLLIN;
        }
        if !self.outbuf.is_empty() {
            events |= libc::POLLOUT;
        }
        events
    }

    /// Write what is buffered, as far as the socket takes it.
    fn flush(&mut self) {
        while !self.outbuf.is_empty() {
            match self.stream.write(&self.outbuf) {
                Ok(0) => return,
                Ok(n) => {
                    self.outbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.outbuf.clear();
                    self.eof = true;
                    return;
                }
            }
        }
    }
}

impl Shim {
    pub(super) fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let token = self.next();
                    self.conns.insert(
                        token,
                        Conn {
                            stream,
                            inbuf: Vec::new(),
                            outbuf: Vec::new(),
                            busy: false,
                            eof: false,
                        },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!(target: "crius_shim", error = %e, "accept on control socket");
                    return;
                }
            }
        }
    }

    pub(super) fn on_conn(&mut self, token: Token, revents: i16) {
        let mut buf = std::mem::take(&mut self.buf);
        if let Some(conn) = self.conns.get_mut(&token) {
            if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                loop {
                    match conn.stream.read(&mut buf) {
                        Ok(0) => {
                            conn.eof = true;
                            break;
                        }
                        Ok(n) => {
                            conn.inbuf.extend_from_slice(&buf[..n]);
                            if conn.inbuf.len() > MAX_FRAME + 4 {
                                conn.eof = true;
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => {
                            conn.eof = true;
                            conn.outbuf.clear();
                            break;
                        }
                    }
                }
            }
            if revents & libc::POLLOUT != 0 {
                conn.flush();
            }
        }
        self.buf = buf;
        self.serve_conn(token);
    }

    /// Serve the complete requests buffered on `token`, one at a time.
    fn serve_conn(&mut self, token: Token) {
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            if conn.busy {
                break;
            }
            match decode_frame::<Request>(&conn.inbuf) {
                Ok(Some((request, used))) => {
                    conn.inbuf.drain(..used);
                    conn.busy = true;
                    if let Some(response) = self.handle(token, request) {
                        self.reply(token, response);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    conn.inbuf.clear();
                    conn.busy = true;
                    let response = Response::Err(err(
                        ErrorKind::InvalidArgument,
                        format!("malformed request: {e}"),
                    ));
                    self.reply(token, response);
                    if let Some(conn) = self.conns.get_mut(&token) {
                        conn.eof = true;
                    }
                    break;
                }
            }
        }
        if let Some(conn) = self.conns.get(&token) {
            // A peer that closed wants no more answers (a client that gave up on a `wait`, say):
            // drop the connection, and its place among a container's waiters. A parked
            // operation itself runs on; its answer goes nowhere.
            if conn.eof && (conn.busy || conn.outbuf.is_empty()) {
                self.conns.remove(&token);
                for c in self.containers.values_mut() {
                    c.waiters.retain(|t| *t != token);
                    c.detach(token);
                }
                self.abandon_execs(token);
            }
        }
    }

    fn reply(&mut self, token: Token, response: Response) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.busy = false;
        match encode_frame(&response) {
            Ok(frame) => conn.outbuf.extend_from_slice(&frame),
            Err(e) => {
                let fallback =
                    Response::Err(err(ErrorKind::Internal, format!("encode reply: {e}")));
                if let Ok(frame) = encode_frame(&fallback) {
                    conn.outbuf.extend_from_slice(&frame);
                }
            }
        }
        conn.flush();
    }

    /// Answer a parked request. The answer is queued and sent (and that connection's next
    /// request served) after the current event, so the caller's view of the state stays valid.
    pub(super) fn complete(&mut self, token: Token, response: Response) {
        self.outbox.push_back((token, response));
    }

    /// Send the queued answers, serving what each connection asked next.
    pub(super) fn flush_outbox(&mut self) {
        while let Some((token, response)) = self.outbox.pop_front() {
            self.reply(token, response);
            self.serve_conn(token);
        }
    }

    pub(super) fn flush_before_exit(&mut self) {
        self.flush_outbox();
        let until = Instant::now() + FLUSH_ON_EXIT;
        while Instant::now() < until {
            let mut pending = false;
            for conn in self.conns.values_mut() {
                conn.flush();
                pending |= !conn.outbuf.is_empty();
            }
            if !pending {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Send a response with descriptors on its first byte, leaving the connection's request
    /// in progress (a streaming request answers again later). A connection that cannot take
    /// the frame at once is given up: crius sees it close.
    pub(super) fn send_with_fds(&mut self, token: Token, response: &Response, fds: &[RawFd]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let frame = match encode_frame(response) {
            Ok(frame) => frame,
            Err(e) => {
                warn!(target: "crius_shim", error = %e, "encode streams answer");
                conn.eof = true;
                return;
            }
        };
        if !conn.outbuf.is_empty() {
            conn.eof = true;
            return;
        }
        let iov = [io::IoSlice::new(&frame)];
        let cmsgs = [nix::sys::socket::ControlMessage::ScmRights(fds)];
        let cmsgs: &[nix::sys::socket::ControlMessage<'_>] =
            if fds.is_empty() { &[] } else { &cmsgs };
        match nix::sys::socket::sendmsg::<()>(
            conn.stream.as_raw_fd(),
            &iov,
            cmsgs,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => conn.outbuf.extend_from_slice(&frame[n..]),
            Err(e) => {
                warn!(target: "crius_shim", error = %e, "send streams answer");
                conn.eof = true;
            }
        }
        conn.flush();
    }

    /// Serve one request; `None` when the answer comes later.
    fn handle(&mut self, token: Token, request: Request) -> Option<Response> {
        if request.v != PROTOCOL_VERSION {
            return Some(Response::Err(err(
                ErrorKind::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported, this shim speaks {PROTOCOL_VERSION}",
                    request.v
                ),
            )));
        }
        let result = match request.op {
            Op::Hello => Ok(Some(Reply::Hello {
                version: PROTOCOL_VERSION,
                pid: std::process::id() as i32,
                pod_id: self.cfg.pod_id.clone(),
            })),
            Op::CreateContainer(req) => self.create(token, req).map(|()| None),
            Op::Start { id } => self.start(token, &id),
            Op::Kill { id, signal, all } => self.kill(token, &id, signal, all),
            Op::Delete { id, force } => self.delete(token, &id, force).map(|()| None),
            Op::State { id } => self
                .containers
                .get(&id)
                .map(|c| Some(Reply::Container(c.info())))
                .ok_or_else(|| not_found(&id)),
            Op::List => Ok(Some(Reply::Containers {
                containers: self.containers.values().map(Container::info).collect(),
            })),
            Op::ExecSync(req) => self.exec(token, req).map(|()| None),
            Op::ReopenLog { id } => self.reopen_log(&id).map(Some),
            Op::Wait { id } => match self.containers.get_mut(&id) {
                None => Err(not_found(&id)),
                Some(c) => match c.phase.exit() {
                    Some(exit) => Ok(Some(Reply::Exited(exit.clone()))),
                    None => {
                        c.waiters.push(token);
                        Ok(None)
                    }
                },
            },
            Op::Shutdown => {
                info!(target: "crius_shim", remaining = self.containers.len(), "shutdown requested");
                self.shutdown_requested = true;
                self.prepared.clear();
                Ok(Some(Reply::Done))
            }
            Op::ExecStream(req) => self.exec_stream(token, req).map(|()| None),
            Op::Attach(req) => self.attach(token, req).map(|()| None),
            Op::Prepare => {
                self.prepare_helper();
                Ok(Some(Reply::Done))
            }
        };
        match result {
            Ok(Some(reply)) => Some(Response::Ok(reply)),
            Ok(None) => None,
            Err(e) => Some(Response::Err(e)),
        }
    }

    pub(super) fn refuse_if_stopping(&self) -> Result<(), ShimError> {
        if self.shutdown_requested || self.terminating {
            return Err(err(
                ErrorKind::FailedPrecondition,
                format!("shim of pod {} is shutting down", self.cfg.pod_id),
            ));
        }
        Ok(())
    }
}
