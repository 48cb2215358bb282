//! Processes run in a running container: `exec_sync` (output captured up to a limit, a
//! deadline, the answer once the process is reaped and its pipes drained) and `exec_stream`
//! (stdio handed to crius, the answer once it exits).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crius_api::shim::{
    ErrorKind, ExecOutcome, ExecStream, ExecSync, Reply, Response, ShimError, StreamFd, Streams,
    DEFAULT_EXEC_OUTPUT_LIMIT,
};

use super::helpers::HelperPurpose;
use super::io::{read_fd, ReadResult};
use super::{decode_status, err, not_found, pipe, Shim, Token};
use crate::helper::{set_nonblocking, HelperOp};

/// After an exec's process exits, how long to keep reading output that a background child of
/// it may still write to the inherited pipes.
const EXEC_DRAIN_GRACE: Duration = Duration::from_millis(100);

/// One output stream of an `exec_sync` process, kept up to a limit.
pub(super) struct Capture {
    pub(super) fd: Option<OwnedFd>,
    data: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Capture {
    fn new(fd: OwnedFd, limit: usize) -> Self {
        Self {
            fd: Some(fd),
            data: Vec::new(),
            limit,
            truncated: false,
        }
    }

    fn empty() -> Self {
        Self {
            fd: None,
            data: Vec::new(),
            limit: 0,
            truncated: false,
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = self.limit.saturating_sub(self.data.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Up to `rounds` reads, until the pipe would block or ends.
    fn read(&mut self, buf: &mut [u8], rounds: usize) {
        for _ in 0..rounds {
            let Some(fd) = &self.fd else {
                return;
            };
            match read_fd(fd.as_raw_fd(), buf) {
                ReadResult::Data(n) => self.take(&buf[..n]),
                ReadResult::WouldBlock => return,
                ReadResult::Eof => {
                    self.fd = None;
                    return;
                }
            }
        }
    }
}

pub(super) struct ExecJob {
    token: Token,
    container: String,
    pid: Option<i32>,
    pub(super) out: [Capture; 2],
    /// Raw wait status once reaped.
    status: Option<i32>,
    deadline: Option<Instant>,
    /// Killed for its deadline or because its requester went away.
    timed_out: bool,
    drain_until: Option<Instant>,
    process_file: PathBuf,
    /// An `exec_stream`: its stdio belongs to crius and its answer is `process_exited`.
    streaming: bool,
    /// For `exec_stream`: the crius ends of the process's stdio, handed over with the
    /// `streams` answer once the process runs (the captures then stay empty).
    stream: Option<StreamHandoff>,
}

struct StreamHandoff {
    /// With a tty: hand over the master as stdin too.
    stdin: bool,
    fds: Vec<(StreamFd, OwnedFd)>,
}

/// An exec that failed in the shim, before its process ran.
fn exec_failed(id: &str, what: &str, e: &dyn std::fmt::Display) -> ShimError {
    err(
        ErrorKind::Internal,
        format!("exec in container {id}: {what}: {e}"),
    )
}

impl ExecJob {
    /// A job whose helper was just spawned; `stream` makes it an `exec_stream`.
    fn new(
        token: Token,
        container: String,
        process_file: PathBuf,
        out: [Capture; 2],
        deadline: Option<Instant>,
        stream: Option<StreamHandoff>,
    ) -> Self {
        Self {
            token,
            container,
            pid: None,
            out,
            status: None,
            deadline,
            timed_out: false,
            drain_until: None,
            process_file,
            streaming: stream.is_some(),
            stream,
        }
    }

    /// Its pending timers: the deadline (while it runs) and the end of the drain.
    pub(super) fn timers(&self) -> [Option<Instant>; 2] {
        let deadline = if self.timed_out || self.status.is_some() {
            None
        } else {
            self.deadline
        };
        [deadline, self.drain_until]
    }
}

impl Shim {
    pub(super) fn exec(&mut self, token: Token, req: ExecSync) -> Result<(), ShimError> {
        let id = req.id.clone();
        // Output is captured through pipes; a terminal would need a console socket.
        let process = self.exec_process(&id, req.process, false)?;
        let internal = |what: &str, e: &dyn std::fmt::Display| exec_failed(&id, what, e);
        let (out_r, out_w) = pipe().map_err(|e| internal("stdout pipe", &e))?;
        let (err_r, err_w) = pipe().map_err(|e| internal("stderr pipe", &e))?;
        set_nonblocking(out_r.as_raw_fd()).map_err(|e| internal("pipe", &e))?;
        set_nonblocking(err_r.as_raw_fd()).map_err(|e| internal("pipe", &e))?;
        let stdio = [None, Some(out_w), Some(err_w)];
        let (exec_id, process_file) = self.spawn_exec(&id, &process, stdio)?;
        let limit = match req.output_limit {
            0 => DEFAULT_EXEC_OUTPUT_LIMIT,
            n => n,
        };
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let deadline =
            (req.timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(req.timeout_ms));
        let out = [Capture::new(out_r, limit), Capture::new(err_r, limit)];
        let job = ExecJob::new(token, id, process_file, out, deadline, None);
        self.execs.insert(exec_id, job);
        Ok(())
    }

    /// The OCI process of an exec in container `id`, which must be running, with its
    /// `terminal` set to `terminal`.
    fn exec_process(
        &self,
        id: &str,
        mut process: serde_json::Value,
        terminal: bool,
    ) -> Result<serde_json::Value, ShimError> {
        self.refuse_if_stopping()?;
        let c = self.containers.get(id).ok_or_else(|| not_found(id))?;
        c.phase.can_exec(id)?;
        let Some(obj) = process.as_object_mut() else {
            return Err(err(
                ErrorKind::InvalidArgument,
                "exec process must be a JSON object (an OCI process)",
            ));
        };
        obj.insert("terminal".into(), serde_json::Value::Bool(terminal));
        Ok(process)
    }

    /// Start the helper that runs `process` in container `id` with `stdio` (closed here once
    /// the helper has them): the exec's id and process file, which a failure removes.
    fn spawn_exec(
        &mut self,
        id: &str,
        process: &serde_json::Value,
        stdio: [Option<OwnedFd>; 3],
    ) -> Result<(u64, PathBuf), ShimError> {
        let exec_id = self.next();
        let process_file = self.write_process_file(exec_id, process, id)?;
        // The helper reads the host's mount table itself if the shim cannot name them.
        let cgroup_mounts = self.hierarchies().map(|h| h.mounts()).unwrap_or_default();
        let op = HelperOp::Exec {
            process: process_file.clone(),
            cgroup_mounts,
        };
        let raw = [0, 1, 2].map(|i| stdio[i].as_ref().map(|f| f.as_raw_fd()));
        let purpose = HelperPurpose::Exec { exec: exec_id };
        if let Err(e) = self.spawn_helper(id, op, raw, purpose) {
            let _ = fs::remove_file(&process_file);
            return Err(err(
                ErrorKind::Internal,
                format!("exec in container {id}: spawn helper: {e}"),
            ));
        }
        Ok((exec_id, process_file))
    }

    /// Write an exec's OCI process where its helper reads it: `exec/<n>.json`.
    fn write_process_file(
        &self,
        exec_id: u64,
        process: &serde_json::Value,
        id: &str,
    ) -> Result<PathBuf, ShimError> {
        let internal = |what: &str, e: &dyn std::fmt::Display| exec_failed(id, what, e);
        let dir = self.cfg.state_dir.join("exec");
        let process_file = dir.join(format!("{exec_id}.json"));
        let bytes = serde_json::to_vec(process).map_err(|e| internal("encode process", &e))?;
        let written = match fs::write(&process_file, &bytes) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&dir).and_then(|()| fs::write(&process_file, &bytes))
            }
            other => other,
        };
        written.map_err(|e| internal("write process file", &e))?;
        Ok(process_file)
    }

    /// `exec_stream`: start a process whose stdio crius relays; see the protocol's
    /// "Streaming requests".
    pub(super) fn exec_stream(&mut self, token: Token, req: ExecStream) -> Result<(), ShimError> {
        let id = req.id.clone();
        let process = self.exec_process(&id, req.process, req.tty)?;
        let internal = |what: &str, e: &dyn std::fmt::Display| exec_failed(&id, what, e);
        // The process's ends (stdin, stdout, stderr) and crius's.
        let mut child: [Option<OwnedFd>; 3] = [None, None, None];
        let mut handoff = Vec::new();
        // With a tty the helper opens the pty in the container's devpts and reports its master.
        if !req.tty {
            if req.stdin {
                let (r, w) = pipe().map_err(|e| internal("stdin pipe", &e))?;
                child[0] = Some(r);
                handoff.push((StreamFd::Stdin, w));
            }
            for (i, (wanted, kind)) in [
                (req.stdout, StreamFd::Stdout),
                (req.stderr, StreamFd::Stderr),
            ]
            .into_iter()
            .enumerate()
            {
                if wanted {
                    let (r, w) = pipe().map_err(|e| internal("output pipe", &e))?;
                    child[i + 1] = Some(w);
                    handoff.push((kind, r));
                } else {
                    let null = fs::OpenOptions::new()
                        .write(true)
                        .open("/dev/null")
                        .map_err(|e| internal("open /dev/null", &e))?;
                    child[i + 1] = Some(null.into());
                }
            }
        }
        let (exec_id, process_file) = self.spawn_exec(&id, &process, child)?;
        let stream = StreamHandoff {
            stdin: req.stdin,
            fds: handoff,
        };
        let out = [Capture::empty(), Capture::empty()];
        let job = ExecJob::new(token, id, process_file, out, None, Some(stream));
        self.execs.insert(exec_id, job);
        Ok(())
    }

    /// The exec's helper reported: the process runs (a stream gets its descriptors now), or
    /// the exec failed.
    pub(super) fn exec_started(
        &mut self,
        exec: u64,
        result: Result<(i32, Option<OwnedFd>), String>,
    ) {
        let (pid, master) = match result {
            Ok(ok) => ok,
            Err(message) => {
                let Some(job) = self.execs.remove(&exec) else {
                    return;
                };
                let _ = fs::remove_file(&job.process_file);
                // The init ended while the helper was joining it (a pod being stopped): its
                // namespaces were gone. The container is not running; the shim did not fail.
                let error = match self.init_ended(&job.container) {
                    _ if message.contains(crate::exec::COMMAND_CANNOT_RUN) => err(
                        ErrorKind::InvalidArgument,
                        format!("exec in container {}: {message}", job.container),
                    ),
                    true => err(
                        ErrorKind::FailedPrecondition,
                        format!(
                            "container {} is not running: it ended while the exec was starting \
                             ({message})",
                            job.container
                        ),
                    ),
                    false => err(
                        ErrorKind::Internal,
                        format!("exec in container {}: {message}", job.container),
                    ),
                };
                self.complete(job.token, Response::Err(error));
                return;
            }
        };
        let Some(job) = self.execs.get_mut(&exec) else {
            return;
        };
        job.pid = Some(pid);
        let token = job.token;
        let timed_out = job.timed_out;
        if let Some(mut handoff) = job.stream.take() {
            // The helper reports a master only for a process on a terminal.
            let tty = master.is_some();
            if let Some(master) = master {
                // A terminal: the master is the process's input and output.
                let wanted = [(handoff.stdin, StreamFd::Stdin), (true, StreamFd::Stdout)];
                for (_, kind) in wanted.into_iter().filter(|(w, _)| *w) {
                    if let Ok(dup) = master.try_clone() {
                        handoff.fds.push((kind, dup));
                    }
                }
                handoff.fds.push((StreamFd::Pty, master));
            }
            let streams = Streams {
                pid,
                tty,
                fds: handoff.fds.iter().map(|(kind, _)| *kind).collect(),
            };
            let fds: Vec<RawFd> = handoff.fds.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
            self.send_with_fds(token, &Response::Ok(Reply::Streams(streams)), &fds);
            // Our copies close here: the process and crius hold the only ends.
            drop(handoff);
        }
        if timed_out {
            self.signal(pid, libc::SIGKILL);
        }
        if let Some(status) = self.take_orphan_exit(pid) {
            self.exec_exited(exec, status);
        }
    }

    /// Whether container `id`'s init has ended: the shim has seen its exit, or it is a zombie
    /// or gone though its exit has not been handled yet.
    fn init_ended(&self, id: &str) -> bool {
        let Some(pid) = self.containers.get(id).and_then(|c| c.phase.live_pid()) else {
            return true;
        };
        match fs::read(format!("/proc/{pid}/stat")) {
            // The state is the field after the command, which ends at the last `)`.
            Ok(stat) => stat
                .iter()
                .rposition(|&b| b == b')')
                .and_then(|end| stat.get(end + 2))
                .is_some_and(|state| matches!(state, b'Z' | b'X')),
            Err(_) => true,
        }
    }

    /// The exec whose process is `pid`, still running.
    pub(super) fn exec_of(&self, pid: i32) -> Option<u64> {
        self.execs
            .iter()
            .find(|(_, j)| j.pid == Some(pid) && j.status.is_none())
            .map(|(k, _)| *k)
    }

    pub(super) fn on_exec_output(&mut self, exec: u64, i: usize) {
        if let Some(job) = self.execs.get_mut(&exec) {
            job.out[i].read(&mut self.buf, 1);
        }
        self.maybe_finish_exec(exec);
    }

    pub(super) fn exec_exited(&mut self, exec: u64, status: i32) {
        let Some(job) = self.execs.get_mut(&exec) else {
            return;
        };
        job.status = Some(status);
        for cap in &mut job.out {
            cap.read(&mut self.buf, usize::MAX);
        }
        if job.out.iter().any(|c| c.fd.is_some()) {
            // A background child still holds the pipes: give it a moment, not forever.
            job.drain_until = Some(Instant::now() + EXEC_DRAIN_GRACE);
        }
        self.maybe_finish_exec(exec);
    }

    fn maybe_finish_exec(&mut self, exec: u64) {
        let Some(job) = self.execs.get(&exec) else {
            return;
        };
        let Some(status) = job.status else {
            return;
        };
        let drained = job.out.iter().all(|c| c.fd.is_none());
        let grace_over = job.drain_until.is_some_and(|t| Instant::now() >= t);
        if !drained && !grace_over {
            return;
        }
        let Some(mut job) = self.execs.remove(&exec) else {
            return;
        };
        let _ = fs::remove_file(&job.process_file);
        let (exit_code, signal) = decode_status(status);
        if job.streaming {
            let response = Response::Ok(Reply::ProcessExited { exit_code, signal });
            self.complete(job.token, response);
            return;
        }
        let [out, errs] = &mut job.out;
        let outcome = ExecOutcome {
            exit_code,
            signal,
            timed_out: job.timed_out,
            stdout: std::mem::take(&mut out.data),
            stderr: std::mem::take(&mut errs.data),
            stdout_truncated: out.truncated,
            stderr_truncated: errs.truncated,
        };
        self.complete(job.token, Response::Ok(Reply::Exec(outcome)));
    }

    /// Kills the processes of the exec_sync calls whose requester went away (its client
    /// cancelled or its deadline passed): nobody will read their output. Streaming execs belong
    /// to crius's stream once handed over and are left alone.
    pub(super) fn abandon_execs(&mut self, token: Token) {
        let mut kill = Vec::new();
        for job in self.execs.values_mut() {
            if job.token != token || job.streaming || job.timed_out || job.status.is_some() {
                continue;
            }
            // Marked like a timeout: a pid not known yet is killed when the helper reports it.
            job.timed_out = true;
            kill.extend(job.pid);
        }
        for pid in kill {
            self.signal(pid, libc::SIGKILL);
        }
    }

    /// Kill the execs past their deadline; answer those whose drain grace ended.
    pub(super) fn check_exec_timers(&mut self, now: Instant) {
        let mut finish = Vec::new();
        let mut kill = Vec::new();
        for (id, job) in &mut self.execs {
            if let Some(deadline) = job.deadline {
                if !job.timed_out && job.status.is_none() && now >= deadline {
                    job.timed_out = true;
                    kill.extend(job.pid);
                }
            }
            if job.drain_until.is_some_and(|t| now >= t) {
                finish.push(*id);
            }
        }
        for pid in kill {
            self.signal(pid, libc::SIGKILL);
        }
        for id in finish {
            self.maybe_finish_exec(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_truncates_at_its_limit() {
        let (r, _w) = pipe().unwrap();
        let mut cap = Capture::new(r, 5);
        cap.take(b"abc");
        cap.take(b"defg");
        assert_eq!(cap.data, b"abcde");
        assert!(cap.truncated);
    }
}
