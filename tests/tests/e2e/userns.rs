//! User-namespaced pods (`hostUsers: false`) and image volumes end to end: what a container in a
//! pod with its own user namespace sees of itself, its rootfs and its volumes, what the host
//! sees of it, and read-only image volumes. Real crius, registry, CNI and containers. Run as
//! root.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;

use crate::common;
use crate::common::{assert_status, cgroup_v2, pod_sc, sc, Env, HostCgroup};
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use crius_tests::streaming::{exit_code_of, Client};
use crius_tests::TestDir;
use tonic::Code;

/// Host id of the pod's root; the pod maps 65536 ids from here.
const HOST_BASE: u32 = 300_000;

fn mapping(host: u32) -> Vec<IdMapping> {
    vec![IdMapping {
        host_id: host,
        container_id: 0,
        length: 65536,
    }]
}

fn userns(host: u32) -> UserNamespace {
    UserNamespace {
        mode: NamespaceMode::Pod as i32,
        uids: mapping(host),
        gids: mapping(host),
    }
}

fn namespace_options(config: &mut PodSandboxConfig) -> &mut NamespaceOption {
    pod_sc(config)
        .namespace_options
        .get_or_insert_with(Default::default)
}

fn container_userns(config: &mut ContainerConfig, ns: UserNamespace) {
    sc(config)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(ns);
}

/// ExecSync `sh -c script`, asserting success; returns stdout trimmed.
async fn sh(env: &Env, id: &str, script: &str) -> String {
    let out = env.exec(id, &["sh", "-c", script], 10).await.unwrap();
    assert_eq!(
        out.exit_code,
        0,
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The first (real) uid of `/proc/<pid>/status`.
fn host_uid(pid: i32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn user_namespaced_pod() {
    let mut env = Env::with_image().await;

    // advertised for the default handler
    let status = env.runtime_status().await;
    let features = status.runtime_handlers[0].features.unwrap();
    assert!(features.user_namespaces, "{status:?}");

    // bad requests: root unmapped, node namespaces, no mappings
    for (what, edit) in [
        (
            "userns_options must map container uid and gid 0",
            Box::new(|c: &mut PodSandboxConfig| {
                let mut u = userns(HOST_BASE);
                u.uids[0].container_id = 1;
                namespace_options(c).userns_options = Some(u);
            }) as Box<dyn Fn(&mut PodSandboxConfig)>,
        ),
        (
            "network NODE",
            Box::new(|c: &mut PodSandboxConfig| {
                namespace_options(c).network = NamespaceMode::Node as i32;
                namespace_options(c).userns_options = Some(userns(HOST_BASE));
            }),
        ),
        (
            "needs uid and gid mappings",
            Box::new(|c: &mut PodSandboxConfig| {
                namespace_options(c).userns_options = Some(UserNamespace {
                    mode: NamespaceMode::Pod as i32,
                    ..Default::default()
                });
            }),
        ),
    ] {
        let mut config = env.pod_config("userns-bad", false);
        edit(&mut config);
        let got = env
            .rt()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await;
        assert_status(got, Code::InvalidArgument, &[what]);
    }

    let mut config = env.pod_config("userns", false);
    namespace_options(&mut config).userns_options = Some(userns(HOST_BASE));
    let pod = env.run_pod(config.clone()).await;
    let pin = env.crius.state().join("userns").join(&pod);
    assert!(pin.exists(), "user namespace pin {}", pin.display());

    // a volume owned by host root, seen through the pod's mapping, and one seen without
    let vol = TestDir::new("userns-vol").unwrap();
    std::fs::write(vol.join("owned-by-host-root"), "x").unwrap();
    let mut c = env.container_config("app", &["sleep", "3600"]);
    container_userns(&mut c, userns(HOST_BASE));
    c.mounts = vec![
        Mount {
            container_path: "/vol".into(),
            host_path: vol.path().display().to_string(),
            uid_mappings: mapping(HOST_BASE),
            gid_mappings: mapping(HOST_BASE),
            ..Default::default()
        },
        Mount {
            container_path: "/plain".into(),
            host_path: vol.path().display().to_string(),
            ..Default::default()
        },
    ];
    let id = env.create_start(&pod, &config, c).await;

    // root inside, the mapped id outside
    assert_eq!(sh(&env, &id, "id -u; id -g").await, "0\n0");
    assert_eq!(
        sh(&env, &id, "cat /proc/self/uid_map")
            .await
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["0", &HOST_BASE.to_string(), "65536"]
    );
    assert_eq!(host_uid(env.pid(&id).await), HOST_BASE);

    // the image's files are root's, and what root writes is the mapped id on the host
    assert_eq!(
        sh(&env, &id, "stat -c %u:%g /bin/busybox /etc").await,
        "0:0\n0:0"
    );
    assert_eq!(
        sh(&env, &id, "echo hi > /made && stat -c %u /made").await,
        "0"
    );
    let upper = env.crius.root().join("containers").join(&id).join("upper");
    let upper_uid = |rel: &str| std::fs::metadata(upper.join(rel)).unwrap().uid();
    assert_eq!(upper_uid("made"), HOST_BASE);
    // a copied-up file keeps root's ownership
    assert_eq!(
        sh(&env, &id, "echo x >> /etc/passwd && stat -c %u /etc/passwd").await,
        "0"
    );
    assert_eq!(upper_uid("etc/passwd"), HOST_BASE);

    // the idmapped volume: host root's file is root's, root's new file is host root's
    assert_eq!(
        sh(&env, &id, "stat -c %u /vol/owned-by-host-root").await,
        "0"
    );
    sh(&env, &id, "echo y > /vol/from-pod").await;
    assert_eq!(std::fs::metadata(vol.join("from-pod")).unwrap().uid(), 0);
    // without the mapping the same files belong to nobody
    assert_eq!(
        sh(&env, &id, "stat -c %u /plain/owned-by-host-root").await,
        "65534"
    );
    // the pod's files are root's; sysfs and the pod network are its own
    assert_eq!(
        sh(&env, &id, "stat -c %u /etc/hosts /etc/resolv.conf").await,
        "0\n0"
    );
    assert_eq!(
        sh(&env, &id, "cat /sys/class/net/lo/operstate").await,
        "unknown"
    );
    let ip = env.pod_status(&pod).await.network.unwrap().ip;
    assert!(ip.starts_with(&env.subnet_prefix()), "pod ip {ip}");
    assert!(sh(&env, &id, "ip addr show eth0").await.contains(&ip));

    // a container must use the pod's mapping
    let mut other = env.container_config("other-mapping", &["true"]);
    container_userns(&mut other, userns(HOST_BASE + 65536));
    let got = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(other),
            sandbox_config: Some(config.clone()),
        })
        .await;
    assert_status(got, Code::InvalidArgument, &["userns_options"]);

    // a crius killed and restarted finds the pod and its container as they were
    env.crius.kill9().unwrap();
    env.crius.restart().await.unwrap();
    assert_eq!(
        sh(&env, &id, "id -u; stat -c %u /vol/from-pod").await,
        "0\n0"
    );
    let again = env
        .create_start(
            &pod,
            &config,
            env.container_config("after-restart", &["sleep", "3600"]),
        )
        .await;
    assert_eq!(
        sh(&env, &again, "id -u; stat -c %u /bin/busybox").await,
        "0\n0"
    );
    assert_eq!(host_uid(env.pid(&again).await), HOST_BASE);

    env.stop(&id, 0).await;
    env.remove(&id).await;
    assert!(vol.join("owned-by-host-root").exists(), "volume files kept");
    env.stop_pod(&pod).await;
    assert!(!pin.exists(), "user namespace pin left after stop");
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn image_volumes() {
    let mut env = Env::with_image().await;
    let multi = images::push(&env.registry, TestImage::MultiLayer).unwrap();
    env.pull(&multi.reference).await;
    let config = env.pod_config("imgvol", false);
    let pod = env.run_pod(config.clone()).await;

    let image_mount = |path: &str, image: &str, sub: &str| Mount {
        container_path: path.into(),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        image_sub_path: sub.into(),
        readonly: true,
        ..Default::default()
    };
    let mut c = env.container_config("reader", &["sleep", "3600"]);
    c.mounts = vec![
        // one layer: a read-only bind; several: a read-only overlay
        image_mount("/single", &env.image, ""),
        image_mount("/multi", &multi.reference, ""),
        image_mount("/etc-only", &env.image, "etc"),
    ];
    let id = env.create_start(&pod, &config, c).await;
    assert_eq!(
        sh(&env, &id, "test -x /single/bin/busybox && echo ok").await,
        "ok"
    );
    // ContainerStatus names each image volume's image by its digest (ImageSpec.image_ref).
    let refs: Vec<(String, String)> = env
        .status(&id)
        .await
        .mounts
        .iter()
        .map(|m| {
            (
                m.container_path.clone(),
                m.image.as_ref().unwrap().image_ref.clone(),
            )
        })
        .collect();
    assert_eq!(
        refs,
        [
            ("/single".to_string(), env.image_ref.clone()),
            ("/multi".to_string(), multi.config_digest.clone()),
            ("/etc-only".to_string(), env.image_ref.clone()),
        ]
    );
    assert_eq!(
        sh(&env, &id, "test -x /multi/bin/busybox && echo ok").await,
        "ok"
    );
    assert!(sh(&env, &id, "cat /etc-only/passwd")
        .await
        .contains("root:"));
    for dir in ["/single", "/multi", "/etc-only"] {
        let out = env
            .exec(&id, &["sh", "-c", &format!("touch {dir}/x")], 10)
            .await
            .unwrap();
        assert_ne!(out.exit_code, 0, "{dir} is writable");
    }

    // bad requests
    for (mount, code, what) in [
        (
            image_mount("/m", "127.0.0.1:1/crius-test/absent:latest", ""),
            Code::NotFound,
            "absent",
        ),
        (
            image_mount("/m", &env.image, "../.."),
            Code::InvalidArgument,
            "image_sub_path",
        ),
        (
            image_mount("/m", &env.image, "no/such/dir"),
            Code::InvalidArgument,
            "does not exist",
        ),
        (
            Mount {
                readonly: false,
                ..image_mount("/m", &env.image, "")
            },
            Code::InvalidArgument,
            "must be readonly",
        ),
    ] {
        let mut c = env.container_config("bad-volume", &["true"]);
        c.mounts = vec![mount];
        let got = env
            .rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(c),
                sandbox_config: Some(config.clone()),
            })
            .await;
        assert_status(got, code, &[what]);
    }

    // each image volume holds a lease of its own, dropped with the container
    let leases = env.crius.root().join("leases");
    let volume_leases = || {
        std::fs::read_dir(&leases)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().contains(".vol"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(volume_leases(), 3);

    // the container's lease keeps the volume's layers after RemoveImage
    env.crius
        .image()
        .remove_image(RemoveImageRequest {
            image: Some(ImageSpec {
                image: multi.reference.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(
        sh(&env, &id, "test -x /multi/bin/busybox && echo ok").await,
        "ok"
    );

    env.stop(&id, 0).await;
    env.remove(&id).await;
    assert_eq!(volume_leases(), 0, "image volume leases left");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// In a user-namespaced pod: an image volume (`Mount.image`) is the image's files owned by the
/// pod's root, and an image-declared volume keeps the image's owners as the pod sees them.
#[tokio::test]
async fn volumes_from_images_in_a_user_namespaced_pod() {
    let mut env = Env::with_image().await;
    let declared = images::push(&env.registry, TestImage::Volumes).unwrap();
    env.pull(&declared.reference).await;
    let mut config = env.pod_config("userns-imgvol", false);
    namespace_options(&mut config).userns_options = Some(userns(HOST_BASE));
    let pod = env.run_pod(config.clone()).await;

    let mut c = env.container_config("app", &["sleep", "3600"]);
    c.image.as_mut().unwrap().image = declared.reference.clone();
    container_userns(&mut c, userns(HOST_BASE));
    c.mounts = vec![Mount {
        container_path: "/busybox".into(),
        image: Some(ImageSpec {
            image: env.image.clone(),
            ..Default::default()
        }),
        readonly: true,
        ..Default::default()
    }];
    let id = env.create_start(&pod, &config, c).await;
    assert_eq!(
        sh(&env, &id, "stat -c %u:%g /busybox/bin/busybox").await,
        "0:0"
    );
    assert_eq!(
        sh(&env, &id, "stat -c '%u:%g %a' /data /empty").await,
        format!(
            "{}:{} {:o}\n0:0 755",
            images::USER_UID,
            images::USER_GID,
            images::volumes::DATA_MODE
        )
    );
    assert_eq!(
        sh(&env, &id, "echo mine > /data/new && stat -c %u /data/new").await,
        "0"
    );

    // A volume on a filesystem that cannot be idmapped (ramfs) is refused, naming it.
    let ramfs = RamfsDir::new();
    let mut c = env.container_config("on-ramfs", &["true"]);
    container_userns(&mut c, userns(HOST_BASE));
    c.mounts = vec![Mount {
        container_path: "/ram".into(),
        host_path: ramfs.dir.path().display().to_string(),
        uid_mappings: mapping(HOST_BASE),
        gid_mappings: mapping(HOST_BASE),
        ..Default::default()
    }];
    let got = env
        .rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(c),
            sandbox_config: Some(config.clone()),
        })
        .await;
    let path = ramfs.dir.path().display().to_string();
    assert_status(
        got,
        Code::FailedPrecondition,
        &["mount /ram", &path, "idmapped"],
    );
    drop(ramfs);

    env.stop(&id, 0).await;
    env.remove(&id).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// A ramfs mounted on a test directory (ramfs supports no idmapped mounts), unmounted on drop.
struct RamfsDir {
    dir: TestDir,
}

impl RamfsDir {
    fn new() -> RamfsDir {
        let dir = TestDir::new("userns-ramfs").unwrap();
        nix::mount::mount(
            Some("ramfs"),
            dir.path(),
            Some("ramfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        RamfsDir { dir }
    }
}

impl Drop for RamfsDir {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A user-namespaced pod's RunPodSandbox answers once the pause runs crius-pause. Before its
/// exec the pause is not dumpable, and the kernel then refuses its namespace files to every
/// process of the pod's user namespace: a container created in between, whose init opens them
/// after joining that namespace, failed with EACCES. Here the pause gets almost no CPU (its
/// pod's cgroup parent has a tenth of one, and a busy loop takes most of that), so without the
/// wait it is nearly always still before its exec when the answer comes.
#[tokio::test]
async fn a_user_namespaced_pod_answers_once_its_pause_runs_its_program() {
    let mut env = Env::with_image().await;
    let parent = HostCgroup::new("crius-test-slow-pause");
    let cpu_dir = parent
        .dirs
        .iter()
        .find(|d| d.join("cpu.cfs_quota_us").exists() || d.join("cpu.max").exists())
        .expect("a cpu controller")
        .clone();
    if cgroup_v2() {
        std::fs::write(cpu_dir.join("cpu.max"), "1000 10000").unwrap();
    } else {
        std::fs::write(cpu_dir.join("cpu.cfs_period_us"), "10000").unwrap();
        std::fs::write(cpu_dir.join("cpu.cfs_quota_us"), "1000").unwrap();
    }
    // Killed with the cgroup when `parent` is dropped, even if an assertion fails first.
    let hog = std::process::Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    std::fs::write(cpu_dir.join("cgroup.procs"), hog.id().to_string()).unwrap();

    let pause_binary =
        std::fs::metadata(env.crius.state().join("bin").join("crius-pause")).unwrap();
    for i in 0..3 {
        let mut config = env.pod_config(&format!("userns-slow-pause-{i}"), false);
        config.linux.as_mut().unwrap().cgroup_parent = parent.name.clone();
        namespace_options(&mut config).userns_options = Some(userns(HOST_BASE));
        let pod = env.run_pod(config.clone()).await;
        let pause = env.pause_pid(&pod).await;
        let exe = std::fs::metadata(format!("/proc/{pause}/exe")).unwrap();
        assert_eq!(
            (exe.dev(), exe.ino()),
            (pause_binary.dev(), pause_binary.ino()),
            "pod {i}: the pause has not run crius-pause yet"
        );
        let mut c = env.container_config("app", &["true"]);
        container_userns(&mut c, userns(HOST_BASE));
        let id = env.create(&pod, &config, c).await;
        env.remove(&id).await;
        env.stop_pod(&pod).await;
        env.remove_pod(&pod).await;
    }
    drop(parent);
    drop(hog);
    env.assert_no_leaks().await;
}

/// A user-namespaced pod under the crun handler, with an exec and a streaming exec that wants
/// no output: crun 1.8 chowns the stdio it creates such a container with to the container's
/// root, so crius hands it pipes, never the node's /dev/null, whose owner stays root (crius's
/// start-up trial of crun is checked the same way).
#[tokio::test]
async fn crun_leaves_the_nodes_dev_null_alone() {
    let mut env = Env::with_image().await;
    common::assert_dev_null_is_roots();
    let status = env.runtime_status().await;
    let crun_userns = status
        .runtime_handlers
        .iter()
        .any(|h| h.name == "crun" && h.features.is_some_and(|f| f.user_namespaces));
    if !crun_userns {
        eprintln!("skipped the pod part: no crun handler with user namespaces here");
        return;
    }
    let mut config = env.pod_config("crun-userns", false);
    namespace_options(&mut config).userns_options = Some(userns(HOST_BASE));
    let pod = env.run_pod_with_handler(config.clone(), "crun").await;
    let mut c = env.container_config("app", &["sleep", "60"]);
    container_userns(&mut c, userns(HOST_BASE));
    let id = env.create_start(&pod, &config, c).await;
    assert_eq!(sh(&env, &id, "id -u").await, "0");
    common::assert_dev_null_is_roots();
    // A streaming exec that wants neither output (stdin only: one of the three must be set)
    // gets the node's /dev/null for both: crun's exec, unlike its create, leaves its owner.
    let url = env
        .exec_url(ExecRequest {
            container_id: id.clone(),
            cmd: [
                "sh",
                "-c",
                "head -c 300000 /dev/zero; echo gone >&2; exit 4",
            ]
            .map(String::from)
            .to_vec(),
            stdin: true,
            ..Default::default()
        })
        .await;
    let mut client = Client::connect(&url, &["v4.channel.k8s.io"]).await.unwrap();
    let s = client
        .open_command(true, false, false, false)
        .await
        .unwrap();
    let status = client
        .wait_status(&s, std::time::Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(exit_code_of(&status), Some(4), "{status}");
    common::assert_dev_null_is_roots();
    env.stop(&id, 0).await;
    env.remove_all_and_check(&[&id], &pod).await;
}
