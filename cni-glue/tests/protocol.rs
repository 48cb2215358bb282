//! The execution protocol as plugins see it, checked with recording script plugins: request
//! configuration (name, cniVersion, prevResult, runtimeConfig), parameters, chain order, and
//! which commands each config version gets. Needs no root and no real plugins.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crius_cni::{DnsConfig, Network, NetworkOptions, PodNetwork, PortMapping};
use serde_json::{json, Value};

/// A recorded plugin call.
#[derive(Debug)]
struct Call {
    plugin: String,
    command: String,
    env: Vec<String>,
    stdin: Value,
}

struct Rig {
    dir: tempfile::TempDir,
    network: Network,
}

impl Rig {
    /// Plugins `crius-rec-a` and `crius-rec-b` in a conflist of `version`.
    fn new(version: &str) -> Rig {
        let dir = tempfile::Builder::new()
            .prefix("crius-cni-proto-")
            .tempdir()
            .unwrap();
        for sub in ["net.d", "bin", "log"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let log = dir.path().join("log");
        let fail = dir.path().join("status-fail");
        // Each plugin logs its env and stdin, and answers ADD with a fixed result of its own.
        for (name, result) in [
            (
                "crius-rec-a",
                json!({"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": "/x"}],
                       "ips": [{"address": "10.88.250.2/24", "gateway": "10.88.250.1", "interface": 0}]}),
            ),
            (
                "crius-rec-b",
                json!({"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": "/x"}],
                       "ips": [{"address": "10.88.250.2/24", "gateway": "10.88.250.1", "interface": 0}],
                       "dns": {"nameservers": ["10.88.250.53"]}}),
            ),
        ] {
            let script = format!(
                r#"#!/bin/sh
n=$(ls {log} | wc -l)
f={log}/$(printf %03d $((n / 2)))-{name}-$CNI_COMMAND
cat > $f.stdin
printf '%s\n' "CNI_CONTAINERID=${{CNI_CONTAINERID-unset}}" "CNI_NETNS=${{CNI_NETNS-unset}}" "CNI_IFNAME=${{CNI_IFNAME-unset}}" "CNI_ARGS=${{CNI_ARGS-unset}}" "CNI_PATH=$CNI_PATH" > $f.env
case $CNI_COMMAND in
ADD) echo '{result}' ;;
STATUS) if [ -e {fail} ]; then echo '{{"cniVersion":"{version}","code":50,"msg":"no IPs left"}}'; exit 1; fi ;;
esac
exit 0
"#,
                log = log.display(),
                fail = fail.display(),
            );
            let p = dir.path().join("bin").join(name);
            std::fs::write(&p, script).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let conflist = json!({
            "cniVersion": version,
            "name": "crius-proto",
            "plugins": [
                {"type": "crius-rec-a", "capabilities": {"portMappings": true}, "mode": "a"},
                {"type": "crius-rec-b", "capabilities": {"dns": true, "io.kubernetes.cri.pod-annotations": true}}
            ]
        });
        std::fs::write(
            dir.path().join("net.d/10-proto.conflist"),
            conflist.to_string(),
        )
        .unwrap();
        let network = Network::new(NetworkOptions {
            conf_dir: dir.path().join("net.d"),
            bin_dirs: vec![dir.path().join("bin")],
            cache_dir: dir.path().join("cache"),
            plugin_timeout: Duration::from_secs(10),
            ..NetworkOptions::default()
        });
        Rig { dir, network }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Calls recorded so far, in order; clears the log.
    fn take_calls(&self) -> Vec<Call> {
        let log = self.path("log");
        let mut names: Vec<String> = std::fs::read_dir(&log)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_suffix(".stdin").map(str::to_string))
            .collect();
        names.sort();
        let calls = names
            .iter()
            .map(|n| {
                let (_, rest) = n.split_once('-').unwrap();
                let (plugin, command) = rest.rsplit_once('-').unwrap();
                let stdin = std::fs::read(log.join(format!("{n}.stdin"))).unwrap();
                let env = std::fs::read_to_string(log.join(format!("{n}.env"))).unwrap();
                Call {
                    plugin: plugin.to_string(),
                    command: command.to_string(),
                    env: env.lines().map(str::to_string).collect(),
                    stdin: serde_json::from_slice(&stdin).unwrap(),
                }
            })
            .collect();
        for e in std::fs::read_dir(&log).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        calls
    }
}

fn order(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.command, c.plugin))
        .collect()
}

fn pod() -> PodNetwork {
    PodNetwork {
        id: "crius-proto-pod".into(),
        name: "web".into(),
        namespace: "ns1".into(),
        uid: "uid-1".into(),
        netns_path: Path::new("/nonexistent/crius-proto-ns").into(),
        port_mappings: vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: String::new(),
        }],
        dns: Some(DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        annotations: BTreeMap::from([("team".to_string(), "crius".to_string())]),
        ..PodNetwork::default()
    }
}

#[tokio::test]
async fn protocol_of_a_1_1_0_chain() {
    let rig = Rig::new("1.1.0");
    let pod = pod();
    let result = rig.network.setup(&pod).await.unwrap();
    // The final result is the last plugin's.
    assert_eq!(result.dns.nameservers, vec!["10.88.250.53"]);
    assert_eq!(
        result.pod_ips(),
        vec!["10.88.250.2".parse::<std::net::IpAddr>().unwrap()]
    );

    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["ADD crius-rec-a", "ADD crius-rec-b"]);
    let (a, b) = (&calls[0], &calls[1]);
    assert_eq!(a.stdin["name"], "crius-proto");
    assert_eq!(a.stdin["cniVersion"], "1.1.0");
    assert_eq!(a.stdin["mode"], "a", "plugin fields pass through");
    assert!(
        a.stdin.get("prevResult").is_none(),
        "first ADD has no prevResult"
    );
    assert!(a.stdin.get("capabilities").is_none());
    assert_eq!(
        a.stdin["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
    );
    assert_eq!(b.stdin["prevResult"]["ips"][0]["address"], "10.88.250.2/24");
    assert!(
        b.stdin["prevResult"].get("dns").is_none(),
        "b gets a's result"
    );
    assert_eq!(
        b.stdin["runtimeConfig"],
        json!({
            "dns": {"servers": ["10.96.0.10"], "searches": ["svc.cluster.local"], "options": ["ndots:5"]},
            "io.kubernetes.cri.pod-annotations": {"team": "crius"}
        })
    );
    assert_eq!(
        a.env,
        [
            "CNI_CONTAINERID=crius-proto-pod",
            "CNI_NETNS=/nonexistent/crius-proto-ns",
            "CNI_IFNAME=eth0",
            "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=crius-proto-pod;K8S_POD_UID=uid-1",
            &format!("CNI_PATH={}", rig.path("bin").display()),
        ]
    );

    // CHECK: in order, with the final ADD result.
    rig.network.check(&pod.id).await.unwrap();
    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["CHECK crius-rec-a", "CHECK crius-rec-b"]);
    for c in &calls {
        assert_eq!(
            c.stdin["prevResult"]["dns"]["nameservers"][0],
            "10.88.250.53"
        );
    }

    // STATUS: every plugin, without attachment parameters; code 50 surfaces.
    let st = rig.network.status().unwrap();
    assert_eq!(st.cni_version, "1.1.0");
    assert!(rig.take_calls().is_empty(), "status() runs no plugin");
    let st = rig.network.plugin_status().await.unwrap();
    assert_eq!(st.network, "crius-proto");
    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["STATUS crius-rec-a", "STATUS crius-rec-b"]);
    assert_eq!(calls[0].env[0], "CNI_CONTAINERID=unset");
    assert!(calls[0].stdin.get("runtimeConfig").is_none());
    std::fs::write(rig.path("status-fail"), b"").unwrap();
    let err = rig.network.plugin_status().await.unwrap_err();
    assert_eq!(err.cni_code(), Some(50));
    assert!(err.to_string().contains("no IPs left"), "{err}");
    std::fs::remove_file(rig.path("status-fail")).unwrap();
    rig.take_calls();

    // GC: the valid attachments are passed; the pod is kept.
    let valid: HashSet<String> = [pod.id.clone()].into();
    rig.network.gc(&valid).await.unwrap();
    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["GC crius-rec-a", "GC crius-rec-b"]);
    assert_eq!(
        calls[0].stdin["cni.dev/valid-attachments"],
        json!([{"containerID": "crius-proto-pod", "ifname": "eth0"}])
    );

    // DEL: reverse order, final result as prevResult, netns "" as it does not exist.
    rig.network.teardown(&pod.id).await.unwrap();
    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["DEL crius-rec-b", "DEL crius-rec-a"]);
    for c in &calls {
        assert_eq!(
            c.stdin["prevResult"]["dns"]["nameservers"][0],
            "10.88.250.53"
        );
        assert_eq!(c.env[1], "CNI_NETNS=");
        assert!(c.stdin["runtimeConfig"].is_object());
    }
    rig.network.teardown(&pod.id).await.unwrap();
    assert!(rig.take_calls().is_empty(), "nothing left to DEL");

    // GC after the pod is gone passes an empty list.
    rig.network.gc(&HashSet::new()).await.unwrap();
    let calls = rig.take_calls();
    assert_eq!(calls[0].stdin["cni.dev/valid-attachments"], json!([]));
}

#[tokio::test]
async fn older_versions_get_only_their_commands() {
    // 1.0.0: CHECK yes, STATUS and GC no.
    let rig = Rig::new("1.0.0");
    let pod = pod();
    rig.network.setup(&pod).await.unwrap();
    rig.take_calls();
    rig.network.plugin_status().await.unwrap();
    rig.network.gc(&[pod.id.clone()].into()).await.unwrap();
    assert!(rig.take_calls().is_empty());
    rig.network.check(&pod.id).await.unwrap();
    assert_eq!(rig.take_calls().len(), 2);
    rig.network.teardown(&pod.id).await.unwrap();
    let calls = rig.take_calls();
    assert!(calls.iter().all(|c| c.stdin.get("prevResult").is_some()));

    // 0.3.1: no CHECK, and DEL gets no prevResult.
    let rig = Rig::new("0.3.1");
    rig.network.setup(&pod).await.unwrap();
    rig.take_calls();
    rig.network.check(&pod.id).await.unwrap();
    assert!(rig.take_calls().is_empty());
    rig.network.teardown(&pod.id).await.unwrap();
    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["DEL crius-rec-b", "DEL crius-rec-a"]);
    assert!(calls.iter().all(|c| c.stdin.get("prevResult").is_none()));
}

#[tokio::test]
async fn config_change_does_not_change_what_del_runs() {
    let rig = Rig::new("1.0.0");
    let pod = pod();
    rig.network.setup(&pod).await.unwrap();
    rig.take_calls();
    // The admin swaps the network for another one with only plugin b.
    std::fs::write(
        rig.path("net.d/10-proto.conflist"),
        json!({"cniVersion": "1.0.0", "name": "crius-other", "plugins": [{"type": "crius-rec-b"}]})
            .to_string(),
    )
    .unwrap();
    assert_eq!(rig.network.status().unwrap().network, "crius-other");
    rig.network.teardown(&pod.id).await.unwrap();
    let calls = rig.take_calls();
    assert_eq!(order(&calls), ["DEL crius-rec-b", "DEL crius-rec-a"]);
    assert_eq!(calls[0].stdin["name"], "crius-proto");
}
