//! The shim's state machine without root and without containers: a real `Shim` event loop on a
//! real control socket, with a fake [`Launcher`] whose "helpers" are socket pairs the test
//! answers on and whose "processes" are pids that exist nowhere (above the kernel's pid limit),
//! so signals are only recorded and exits are fed by the test. Covers the races of create,
//! start, kill, delete and exec: helpers that die, exits that arrive before the report naming
//! the process, deletes that wait for helpers, a shim terminated during a create.
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crius_api::shim::{
    decode_frame, encode_frame, ContainerStatus, CreateContainer, ErrorKind, ExecSync, Op, Reply,
    Request, Response,
};
use crius_shim::helper::{self, Helper, HelperCall, HelperOp, Launcher, Outcome};
use crius_shim::server::{Config, Shim};
use crius_shim::signals::Signals;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

/// Fake pids start here: above `pid_max`'s ceiling (2^22), so no real process has them.
const FAKE_PID: i32 = 5_000_000;

/// A helper the shim "spawned": what it was asked and the test's end of its report socket.
struct FakeHelper {
    pid: i32,
    call: HelperCall,
    chan: Option<OwnedFd>,
}

#[derive(Default)]
struct World {
    helpers: Vec<FakeHelper>,
    signals: Vec<(i32, i32)>,
    next_pid: i32,
}

#[derive(Clone, Default)]
struct Fake(Rc<RefCell<World>>);

impl Fake {
    fn pid(&self) -> i32 {
        let mut w = self.0.borrow_mut();
        w.next_pid += 1;
        FAKE_PID + w.next_pid
    }
}

impl Launcher for Fake {
    fn spawn(&mut self, call: &HelperCall, _stdio: [Option<RawFd>; 3]) -> std::io::Result<Helper> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        helper::set_nonblocking(ours.as_raw_fd())?;
        let pid = self.pid();
        self.0.borrow_mut().helpers.push(FakeHelper {
            pid,
            call: call.clone(),
            chan: Some(theirs),
        });
        Ok(Helper { pid, chan: ours })
    }

    fn signal(&mut self, pid: i32, signal: i32) -> std::io::Result<()> {
        self.0.borrow_mut().signals.push((pid, signal));
        Ok(())
    }
}

/// A shim with a fake launcher and a client connection to it.
struct Rig {
    _dir: tempfile::TempDir,
    bundle: PathBuf,
    shim: Shim,
    fake: Fake,
    /// Where parked requests are sent ([`Rig::send`], [`Rig::answer`]).
    client: UnixStream,
    inbuf: Vec<u8>,
    /// A second connection for requests answered at once ([`Rig::call`]), which the
    /// parked request of `client` must not hold up.
    side: UnixStream,
    side_buf: Vec<u8>,
}

/// Run `shim` until a frame is complete on `conn`.
fn await_answer(shim: &mut Shim, conn: &mut UnixStream, inbuf: &mut Vec<u8>) -> Response {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((response, used)) = decode_frame::<Response>(inbuf).unwrap() {
            inbuf.drain(..used);
            return response;
        }
        assert!(Instant::now() < until, "no answer");
        shim.turn(10);
        let mut buf = [0u8; 65536];
        match conn.read(&mut buf) {
            Ok(0) => panic!("shim closed the connection"),
            Ok(n) => inbuf.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn write_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = r#"{"ociVersion":"1.0.2","process":{"terminal":false,"args":["sh"],"cwd":"/"},
        "root":{"path":"rootfs"},"linux":{"cgroupsPath":"/crius-fake/c"}}"#;
    std::fs::write(bundle.join("config.json"), spec).unwrap();
    bundle
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let bundle = write_bundle(dir.path());
        // By its full path: `bind_control_socket` changes the process's working directory,
        // which the tests running in parallel share.
        let listener =
            std::os::unix::net::UnixListener::bind(state.join(crius_api::shim::CONTROL_SOCKET))
                .unwrap();
        let cfg = Config {
            pod_id: "pod".to_owned(),
            state_dir: state.clone(),
            max_log_line: 16 * 1024,
            helper: PathBuf::from("/nonexistent/crius-shim-helper"),
        };
        let fake = Fake::default();
        let signals = Signals::new().unwrap();
        let shim = Shim::with_launcher(cfg, listener, signals, Box::new(fake.clone())).unwrap();
        let connect = || {
            let conn = UnixStream::connect(state.join(crius_api::shim::CONTROL_SOCKET)).unwrap();
            conn.set_nonblocking(true).unwrap();
            conn
        };
        Rig {
            _dir: dir,
            bundle,
            shim,
            fake,
            client: connect(),
            inbuf: Vec::new(),
            side: connect(),
            side_buf: Vec::new(),
        }
    }

    /// Send a request without waiting for its answer.
    fn send(&mut self, op: Op) {
        let frame = encode_frame(&Request::new(op)).unwrap();
        self.client.write_all(&frame).unwrap();
    }

    /// Run the loop until the answer to what [`Rig::send`] sent arrives.
    fn answer(&mut self) -> Response {
        await_answer(&mut self.shim, &mut self.client, &mut self.inbuf)
    }

    /// Run the loop a few rounds.
    fn spin(&mut self) {
        for _ in 0..5 {
            self.shim.turn(5);
        }
    }

    /// Run the loop a few rounds and check that no answer came.
    fn no_answer(&mut self) {
        self.spin();
        let mut buf = [0u8; 65536];
        match self.client.read(&mut buf) {
            Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
        }
        assert!(self.inbuf.is_empty(), "unexpected answer");
    }

    /// A request on the side connection, answered at once.
    fn call(&mut self, op: Op) -> Response {
        let frame = encode_frame(&Request::new(op)).unwrap();
        self.side.write_all(&frame).unwrap();
        await_answer(&mut self.shim, &mut self.side, &mut self.side_buf)
    }

    fn ok(&mut self, op: Op) -> Reply {
        match self.call(op) {
            Response::Ok(reply) => reply,
            Response::Err(e) => panic!("request failed: {e:?}"),
        }
    }

    fn refused(&mut self, op: Op) -> ErrorKind {
        match self.call(op) {
            Response::Ok(reply) => panic!("expected a refusal, got {reply:?}"),
            Response::Err(e) => e.kind,
        }
    }

    fn status(&mut self, id: &str) -> ContainerStatus {
        match self.ok(Op::State { id: id.to_owned() }) {
            Reply::Container(info) => info.status,
            other => panic!("{other:?}"),
        }
    }

    /// The `n`-th helper launched (0-based): its pid and operation.
    fn helper(&self, n: usize) -> (i32, HelperOp) {
        let w = self.fake.0.borrow();
        let h = &w.helpers[n];
        (h.pid, h.call.op.clone())
    }

    fn helpers(&self) -> usize {
        self.fake.0.borrow().helpers.len()
    }

    /// Asks for an exec in container `id`, which stays unanswered until its helper reports;
    /// returns that helper's number.
    fn exec_pending(&mut self, id: &str) -> usize {
        self.send(exec_op(id));
        self.no_answer();
        self.helpers() - 1
    }

    /// Helper `n` reports `outcome`.
    fn report(&mut self, n: usize, outcome: Outcome) {
        let w = self.fake.0.borrow();
        let chan = w.helpers[n].chan.as_ref().unwrap();
        helper::report_on(chan.as_raw_fd(), &outcome, None).unwrap();
    }

    /// Helper `n` dies without a report, killed by SIGKILL.
    fn crash(&mut self, n: usize) {
        let pid = {
            let mut w = self.fake.0.borrow_mut();
            w.helpers[n].chan = None;
            w.helpers[n].pid
        };
        self.shim.process_exited(pid, libc::SIGKILL);
    }

    /// Helper `n` exits after its report.
    fn helper_exits(&mut self, n: usize) {
        let pid = self.fake.0.borrow().helpers[n].pid;
        self.shim.process_exited(pid, 0);
    }

    fn signalled(&self) -> Vec<(i32, i32)> {
        self.fake.0.borrow().signals.clone()
    }

    fn create(&mut self, id: &str) {
        let bundle = self.bundle.clone();
        self.send(Op::CreateContainer(CreateContainer {
            id: id.to_owned(),
            bundle,
            stdin: false,
            stdin_once: false,
            tty: false,
            log_path: None,
            runtime: None,
            restore: None,
        }));
    }

    /// Create `id` and answer its helper with a fresh init pid: the pid.
    fn created(&mut self, id: &str) -> i32 {
        let init = self.fake.pid();
        self.created_as(id, init)
    }

    /// Create `id` and answer its helper with `init` as the init's pid.
    fn created_as(&mut self, id: &str, init: i32) -> i32 {
        self.create(id);
        self.no_answer();
        let n = self.helpers() - 1;
        assert!(matches!(self.helper(n).1, HelperOp::Create { .. }));
        self.report(n, Outcome::Ok { pid: init });
        assert_eq!(self.answer(), Response::Ok(Reply::Created { pid: init }));
        self.helper_exits(n);
        init
    }

    /// Create and start `id` (the start goes to a helper: the fake has no libcontainer
    /// record): the init's pid.
    fn running(&mut self, id: &str) -> i32 {
        let init = self.fake.pid();
        self.running_as(id, init)
    }

    /// The answer is the start of `id`'s `init`, with the start time the shim then reports
    /// in the container's state (the daemon records the one, a recovery reads the other).
    fn assert_started(&mut self, id: &str, init: i32) {
        let Response::Ok(Reply::Started { pid, started_at }) = self.answer() else {
            panic!("not a start");
        };
        assert_eq!(pid, init);
        assert!(started_at.is_some_and(|t| t > 0), "{started_at:?}");
        match self.ok(Op::State { id: id.into() }) {
            Reply::Container(info) => assert_eq!(info.started_at_unix_nano, started_at),
            other => panic!("{other:?}"),
        }
    }

    /// [`Rig::running`] with `init` as the init's pid.
    fn running_as(&mut self, id: &str, init: i32) -> i32 {
        let init = self.created_as(id, init);
        self.send(Op::Start { id: id.to_owned() });
        self.no_answer();
        let n = self.helpers() - 1;
        assert_eq!(self.helper(n).1, HelperOp::Start);
        self.report(n, Outcome::Ok { pid: 0 });
        self.assert_started(id, init);
        self.helper_exits(n);
        assert_eq!(self.status(id), ContainerStatus::Running);
        init
    }
}

fn exec_op(id: &str) -> Op {
    Op::ExecSync(ExecSync {
        id: id.to_owned(),
        process: serde_json::json!({"args": ["true"], "cwd": "/"}),
        timeout_ms: 0,
        output_limit: 0,
    })
}

fn delete_op(id: &str, force: bool) -> Op {
    Op::Delete {
        id: id.to_owned(),
        force,
    }
}

#[test]
fn create_start_exit_and_delete_through_helpers() {
    let mut rig = Rig::new();
    let init = rig.running("c");
    rig.send(Op::Wait { id: "c".into() });
    rig.no_answer();
    rig.shim.process_exited(init, 3 << 8);
    match rig.answer() {
        Response::Ok(Reply::Exited(exit)) => assert_eq!((exit.pid, exit.exit_code), (init, 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.status("c"), ContainerStatus::Stopped);
    rig.send(delete_op("c", false));
    rig.no_answer();
    let n = rig.helpers() - 1;
    assert_eq!(rig.helper(n).1, HelperOp::Delete);
    rig.report(n, Outcome::Ok { pid: 0 });
    assert_eq!(rig.answer(), Response::Ok(Reply::Done));
    assert_eq!(
        rig.refused(Op::State { id: "c".into() }),
        ErrorKind::NotFound
    );
}

#[test]
fn requests_against_a_container_being_created_are_refused() {
    let mut rig = Rig::new();
    rig.create("c");
    rig.no_answer();
    assert_eq!(rig.status("c"), ContainerStatus::Creating);
    assert_eq!(
        rig.refused(delete_op("c", true)),
        ErrorKind::FailedPrecondition
    );
    let kill = Op::Kill {
        id: "c".into(),
        signal: 15,
        all: false,
    };
    assert_eq!(rig.refused(kill), ErrorKind::FailedPrecondition);
    assert_eq!(
        rig.refused(Op::Start { id: "c".into() }),
        ErrorKind::FailedPrecondition
    );
    assert_eq!(rig.refused(exec_op("c")), ErrorKind::FailedPrecondition);
    let again = Op::CreateContainer(CreateContainer {
        id: "c".to_owned(),
        bundle: rig.bundle.clone(),
        stdin: false,
        stdin_once: false,
        tty: false,
        log_path: None,
        runtime: None,
        restore: None,
    });
    assert_eq!(rig.refused(again), ErrorKind::AlreadyExists);
}

#[test]
fn a_create_helper_that_dies_fails_the_create_and_cleans_up_in_the_background() {
    let mut rig = Rig::new();
    rig.create("c");
    rig.no_answer();
    rig.crash(0);
    match rig.answer() {
        Response::Err(e) => {
            assert_eq!(e.kind, ErrorKind::Internal);
            assert!(e.message.contains("without a report"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rig.refused(Op::State { id: "c".into() }),
        ErrorKind::NotFound
    );
    // What a dead helper may have left of libcontainer's state goes in the background.
    assert_eq!(rig.helper(1).1, HelperOp::Delete);
    // The id is free again.
    rig.created("c");
}

#[test]
fn an_init_that_exits_before_the_create_report_is_stopped_at_once() {
    let mut rig = Rig::new();
    rig.create("c");
    rig.no_answer();
    let init = rig.fake.pid();
    // Reaped before the helper's report names it.
    rig.shim.process_exited(init, 1 << 8);
    rig.report(0, Outcome::Ok { pid: init });
    assert_eq!(rig.answer(), Response::Ok(Reply::Created { pid: init }));
    assert_eq!(rig.status("c"), ContainerStatus::Stopped);
    assert_eq!(
        rig.refused(Op::Start { id: "c".into() }),
        ErrorKind::FailedPrecondition
    );
}

#[test]
fn a_second_start_while_one_runs_is_refused_and_a_failed_start_can_be_retried() {
    let mut rig = Rig::new();
    let init = rig.created("c");
    rig.send(Op::Start { id: "c".into() });
    rig.no_answer();
    let first = rig.helpers() - 1;
    // A second client asks too.
    let mut other = UnixStream::connect(rig._dir.path().join("state/control.sock")).unwrap();
    other
        .write_all(&encode_frame(&Request::new(Op::Start { id: "c".into() })).unwrap())
        .unwrap();
    rig.spin();
    other.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let n = other.read(&mut buf).unwrap();
    match decode_frame::<Response>(&buf[..n]).unwrap() {
        Some((Response::Err(e), _)) => assert_eq!(e.kind, ErrorKind::FailedPrecondition),
        other => panic!("{other:?}"),
    }
    rig.report(
        first,
        Outcome::Err {
            message: "hook failed".into(),
        },
    );
    assert!(matches!(rig.answer(), Response::Err(e) if e.message.contains("hook failed")));
    assert_eq!(rig.status("c"), ContainerStatus::Created);
    rig.send(Op::Start { id: "c".into() });
    rig.no_answer();
    let n = rig.helpers() - 1;
    rig.report(n, Outcome::Ok { pid: 0 });
    rig.assert_started("c", init);
}

#[test]
fn an_init_that_exits_while_its_start_helper_runs() {
    let mut rig = Rig::new();
    let init = rig.created("c");
    rig.send(Op::Start { id: "c".into() });
    rig.no_answer();
    let n = rig.helpers() - 1;
    rig.shim.process_exited(init, 0);
    rig.report(n, Outcome::Ok { pid: 0 });
    rig.assert_started("c", init);
    match rig.ok(Op::State { id: "c".into() }) {
        Reply::Container(info) => {
            assert_eq!(info.status, ContainerStatus::Stopped);
            assert!(info.started_at_unix_nano.is_some());
            assert_eq!(info.exit.unwrap().exit_code, 0);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_exec_helper_is_told_the_hosts_cgroup_mounts() {
    let mut rig = Rig::new();
    rig.running("c");
    let exec_helper = rig.exec_pending("c");
    let HelperOp::Exec { cgroup_mounts, .. } = rig.helper(exec_helper).1 else {
        panic!("not an exec helper");
    };
    // What the helper would otherwise read from the mount table itself, found by the shim.
    let host = crius_shim::cgroup::Hierarchies::detect().unwrap().mounts();
    assert!(!host.is_empty());
    assert_eq!(cgroup_mounts, host);
}

#[test]
fn a_forced_delete_kills_the_init_and_waits_for_running_helpers() {
    let mut rig = Rig::new();
    let init = rig.running("c");
    // An exec whose helper has not reported yet.
    let exec_helper = rig.exec_pending("c");
    assert!(matches!(rig.helper(exec_helper).1, HelperOp::Exec { .. }));
    // A second connection deletes by force.
    let mut deleter = UnixStream::connect(rig._dir.path().join("state/control.sock")).unwrap();
    deleter
        .write_all(&encode_frame(&Request::new(delete_op("c", true))).unwrap())
        .unwrap();
    rig.spin();
    assert!(rig.signalled().contains(&(init, libc::SIGKILL)));
    assert_eq!(rig.status("c"), ContainerStatus::Running, "until reaped");
    assert_eq!(rig.refused(exec_op("c")), ErrorKind::FailedPrecondition);
    rig.shim.process_exited(init, libc::SIGKILL);
    assert_eq!(rig.status("c"), ContainerStatus::Stopped);
    let before = rig.helpers();
    rig.spin();
    assert_eq!(
        rig.helpers(),
        before,
        "no delete while the exec helper runs"
    );
    // The exec helper fails (its container is gone): the container is not running; then the
    // delete runs.
    rig.report(
        exec_helper,
        Outcome::Err {
            message: "container is not running".into(),
        },
    );
    assert!(matches!(rig.answer(), Response::Err(e) if e.kind == ErrorKind::FailedPrecondition));
    let n = rig.helpers() - 1;
    assert_eq!(rig.helper(n).1, HelperOp::Delete);
    rig.report(n, Outcome::Ok { pid: 0 });
    rig.spin();
    deleter
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let got = deleter.read(&mut buf).unwrap();
    assert_eq!(
        decode_frame::<Response>(&buf[..got]).unwrap().unwrap().0,
        Response::Ok(Reply::Done)
    );
    assert_eq!(
        rig.refused(Op::State { id: "c".into() }),
        ErrorKind::NotFound
    );
}

#[test]
fn a_failed_delete_leaves_the_container_stopped_for_a_retry() {
    let mut rig = Rig::new();
    let init = rig.running("c");
    rig.shim.process_exited(init, 0);
    rig.send(delete_op("c", false));
    rig.no_answer();
    let n = rig.helpers() - 1;
    rig.report(
        n,
        Outcome::Err {
            message: "cgroup busy".into(),
        },
    );
    assert!(matches!(rig.answer(), Response::Err(e) if e.message.contains("cgroup busy")));
    assert_eq!(rig.status("c"), ContainerStatus::Stopped);
    rig.send(delete_op("c", false));
    rig.no_answer();
    let n = rig.helpers() - 1;
    rig.report(n, Outcome::Ok { pid: 0 });
    assert_eq!(rig.answer(), Response::Ok(Reply::Done));
}

#[test]
fn an_exec_whose_process_is_reaped_before_its_helper_reports() {
    let mut rig = Rig::new();
    rig.running("c");
    let n = rig.exec_pending("c");
    let pid = rig.fake.pid();
    rig.shim.process_exited(pid, 7 << 8);
    rig.report(n, Outcome::Ok { pid });
    match rig.answer() {
        Response::Ok(Reply::Exec(outcome)) => {
            assert_eq!(outcome.exit_code, 7);
            assert!(!outcome.timed_out);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_exec_that_fails_because_its_init_ended_is_refused_not_an_internal_error() {
    let mut rig = Rig::new();
    // An init that lives (this test's own process: the fake launcher only records signals).
    let live = i32::try_from(std::process::id()).unwrap();
    rig.running_as("alive", live);
    let n = rig.exec_pending("alive");
    rig.report(
        n,
        Outcome::Err {
            message: "exec: set up the process: something broke".into(),
        },
    );
    match rig.answer() {
        Response::Err(e) => assert_eq!(e.kind, ErrorKind::Internal, "{e:?}"),
        other => panic!("{other:?}"),
    }
    // An init that has ended, its exit not handled yet: the helper found no namespaces.
    let ended = rig.running("ended");
    let n = rig.exec_pending("ended");
    let message = format!("exec: open namespace /proc/{ended}/ns/ipc: No such file or directory");
    rig.report(n, Outcome::Err { message });
    match rig.answer() {
        Response::Err(e) => {
            assert_eq!(e.kind, ErrorKind::FailedPrecondition, "{e:?}");
            assert!(e.message.contains("not running"), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_exec_sync_whose_client_goes_away_is_killed() {
    let mut rig = Rig::new();
    rig.running("c");
    let mut prober = UnixStream::connect(rig._dir.path().join("state/control.sock")).unwrap();
    prober
        .write_all(&encode_frame(&Request::new(exec_op("c"))).unwrap())
        .unwrap();
    rig.spin();
    let n = rig.helpers() - 1;
    drop(prober);
    rig.spin();
    // Its process is killed as soon as the helper names it.
    let pid = rig.fake.pid();
    rig.report(n, Outcome::Ok { pid });
    rig.spin();
    assert!(rig.signalled().contains(&(pid, libc::SIGKILL)));
}

#[test]
fn a_shim_terminated_during_a_create_deletes_the_container_once_created() {
    let mut rig = Rig::new();
    let running = rig.running("a");
    rig.create("b");
    rig.no_answer();
    let n = rig.helpers() - 1;
    // SIGTERM to this thread, which the shim's signalfd reads.
    // SAFETY: signalling our own thread with a signal it blocks.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
    rig.spin();
    assert!(rig.signalled().contains(&(running, libc::SIGKILL)));
    let init = rig.fake.pid();
    rig.report(n, Outcome::Ok { pid: init });
    assert_eq!(rig.answer(), Response::Ok(Reply::Created { pid: init }));
    assert!(
        rig.signalled().contains(&(init, libc::SIGKILL)),
        "a container created after SIGTERM is killed at once"
    );
    assert_eq!(
        rig.refused(Op::Start { id: "b".into() }),
        ErrorKind::FailedPrecondition
    );
}

#[test]
fn a_restored_container_is_made_by_a_restore_helper_and_started_by_sigcont() {
    let mut rig = Rig::new();
    let runtime = crius_api::shim::OciRuntime {
        binary: PathBuf::from("/usr/sbin/runc"),
        root: None,
        options: Vec::new(),
    };
    let restore = crius_api::shim::Restore {
        images: PathBuf::from("/ck/checkpoint"),
        criu: PathBuf::from("/opt/criu/bin/criu"),
    };
    // Only an OCI runtime restores.
    let without_runtime = Op::CreateContainer(CreateContainer {
        id: "r".to_owned(),
        bundle: rig.bundle.clone(),
        stdin: false,
        stdin_once: false,
        tty: false,
        log_path: None,
        runtime: None,
        restore: Some(restore.clone()),
    });
    assert_eq!(rig.refused(without_runtime), ErrorKind::InvalidArgument);

    rig.send(Op::CreateContainer(CreateContainer {
        id: "r".to_owned(),
        bundle: rig.bundle.clone(),
        stdin: false,
        stdin_once: false,
        tty: false,
        log_path: None,
        runtime: Some(runtime),
        restore: Some(restore),
    }));
    rig.no_answer();
    let (_, op) = rig.helper(0);
    match op {
        HelperOp::Restore {
            image_path, criu, ..
        } => {
            assert_eq!(image_path, PathBuf::from("/ck/checkpoint"));
            assert_eq!(criu, Some(PathBuf::from("/opt/criu/bin/criu")));
        }
        other => panic!("{other:?}"),
    }
    let init = rig.fake.pid();
    rig.report(0, Outcome::Ok { pid: init });
    assert_eq!(rig.answer(), Response::Ok(Reply::Created { pid: init }));
    rig.helper_exits(0);
    assert_eq!(rig.status("r"), ContainerStatus::Created);

    // Its processes exist, stopped: the start continues them.
    rig.send(Op::Start { id: "r".into() });
    rig.no_answer();
    assert_eq!(
        rig.helper(1).1,
        HelperOp::Kill {
            signal: libc::SIGCONT
        }
    );
    rig.report(1, Outcome::Ok { pid: 0 });
    rig.assert_started("r", init);
    rig.helper_exits(1);
    assert_eq!(rig.status("r"), ContainerStatus::Running);
}
