//! The streaming server cannot be starved by idle or slow clients: connections that have not
//! become a session are capped and time out, and none of it reaches the CRI socket.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::Env;
use crius_api::v1::*;

const CAP: usize = 16;
const HEADER_TIMEOUT_SECS: u64 = 2;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// True once the server closed `conn` (EOF or reset), false if it is still open after `limit`.
fn closed_within(conn: &mut TcpStream, limit: Duration) -> bool {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_stream_clients_are_capped_and_timed_out() {
    let extra = format!(
        "[stream]\nheader_timeout_secs = {HEADER_TIMEOUT_SECS}\nmax_pending_connections = {CAP}\n"
    );
    let mut env = Env::with_image_and_config(&extra).await;
    let config = env.pod_config("streamer", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("box", &["sleep", "1000"]),
        )
        .await;
    let url = env
        .exec_url(ExecRequest {
            container_id: c.clone(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await;
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let pid = env.crius.pid().unwrap();
    let before = open_fds(pid);

    // Ten times the cap: idle ones, and slowloris ones that dribble a header.
    let mut conns: Vec<TcpStream> = (0..CAP * 10)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    for conn in conns.iter_mut().step_by(2) {
        conn.write_all(b"GET /exec/x HTTP/1.1\r\nHost: a\r\n")
            .unwrap();
    }
    // One that completes a request (a 404) and then sits idle on keep-alive.
    conns[1]
        .write_all(b"GET /nothing HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = open_fds(pid);
    assert!(
        during <= before + CAP + 8,
        "crius holds {during} descriptors, {before} before {} connections (cap {CAP})",
        conns.len()
    );

    // The CRI keeps working meanwhile.
    env.crius
        .runtime()
        .version(VersionRequest::default())
        .await
        .unwrap();
    let out = env.exec(&c, &["echo", "alive"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "alive");
    let other = env.run_pod(env.pod_config("while-flooded", false)).await;
    env.remove_pod(&other).await;

    // Every connection is closed by crius within the header timeout (plus slack), even one
    // that keeps sending header bytes.
    let begin = Instant::now();
    let slow = &mut conns[0];
    let deadline = Instant::now() + Duration::from_secs(HEADER_TIMEOUT_SECS + 3);
    let mut slow_closed = false;
    while Instant::now() < deadline {
        if slow.write_all(b"X-Slow: 1\r\n").is_err() {
            slow_closed = true;
            break;
        }
        if closed_within(slow, Duration::from_millis(500)) {
            slow_closed = true;
            break;
        }
    }
    assert!(
        slow_closed,
        "a slowloris connection outlived the header timeout"
    );
    for (i, conn) in conns.iter_mut().enumerate().skip(1) {
        let left = Duration::from_secs(HEADER_TIMEOUT_SECS + 3).saturating_sub(begin.elapsed());
        assert!(
            closed_within(conn, left.max(Duration::from_millis(100))),
            "connection {i} still open after {:?}",
            begin.elapsed()
        );
    }
    drop(conns);
    // crius closes its ends as it reads the EOFs: on a loaded node that takes a while.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds(pid) > before + 2 {
        assert!(
            Instant::now() < deadline,
            "descriptors not given back: {} open, {before} before",
            open_fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// A script that opens `count` connections to `addr` and holds them until its stdin closes.
const HOLDER: &str = r#"
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = [socket.create_connection((host, port)) for _ in range(count)]
print(len(held), flush=True)
sys.stdin.read()
"#;

/// An unprivileged user of the node that floods the streaming port takes at most its own share
/// of the places of connections not yet upgraded: root's clients (kubelet) are still served,
/// and the CRI works throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_local_user_cannot_take_every_place() {
    const TOTAL: usize = 64;
    const PER_PEER: usize = 16;
    let extra = format!(
        "[stream]\nheader_timeout_secs = 60\nmax_pending_connections = {TOTAL}\n\
         max_pending_per_peer = {PER_PEER}\n"
    );
    let mut env = Env::with_image_and_config(&extra).await;
    let config = env.pod_config("flooded", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("box", &["sleep", "1000"]),
        )
        .await;
    let url = env
        .exec_url(ExecRequest {
            container_id: c.clone(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await;
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let pid = env.crius.pid().unwrap();
    let before = open_fds(pid);

    // nobody (65534) opens far more connections than the whole cap and holds them.
    use std::os::unix::process::CommandExt;
    let mut holder = std::process::Command::new("/usr/bin/python3")
        .args(["-c", HOLDER, host, port, "300"])
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "300", "the holder's connections");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = open_fds(pid);
    assert!(
        during <= before + PER_PEER + 8,
        "crius holds {during} descriptors, {before} before (per-peer cap {PER_PEER})"
    );

    // root's clients are still served: several at once, each answered.
    let mut mine: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    for conn in &mut mine {
        conn.write_all(b"GET /nothing HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
    }
    for conn in &mut mine {
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut head = [0u8; 12];
        conn.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 404");
    }
    drop(mine);

    // and the CRI works throughout.
    env.crius
        .runtime()
        .version(VersionRequest::default())
        .await
        .unwrap();
    let out = env.exec(&c, &["echo", "alive"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "alive");
    let other = env.run_pod(env.pod_config("beside-the-flood", false)).await;
    env.remove_pod(&other).await;

    drop(holder.stdin.take());
    holder.wait().unwrap();
    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// A session with no traffic for `[stream] idle_timeout_secs` is closed by crius (kubelet's
/// streaming idle timeout); one with traffic stays open past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed() {
    use crius_tests::streaming::Client;
    const IDLE: u64 = 2;
    let mut env =
        Env::with_image_and_config(&format!("[stream]\nidle_timeout_secs = {IDLE}\n")).await;
    let config = env.pod_config("idle", false);
    let pod = env.run_pod(config.clone()).await;
    let c = env
        .create_start(
            &pod,
            &config,
            env.container_config("box", &["sleep", "1000"]),
        )
        .await;
    let url = env
        .exec_url(ExecRequest {
            container_id: c.clone(),
            cmd: vec!["cat".into()],
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await;
    let mut client = Client::connect(&url, &["v4.channel.k8s.io"]).await.unwrap();
    let s = client.open_command(true, true, false, false).await.unwrap();
    let stdin = s.stdin.unwrap();
    let stdout = s.stdout.unwrap();

    // Traffic every second keeps it open well past the idle timeout.
    let mut last_traffic = Instant::now();
    for i in 0..(IDLE * 2) {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let line = format!("line {i}\n");
        client.write(stdin, line.as_bytes(), false).await.unwrap();
        client
            .read_until("the echo", Duration::from_secs(5), |c| {
                String::from_utf8_lossy(&c.received(stdout).data).contains(&line)
            })
            .await
            .unwrap();
        last_traffic = Instant::now();
        assert!(!client.ended(stdout), "closed while in use");
    }

    // Silence: crius closes the session, not before the idle time has passed.
    client
        .read_until(
            "the idle session to close",
            Duration::from_secs(IDLE + 10),
            |c| c.ended(stdout),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let silence = last_traffic.elapsed();
    assert!(
        silence >= Duration::from_millis(IDLE * 1000 - 200),
        "closed after {silence:?} of silence"
    );

    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
