//! Exec, Attach and PortForward end to end: the RPCs answer a URL on crius's streaming server,
//! and a client speaking SPDY/3.1 or WebSocket and the Kubernetes stream protocols (as kubelet,
//! crictl and critest do) runs the session against real containers. Run as root.
//! Test networks: 83 (exec), 84 (exec with a tty), 85 (attach), 86 (port-forward).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::common::{assert_status, texts, wait_for, Env};
use crius_api::v1::*;
use crius_tests::streaming::{exit_code_of, Client, WsClient};
use tonic::Code;

const REMOTE_COMMAND: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
const SESSION_LIMIT: Duration = Duration::from_secs(20);

fn exec_req(id: &str, cmd: &[&str]) -> ExecRequest {
    ExecRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        stdout: true,
        stderr: true,
        ..Default::default()
    }
}

/// An environment on test network `n` with a pod `pod_name` running the container `config`
/// makes: (env, pod id, container id).
async fn pod_with(
    pod_name: &str,
    config: impl FnOnce(&Env) -> ContainerConfig,
) -> (Env, String, String) {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config(pod_name, false);
    let pod = env.run_pod(pod_config.clone()).await;
    let config = config(&env);
    let c = env.create_start(&pod, &pod_config, config).await;
    (env, pod, c)
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn exec_streams_output_stdin_and_exit_codes() {
    let (env, pod, c) = pod_with("exec", |env| {
        env.container_config("box", &["sleep", "1000"])
    })
    .await;

    // stdout and stderr apart, and a non-zero exit code in the v4 status.
    let url = env
        .exec_url(exec_req(
            &c,
            &["sh", "-c", "echo out-1; echo err-1 >&2; echo out-2; exit 7"],
        ))
        .await;
    let mut client = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
    assert_eq!(client.protocol, "v4.channel.k8s.io");
    let s = client.open_command(false, true, true, false).await.unwrap();
    let status = client.wait_status(&s, SESSION_LIMIT).await.unwrap();
    assert_eq!(client.received(s.stdout.unwrap()).data, b"out-1\nout-2\n");
    assert_eq!(client.received(s.stderr.unwrap()).data, b"err-1\n");
    assert_eq!(exit_code_of(&status), Some(7), "{status}");

    // The URL was for one session only.
    let again = Client::connect(&url, REMOTE_COMMAND).await;
    assert!(again.is_err(), "a used token must not work twice");

    // stdin reaches the process; its end closes the process's stdin.
    let mut req = exec_req(&c, &["cat"]);
    req.stdin = true;
    req.stderr = false;
    let url = env.exec_url(req).await;
    let mut client = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
    let s = client.open_command(true, true, false, false).await.unwrap();
    let stdin = s.stdin.unwrap();
    client.write(stdin, b"hello ", false).await.unwrap();
    client.write(stdin, b"from stdin\n", true).await.unwrap();
    let status = client.wait_status(&s, SESSION_LIMIT).await.unwrap();
    assert_eq!(
        client.received(s.stdout.unwrap()).data,
        b"hello from stdin\n"
    );
    assert_eq!(exit_code_of(&status), Some(0), "{status}");

    // The same over WebSocket (v5): channels 0 stdin, 1 stdout, 2 stderr, 3 error; a
    // half-close of stdin; pings answered.
    let mut req = exec_req(&c, &["sh", "-c", "cat; echo ws-err >&2; exit 5"]);
    req.stdin = true;
    let url = env.exec_url(req).await;
    let mut ws = WsClient::connect(&url, REMOTE_COMMAND).await.unwrap();
    assert_eq!(ws.protocol, "v5.channel.k8s.io");
    ws.ping().await.unwrap();
    ws.send(0, b"over websocket\n").await.unwrap();
    ws.close_channel(0).await.unwrap();
    ws.read_until("the websocket session to end", SESSION_LIMIT, |_| false)
        .await
        .unwrap();
    assert_eq!(ws.channel(1), b"over websocket\n");
    assert_eq!(ws.channel(2), b"ws-err\n");
    let status = String::from_utf8_lossy(&ws.channel(3)).into_owned();
    assert_eq!(exit_code_of(&status), Some(5), "{status}");
    assert!(ws.pongs >= 1);

    // A command that does not exist fails in the session, not in the RPC.
    let url = env.exec_url(exec_req(&c, &["no-such-command"])).await;
    let mut client = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
    let s = client.open_command(false, true, true, false).await.unwrap();
    let status = client.wait_status(&s, SESSION_LIMIT).await.unwrap();
    assert!(status.contains("Failure"), "{status}");
    assert!(status.contains("no-such-command"), "{status}");

    // Requests the RPC refuses.
    let unknown = exec_req("no-such-container", &["true"]);
    assert_status(
        env.rt().exec(unknown).await,
        Code::NotFound,
        &["no-such-container"],
    );
    assert_status(
        env.rt().exec(exec_req(&c, &[])).await,
        Code::InvalidArgument,
        &["cmd"],
    );
    let mut none = exec_req(&c, &["true"]);
    none.stdout = false;
    none.stderr = false;
    assert_status(env.rt().exec(none).await, Code::InvalidArgument, &["stdin"]);
    let mut tty_stderr = exec_req(&c, &["true"]);
    tty_stderr.tty = true;
    assert_status(
        env.rt().exec(tty_stderr).await,
        Code::InvalidArgument,
        &["tty"],
    );

    // Figures: from the Exec RPC to the first byte of `echo`, and the shim's memory across
    // many execs.
    let shim = env.shim_pid(&pod);
    let mut first_byte = Vec::new();
    let rss_before = rss_kib(shim);
    for _ in 0..100 {
        let begin = Instant::now();
        let mut req = exec_req(&c, &["echo", "hi"]);
        req.stderr = false;
        let url = env.exec_url(req).await;
        let mut client = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
        let s = client
            .open_command(false, true, false, false)
            .await
            .unwrap();
        let out = s.stdout.unwrap();
        client
            .read_until("the first byte", SESSION_LIMIT, |c| {
                !c.received(out).data.is_empty()
            })
            .await
            .unwrap();
        first_byte.push(begin.elapsed());
        let status = client.wait_status(&s, SESSION_LIMIT).await.unwrap();
        assert_eq!(exit_code_of(&status), Some(0));
        assert_eq!(client.received(out).data, b"hi\n");
    }
    let rss_after = rss_kib(shim);
    first_byte.sort();
    eprintln!(
        "exec echo, Exec RPC to first output byte over 100 runs: median {:?}, min {:?}, max {:?}; \
         shim VmRSS {rss_before} KiB before, {rss_after} KiB after ({:+} KiB)",
        first_byte[first_byte.len() / 2],
        first_byte[0],
        first_byte[first_byte.len() - 1],
        rss_after as i64 - rss_before as i64,
    );
    assert!(
        rss_after < rss_before + 2048,
        "the shim grew from {rss_before} to {rss_after} KiB over 100 execs"
    );
    // Every exec process was reaped and its process file removed.
    let exec_dir = env.crius.state().join("shims").join(&pod).join("exec");
    let left: Vec<_> = std::fs::read_dir(&exec_dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "exec files left: {left:?}");
}

#[tokio::test]
async fn exec_with_a_tty_runs_on_a_terminal_that_resizes() {
    let (env, _pod, c) =
        pod_with("tty", |env| env.container_config("box", &["sleep", "1000"])).await;
    let url = env
        .exec_url(ExecRequest {
            container_id: c.clone(),
            cmd: vec!["sh".into()],
            tty: true,
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await;
    let mut client = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
    let s = client.open_command(true, true, false, true).await.unwrap();
    assert!(s.stderr.is_none());
    client
        .write(s.resize.unwrap(), br#"{"Width":123,"Height":45}"#, false)
        .await
        .unwrap();
    client.write(s.resize.unwrap(), b"\n", false).await.unwrap();
    let stdin = s.stdin.unwrap();
    let out = s.stdout.unwrap();
    // The resize goes its own way to the terminal: the shell waits (up to 5 s) for the size
    // to land before it reports it. What the assertions look for is not written out in the
    // command, which the terminal echoes.
    client
        .write(
            stdin,
            b"for i in $(seq 100); do [ \"$(stty size)\" = \"$((40+5)) $((120+3))\" ] && break; \
              sleep 0.05; done; \
              [ -t 0 ] && echo is-a-$(echo tty); tty; stty size; echo sum-$((40+2)) >&2; exit 3\n",
            false,
        )
        .await
        .unwrap();
    let status = client.wait_status(&s, SESSION_LIMIT).await.unwrap();
    let text = String::from_utf8_lossy(&client.received(out).data).into_owned();
    assert!(text.contains("is-a-tty"), "{text:?}");
    // The pty is the container's own (its devpts), so `tty` can name it.
    assert!(text.contains("/dev/pts/"), "{text:?}");
    assert!(text.contains("45 123"), "{text:?}");
    // stderr goes to the terminal too, and a terminal ends lines with CRLF.
    assert!(text.contains("sum-42\r\n"), "{text:?}");
    assert_eq!(exit_code_of(&status), Some(3), "{status}");
}

#[tokio::test]
async fn attach_sees_live_output_and_feeds_stdin() {
    let (env, pod, c) = pod_with("attach", |env| {
        let mut config = env.container_config("shell", &["sh"]);
        config.stdin = true;
        config.stdin_once = true;
        config
    })
    .await;
    let log = env.log_dir("attach").join("shell.log");

    // Attaching to a stopped or unknown container is refused by the RPC.
    assert_status(
        env.rt()
            .attach(AttachRequest {
                container_id: "nope".into(),
                stdout: true,
                ..Default::default()
            })
            .await,
        Code::NotFound,
        &["nope"],
    );
    let url = env
        .rt()
        .attach(AttachRequest {
            container_id: c.clone(),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    assert!(url.contains("/attach/"), "{url}");
    let mut client = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
    let s = client.open_command(true, true, true, false).await.unwrap();
    let (stdin, out, err) = (s.stdin.unwrap(), s.stdout.unwrap(), s.stderr.unwrap());
    client
        .write(stdin, b"echo attached-$((6*7)); echo oops >&2\n", false)
        .await
        .unwrap();
    client
        .read_until("the attached output", SESSION_LIMIT, |c| {
            c.received(out).data.ends_with(b"attached-42\n") && c.received(err).data == b"oops\n"
        })
        .await
        .unwrap();
    // The log is written all the same.
    let lines = env
        .wait_log(&log, Duration::from_secs(10), |l| l.len() >= 2)
        .await;
    assert_eq!(texts(&lines, "stdout")[0], "attached-42");
    assert_eq!(texts(&lines, "stderr"), vec!["oops"]);

    // A burst of output reaches the session whole (the shim's pipe to crius has room for it).
    client
        .write(
            stdin,
            b"head -c 524288 /dev/zero | tr '\\0' x; echo burst-end\n",
            false,
        )
        .await
        .unwrap();
    client
        .read_until("the burst", SESSION_LIMIT, |c| {
            c.received(out).data.ends_with(b"burst-end\n")
        })
        .await
        .unwrap();
    let got = client.received(out).data;
    let xs = got.iter().filter(|b| **b == b'x').count();
    assert_eq!(xs, 524288, "attach lost output of the burst");

    // A second session, output only, whose client just goes away: crius notices and the
    // shim drops the session (its connection and pipe close).
    let shim = env.shim_pid(&pod);
    let fds = || {
        std::fs::read_dir(format!("/proc/{shim}/fd"))
            .unwrap()
            .count()
    };
    let before = fds();
    let url = env
        .rt()
        .attach(AttachRequest {
            container_id: c.clone(),
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    let mut watcher = Client::connect(&url, REMOTE_COMMAND).await.unwrap();
    let w = watcher
        .open_command(false, true, false, false)
        .await
        .unwrap();
    wait_for(
        "the shim to serve the second session",
        SESSION_LIMIT,
        || async { (fds() > before).then_some(()) },
    )
    .await;
    client
        .write(stdin, b"echo seen-by-both\n", false)
        .await
        .unwrap();
    let seen = w.stdout.unwrap();
    watcher
        .read_until("output in the second session", SESSION_LIMIT, |c| {
            c.received(seen).data.ends_with(b"seen-by-both\n")
        })
        .await
        .unwrap();
    drop(watcher);
    wait_for(
        "the shim to drop the second session",
        SESSION_LIMIT,
        || async { (fds() == before).then_some(()) },
    )
    .await;

    // stdin_once: the end of this session's stdin is the end of the container's stdin, so
    // the shell exits and the session ends.
    client.write(stdin, b"", true).await.unwrap();
    let status = client.wait_status(&s, SESSION_LIMIT).await.unwrap();
    assert!(
        status.is_empty() || exit_code_of(&status) == Some(0),
        "{status}"
    );
    let exited = env.wait_exited(&c, Duration::from_secs(10)).await;
    assert_eq!(exited.exit_code, 0);

    // A second attach to a container that is no longer running is refused.
    assert_status(
        env.rt()
            .attach(AttachRequest {
                container_id: c.clone(),
                stdout: true,
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        &[&c],
    );
}

#[tokio::test]
async fn port_forward_reaches_a_server_inside_the_pod() {
    let serve =
        "mkdir -p /www && echo forwarded-ok > /www/index.html && exec httpd -f -p 8080 -h /www";
    let (env, pod, c) = pod_with("pf", |env| {
        env.container_config("web", &["sh", "-c", serve])
    })
    .await;
    // The server listens only inside the pod: wait until it does.
    wait_for("httpd to listen", Duration::from_secs(10), || async {
        let out = env
            .exec(&c, &["sh", "-c", "netstat -ltn | grep -q :8080"], 5)
            .await;
        out.is_ok_and(|o| o.exit_code == 0).then_some(())
    })
    .await;

    assert_status(
        env.rt()
            .port_forward(PortForwardRequest {
                pod_sandbox_id: "nope".into(),
                port: vec![8080],
            })
            .await,
        Code::NotFound,
        &["nope"],
    );
    let url = env
        .rt()
        .port_forward(PortForwardRequest {
            pod_sandbox_id: pod.clone(),
            port: vec![8080],
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    let mut client = Client::connect(&url, &["portforward.k8s.io"])
        .await
        .unwrap();
    assert_eq!(client.protocol, "portforward.k8s.io");

    // Two connections in one session, as a client forwarding a port does.
    for request in ["0", "1"] {
        let error = client
            .open(&[
                ("streamtype", "error"),
                ("port", "8080"),
                ("requestid", request),
            ])
            .await
            .unwrap();
        client.write(error, b"", true).await.unwrap();
        let data = client
            .open(&[
                ("streamtype", "data"),
                ("port", "8080"),
                ("requestid", request),
            ])
            .await
            .unwrap();
        client
            .write(data, b"GET /index.html HTTP/1.0\r\n\r\n", false)
            .await
            .unwrap();
        client
            .read_until("the forwarded response", SESSION_LIMIT, |c| c.ended(data))
            .await
            .unwrap();
        // As client-go does: reset the data stream once the pod side is done, then wait for
        // the error stream to end.
        client.reset(data).await.unwrap();
        client
            .read_until("the end of the error stream", SESSION_LIMIT, |c| {
                c.ended(error)
            })
            .await
            .unwrap();
        let response = String::from_utf8_lossy(&client.received(data).data).into_owned();
        assert!(
            response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"),
            "{response}"
        );
        assert!(response.contains("forwarded-ok"), "{response}");
        assert!(client.received(error).data.is_empty());
    }

    // Nothing listens on 8081: the error stream says so.
    let error = client
        .open(&[
            ("streamtype", "error"),
            ("port", "8081"),
            ("requestid", "2"),
        ])
        .await
        .unwrap();
    client.write(error, b"", true).await.unwrap();
    let data = client
        .open(&[("streamtype", "data"), ("port", "8081"), ("requestid", "2")])
        .await
        .unwrap();
    client
        .read_until("the error", SESSION_LIMIT, |c| {
            c.ended(error) && c.ended(data)
        })
        .await
        .unwrap();
    let message = String::from_utf8_lossy(&client.received(error).data).into_owned();
    assert!(message.contains("8081"), "{message}");
    assert!(client.ended(data));
}
