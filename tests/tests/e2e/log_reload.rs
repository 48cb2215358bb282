//! crius's own log and configuration reload: SIGHUP changes the level from the config file
//! without a restart (and names the changes that wait for one), moves, stops and starts the
//! metrics endpoint and applies registry settings; `log_format = "json"` writes one JSON object
//! per line. A real crius started with only `--config` (the fixture's `--log-level` flag would win).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crius_api::v1::runtime_service_client::RuntimeServiceClient;
use crius_api::v1::*;
use crius_tests::TestDir;

/// A crius started by hand, stopped (SIGTERM, then SIGKILL) on drop.
struct Daemon {
    child: Child,
    dir: TestDir,
}

impl Daemon {
    fn config(dir: &Path, extra: &str) -> String {
        format!(
            "root = \"{d}/root\"\nstate = \"{d}/state\"\nlisten = \"unix://{d}/crius.sock\"\n{extra}",
            d = dir.display()
        )
    }

    async fn start(label: &str, extra: &str) -> Daemon {
        let dir = TestDir::new(label).unwrap();
        std::fs::write(dir.join("config.toml"), Daemon::config(dir.path(), extra)).unwrap();
        let log = std::fs::File::create(dir.join("crius.log")).unwrap();
        let child = Command::new(crius_tests::binary("crius").unwrap())
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let daemon = Daemon { child, dir };
        // Up once it answers Version: the socket file exists before crius listens on it.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(channel) = crius_tests::crius::connect(&daemon.socket()).await {
                let mut rt = RuntimeServiceClient::new(channel);
                if rt.version(VersionRequest::default()).await.is_ok() {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "crius does not answer:\n{}",
                daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        daemon
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("crius.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("crius.log")).unwrap_or_default()
    }

    async fn client(&self) -> RuntimeServiceClient<tonic::transport::Channel> {
        RuntimeServiceClient::new(crius_tests::crius::connect(&self.socket()).await.unwrap())
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    async fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A call that logs "ok" at info level: removing a pod that does not exist succeeds.
async fn info_level_call(rt: &mut RuntimeServiceClient<tonic::transport::Channel>, id: &str) {
    rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_the_log_level_without_a_restart() {
    let daemon = Daemon::start("log-reload", "log_level = \"warn\"\n").await;
    let mut rt = daemon.client().await;
    info_level_call(&mut rt, "quiet-before-sighup").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !daemon.log().contains("quiet-before-sighup"),
        "{}",
        daemon.log()
    );

    // info from now on; a changed root waits for a restart and says so
    let config = Daemon::config(daemon.dir.path(), "log_level = \"info\"\n")
        .replace("/root\"", "/other-root\"");
    std::fs::write(daemon.dir.join("config.toml"), config).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon.wait_log("SIGHUP: log level changed").await;
    daemon.wait_log("take effect at the next start").await;
    assert!(daemon.log().contains("keys=root"), "{}", daemon.log());
    info_level_call(&mut rt, "heard-after-sighup").await;
    daemon.wait_log("heard-after-sighup").await;

    // a config that does not load changes nothing, and crius serves on
    std::fs::write(daemon.dir.join("config.toml"), "log_level = [").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon.wait_log("does not load, nothing changed").await;
    rt.version(VersionRequest::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines() {
    let daemon = Daemon::start("log-json", "log_format = \"json\"\n").await;
    let mut rt = daemon.client().await;
    info_level_call(&mut rt, "json-pod").await;
    daemon.wait_log("json-pod").await;
    let log = daemon.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    assert!(lines
        .iter()
        .any(|l| l["span"]["method"] == "RemovePodSandbox" && l["fields"]["message"] == "ok"));
}

/// `GET /metrics` on 127.0.0.1:`port`: whether it answered 200.
fn scrapes(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(tcp, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut raw = String::new();
    let _ = tcp.read_to_string(&mut raw);
    raw.starts_with("HTTP/1.0 200") && raw.contains("crius_pods")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_moves_stops_and_starts_the_metrics_endpoint() {
    let (a, b) = (
        crius_tests::free_port().unwrap(),
        crius_tests::free_port().unwrap(),
    );
    let metrics = |port: Option<u16>| {
        let address = port.map(|p| format!("127.0.0.1:{p}")).unwrap_or_default();
        format!("[metrics]\naddress = \"{address}\"\n[registry]\nmax_concurrent_downloads = 5\n")
    };
    let daemon = Daemon::start("metrics-reload", &metrics(Some(a))).await;
    // The socket is bound before crius has finished starting.
    wait_scrapes(&daemon, a).await;
    let rewrite = |text: String| {
        std::fs::write(
            daemon.dir.join("config.toml"),
            Daemon::config(daemon.dir.path(), &text),
        )
        .unwrap()
    };

    // moved, and the registry change applies to new pulls: nothing waits for a restart
    rewrite(metrics(Some(b)).replace("= 5", "= 2"));
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon.wait_log("SIGHUP: metrics endpoint changed").await;
    daemon.wait_log("SIGHUP: configuration re-read").await;
    assert!(scrapes(b), "{}", daemon.log());
    assert!(!scrapes(a));
    assert!(
        daemon.log().contains("registry settings changed"),
        "{}",
        daemon.log()
    );
    assert!(
        !daemon.log().contains("take effect at the next start"),
        "{}",
        daemon.log()
    );

    // off, then on again
    rewrite(metrics(None).replace("= 5", "= 2"));
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon.wait_log("metrics endpoint stopped").await;
    assert!(!scrapes(b));
    rewrite(metrics(Some(a)).replace("= 5", "= 2"));
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    wait_scrapes(&daemon, a).await;
}

async fn wait_scrapes(daemon: &Daemon, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scrapes(port) {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
