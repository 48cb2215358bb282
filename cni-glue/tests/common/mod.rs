//! Fixtures for the integration tests: a private bridge network per test, pods in pinned netns,
//! and cleanup in `Drop` so a failing assertion leaves nothing behind.
//!
//! Every test gets its own bridge (`crius-t<N>`), subnet (`10.88.<200+N>.0/24`, which exists
//! only on that bridge and inside the test's netns) and temp dir (conf dir, cache dir, netns
//! pins, host-local's `dataDir`). The tests also take [`NET_LOCK`], so they never overlap in the
//! shared iptables chains of the portmap plugin.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crius_cni::{netns, Network, NetworkOptions, PodNetwork};

pub const PLUGIN_DIR: &str = "/usr/lib/cni";

/// Serializes the networking tests (a tokio mutex: held across awaits, never poisoned).
pub static NET_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn lock() -> tokio::sync::MutexGuard<'static, ()> {
    NET_LOCK.lock().await
}

pub struct TestNet {
    pub n: u8,
    pub bridge: String,
    pub network_name: String,
    pub dir: tempfile::TempDir,
    pub loopback: bool,
    pub network: Arc<Network>,
    pods: Mutex<Vec<(String, PathBuf)>>,
}

impl TestNet {
    /// A network `crius-test-<n>` on bridge `crius-t<n>`, subnet `10.88.<200+n>.0/24`.
    /// `extra_plugins` are appended to the bridge plugin in the conflist.
    pub fn new(n: u8, extra_plugins: &str) -> TestNet {
        assert!(n < 50);
        let dir = tempfile::Builder::new()
            .prefix(&format!("crius-cni-test-{n}-"))
            .tempdir()
            .unwrap();
        for sub in ["net.d", "bin", "cache", "netns", "ipam"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let bridge = format!("crius-t{n}");
        let network_name = format!("crius-test-{n}");
        let conflist = format!(
            r#"{{
  "cniVersion": "1.0.0",
  "name": "{network_name}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{bridge}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "10.88.{x}.0/24"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}],
        "dataDir": "{ipam}"
      }}
    }}{extra_plugins}
  ]
}}"#,
            x = 200 + u16::from(n),
            ipam = dir.path().join("ipam").display(),
        );
        std::fs::write(dir.path().join("net.d/10-crius-test.conflist"), conflist).unwrap();
        let network = Network::new(Self::options_for(dir.path(), false));
        TestNet {
            n,
            bridge,
            network_name,
            dir,
            loopback: false,
            network: Arc::new(network),
            pods: Mutex::new(Vec::new()),
        }
    }

    pub fn options_for(dir: &Path, loopback: bool) -> NetworkOptions {
        NetworkOptions {
            conf_dir: dir.join("net.d"),
            // Test plugins first, then Debian's.
            bin_dirs: vec![dir.join("bin"), PathBuf::from(PLUGIN_DIR)],
            cache_dir: dir.join("cache"),
            plugin_timeout: Duration::from_secs(20),
            loopback,
            ..NetworkOptions::default()
        }
    }

    /// A fresh `Network` over the same dirs, as a restarted daemon would build.
    pub fn restart(&mut self) {
        self.network = Arc::new(Network::new(Self::options_for(
            self.dir.path(),
            self.loopback,
        )));
    }

    /// Also run the loopback plugin (ifname `lo`) in setup.
    pub fn with_loopback_plugin(mut self) -> Self {
        self.loopback = true;
        self.restart();
        self
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    pub fn subnet_prefix(&self) -> String {
        format!("10.88.{}.", 200 + u16::from(self.n))
    }

    /// Writes an executable test plugin into the test's bin dir.
    pub fn script_plugin(&self, name: &str, body: &str) {
        let p = self.path("bin").join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Creates a netns for a pod and returns its `PodNetwork` (registered for cleanup).
    pub fn pod(&self, name: &str) -> PodNetwork {
        let id = format!("crius-{}-{name}", self.n);
        let path = netns::create(&self.path("netns"), &id).unwrap();
        self.pods.lock().unwrap().push((id.clone(), path.clone()));
        PodNetwork {
            id,
            name: name.into(),
            namespace: "crius-test".into(),
            uid: format!("uid-{name}"),
            netns_path: path,
            ..PodNetwork::default()
        }
    }

    /// IP files host-local holds for this network (an address per allocation).
    pub fn allocated_ips(&self) -> Vec<String> {
        let dir = self.path("ipam").join(&self.network_name);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .collect()
    }

    /// Files left in the attachment cache.
    pub fn cache_files(&self) -> Vec<PathBuf> {
        walk(&self.path("cache"))
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Runs a future to completion on a private runtime (usable from `Drop`, even inside a test's
/// own runtime).
pub fn block_on<F: std::future::Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f)
        })
        .join()
        .unwrap()
    })
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let pods = std::mem::take(&mut *self.pods.lock().unwrap_or_else(|p| p.into_inner()));
        let network = self.network.clone();
        for (id, path) in pods {
            let net = network.clone();
            let idc = id.clone();
            if let Err(e) = block_on(async move { net.teardown(&idc).await }) {
                eprintln!("cleanup: teardown {id}: {e}");
            }
            if let Err(e) = netns::remove(&path) {
                eprintln!("cleanup: remove netns {}: {e}", path.display());
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

pub fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", name])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `ping -c1 -W1` from the host (busybox's ping: Debian's busybox-static is installed).
pub fn ping(ip: IpAddr) -> bool {
    Command::new("busybox")
        .args(["ping", "-c1", "-W1", &ip.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A TCP listener inside a netns that answers each connection with `reply` (in a thread that
/// ends with the listener's last accept, `count` connections). Port 0 picks one; returns it.
pub fn serve_in(netns_path: &Path, port: u16, reply: &'static str, count: usize) -> u16 {
    let listener = netns::run_in(netns_path, || {
        TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
    })
    .unwrap()
    .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for _ in 0..count {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.write_all(reply.as_bytes());
                }
                Err(_) => return,
            }
        }
    });
    port
}

/// Connects to `addr` (from inside `netns_path` if given) and reads what the server says.
pub fn fetch(netns_path: Option<&Path>, addr: SocketAddr) -> std::io::Result<String> {
    let go = move || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    };
    match netns_path {
        Some(p) => netns::run_in(p, go).map_err(std::io::Error::other)?,
        None => go(),
    }
}

pub fn iptables_save() -> String {
    let out = Command::new("iptables-save").output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs [`remove_empty_portmap_chains`] when dropped (declare it before the `TestNet`, so it
/// drops after the pods were torn down).
pub struct PortmapChainsGuard;

impl Drop for PortmapChainsGuard {
    fn drop(&mut self) {
        remove_empty_portmap_chains();
    }
}

/// Removes portmap's shared chains (CNI-HOSTPORT-*) and the jumps to them, but only when no
/// per-pod rule is left in them (so nobody else's mappings are touched).
pub fn remove_empty_portmap_chains() {
    let save = iptables_save();
    let in_use = save
        .lines()
        .any(|l| l.starts_with("-A CNI-HOSTPORT-") && l.contains("-j CNI-DN-"));
    if in_use {
        return;
    }
    for line in save.lines() {
        // Jumps from the built-in chains; iptables-save quotes like a shell, so let sh split.
        if let Some(rule) = line.strip_prefix("-A ") {
            if rule.contains("-j CNI-HOSTPORT-") && !rule.starts_with("CNI-HOSTPORT-") {
                let _ = Command::new("sh")
                    .arg("-c")
                    .arg(format!("iptables -w -t nat -D {rule}"))
                    .status();
            }
        }
    }
    for chain in [
        "CNI-HOSTPORT-DNAT",
        "CNI-HOSTPORT-SETMARK",
        "CNI-HOSTPORT-MASQ",
    ] {
        let _ = Command::new("iptables")
            .args(["-w", "-t", "nat", "-F", chain])
            .stderr(std::process::Stdio::null())
            .status();
        let _ = Command::new("iptables")
            .args(["-w", "-t", "nat", "-X", chain])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Names of the host's network interfaces.
pub fn links() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs a command and returns its stdout (stderr appended on failure, for assertion messages).
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        text.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    text
}
