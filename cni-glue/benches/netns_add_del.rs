//! Median of 20 of "netns create + CNI ADD" and "CNI DEL + netns remove" with Debian's bridge +
//! host-local plugins (and the loopback plugin, as `Network::setup` runs it by default).
//! Needs root and /usr/lib/cni. Run: `cargo bench -p crius-cni --bench netns_add_del`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crius_cni::{netns, Network, NetworkOptions, PodNetwork};

const RUNS: usize = 20;
const BRIDGE: &str = "crius-bench";

struct Cleanup {
    netns_dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.netns_dir) {
            for e in entries.flatten() {
                let _ = netns::remove(&e.path());
            }
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", BRIDGE])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn measure(dir: &Path, loopback: bool) -> (Vec<Duration>, Vec<Duration>) {
    let network = Network::new(NetworkOptions {
        conf_dir: dir.join("net.d"),
        bin_dirs: vec![PathBuf::from("/usr/lib/cni")],
        cache_dir: dir.join("cache"),
        loopback,
        ..NetworkOptions::default()
    });
    let netns_dir = dir.join("netns");
    let mut add = Vec::new();
    let mut del = Vec::new();
    // One warm-up round (creates the bridge, faults in the plugin binaries).
    for i in 0..=RUNS {
        let id = format!("crius-bench-{loopback}-{i}");
        let t0 = Instant::now();
        let path = netns::create(&netns_dir, &id).unwrap();
        let pod = PodNetwork {
            id: id.clone(),
            name: format!("bench-{i}"),
            namespace: "bench".into(),
            uid: format!("uid-{i}"),
            netns_path: path.clone(),
            ..PodNetwork::default()
        };
        network.setup(&pod).await.unwrap();
        let t1 = Instant::now();
        network.teardown(&id).await.unwrap();
        netns::remove(&path).unwrap();
        let t2 = Instant::now();
        if i > 0 {
            add.push(t1 - t0);
            del.push(t2 - t1);
        }
    }
    (add, del)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::Builder::new()
        .prefix("crius-cni-bench-")
        .tempdir()
        .unwrap();
    std::fs::create_dir(dir.path().join("net.d")).unwrap();
    let conflist = format!(
        r#"{{"cniVersion":"1.0.0","name":"crius-bench","plugins":[{{"type":"bridge","bridge":"{BRIDGE}",
        "isGateway":true,"ipMasq":false,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"10.88.249.0/24"}}]],
        "routes":[{{"dst":"0.0.0.0/0"}}],"dataDir":"{}"}}}}]}}"#,
        dir.path().join("ipam").display()
    );
    std::fs::write(dir.path().join("net.d/10-bench.conflist"), conflist).unwrap();
    let _cleanup = Cleanup {
        netns_dir: dir.path().join("netns"),
    };
    for loopback in [true, false] {
        let (add, del) = measure(dir.path(), loopback).await;
        let what = if loopback {
            "bridge+host-local, with loopback plugin"
        } else {
            "bridge+host-local, no loopback plugin"
        };
        println!(
            "{what}: netns create + ADD median {} (min {}, max {}); DEL + netns remove median {} (min {}, max {}) over {RUNS} runs",
            ms(median(add.clone())),
            ms(*add.iter().min().unwrap()),
            ms(*add.iter().max().unwrap()),
            ms(median(del.clone())),
            ms(*del.iter().min().unwrap()),
            ms(*del.iter().max().unwrap()),
        );
    }
}
