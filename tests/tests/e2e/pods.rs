//! Pod sandboxes end to end: lifecycle, name reservation, unknown ids, bad requests and the
//! bridge network, against a real crius with real CNI plugins. Run as root.
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common;
use crate::common::{assert_status, Env};
use crius_api::v1::*;
use tonic::Code;

#[tokio::test]
async fn pod_lifecycle_on_the_host_network() {
    let mut env = Env::new().await;
    let config = env.pod_config("lifecycle", true);
    let id = env.run_pod(config.clone()).await;
    let other_config = env.pod_config("other", true);
    // The runtime handler crius answers to by name.
    let other = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(other_config),
            runtime_handler: "crius".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    env.pods.push(other.clone());
    assert_eq!(env.pod_status(&other).await.runtime_handler, "crius");

    let status = env.pod_status(&id).await;
    assert_eq!(status.id, id);
    assert_eq!(status.state, PodSandboxState::SandboxReady as i32);
    assert_eq!(status.metadata, config.metadata);
    assert_eq!(status.labels, config.labels);
    assert!(status.created_at > 0);
    let ns = status.linux.unwrap().namespaces.unwrap().options.unwrap();
    assert_eq!(ns.network, NamespaceMode::Node as i32);
    assert_eq!(ns.pid, NamespaceMode::Pod as i32);
    // A host-network pod has no pod IP of its own.
    assert_eq!(status.network.unwrap().ip, "");

    // The pause process runs in the pod's cgroup.
    let procs = common::processes_of_pod(&id);
    assert!(procs.len() >= 2, "shim and pause expected, found {procs:?}");

    // Filters: id prefix, state, labels.
    let ids = |pods: Vec<PodSandbox>| pods.into_iter().map(|p| p.id).collect::<Vec<_>>();
    let all = ids(env.list_pods(PodSandboxFilter::default()).await);
    assert_eq!(all.len(), 2);
    assert_eq!(all[0], other, "newest first");
    let by_prefix = env
        .list_pods(PodSandboxFilter {
            id: id[..12].to_string(),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(by_prefix), vec![id.clone()]);
    let by_label = env
        .list_pods(PodSandboxFilter {
            label_selector: [("pod".to_string(), "lifecycle".to_string())].into(),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(by_label), vec![id.clone()]);
    // StreamPodSandboxes answers what ListPodSandbox does.
    let mut stream = env
        .rt()
        .stream_pod_sandboxes(StreamPodSandboxesRequest {
            filter: Some(PodSandboxFilter {
                id: id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("one message");
    assert_eq!(ids(first.pod_sandboxes), vec![id.clone()]);
    let no_label = env
        .list_pods(PodSandboxFilter {
            label_selector: [("pod".to_string(), "nope".to_string())].into(),
            ..Default::default()
        })
        .await;
    assert!(no_label.is_empty());

    // Stop: NotReady, pause gone, idempotent; by a unique id prefix too.
    env.stop_pod(&id[..12]).await;
    let status = env.pod_status(&id).await;
    assert_eq!(status.state, PodSandboxState::SandboxNotready as i32);
    env.stop_pod(&id).await;
    let not_ready = env
        .list_pods(PodSandboxFilter {
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxNotready as i32,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(not_ready), vec![id.clone()]);
    let ready = env
        .list_pods(PodSandboxFilter {
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(ids(ready), vec![other.clone()]);
    let procs: Vec<i32> = common::processes_of_pod(&id)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(&format!("/crius/{id}/{id}")))
        })
        .collect();
    assert!(procs.is_empty(), "pause still runs after stop: {procs:?}");

    // Remove: gone, idempotent.
    env.remove_pod(&id).await;
    env.remove_pod(&id).await;
    assert_status(
        env.rt()
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await,
        Code::NotFound,
        &[&id],
    );
    env.assert_pod_gone(&id).await;

    // Remove without a stop first.
    env.remove_pod(&other).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn pod_name_is_reserved_until_removal() {
    let mut env = Env::new().await;
    let config = env.pod_config("twin", true);
    let first = env.run_pod(config.clone()).await;
    let second = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await;
    assert_status(
        second,
        Code::AlreadyExists,
        &["twin_crius-e2e_uid-twin_0", &first],
    );
    // Another attempt is another name.
    let mut retry = config.clone();
    retry.metadata.as_mut().unwrap().attempt = 1;
    let retried = env.run_pod(retry).await;
    assert_ne!(retried, first);

    // A stopped pod still holds its name; a removed one frees it.
    env.stop_pod(&first).await;
    let again = env
        .rt()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await;
    assert_status(again, Code::AlreadyExists, &[&first]);
    env.remove_pod(&first).await;
    let reused = env.run_pod(config).await;
    assert_ne!(reused, first);
    for id in [&retried, &reused] {
        env.remove_pod(id).await;
    }
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn unknown_ids() {
    let env = Env::new().await;
    let mut rt = env.rt();
    let unknown = "0123456789abcdef0123456789abcdef";

    assert_status(
        rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: unknown.into(),
            verbose: false,
        })
        .await,
        Code::NotFound,
        &[unknown],
    );
    rt.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: unknown.into(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: unknown.into(),
    })
    .await
    .unwrap();

    let config = env.container_config("c", &["true"]);
    assert_status(
        rt.create_container(CreateContainerRequest {
            pod_sandbox_id: unknown.into(),
            config: Some(config),
            sandbox_config: None,
        })
        .await,
        Code::NotFound,
        &[unknown],
    );
    assert_status(
        rt.container_status(ContainerStatusRequest {
            container_id: unknown.into(),
            verbose: false,
        })
        .await,
        Code::NotFound,
        &[unknown],
    );
    assert_status(
        rt.start_container(StartContainerRequest {
            container_id: unknown.into(),
        })
        .await,
        Code::NotFound,
        &[unknown],
    );
    assert_status(
        env.exec(unknown, &["true"], 5).await,
        Code::NotFound,
        &[unknown],
    );
    assert_status(
        rt.reopen_container_log(ReopenContainerLogRequest {
            container_id: unknown.into(),
        })
        .await,
        Code::NotFound,
        &[unknown],
    );
    rt.stop_container(StopContainerRequest {
        container_id: unknown.into(),
        timeout: 1,
    })
    .await
    .unwrap();
    rt.remove_container(RemoveContainerRequest {
        container_id: unknown.into(),
    })
    .await
    .unwrap();
    let listed = env
        .list_containers(ContainerFilter {
            pod_sandbox_id: unknown.into(),
            ..Default::default()
        })
        .await;
    assert!(listed.is_empty());
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn bad_requests_name_the_field() {
    let mut env = Env::new().await;
    let mut rt = env.rt();
    let run = |config: Option<PodSandboxConfig>, handler: &str| RunPodSandboxRequest {
        config,
        runtime_handler: handler.into(),
    };

    assert_status(
        rt.run_pod_sandbox(run(None, "")).await,
        Code::InvalidArgument,
        &["config"],
    );
    let mut config = env.pod_config("bad", true);
    config.metadata = None;
    assert_status(
        rt.run_pod_sandbox(run(Some(config), "")).await,
        Code::InvalidArgument,
        &["config.metadata"],
    );
    for (field, clear) in [
        (
            "config.metadata.name",
            (|m: &mut PodSandboxMetadata| m.name.clear()) as fn(&mut PodSandboxMetadata),
        ),
        ("config.metadata.namespace", |m| m.namespace.clear()),
        ("config.metadata.uid", |m| m.uid.clear()),
    ] {
        let mut config = env.pod_config("bad", true);
        clear(config.metadata.as_mut().unwrap());
        assert_status(
            rt.run_pod_sandbox(run(Some(config), "")).await,
            Code::InvalidArgument,
            &[field],
        );
    }
    assert_status(
        rt.run_pod_sandbox(run(Some(env.pod_config("bad", true)), "no-such-handler"))
            .await,
        Code::InvalidArgument,
        &["runtime_handler", "no-such-handler"],
    );
    // Ports, nameservers and groups that the network plugin, the resolver or the kernel
    // would trip over later.
    let port = |host_port: i32, container_port: i32| PortMapping {
        protocol: Protocol::Tcp as i32,
        container_port,
        host_port,
        host_ip: String::new(),
    };
    let mut config = env.pod_config("bad", false);
    config.port_mappings = vec![port(18081, 80), port(18081, 81)];
    assert_status(
        rt.run_pod_sandbox(run(Some(config), "")).await,
        Code::InvalidArgument,
        &[
            "port_mappings[1]: host port 18081",
            "port_mappings[0]'s already",
        ],
    );
    let mut config = env.pod_config("bad", false);
    config.port_mappings = vec![port(18082, 0)];
    assert_status(
        rt.run_pod_sandbox(run(Some(config), "")).await,
        Code::InvalidArgument,
        &["port_mappings[0]: host port 18082 goes to container port 0"],
    );
    let mut config = env.pod_config("bad", true);
    config.dns_config = Some(DnsConfig {
        servers: vec!["10.0.0.10".into(), "not-an-address".into()],
        ..Default::default()
    });
    assert_status(
        rt.run_pod_sandbox(run(Some(config), "")).await,
        Code::InvalidArgument,
        &[
            "dns_config.servers[1]",
            "not-an-address",
            "is not an IP address",
        ],
    );
    let mut config = env.pod_config("bad", true);
    common::pod_sc(&mut config).supplemental_groups = (1..=70_000).collect();
    assert_status(
        rt.run_pod_sandbox(run(Some(config), "")).await,
        Code::InvalidArgument,
        &["supplemental_groups: 70000 groups", "at most 65536"],
    );
    // None of those reserved the name.
    let pod = env.run_pod(env.pod_config("bad", true)).await;
    let pod_config = env.pod_config("bad", true);

    let create = |config: Option<ContainerConfig>| CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config,
        sandbox_config: Some(pod_config.clone()),
    };
    assert_status(
        rt.create_container(create(None)).await,
        Code::InvalidArgument,
        &["config"],
    );
    let mut config = env.container_config("c", &["true"]);
    config.metadata = None;
    assert_status(
        rt.create_container(create(Some(config))).await,
        Code::InvalidArgument,
        &["config.metadata.name"],
    );
    let mut config = env.container_config("c", &["true"]);
    config.image = None;
    assert_status(
        rt.create_container(create(Some(config))).await,
        Code::InvalidArgument,
        &["config.image.image"],
    );
    let mut config = env.container_config("c", &["true"]);
    config.log_path = "../escape.log".into();
    assert_status(
        rt.create_container(create(Some(config))).await,
        Code::InvalidArgument,
        &["config.log_path"],
    );
    // An image that is not there: NotFound naming it.
    let mut config = env.container_config("c", &["true"]);
    config.image.as_mut().unwrap().image = "127.0.0.1:1/crius-test/absent:latest".into();
    assert_status(
        rt.create_container(create(Some(config))).await,
        Code::NotFound,
        &["crius-test/absent"],
    );
    assert_status(
        rt.create_container(CreateContainerRequest {
            pod_sandbox_id: String::new(),
            config: Some(env.container_config("c", &["true"])),
            sandbox_config: None,
        })
        .await,
        Code::InvalidArgument,
        &["pod_sandbox_id"],
    );
    assert_status(
        rt.container_status(ContainerStatusRequest {
            container_id: String::new(),
            verbose: false,
        })
        .await,
        Code::InvalidArgument,
        &["container_id"],
    );
    assert_status(
        rt.stop_container(StopContainerRequest {
            container_id: "x".into(),
            timeout: -1,
        })
        .await,
        Code::InvalidArgument,
        &["timeout"],
    );
    assert_status(
        rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: String::new(),
            verbose: false,
        })
        .await,
        Code::InvalidArgument,
        &["pod_sandbox_id"],
    );
    assert_status(env.exec("x", &[], 1).await, Code::InvalidArgument, &["cmd"]);
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// Reads from `addr` until `want` shows up (or the peer closes); retries connects for a while,
/// since the server in the pod starts asynchronously.
async fn tcp_read(addr: SocketAddr, want: &str) -> String {
    common::wait_for(
        &format!("{want:?} from {addr}"),
        Duration::from_secs(20),
        || async move {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&got).contains(want) {
                    break;
                }
            }
            let got = String::from_utf8_lossy(&got).into_owned();
            got.contains(want).then_some(got)
        },
    )
    .await
}

#[tokio::test]
async fn bridge_network_reachable_from_host_and_between_pods() {
    let mut env = Env::with_image().await;
    let server = |name: &str| {
        let reply = format!("hello from {name}");
        vec![
            "sh".to_string(),
            "-c".to_string(),
            format!("while true; do echo '{reply}' | nc -l -p 8080; done"),
        ]
    };
    let mut pods = Vec::new();
    for name in ["net-a", "net-b"] {
        let config = env.pod_config(name, false);
        let pod = env.run_pod(config.clone()).await;
        let status = env.pod_status(&pod).await;
        let ip = status.network.unwrap().ip;
        assert!(
            ip.starts_with(&env.subnet_prefix()),
            "pod {name} IP {ip:?} not in {}0/24",
            env.subnet_prefix()
        );
        let ns = status.linux.unwrap().namespaces.unwrap().options.unwrap();
        assert_eq!(ns.network, NamespaceMode::Pod as i32);
        let cmd = server(name);
        let mut c = env.container_config("server", &[]);
        c.command = cmd;
        let container = env.create_start(&pod, &config, c).await;
        pods.push((pod, ip, container));
    }
    assert_ne!(pods[0].1, pods[1].1, "two pods, one IP");
    assert_eq!(env.allocated_ips().len(), 2);

    // From the host to each pod.
    for (name, (_, ip, _)) in ["net-a", "net-b"].iter().zip(&pods) {
        let addr: SocketAddr = format!("{ip}:8080").parse().unwrap();
        tcp_read(addr, &format!("hello from {name}")).await;
    }
    // From pod b to pod a, with busybox nc inside the container. Pod a's server listens again
    // only after its shell loop has started the next `nc -l`, so a connect right after the
    // host's read may be refused: tried again for a while, as the host's read is.
    let (_, ip_a, _) = &pods[0];
    let (_, _, container_b) = &pods[1];
    let cmd = format!(
        "for i in $(seq 50); do out=$(nc -w 3 {ip_a} 8080 </dev/null) && [ -n \"$out\" ] \
         && {{ echo \"$out\"; exit 0; }}; sleep 0.2; done; exit 1"
    );
    let out = env
        .exec(container_b, &["sh", "-c", &cmd], 20)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from net-a\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The pod sees its own address on eth0.
    let out = env
        .exec(container_b, &["ip", "-4", "addr", "show", "eth0"], 10)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&pods[1].1));

    // Stop releases the addresses; remove leaves nothing.
    for (pod, _, _) in &pods {
        env.stop_pod(pod).await;
        assert_eq!(env.pod_status(pod).await.network.unwrap().ip, "");
    }
    assert!(env.allocated_ips().is_empty(), "{:?}", env.allocated_ips());
    for (pod, _, _) in &pods {
        env.remove_pod(pod).await;
    }
    env.assert_no_leaks().await;
    assert!(
        !std::path::Path::new("/sys/class/net")
            .join(&env.bridge)
            .join("brif")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some()),
        "veths left on {}",
        env.bridge
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pods_on_the_bridge() {
    let mut env = Env::new().await;
    const PODS: usize = 8;
    let runs = (0..PODS).map(|i| {
        let mut rt = env.rt();
        let config = env.pod_config(&format!("many-{i}"), false);
        async move {
            rt.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .map(|r| r.into_inner().pod_sandbox_id)
        }
    });
    let results = futures_join_all(runs).await;
    let ids: Vec<String> = results.into_iter().map(|r| r.unwrap()).collect();
    env.pods.extend(ids.iter().cloned());
    let mut ips = Vec::new();
    for id in &ids {
        let ip = env.pod_status(id).await.network.unwrap().ip;
        assert!(ip.starts_with(&env.subnet_prefix()), "{ip}");
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), PODS, "duplicate pod IPs");
    assert_eq!(env.allocated_ips().len(), PODS);

    // Stop and remove them all at once, twice each (idempotent under concurrency too).
    let removes = ids
        .iter()
        .flat_map(|id| [id.clone(), id.clone()])
        .map(|id| {
            let mut rt = env.rt();
            async move {
                rt.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                    .await
            }
        });
    for r in futures_join_all(removes).await {
        r.unwrap();
    }
    env.assert_no_leaks().await;
}

/// Runs futures concurrently on the test's runtime and collects their outputs in order.
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn failed_network_setup_is_undone() {
    // The bridge's ADD succeeds (an address is taken), then tuning's fails on a sysctl that does
    // not exist: RunPodSandbox must give the address back.
    network_failure_is_undone(
        r#"{ "type": "tuning", "sysctl": { "net.ipv4.conf.eth0.crius_e2e_no_such": "1" } }"#,
        "tuning",
        None,
        Code::FailedPrecondition,
    )
    .await;
}

#[tokio::test]
async fn failed_network_setup_with_a_plugin_printing_nonsense_is_undone() {
    network_failure_is_undone(
        r#"{ "type": "crius-e2e-nonsense" }"#,
        "crius-e2e-nonsense",
        Some(r#"[ "$CNI_COMMAND" = ADD ] && echo 'this is not a CNI result'; exit 0"#),
        Code::FailedPrecondition,
    )
    .await;
}

/// A plugin's "try again later" (CNI error code 11) is Unavailable: kubelet's retry is the
/// answer, not a fix of the node.
#[tokio::test]
async fn failed_network_setup_a_plugin_asks_to_retry_is_unavailable_and_undone() {
    network_failure_is_undone(
        r#"{ "type": "crius-e2e-busy" }"#,
        "crius-e2e-busy",
        Some(
            r#"[ "$CNI_COMMAND" = ADD ] || exit 0
echo '{"cniVersion": "1.0.0", "code": 11, "msg": "busy, try again later"}'; exit 1"#,
        ),
        Code::Unavailable,
    )
    .await;
}

#[tokio::test]
async fn failed_network_setup_with_a_missing_plugin_is_undone() {
    network_failure_is_undone(
        r#"{ "type": "crius-e2e-no-such-plugin" }"#,
        "crius-e2e-no-such-plugin",
        None,
        Code::FailedPrecondition,
    )
    .await;
}

/// Appends `plugin` to the test network's chain (with `script` as the body of a plugin named
/// `plugin_name` in the test's plugin dir), checks RunPodSandbox fails with `code` naming
/// `plugin_name` and leaves nothing (no pod, no address, no state), then repairs the config
/// and runs the same pod.
async fn network_failure_is_undone(
    plugin: &str,
    plugin_name: &str,
    script: Option<&str>,
    code: Code,
) {
    let mut env = Env::new().await;
    if let Some(body) = script {
        env.script_plugin(plugin_name, body);
    }
    let good = env.bridge_conflist();
    let broken = env.bridge_conflist_with(plugin);
    env.write_cni_config(&broken);
    let config = env.pod_config("netfail", false);
    let failed = wait_for_error(&env, &config).await;
    assert!(failed.message().contains(plugin_name), "{failed:?}");
    assert_eq!(failed.code(), code, "{failed:?}");
    assert!(env.list_pods(PodSandboxFilter::default()).await.is_empty());
    assert!(env.allocated_ips().is_empty(), "{:?}", env.allocated_ips());
    let state = env.crius.state();
    for dir in ["pods", "netns", "shims"] {
        let left: Vec<_> = std::fs::read_dir(state.join(dir))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{dir} left: {left:?}");
    }
    // With the config repaired the same pod (same name) starts.
    env.write_cni_config(&good);
    let pod = common::wait_for("the repaired network", Duration::from_secs(10), || {
        let mut rt = env.rt();
        let config = config.clone();
        async move {
            rt.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .ok()
            .map(|r| r.into_inner().pod_sandbox_id)
        }
    })
    .await;
    env.pods.push(pod.clone());
    let ip = env.pod_status(&pod).await.network.unwrap().ip;
    assert!(ip.starts_with(&env.subnet_prefix()), "{ip}");
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// RunPodSandbox until it fails (the config change is picked up asynchronously); a pod that
/// starts meanwhile is removed again.
async fn wait_for_error(env: &Env, config: &PodSandboxConfig) -> tonic::Status {
    common::wait_for("RunPodSandbox to fail", Duration::from_secs(10), || {
        let mut rt = env.rt();
        let config = config.clone();
        async move {
            match rt
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
            {
                Err(s) => Some(s),
                Ok(r) => {
                    let id = r.into_inner().pod_sandbox_id;
                    rt.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                        .await
                        .unwrap();
                    None
                }
            }
        }
    })
    .await
}

/// kubelet's Evented PLEG reads `PodSandboxStatus.timestamp` in seconds and, when it is set,
/// takes the pod's containers from `containers_statuses`: a set timestamp with no containers
/// made it start copies of containers it thought were missing.
#[tokio::test]
async fn sandbox_status_carries_its_containers_and_a_timestamp_in_seconds() {
    let mut env = Env::with_image().await;
    let config = env.pod_config("evented", false);
    let pod = env.run_pod(config.clone()).await;
    let running = env
        .create_start(
            &pod,
            &config,
            env.container_config("runner", &["sleep", "3600"]),
        )
        .await;
    let done = env
        .create_start(&pod, &config, env.container_config("done", &["true"]))
        .await;
    env.wait_exited(&done, Duration::from_secs(10)).await;

    let resp = env
        .rt()
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - resp.timestamp).abs() < 60,
        "timestamp {} is not seconds since the epoch (now {now})",
        resp.timestamp
    );
    let mut got: Vec<(String, i32)> = resp
        .containers_statuses
        .iter()
        .map(|c| (c.id.clone(), c.state))
        .collect();
    got.sort();
    let mut want = vec![
        (running.clone(), ContainerState::ContainerRunning as i32),
        (done.clone(), ContainerState::ContainerExited as i32),
    ];
    want.sort();
    assert_eq!(got, want, "containers_statuses");
    for c in &resp.containers_statuses {
        let alone = env.status(&c.id).await;
        assert_eq!(
            &alone, c,
            "the pod's view of {} equals ContainerStatus",
            c.id
        );
    }

    env.stop(&running, 0).await;
    env.remove(&running).await;
    env.remove(&done).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// UpdateRuntimeConfig with the node's pod CIDR: kept across restarts, and with `[cni]
/// conf_template` set and no network config yet, a network config is written from the template
/// and pods get addresses from that CIDR. A bad CIDR is InvalidArgument; none is a no-op.
#[tokio::test]
async fn pod_cidr_fills_the_network_template() {
    let mut env = Env::new().await;
    let conf_dir = env.net_path("net.d");
    let template = env.net_path("template.conflist");
    let text = env
        .bridge_conflist()
        .replace(
            &format!("[[{{\"subnet\": \"{}\"}}]]", env.subnet()),
            "{{.PodCIDRRanges}}",
        )
        .replace("[{\"dst\": \"0.0.0.0/0\"}]", "{{.Routes}}");
    assert!(text.contains("{{.PodCIDRRanges}}") && text.contains("{{.Routes}}"));
    std::fs::write(&template, text).unwrap();
    for e in std::fs::read_dir(&conf_dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let drop_in = env.crius.dir().join("config.d");
    std::fs::create_dir_all(&drop_in).unwrap();
    std::fs::write(
        drop_in.join("template.toml"),
        format!("[cni]\nconf_template = \"{}\"\n", template.display()),
    )
    .unwrap();
    env.crius.restart().await.unwrap();

    let network_ready = |env: &Env| {
        let mut rt = env.rt();
        async move {
            let status = rt
                .status(StatusRequest::default())
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap();
            status
                .conditions
                .iter()
                .any(|c| c.r#type == "NetworkReady" && c.status)
        }
    };
    let update = |cidr: &str| {
        let mut rt = env.rt();
        let cidr = cidr.to_string();
        async move {
            rt.update_runtime_config(UpdateRuntimeConfigRequest {
                runtime_config: Some(RuntimeConfig {
                    network_config: Some(NetworkConfig { pod_cidr: cidr }),
                }),
            })
            .await
        }
    };
    assert!(!network_ready(&env).await);
    assert_status(
        update("10.88.18.0/33").await,
        Code::InvalidArgument,
        &["pod_cidr", "prefix length"],
    );
    update("").await.unwrap();
    assert!(std::fs::read_dir(&conf_dir).unwrap().next().is_none());

    update(&env.subnet()).await.unwrap();
    let written = conf_dir.join("10-crius-pod-cidr.conflist");
    assert!(written.is_file());
    assert!(network_ready(&env).await);
    let cidr = std::fs::read_to_string(env.crius.root().join("pod-cidr")).unwrap();
    assert_eq!(cidr, env.subnet());
    let pod = env.run_pod(env.pod_config("from-template", false)).await;
    let ip = env.pod_status(&pod).await.network.unwrap().ip;
    assert!(ip.starts_with(&env.subnet_prefix()), "{ip}");
    env.remove_pod(&pod).await;

    // Kept across a restart: the missing network config is written again at start.
    std::fs::remove_file(&written).unwrap();
    env.crius.restart().await.unwrap();
    assert!(written.is_file(), "not written again at start");
    assert!(network_ready(&env).await);
    env.assert_no_leaks().await;
}

/// A plugin whose DEL fails makes StopPodSandbox fail as the node's problem
/// (FailedPrecondition, naming the plugin), not Internal; kubelet's next stop, once the plugin
/// works, releases everything.
#[tokio::test]
async fn a_stop_whose_plugin_del_fails_is_failed_precondition_and_can_be_retried() {
    let mut env = Env::new().await;
    let del_ok = env.net_path("del-ok");
    // ADD passes the bridge's result on (python3 reads it from the config); DEL fails until
    // `del-ok` exists.
    env.script_plugin(
        "crius-e2e-del-fails",
        &format!(
            "case \"$CNI_COMMAND\" in\n\
             ADD) exec python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)[\"prevResult\"]))' ;;\n\
             DEL) cat >/dev/null; [ -e {del_ok} ] && exit 0\n\
             echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"crius-e2e del fails\"}}'; exit 1 ;;\n\
             esac\ncat >/dev/null; exit 0",
            del_ok = del_ok.display()
        ),
    );
    let chain = env.bridge_conflist_with(r#"{ "type": "crius-e2e-del-fails" }"#);
    env.write_cni_config(&chain);
    let config = env.pod_config("del-fails", false);
    // The config change is picked up asynchronously: wait for a pod the plugin ran for.
    let pod = common::wait_for("a pod on the new chain", Duration::from_secs(10), || {
        let mut rt = env.rt();
        let config = config.clone();
        async move {
            let id = rt
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
                .ok()?
                .into_inner()
                .pod_sandbox_id;
            let stop = rt
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
            match stop {
                Err(status) => Some((id, status)),
                Ok(_) => {
                    rt.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                        .await
                        .unwrap();
                    None
                }
            }
        }
    })
    .await;
    let (pod, failed) = pod;
    env.pods.push(pod.clone());
    assert_eq!(failed.code(), Code::FailedPrecondition, "{failed:?}");
    assert!(
        failed.message().contains("crius-e2e-del-fails (DEL)"),
        "{failed:?}"
    );
    std::fs::write(&del_ok, "").unwrap();
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.write_cni_config(&env.bridge_conflist());
    env.assert_no_leaks().await;
}

/// systemd mounts `/run` (where crius's state lives by default) `noexec`. The pause, which each
/// pod's pause container executes from a bind of `<state>/bin`, kept that flag and every pod
/// died at once with EACCES. crius now mounts a tmpfs of its own (exec, nosuid, nodev) on
/// `<state>/bin`: pods and containers run with the state directory on a `noexec` mount, and a
/// restart of crius finds its tmpfs again rather than stacking another.
#[tokio::test]
async fn pods_run_with_the_state_directory_on_a_noexec_mount() {
    use nix::mount::{mount, MsFlags};
    let mut env = Env::with_image().await;
    env.crius.stop().unwrap();
    let state = env.crius.state();
    // As after a reboot onto a `noexec` /run: the state dir empty, on such a mount.
    let _ = nix::mount::umount2(&state.join("bin"), nix::mount::MntFlags::MNT_DETACH);
    mount(
        Some("tmpfs"),
        &state,
        Some("tmpfs"),
        MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=64m"),
    )
    .unwrap();
    env.crius.restart().await.unwrap();

    let pod_config = env.pod_config("noexec-state", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let config = env.container_config("sleeper", &["sleep", "600"]);
    let id = env.create_start(&pod, &pod_config, config).await;
    let out = env.exec(&id, &["echo", "ran"], 10).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    // The pause is alive (its failed exec ended it with 255).
    assert!(common::alive(env.pause_pid(&pod).await));
    assert_eq!(
        env.pod_status(&pod).await.state,
        PodSandboxState::SandboxReady as i32
    );

    let bin = state.join("bin");
    let mounts_at_bin = || {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines()
            .filter(|l| l.split(' ').nth(4) == Some(bin.to_str().unwrap()))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for round in 0..2 {
        if round == 1 {
            env.crius.restart().await.unwrap();
        }
        let at_bin = mounts_at_bin();
        assert_eq!(
            at_bin.len(),
            1,
            "round {round}: one mount at {bin:?}: {at_bin:?}"
        );
        let line = &at_bin[0];
        assert!(line.contains(" - tmpfs crius-bin "), "{line}");
        let options = line.split(' ').nth(5).unwrap();
        assert!(!options.contains("noexec"), "{line}");
        assert!(
            options.contains("nosuid") && options.contains("nodev"),
            "{line}"
        );
    }

    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    // (Not `assert_no_leaks`: the test's own tmpfs is on the state dir.)
    env.assert_pod_gone(&pod).await;
}
