//! Integration tests with Debian's CNI plugins (bridge, host-local, portmap, loopback) in real
//! network namespaces. They need root; each uses its own bridge and subnet and takes a lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use common::{fetch, lock, ping, serve_in, TestNet};
use crius_cni::{netns, Error, PortMapping};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_gives_reachable_ips_and_del_releases_them() {
    let _g = lock().await;
    let t = TestNet::new(1, "").with_loopback_plugin();
    let st = t.network.status().unwrap();
    assert_eq!(st.network, "crius-test-1");
    assert_eq!(st.cni_version, "1.0.0");

    let a = t.pod("a");
    let b = t.pod("b");
    let ra = t.network.setup(&a).await.unwrap();
    let rb = t.network.setup(&b).await.unwrap();

    // The result: an address in the test subnet on eth0 inside the pod, gateway .1, routes.
    let ip_a = ra.pod_ips()[0];
    let ip_b = rb.pod_ips()[0];
    assert!(ip_a.to_string().starts_with(&t.subnet_prefix()), "{ip_a}");
    assert_ne!(ip_a, ip_b);
    let ipc = &ra.ips[0];
    assert_eq!(ipc.address.prefix_len, 24);
    assert_eq!(
        ipc.gateway,
        Some(format!("{}1", t.subnet_prefix()).parse().unwrap())
    );
    let iface = &ra.interfaces[ipc.interface.unwrap()];
    assert_eq!(iface.name, "eth0");
    assert_eq!(
        iface.sandbox.as_deref(),
        Some(a.netns_path.to_str().unwrap())
    );
    assert!(ra.routes.iter().any(|r| r.dst.to_string() == "0.0.0.0/0"));
    assert!(t.network.cached_result(&a.id).unwrap() == Some(ra.clone()));
    let host_veth_a = ra
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_none() && i.name != t.bridge)
        .unwrap()
        .name
        .clone();
    assert!(common::link_exists(&host_veth_a));
    assert_eq!(t.allocated_ips().len(), 2);

    // Reachable from the host, and from each other.
    assert!(ping(ip_a), "host cannot ping pod a at {ip_a}");
    assert!(ping(ip_b), "host cannot ping pod b at {ip_b}");
    serve_in(&b.netns_path, 8080, "hello from b", 1);
    let got = fetch(Some(&a.netns_path), SocketAddr::new(ip_b, 8080)).unwrap();
    assert_eq!(got, "hello from b");

    // lo is up: a server on 127.0.0.1 inside the pod answers there.
    let port = serve_in(&a.netns_path, 0, "hello on lo", 1);
    let got = fetch(
        Some(&a.netns_path),
        SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port),
    );
    assert_eq!(got.unwrap(), "hello on lo");
    // The loopback plugin's attachment was recorded next to the pod network's.
    let cached: Vec<String> = t
        .cache_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        cached.contains(&"0-crius-loopback-lo.json".to_string()),
        "{cached:?}"
    );

    // CHECK passes on a healthy attachment (1.0.0 config).
    t.network.check(&a.id).await.unwrap();

    // DEL releases the address and the veth; a second DEL is a no-op.
    t.network.teardown(&a.id).await.unwrap();
    assert!(!common::link_exists(&host_veth_a));
    assert_eq!(t.allocated_ips().len(), 1);
    t.network.teardown(&a.id).await.unwrap();
    assert_eq!(t.network.cached_result(&a.id).unwrap(), None);
    assert!(!ping(ip_a), "pod a still answers after DEL");

    t.network.teardown(&b.id).await.unwrap();
    assert!(t.allocated_ips().is_empty(), "{:?}", t.allocated_ips());
    assert!(t.cache_files().is_empty(), "{:?}", t.cache_files());

    netns::remove(&a.netns_path).unwrap();
    netns::remove(&a.netns_path).unwrap();
    assert!(!a.netns_path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_mapping_forwards_localhost_to_the_pod() {
    let _g = lock().await;
    let chains = common::PortmapChainsGuard;
    let t = TestNet::new(
        2,
        r#", {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}"#,
    );
    let mut p = t.pod("web");
    p.port_mappings = vec![PortMapping {
        host_port: 18742,
        container_port: 8080,
        protocol: "tcp".into(),
        host_ip: "127.0.0.1".into(),
    }];
    let r = t.network.setup(&p).await.unwrap();
    assert_eq!(r.pod_ips().len(), 1);
    serve_in(&p.netns_path, 8080, "hello through portmap", 1);
    let got = fetch(None, "127.0.0.1:18742".parse().unwrap());
    let save = common::iptables_save();
    assert!(
        save.contains("18742"),
        "no DNAT rule for the host port:\n{save}"
    );
    assert_eq!(got.unwrap(), "hello through portmap");

    t.network.teardown(&p.id).await.unwrap();
    let save = common::iptables_save();
    for line in save.lines() {
        assert!(
            !line.contains(&p.id) && !line.contains("18742") && !line.contains(&t.subnet_prefix()),
            "rule left after DEL: {line}"
        );
    }
    assert!(t.allocated_ips().is_empty());
    drop(t);
    drop(chains);
    let save = common::iptables_save();
    assert!(
        !save.contains("CNI-HOSTPORT-") || save.contains("-j CNI-DN-"),
        "{save}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_plugin_surfaces_its_error_and_add_is_undone() {
    let _g = lock().await;
    let t = TestNet::new(3, r#", {"type": "crius-fail"}"#);
    // Fails ADD with a CNI error; fails DEL too while a marker file exists.
    let marker = t.path("fail-del");
    t.script_plugin(
        "crius-fail",
        &format!(
            r#"cat >/dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{{"cniVersion":"1.0.0","code":101,"msg":"crius test failure","details":"asked to fail"}}'
  exit 1
fi
if [ "$CNI_COMMAND" = DEL ] && [ -e {marker} ]; then
  echo '{{"cniVersion":"1.0.0","code":102,"msg":"del refused"}}'
  exit 1
fi
exit 0"#,
            marker = marker.display()
        ),
    );
    let p = t.pod("f");
    let err = t.network.setup(&p).await.unwrap_err();
    match &err {
        Error::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
        } => {
            assert_eq!(plugin, "crius-fail");
            assert_eq!(*command, "ADD");
            assert_eq!(*code, 101);
            assert_eq!(msg, "crius test failure");
            assert_eq!(details, "asked to fail");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(err.to_string().contains("crius test failure"), "{err}");
    // setup undid the half-done ADD: the bridge plugin's address is released again.
    assert!(t.allocated_ips().is_empty(), "{:?}", t.allocated_ips());
    assert!(t.cache_files().is_empty(), "{:?}", t.cache_files());

    // Now the undo's DEL fails too: the attachment must not be forgotten, but the failing
    // plugin's DEL does not keep the bridge's from releasing the address.
    std::fs::write(&marker, b"").unwrap();
    let err = t.network.setup(&p).await.unwrap_err();
    assert_eq!(err.cni_code(), Some(101));
    assert!(t.allocated_ips().is_empty(), "{:?}", t.allocated_ips());
    let err = t.network.teardown(&p.id).await.unwrap_err();
    assert_eq!(err.cni_code(), Some(102), "{err}");
    assert!(!t.cache_files().is_empty());
    // Once DEL works again, teardown finishes and releases the address.
    std::fs::remove_file(&marker).unwrap();
    t.network.teardown(&p.id).await.unwrap();
    assert!(t.allocated_ips().is_empty());
    assert!(t.cache_files().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_works_after_restart_with_netns_gone_and_config_removed() {
    let _g = lock().await;
    let mut t = TestNet::new(4, "");
    let p = t.pod("r");
    let r = t.network.setup(&p).await.unwrap();
    assert_eq!(t.allocated_ips().len(), 1);
    let host_veth = r
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_none() && i.name != t.bridge)
        .unwrap()
        .name
        .clone();

    // The daemon restarts, the netns is gone, and the admin removed the network config.
    t.restart();
    netns::remove(&p.netns_path).unwrap();
    std::fs::remove_file(t.path("net.d/10-crius-test.conflist")).unwrap();
    let err = t.network.status().unwrap_err();
    assert!(err.is_no_config());
    assert_eq!(
        err.to_string(),
        format!("no network config found in {}", t.path("net.d").display())
    );

    // The recorded result is still known, and DEL still releases everything.
    assert_eq!(t.network.cached_result(&p.id).unwrap(), Some(r));
    t.network.teardown(&p.id).await.unwrap();
    assert!(t.allocated_ips().is_empty());
    assert!(t.cache_files().is_empty());
    // The veth died with its namespace; nothing is left on the host side.
    for _ in 0..50 {
        if !common::link_exists(&host_veth) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!common::link_exists(&host_veth));

    // Installing a config again is picked up without a restart.
    std::fs::write(
        t.path("net.d/20-again.conflist"),
        r#"{"cniVersion":"1.0.0","name":"crius-again","plugins":[{"type":"loopback"}]}"#,
    )
    .unwrap();
    assert_eq!(t.network.status().unwrap().network, "crius-again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_tears_down_stale_pods_only() {
    let _g = lock().await;
    let t = TestNet::new(5, "");
    let keep = t.pod("keep");
    let stale = t.pod("stale");
    t.network.setup(&keep).await.unwrap();
    t.network.setup(&stale).await.unwrap();
    assert_eq!(t.allocated_ips().len(), 2);
    let valid = [keep.id.clone()].into_iter().collect();
    t.network.gc(&valid).await.unwrap();
    assert_eq!(t.allocated_ips().len(), 1);
    assert!(t.network.cached_result(&keep.id).unwrap().is_some());
    assert!(t.network.cached_result(&stale.id).unwrap().is_none());
    t.network.teardown(&keep.id).await.unwrap();
    assert!(t.allocated_ips().is_empty());
}

#[test]
fn netns_create_pins_and_remove_unpins() {
    let dir = tempfile::Builder::new()
        .prefix("crius-cni-netns-")
        .tempdir()
        .unwrap();
    let path = netns::create(dir.path(), "crius-ns").unwrap();
    assert!(netns::is_netns(&path));
    // A second create of the same id fails and leaves the first intact.
    assert!(netns::create(dir.path(), "crius-ns").is_err());
    assert!(netns::is_netns(&path));
    // It is a different namespace from ours, and our thread did not move.
    let ours = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let theirs = netns::run_in(&path, || {
        std::fs::read_link("/proc/thread-self/ns/net").unwrap()
    })
    .unwrap();
    assert_ne!(ours, theirs);
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        ours
    );
    // Only lo exists in it (asked from a process inside; /sys shows the mounter's view).
    let out = common::block_on(async {
        netns::command(&path, "ip")
            .unwrap()
            .args(["-o", "link"])
            .output()
            .await
            .unwrap()
    });
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains(": lo:") && text.contains(",UP,"), "{text}");

    netns::remove(&path).unwrap();
    assert!(!path.exists());
    assert!(netns::run_in(&path, || ()).is_err());
    assert!(netns::command(Path::new(&path), "true").is_err());
    netns::remove(&path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_annotations_shape_the_pod() {
    let _g = lock().await;
    let t = TestNet::new(
        6,
        r#", {"type": "bandwidth", "capabilities": {"bandwidth": true}}"#,
    );
    let mut p = t.pod("bw");
    p.annotations.insert(
        crius_cni::capabilities::INGRESS_BANDWIDTH_ANNOTATION.into(),
        "1M".into(),
    );
    p.annotations.insert(
        crius_cni::capabilities::EGRESS_BANDWIDTH_ANNOTATION.into(),
        "2M".into(),
    );
    p.bandwidth = crius_cni::Bandwidth::from_annotations(&p.annotations).unwrap();
    let links_before = common::links();
    let r = t.network.setup(&p).await.unwrap();
    let host_veth = r
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_none() && i.name != t.bridge)
        .unwrap()
        .name
        .clone();
    // Ingress to the pod is shaped on the host side of its veth with a token bucket at 1 Mbit.
    let qdisc = common::run("tc", &["qdisc", "show", "dev", &host_veth]);
    assert!(qdisc.contains("tbf") && qdisc.contains("1Mbit"), "{qdisc}");
    // Egress goes through an ifb device the plugin made (named bwp<hash>).
    let added: Vec<String> = common::links()
        .into_iter()
        .filter(|l| !links_before.contains(l) && l.starts_with("bwp"))
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    let qdisc = common::run("tc", &["qdisc", "show", "dev", &added[0]]);
    assert!(qdisc.contains("tbf") && qdisc.contains("2Mbit"), "{qdisc}");

    t.network.teardown(&p.id).await.unwrap();
    assert!(!common::link_exists(&added[0]), "ifb {} left", added[0]);
    assert!(!common::link_exists(&host_veth));
    assert!(t.allocated_ips().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_lists_ipv4_first() {
    let _g = lock().await;
    let t = TestNet::new(7, "");
    // Give host-local a second range: an IPv6 ULA subnet ("crius" in hex), private to this test's bridge.
    let conf = t.path("net.d/10-crius-test.conflist");
    let text = std::fs::read_to_string(&conf).unwrap().replace(
        r#""ranges": [[{"subnet": "10.88.207.0/24"}]]"#,
        r#""ranges": [[{"subnet": "fd63:7269:7573:207::/64"}], [{"subnet": "10.88.207.0/24"}]]"#,
    );
    assert!(text.contains("fd63:7269:7573:207::/64"));
    std::fs::write(&conf, text).unwrap();
    let p = t.pod("ds");
    let r = t.network.setup(&p).await.unwrap();
    let ips = r.pod_ips();
    assert_eq!(ips.len(), 2, "{r:?}");
    assert!(ips[0].is_ipv4() && ips[1].is_ipv6(), "{ips:?}");
    assert!(
        ips[1].to_string().starts_with("fd63:7269:7573:207:"),
        "{ips:?}"
    );
    assert!(ping(ips[0]));
    assert_eq!(t.allocated_ips().len(), 2);
    t.network.teardown(&p.id).await.unwrap();
    assert!(t.allocated_ips().is_empty());
}
