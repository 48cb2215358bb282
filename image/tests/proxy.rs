//! Pulls through a real local proxy (Debian's tinyproxy on 127.0.0.1): an `http://` registry
//! as forward-proxy requests, an `https://` one through a CONNECT tunnel, chosen by a host's
//! `proxy` in hosts.toml or by `HTTPS_PROXY`/`NO_PROXY` from the environment; `proxy = ""`
//! goes direct; a proxy that is down fails the pull naming it.
//!
//! One test function: the environment is process-wide and read once, so the cases run in
//! order in this binary of their own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use crius_image::{Auth, ErrorKind, ImageStore, StoreConfig};

/// tinyproxy in the foreground on a free port, its log in a temp dir; killed and reaped on drop.
struct TinyProxy {
    port: u16,
    log: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

impl TinyProxy {
    fn start() -> TinyProxy {
        let dir = tempfile::Builder::new()
            .prefix("crius-tinyproxy")
            .tempdir()
            .unwrap();
        let port = free_port();
        let conf = dir.path().join("tinyproxy.conf");
        // No ConnectPort line: CONNECT to any port (the test registry's is random).
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 50\nAllow 127.0.0.1\n\
                 LogLevel Connect\nDisableViaHeader Yes\n"
            ),
        )
        .unwrap();
        let log = dir.path().join("tinyproxy.log");
        let child = Command::new("/usr/bin/tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start /usr/bin/tinyproxy (make test installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tinyproxy did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        TinyProxy {
            port,
            log,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The request lines tinyproxy logged (`GET http://…`, `CONNECT host:port …`).
    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("): ").map(|(_, r)| r.to_string()))
            .filter(|r| r.starts_with("GET ") || r.starts_with("CONNECT "))
            .collect()
    }
}

impl Drop for TinyProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn store(root: &Path, name: &str, hosts: &Path) -> ImageStore {
    ImageStore::open(StoreConfig {
        root: root.join(name),
        registry_config_dir: Some(hosts.to_path_buf()),
        no_progress_timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_through_a_proxy() {
    let proxy = TinyProxy::start();
    // Read once, at the first client built: set before any store exists. Nothing else runs in
    // this test binary.
    std::env::set_var("HTTPS_PROXY", proxy.url());
    std::env::remove_var("HTTP_PROXY");
    std::env::remove_var("http_proxy");
    std::env::remove_var("https_proxy");
    std::env::remove_var("NO_PROXY");
    std::env::remove_var("no_proxy");
    std::env::remove_var("ALL_PROXY");
    std::env::remove_var("all_proxy");

    let mut reg = Registry::start();
    Pusher::new(&reg)
        .image(
            "crius/proxied",
            "v1",
            &ImageSpec::new(vec![tar(&[file("p", "proxied")])]),
        )
        .await;
    let name = format!("{}/crius/proxied:v1", reg.host());
    let root = tempfile::Builder::new()
        .prefix("crius-image-proxy")
        .tempdir()
        .unwrap();
    let host = reg.host();
    let hosts = |n: &str, text: String| {
        let dir = root.path().join(format!("hosts-{n}"));
        hosts_toml(&dir, &host, &text);
        dir
    };

    // Plain HTTP with a per-host proxy: forward-proxy requests with absolute URIs.
    let http_server = format!("server = \"http://{}\"\n", reg.host());
    let dir = hosts(
        "http",
        format!("{http_server}proxy = \"{}\"\n", proxy.url()),
    );
    let rec = store(root.path(), "a", &dir)
        .pull(&name, &Auth::default())
        .await
        .unwrap();
    let seen = proxy.requests();
    let manifest = format!("GET http://{}/v2/crius/proxied/manifests/v1 ", reg.host());
    assert!(seen.iter().any(|r| r.starts_with(&manifest)), "{seen:?}");
    let blob = format!(
        "GET http://{}/v2/crius/proxied/blobs/{}",
        reg.host(),
        rec.layers[0]
    );
    assert!(seen.iter().any(|r| r.starts_with(&blob)), "{seen:?}");

    // HTTP and no per-host proxy: the environment names only an HTTPS proxy, so direct.
    let before = proxy.requests().len();
    store(root.path(), "b", &hosts("http-env", http_server.clone()))
        .pull(&name, &Auth::default())
        .await
        .unwrap();
    assert_eq!(proxy.requests().len(), before, "{:?}", proxy.requests());

    // HTTPS: a CONNECT tunnel, from HTTPS_PROXY in the environment, TLS inside it.
    let ca = reg.restart_with_tls();
    let tls = format!(
        "server = \"https://{}\"\nca = \"{}\"\n",
        reg.host(),
        ca.display()
    );
    let tunnel = format!("CONNECT {} ", reg.host());
    let rec = store(root.path(), "c", &hosts("env", tls.clone()))
        .pull(&name, &Auth::default())
        .await
        .unwrap();
    assert!(
        proxy.requests().iter().any(|r| r.starts_with(&tunnel)),
        "{:?}",
        proxy.requests()
    );
    assert_eq!(
        std::fs::read_to_string(
            store(root.path(), "c", &hosts("env", tls.clone()))
                .lowerdirs(&rec.id)
                .unwrap()[0]
                .join("p")
        )
        .unwrap(),
        "proxied"
    );

    // `proxy = ""` overrides the environment: direct.
    let before = proxy.requests().len();
    store(
        root.path(),
        "d",
        &hosts("direct", format!("{tls}proxy = \"\"\n")),
    )
    .pull(&name, &Auth::default())
    .await
    .unwrap();
    assert_eq!(proxy.requests().len(), before, "{:?}", proxy.requests());

    // A per-host proxy that is down: the pull fails, naming it.
    let dead = free_port();
    let err = store(
        root.path(),
        "e",
        &hosts(
            "dead",
            format!("{tls}proxy = \"http://127.0.0.1:{dead}\"\n"),
        ),
    )
    .pull(&name, &Auth::default())
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        crius_common_chain(&err).contains(&format!("through proxy 127.0.0.1:{dead}")),
        "{}",
        crius_common_chain(&err)
    );

    // A bad proxy value is a config error naming the file.
    let err = store(
        root.path(),
        "f",
        &hosts("bad", format!("{tls}proxy = \"socks5://127.0.0.1:1080\"\n")),
    )
    .pull(&name, &Auth::default())
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("only http:// proxies"), "{err}");
}

/// The error with its causes, as crius logs and returns it.
fn crius_common_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
