//! Whole-spec tests: what a container or the pause process ends up with.

use super::*;
use crius_api::v1::{security_profile::ProfileType, IdMapping};
use crius_api::v1::{
    Capability as CriCapability, ContainerMetadata, Device, ImageSpec, Int64Value, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, LinuxPodSandboxConfig, Mount as CriMount,
    PodSandboxMetadata, SecurityProfile, UserNamespace,
};
use oci_spec::runtime::{Capability, LinuxSeccompAction};
use serde_json::json;

/// The node the specs are built for: cgroup v2, every capability held, no LSM, `node-1`.
static HOST: std::sync::LazyLock<HostFacts> = std::sync::LazyLock::new(HostFacts::for_tests);

struct Fixture {
    rootfs: tempfile::TempDir,
    image: serde_json::Value,
}

fn fixture() -> Fixture {
    let rootfs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(rootfs.path().join("etc")).unwrap();
    std::fs::write(
        rootfs.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nweb:x:33:33::/var/www:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        rootfs.path().join("etc/group"),
        "root:x:0:\nweb:x:33:\nlog:x:4:web\n",
    )
    .unwrap();
    Fixture {
        rootfs,
        image: json!({"config": {
            "Env": ["PATH=/usr/bin:/bin", "LANG=C"],
            "Entrypoint": ["/docker-entrypoint.sh"],
            "Cmd": ["nginx", "-g", "daemon off;"],
            "WorkingDir": "/srv",
            "User": "web",
            "StopSignal": "SIGQUIT"
        }}),
    }
}

fn pod(ns: NamespaceOption, privileged: bool) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web-pod".into(),
        log_directory: "/var/log/pods/web".into(),
        annotations: [("pod-note".to_string(), "1".to_string())].into(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(ns),
                privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container(sc: LinuxContainerSecurityContext) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "nginx".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: "docker.io/library/nginx:latest".into(),
            ..Default::default()
        }),
        envs: vec![KeyValue {
            key: "LANG".into(),
            value: b"en_US.UTF-8".to_vec(),
        }],
        annotations: [("note".to_string(), "x".to_string())].into(),
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                cpu_shares: 256,
                memory_limit_in_bytes: 32 << 20,
                oom_score_adj: -100,
                ..Default::default()
            }),
            security_context: Some(sc),
        }),
        ..Default::default()
    }
}

fn input<'a>(
    f: &'a Fixture,
    config: &'a ContainerConfig,
    sandbox: &'a PodSandboxConfig,
) -> ContainerSpecInput<'a> {
    ContainerSpecInput {
        container_id: "c1",
        sandbox_id: "s1",
        config,
        sandbox_config: sandbox,
        image_config: &f.image,
        image_name: "",
        rootfs: f.rootfs.path(),
        sandbox_pid: Some(4242),
        target_pid: None,
        netns_path: Some(Path::new("/run/crius/netns/crius-s1")),
        cgroups_path: "/crius/s1/c1",
        hostname: "web-pod",
        resolv_conf: Some(Path::new("/run/crius/s1/resolv.conf")),
        hosts: Some(Path::new("/run/crius/s1/hosts")),
        hostname_file: Some(Path::new("/run/crius/s1/hostname")),
        shm_dir: Some(Path::new("/run/crius/s1/shm")),
        host_devices_for_privileged: true,
        builtin: true,
        host: &HOST,
    }
}

fn ns_of(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<PathBuf>)> {
    spec.linux()
        .as_ref()
        .unwrap()
        .namespaces()
        .clone()
        .unwrap()
        .iter()
        .map(|n| (n.typ(), n.path().clone()))
        .collect()
}

fn ns_path(spec: &Spec, typ: LinuxNamespaceType) -> Option<Option<PathBuf>> {
    ns_of(spec)
        .into_iter()
        .find(|(t, _)| *t == typ)
        .map(|(_, p)| p)
}

#[test]
fn container_spec_merges_image_and_cri() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let config = container(LinuxContainerSecurityContext::default());
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    let p = spec.process().as_ref().unwrap();
    assert_eq!(
        p.args().clone().unwrap(),
        ["/docker-entrypoint.sh", "nginx", "-g", "daemon off;"]
    );
    assert_eq!(
        p.env().clone().unwrap(),
        ["PATH=/usr/bin:/bin", "HOSTNAME=web-pod", "LANG=en_US.UTF-8"]
    );
    assert_eq!(p.cwd(), Path::new("/srv"));
    assert_eq!((p.user().uid(), p.user().gid()), (33, 33));
    assert_eq!(p.user().additional_gids().clone().unwrap(), [33, 4]);
    assert_eq!(p.oom_score_adj(), Some(-100));
    assert_eq!(p.terminal(), Some(false));
    assert_eq!(
        p.no_new_privileges(),
        None,
        "libcontainer reads Some(false) as set"
    );
    assert!(p.rlimits().is_none());

    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/crius/s1/c1"))
    );
    let res = linux.resources().as_ref().unwrap();
    assert_eq!(res.cpu().as_ref().unwrap().shares(), Some(256));
    assert_eq!(res.memory().as_ref().unwrap().limit(), Some(32 << 20));
    assert!(!res.devices().as_ref().unwrap()[0].allow());
    assert_eq!(linux.masked_paths().as_ref().unwrap().len(), 11);
    let readonly = linux.readonly_paths().clone().unwrap();
    assert_eq!(readonly[..5], security::DEFAULT_READONLY_PATHS);
    assert!(readonly.contains(&"/sys/fs/cgroup/memory".to_string()));
    // unset seccomp is unconfined, as with kubelet
    assert!(linux.seccomp().is_none());
    assert!(spec.hostname().is_none());
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(false));

    let notes = spec.annotations().as_ref().unwrap();
    assert_eq!(notes[annotations::CONTAINER_TYPE], "container");
    assert_eq!(notes[annotations::SANDBOX_ID], "s1");
    assert_eq!(notes[annotations::SANDBOX_NAME], "web");
    assert_eq!(notes[annotations::SANDBOX_NAMESPACE], "default");
    assert_eq!(notes[annotations::SANDBOX_UID], "uid-1");
    assert_eq!(notes[annotations::CONTAINER_NAME], "nginx");
    assert_eq!(
        notes[annotations::IMAGE_NAME],
        "docker.io/library/nginx:latest"
    );
    assert_eq!(notes["note"], "x");

    // serializes to a config.json libcontainer reads back
    let text = serde_json::to_string(&spec).unwrap();
    let back: Spec = serde_json::from_str(&text).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn pod_files_follow_readonly_rootfs() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let config = container(LinuxContainerSecurityContext {
        readonly_rootfs: true,
        ..Default::default()
    });
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    let mounts = spec.mounts().clone().unwrap();
    let find = |d: &str| {
        mounts
            .iter()
            .find(|m| m.destination() == Path::new(d))
            .unwrap()
    };
    for d in ["/etc/hosts", "/etc/resolv.conf", "/etc/hostname"] {
        assert!(
            find(d)
                .options()
                .clone()
                .unwrap()
                .contains(&"ro".to_string()),
            "{d}"
        );
    }
    assert!(find("/dev/shm")
        .options()
        .clone()
        .unwrap()
        .contains(&"rw".to_string()));
    assert_eq!(
        find("/dev/shm").source().as_deref(),
        Some(Path::new("/run/crius/s1/shm"))
    );
}

#[test]
fn namespaces_per_mode() {
    let f = fixture();
    let pid_pod = container(LinuxContainerSecurityContext::default());
    let sandbox = pod(NamespaceOption::default(), false);
    let spec = container_spec(&input(&f, &pid_pod, &sandbox)).unwrap();
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Network),
        Some(Some(PathBuf::from("/run/crius/netns/crius-s1")))
    );
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Ipc),
        Some(Some(PathBuf::from("/proc/4242/ns/ipc")))
    );
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Uts),
        Some(Some(PathBuf::from("/proc/4242/ns/uts")))
    );
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Pid),
        Some(Some(PathBuf::from("/proc/4242/ns/pid")))
    );
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Mount), Some(None));
    assert_eq!(ns_path(&spec, LinuxNamespaceType::User), None);

    let with = |ns: NamespaceOption| {
        container(LinuxContainerSecurityContext {
            namespace_options: Some(ns),
            ..Default::default()
        })
    };
    let own_pid = with(NamespaceOption {
        pid: NamespaceMode::Container as i32,
        ..Default::default()
    });
    let spec = container_spec(&input(&f, &own_pid, &sandbox)).unwrap();
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Pid), Some(None));

    let host = NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Node as i32,
        ipc: NamespaceMode::Node as i32,
        ..Default::default()
    };
    let host_pod = pod(host.clone(), false);
    let host_ctr = with(host);
    let mut i = input(&f, &host_ctr, &host_pod);
    i.netns_path = None;
    i.sandbox_pid = None;
    let spec = container_spec(&i).unwrap();
    assert_eq!(
        ns_of(&spec),
        vec![
            (LinuxNamespaceType::Mount, None),
            (LinuxNamespaceType::Cgroup, None)
        ],
        "host network, PID and IPC join nothing (a cgroup v2 node gives a cgroup namespace)"
    );

    let target = with(NamespaceOption {
        pid: NamespaceMode::Target as i32,
        target_id: "other".into(),
        ..Default::default()
    });
    let mut i = input(&f, &target, &sandbox);
    assert!(matches!(container_spec(&i), Err(SpecError::Input(_))));
    i.target_pid = Some(777);
    let spec = container_spec(&i).unwrap();
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Pid),
        Some(Some(PathBuf::from("/proc/777/ns/pid")))
    );
}

#[test]
fn user_namespace_mappings() {
    let f = fixture();
    let ns = NamespaceOption {
        userns_options: Some(UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: vec![IdMapping {
                host_id: 100_000,
                container_id: 0,
                length: 65536,
            }],
            gids: vec![IdMapping {
                host_id: 100_000,
                container_id: 0,
                length: 65536,
            }],
        }),
        ..Default::default()
    };
    let sandbox = pod(ns.clone(), false);
    let config = container(LinuxContainerSecurityContext {
        namespace_options: Some(ns),
        ..Default::default()
    });
    let spec = build_container_spec(&input(&f, &config, &sandbox)).unwrap();
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::User),
        Some(Some(PathBuf::from("/proc/4242/ns/user")))
    );
    // joined, so the namespace's own mappings apply
    assert!(spec.linux().as_ref().unwrap().uid_mappings().is_none());

    // the pause joins the pinned namespace, which it cannot do without one
    assert!(matches!(
        build_sandbox_spec(&sandbox_input(&sandbox)),
        Err(SpecError::Input(_))
    ));
    let mut i = sandbox_input(&sandbox);
    i.userns_path = Some(Path::new("/run/crius/userns/s1"));
    let pause = sandbox_spec(&i).unwrap();
    assert_eq!(
        ns_path(&pause, LinuxNamespaceType::User),
        Some(Some(PathBuf::from("/run/crius/userns/s1")))
    );
    assert!(pause.linux().as_ref().unwrap().uid_mappings().is_none());

    // a container must use the pod's user namespace
    let plain = container(LinuxContainerSecurityContext {
        namespace_options: Some(NamespaceOption::default()),
        ..Default::default()
    });
    assert!(build_container_spec(&input(&f, &plain, &sandbox))
        .unwrap_err()
        .is_invalid_argument());
    let maps = pod_id_maps(&sandbox).unwrap().unwrap();
    assert_eq!(maps.host_root(), Some((100_000, 100_000)));
}

#[test]
fn privileged_needs_a_privileged_pod() {
    let f = fixture();
    let config = container(LinuxContainerSecurityContext {
        privileged: true,
        ..Default::default()
    });
    let sandbox = pod(NamespaceOption::default(), false);
    let err = container_spec(&input(&f, &config, &sandbox)).unwrap_err();
    assert!(err.is_invalid_argument());
    assert!(err.to_string().contains("nginx"));

    let sandbox = pod(NamespaceOption::default(), true);
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux.masked_paths().as_ref().unwrap().is_empty());
    assert!(linux.readonly_paths().as_ref().unwrap().is_empty());
    assert!(linux.seccomp().is_none());
    assert!(linux
        .devices()
        .as_ref()
        .unwrap()
        .iter()
        .any(|d| d.path() == Path::new("/dev/null")));
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert!(rules[0].allow());
    let caps = spec
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .clone()
        .unwrap();
    assert!(caps
        .effective()
        .clone()
        .unwrap()
        .contains(&Capability::SysAdmin));
    let sys = spec
        .mounts()
        .clone()
        .unwrap()
        .into_iter()
        .find(|m| m.destination() == Path::new("/sys"))
        .unwrap();
    assert!(sys.options().clone().unwrap().contains(&"rw".to_string()));
}

#[test]
fn runtime_default_seccomp_follows_capabilities() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let config = container(LinuxContainerSecurityContext {
        seccomp: Some(SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        capabilities: Some(CriCapability {
            add_capabilities: vec!["SYS_PTRACE".into()],
            ..Default::default()
        }),
        no_new_privs: true,
        ..Default::default()
    });
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    let seccomp = spec.linux().as_ref().unwrap().seccomp().clone().unwrap();
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
    let names: Vec<&String> = seccomp
        .syscalls()
        .as_ref()
        .unwrap()
        .iter()
        .flat_map(|s| s.names())
        .collect();
    assert!(names.iter().any(|n| *n == "kcmp"));
    assert!(!names.iter().any(|n| *n == "mount"));
    assert_eq!(
        spec.process().as_ref().unwrap().no_new_privileges(),
        Some(true)
    );
}

#[test]
fn localhost_seccomp_via_deprecated_path() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("deny-mkdir.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let sandbox = pod(NamespaceOption::default(), false);
    #[allow(deprecated)]
    let config = container(LinuxContainerSecurityContext {
        seccomp_profile_path: format!("localhost/{}", profile.display()),
        ..Default::default()
    });
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    let seccomp = spec.linux().as_ref().unwrap().seccomp().clone().unwrap();
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActAllow);
    assert_eq!(seccomp.syscalls().as_ref().unwrap()[0].names()[0], "mkdir");

    let missing = container(LinuxContainerSecurityContext {
        seccomp: Some(SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "/crius-no-such-profile.json".into(),
        }),
        ..Default::default()
    });
    let err = container_spec(&input(&f, &missing, &sandbox)).unwrap_err();
    assert!(err.is_invalid_argument());
    assert!(err.to_string().contains("/crius-no-such-profile.json"));
}

#[test]
fn mounts_and_devices_from_cri() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let mut config = container(LinuxContainerSecurityContext::default());
    config.mounts = vec![
        CriMount {
            container_path: "/data/cache".into(),
            host_path: "/srv/cache".into(),
            ..Default::default()
        },
        CriMount {
            container_path: "/data".into(),
            host_path: "/srv/data".into(),
            readonly: true,
            selinux_relabel: true,
            propagation: crius_api::v1::MountPropagation::PropagationBidirectional as i32,
            ..Default::default()
        },
    ];
    config.devices = vec![Device {
        container_path: "/dev/xnull".into(),
        host_path: "/dev/null".into(),
        permissions: "rwm".into(),
    }];
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    let dests: Vec<PathBuf> = spec
        .mounts()
        .clone()
        .unwrap()
        .iter()
        .map(|m| m.destination().clone())
        .collect();
    let pos = |p: &str| dests.iter().position(|d| d == Path::new(p)).unwrap();
    assert!(pos("/data") < pos("/data/cache"));
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(linux.rootfs_propagation().as_deref(), Some("shared"));
    let dev = &linux.devices().as_ref().unwrap()[0];
    assert_eq!(dev.path(), Path::new("/dev/xnull"));
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert!(rules.iter().any(|r| r.allow()
        && r.major() == Some(1)
        && r.minor() == Some(3)
        && r.access().as_deref() == Some("rwm")));
}

#[test]
fn tty_sets_terminal_and_exec_inherits_the_process() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let mut config = container(LinuxContainerSecurityContext {
        no_new_privs: true,
        ..Default::default()
    });
    config.tty = true;
    config.stdin = true;
    let spec = container_spec(&input(&f, &config, &sandbox)).unwrap();
    let p = spec.process().as_ref().unwrap();
    assert_eq!(p.terminal(), Some(true));
    assert!(p.env().clone().unwrap().contains(&"TERM=xterm".to_string()));

    let exec = exec_process(
        spec.process().clone(),
        &["ls".to_string(), "-l".to_string()],
        false,
    )
    .unwrap();
    assert_eq!(exec.args().clone().unwrap(), ["ls", "-l"]);
    assert_eq!(exec.terminal(), Some(false));
    assert_eq!(exec.env(), p.env());
    assert_eq!(exec.cwd(), p.cwd());
    assert_eq!(exec.user(), p.user());
    assert_eq!(exec.capabilities(), p.capabilities());
    assert_eq!(exec.no_new_privileges(), Some(true));
    assert!(exec_process(spec.process().clone(), &[], false)
        .unwrap_err()
        .is_invalid_argument());
}

#[test]
fn no_command_is_invalid() {
    let f = Fixture {
        image: json!({"config": {}}),
        ..fixture()
    };
    let sandbox = pod(NamespaceOption::default(), false);
    let config = container(LinuxContainerSecurityContext::default());
    let err = container_spec(&input(&f, &config, &sandbox)).unwrap_err();
    assert_eq!(err.to_string(), "no command specified");
}

fn sandbox_input(config: &PodSandboxConfig) -> SandboxSpecInput<'_> {
    SandboxSpecInput {
        sandbox_id: "s1",
        config,
        rootfs: Path::new("/run/crius/s1/rootfs"),
        pause_binary: Path::new("/usr/libexec/crius/crius-pause"),
        netns_path: Some(Path::new("/run/crius/netns/crius-s1")),
        cgroups_path: "/crius/s1/s1",
        hostname: "web-pod",
        resolv_conf: Some(Path::new("/run/crius/s1/resolv.conf")),
        hosts: None,
        hostname_file: None,
        shm_dir: Some(Path::new("/run/crius/s1/shm")),
        userns_path: None,
        builtin: true,
        host: &HOST,
    }
}

#[test]
fn sandbox_spec_runs_pause_read_only() {
    let mut config = pod(NamespaceOption::default(), false);
    if let Some(l) = config.linux.as_mut() {
        l.sysctls = [(
            "net.ipv4.ip_unprivileged_port_start".to_string(),
            "0".to_string(),
        )]
        .into();
    }
    let spec = sandbox_spec(&sandbox_input(&config)).unwrap();
    let p = spec.process().as_ref().unwrap();
    assert_eq!(p.args().clone().unwrap(), ["/pause"]);
    assert_eq!(p.oom_score_adj(), Some(SANDBOX_OOM_SCORE_ADJ));
    assert_eq!(p.no_new_privileges(), Some(true));
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    assert_eq!(spec.hostname().as_deref(), Some("web-pod"));
    let mounts = spec.mounts().clone().unwrap();
    let pause = mounts
        .iter()
        .find(|m| m.destination() == Path::new("/pause"))
        .unwrap();
    assert_eq!(
        pause.source().as_deref(),
        Some(Path::new("/usr/libexec/crius/crius-pause"))
    );
    assert!(pause.options().clone().unwrap().contains(&"ro".to_string()));
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Network),
        Some(Some(PathBuf::from("/run/crius/netns/crius-s1")))
    );
    for t in [
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Pid,
    ] {
        assert_eq!(ns_path(&spec, t), Some(None));
    }
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.sysctl().as_ref().unwrap()["net.ipv4.ip_unprivileged_port_start"],
        "0"
    );
    assert_eq!(
        linux
            .resources()
            .as_ref()
            .unwrap()
            .cpu()
            .as_ref()
            .unwrap()
            .shares(),
        Some(SANDBOX_CPU_SHARES)
    );
    let notes = spec.annotations().as_ref().unwrap();
    assert_eq!(notes[annotations::CONTAINER_TYPE], "sandbox");
    assert_eq!(
        notes[annotations::SANDBOX_LOG_DIRECTORY],
        "/var/log/pods/web"
    );
    assert_eq!(notes["pod-note"], "1");
}

#[test]
fn sandbox_on_host_network_keeps_the_host_hostname() {
    let mut config = pod(
        NamespaceOption {
            network: NamespaceMode::Node as i32,
            ..Default::default()
        },
        false,
    );
    let mut i = sandbox_input(&config);
    i.netns_path = None;
    let spec = sandbox_spec(&i).unwrap();
    assert!(spec.hostname().is_none(), "must not rename the host");
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Network), None);
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Uts), None);

    if let Some(l) = config.linux.as_mut() {
        l.sysctls = [("net.core.somaxconn".to_string(), "1024".to_string())].into();
    }
    let mut i = sandbox_input(&config);
    i.netns_path = None;
    let err = sandbox_spec(&i).unwrap_err();
    assert!(err.is_invalid_argument());
    assert!(err.to_string().contains("net.core.somaxconn"));
}

#[test]
fn sandbox_refuses_non_namespaced_sysctls_and_ignores_selinux_labels_without_selinux() {
    let mut config = pod(NamespaceOption::default(), false);
    if let Some(l) = config.linux.as_mut() {
        l.sysctls = [("kernel.foo".to_string(), "1".to_string())].into();
    }
    let err = sandbox_spec(&sandbox_input(&config)).unwrap_err();
    assert_eq!(err.to_string(), "sysctl kernel.foo is not namespaced");

    let mut config = pod(NamespaceOption::default(), false);
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.run_as_user = Some(Int64Value { value: 65535 });
        sc.selinux_options = Some(crius_api::v1::SeLinuxOption {
            r#type: "spc_t".into(),
            ..Default::default()
        });
    }
    assert!(sandbox_spec(&sandbox_input(&config)).is_ok());
    let selinux = HostFacts {
        lsm: security::Lsm {
            selinux: true,
            ..security::Lsm::default()
        },
        ..HostFacts::for_tests()
    };
    let on_selinux = SandboxSpecInput {
        host: &selinux,
        ..sandbox_input(&config)
    };
    assert!(sandbox_spec(&on_selinux).unwrap_err().is_invalid_argument());
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.selinux_options = None;
    }
    let spec = sandbox_spec(&sandbox_input(&config)).unwrap();
    assert_eq!(spec.process().as_ref().unwrap().user().uid(), 65535);
}

#[test]
fn stop_signal_from_image() {
    let f = fixture();
    let config = container(LinuxContainerSecurityContext::default());
    assert_eq!(stop_signal(&config, &f.image).unwrap(), libc::SIGQUIT);
}

#[test]
fn relative_cgroups_path_is_a_caller_error() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let config = container(LinuxContainerSecurityContext::default());
    let mut i = input(&f, &config, &sandbox);
    i.cgroups_path = "crius/x";
    let err = container_spec(&i).unwrap_err();
    assert!(!err.is_invalid_argument());
}

#[test]
fn privileged_pod_pause_is_unconfined_and_unmasked() {
    let mut config = pod(NamespaceOption::default(), true);
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.seccomp = Some(SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        });
    }
    let spec = sandbox_spec(&sandbox_input(&config)).unwrap();
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux.seccomp().is_none());
    assert!(linux.masked_paths().as_ref().unwrap().is_empty());

    let config = pod(NamespaceOption::default(), false);
    let mut config = config;
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.seccomp = Some(SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        });
    }
    let spec = sandbox_spec(&sandbox_input(&config)).unwrap();
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux.seccomp().is_some());
}

fn mount_points(spec: &Spec) -> Vec<String> {
    let mut out: Vec<String> = spec
        .mounts()
        .iter()
        .flatten()
        .map(|m| m.destination().display().to_string())
        .collect();
    out.sort();
    out
}

#[test]
fn builtin_pause_gets_proc_and_dev_only_with_the_proc_masks() {
    let config = pod(NamespaceOption::default(), false);
    let spec = sandbox_spec(&sandbox_input(&config)).unwrap();
    assert_eq!(mount_points(&spec), ["/dev", "/pause", "/proc"]);
    let linux = spec.linux().as_ref().unwrap();
    let masked = linux.masked_paths().clone().unwrap();
    let proc_masked: Vec<&str> = security::DEFAULT_MASKED_PATHS
        .into_iter()
        .filter(|p| p.starts_with("/proc/"))
        .collect();
    assert_eq!(masked, proc_masked);
    assert!(masked.contains(&"/proc/kcore".to_string()));
    assert_eq!(
        linux.readonly_paths().clone().unwrap(),
        security::DEFAULT_READONLY_PATHS
    );

    // An OCI handler's runtime gets the sandbox mounts containerd gives.
    let mut i = sandbox_input(&config);
    i.builtin = false;
    let spec = sandbox_spec(&i).unwrap();
    let points = mount_points(&spec);
    for want in [
        "/sys",
        "/sys/fs/cgroup",
        "/dev/shm",
        "/etc/resolv.conf",
        "/pause",
    ] {
        assert!(points.iter().any(|p| p == want), "{want} in {points:?}");
    }
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux
        .masked_paths()
        .as_ref()
        .unwrap()
        .contains(&"/sys/firmware".to_string()));
    assert!(linux
        .readonly_paths()
        .as_ref()
        .unwrap()
        .contains(&"/sys/fs/cgroup/memory".to_string()));
}

#[test]
fn user_namespace_with_node_namespaces_is_refused() {
    let userns = Some(UserNamespace {
        mode: NamespaceMode::Pod as i32,
        uids: vec![IdMapping {
            host_id: 200_000,
            container_id: 0,
            length: 65536,
        }],
        gids: vec![IdMapping {
            host_id: 200_000,
            container_id: 0,
            length: 65536,
        }],
    });
    for (field, ns) in [
        (
            "network",
            NamespaceOption {
                network: NamespaceMode::Node as i32,
                userns_options: userns.clone(),
                ..Default::default()
            },
        ),
        (
            "pid",
            NamespaceOption {
                pid: NamespaceMode::Node as i32,
                userns_options: userns.clone(),
                ..Default::default()
            },
        ),
        (
            "ipc",
            NamespaceOption {
                ipc: NamespaceMode::Node as i32,
                userns_options: userns.clone(),
                ..Default::default()
            },
        ),
    ] {
        let config = pod(ns, false);
        let err = pod_id_maps(&config).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains(&format!("{field} NODE")), "{err}");
    }
    // overlapping, empty or overflowing ranges
    for (uids, what) in [
        (
            vec![
                IdMapping {
                    host_id: 1000,
                    container_id: 0,
                    length: 100_000,
                },
                IdMapping {
                    host_id: 2000,
                    container_id: 0,
                    length: 100_000,
                },
            ],
            "overlaps uids[0]",
        ),
        (
            vec![IdMapping {
                host_id: 1000,
                container_id: 0,
                length: 0,
            }],
            "is empty",
        ),
        (
            vec![IdMapping {
                host_id: u32::MAX,
                container_id: 0,
                length: 2,
            }],
            "past the 32-bit ids",
        ),
    ] {
        let config = pod(
            NamespaceOption {
                userns_options: Some(UserNamespace {
                    mode: NamespaceMode::Pod as i32,
                    uids,
                    gids: vec![IdMapping {
                        host_id: 1000,
                        container_id: 0,
                        length: 100_000,
                    }],
                }),
                ..Default::default()
            },
            false,
        );
        let err = pod_id_maps(&config).unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains(what), "{err}");
    }
    // without mappings
    let config = pod(
        NamespaceOption {
            userns_options: Some(UserNamespace {
                mode: NamespaceMode::Pod as i32,
                ..Default::default()
            }),
            ..Default::default()
        },
        false,
    );
    assert!(pod_id_maps(&config).unwrap_err().is_invalid_argument());
}

#[test]
fn cri_annotations_cannot_override_crius_ones() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let mut config = container(LinuxContainerSecurityContext::default());
    config
        .annotations
        .insert(annotations::SANDBOX_ID.to_string(), "forged".to_string());
    let mut i = input(&f, &config, &sandbox);
    i.hostname = "";
    let spec = container_spec(&i).unwrap();
    assert_eq!(
        spec.annotations().as_ref().unwrap()[annotations::SANDBOX_ID],
        "s1"
    );
    let env = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env.contains(&"HOSTNAME=node-1".to_string()), "{env:?}");
}

#[test]
fn joined_pid_namespace_binds_the_host_cgroup_tree() {
    let f = fixture();
    let v1 = HostFacts {
        cgroup_v1: true,
        ..HostFacts::for_tests()
    };
    let cgroup_mount = |pid: NamespaceMode, privileged: bool, host: &HostFacts| {
        let ns = NamespaceOption {
            pid: pid as i32,
            ..Default::default()
        };
        let sandbox = pod(ns, privileged);
        let config = container(LinuxContainerSecurityContext {
            privileged,
            ..Default::default()
        });
        let spec = container_spec(&ContainerSpecInput {
            host,
            ..input(&f, &config, &sandbox)
        })
        .unwrap();
        let mounts = spec.mounts().clone().unwrap();
        let found: Vec<_> = mounts
            .iter()
            .filter(|m| m.destination() == Path::new("/sys/fs/cgroup"))
            .cloned()
            .collect();
        assert_eq!(found.len(), 1);
        found[0].clone()
    };
    for host in [&v1, &HOST] {
        let own = cgroup_mount(NamespaceMode::Container, false, host);
        assert_eq!(own.typ().as_deref(), Some("cgroup"));
    }
    // on cgroup v2 the pod's PID namespace changes nothing
    let shared = cgroup_mount(NamespaceMode::Pod, false, &HOST);
    assert_eq!(shared.typ().as_deref(), Some("cgroup"));
    let shared = cgroup_mount(NamespaceMode::Pod, false, &v1);
    assert_eq!(shared.typ().as_deref(), Some("bind"));
    assert_eq!(
        shared.source().as_deref(),
        Some(Path::new("/sys/fs/cgroup"))
    );
    assert!(shared.options().clone().unwrap().contains(&"rro".into()));
    let privileged = cgroup_mount(NamespaceMode::Pod, true, &v1);
    assert!(privileged.options().clone().unwrap().contains(&"rw".into()));
}

#[test]
fn all_capabilities_are_the_ones_crius_holds() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), true);
    let config = container(LinuxContainerSecurityContext {
        privileged: true,
        ..Default::default()
    });
    let bounding = |host: &HostFacts| {
        let spec = container_spec(&ContainerSpecInput {
            host,
            ..input(&f, &config, &sandbox)
        })
        .unwrap();
        let caps = spec.process().clone().unwrap().capabilities().clone();
        caps.unwrap().bounding().clone().unwrap()
    };
    assert_eq!(bounding(&HOST).len(), 41);
    // a kernel that knows up to CAP_SYSLOG (34), crius without CAP_SYS_ADMIN (21)
    let lesser = HostFacts {
        cap_last_cap: 34,
        held_caps: !(1 << 21),
        ..HostFacts::for_tests()
    };
    let caps = bounding(&lesser);
    assert_eq!(caps.len(), 34);
    assert!(!caps.contains(&Capability::SysAdmin));
}

#[test]
fn unknown_cdi_device_is_refused_by_name() {
    let f = fixture();
    let sandbox = pod(NamespaceOption::default(), false);
    let mut config = container(LinuxContainerSecurityContext::default());
    config.cdi_devices = vec![crius_api::v1::CdiDevice {
        name: "crius.invalid/none=missing".into(),
    }];
    let err = container_spec(&input(&f, &config, &sandbox)).unwrap_err();
    assert!(err.is_invalid_argument());
    assert!(
        err.to_string().contains("crius.invalid/none=missing"),
        "{err}"
    );
}

#[test]
fn cgroup_namespace_for_unprivileged_containers_on_cgroup_v2() {
    assert!(wants_cgroup_namespace(false, true));
    assert!(!wants_cgroup_namespace(true, true));
    assert!(!wants_cgroup_namespace(false, false));
    assert!(!wants_cgroup_namespace(true, false));
    // The spec follows the node's hierarchy: a v2 node shows the namespace, a v1 one not.
    let f = fixture();
    let v1 = HostFacts {
        cgroup_v1: true,
        ..HostFacts::for_tests()
    };
    for (host, cgroup_v1) in [(&*HOST, false), (&v1, true)] {
        for privileged in [false, true] {
            let sandbox = pod(NamespaceOption::default(), privileged);
            let config = container(LinuxContainerSecurityContext {
                privileged,
                ..Default::default()
            });
            let spec = container_spec(&ContainerSpecInput {
                host,
                ..input(&f, &config, &sandbox)
            })
            .unwrap();
            let expected = (!privileged && !cgroup_v1).then_some(None);
            assert_eq!(
                ns_path(&spec, LinuxNamespaceType::Cgroup),
                expected,
                "privileged: {privileged}, cgroup v1: {cgroup_v1}"
            );
        }
    }
}
