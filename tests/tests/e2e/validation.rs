//! Bad requests are refused at the door: the right code, a message that names the field, and
//! never more than a short excerpt of the value (a 1 MiB value echoed into a status is a
//! header that gRPC C-core clients refuse, hiding the error).
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::{assert_status, sc, Env};
use crius_api::v1::*;
use tonic::Code;

/// Longer than any message crius should send for one bad field.
const BOUNDED: usize = 1024;

fn assert_bounded<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: Code,
    needles: &[&str],
) {
    let len = match &result {
        Err(s) => s.message().len(),
        Ok(_) => 0,
    };
    assert_status(result, code, needles);
    assert!(len < BOUNDED, "status message of {len} bytes");
}

#[tokio::test]
async fn bad_pod_and_container_fields_are_refused_with_short_messages() {
    let env = Env::with_image().await;
    let huge = "x".repeat(1 << 20);
    let run = |config: PodSandboxConfig| {
        let mut rt = env.rt();
        async move {
            rt.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        }
    };

    for field in ["name", "namespace", "uid"] {
        let mut config = env.pod_config("valid", false);
        let m = config.metadata.as_mut().unwrap();
        match field {
            "name" => m.name = huge.clone(),
            "namespace" => m.namespace = huge.clone(),
            _ => m.uid = huge.clone(),
        }
        assert_bounded(
            run(config).await,
            Code::InvalidArgument,
            &[&format!("config.metadata.{field}"), "longer than 253 bytes"],
        );
    }

    let mut config = env.pod_config("relative-logs", false);
    config.log_directory = "logs/here".into();
    assert_bounded(
        run(config).await,
        Code::InvalidArgument,
        &["config.log_directory", "logs/here", "absolute"],
    );

    let mut config = env.pod_config("bad-host-ip", false);
    config.port_mappings = vec![PortMapping {
        protocol: Protocol::Tcp as i32,
        container_port: 80,
        host_port: 8080,
        host_ip: "not-an-ip".into(),
    }];
    assert_bounded(
        run(config).await,
        Code::InvalidArgument,
        &["port_mappings[0].host_ip", "not-an-ip"],
    );
    assert!(env.list_pods(PodSandboxFilter::default()).await.is_empty());

    // An unknown 1 MiB id: NotFound, quoted in part.
    assert_bounded(
        env.rt()
            .container_status(ContainerStatusRequest {
                container_id: huge.clone(),
                verbose: false,
            })
            .await,
        Code::NotFound,
        &["container", "1048576 bytes"],
    );
    assert_bounded(
        env.rt()
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: huge.clone(),
                verbose: false,
            })
            .await,
        Code::NotFound,
        &["pod sandbox", "1048576 bytes"],
    );

    // Resources: one set of rules for Run, Create and Update.
    let mut config = env.pod_config("tiny-memory", false);
    config.linux.get_or_insert_with(Default::default).overhead = Some(LinuxContainerResources {
        memory_limit_in_bytes: 1,
        ..Default::default()
    });
    assert_bounded(
        run(config).await,
        Code::InvalidArgument,
        &["config.linux.overhead.memory_limit_in_bytes", "minimum"],
    );
    assert!(env.list_pods(PodSandboxFilter::default()).await.is_empty());

    // A 1 MiB container name in a real pod.
    let mut env = env;
    let config = env.pod_config("real", false);
    let pod = env.run_pod(config.clone()).await;
    let mut c = env.container_config("ok", &["true"]);
    c.metadata.as_mut().unwrap().name = huge.clone();
    assert_bounded(
        env.rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(c),
                sandbox_config: Some(config),
            })
            .await,
        Code::InvalidArgument,
        &["config.metadata.name", "longer than 253 bytes"],
    );
    let mut c = env.container_config("banana", &["true"]);
    c.linux.get_or_insert_with(Default::default).resources = Some(LinuxContainerResources {
        cpuset_cpus: "banana".into(),
        ..Default::default()
    });
    assert_bounded(
        env.rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(c),
                sandbox_config: Some(env.pod_config("real", false)),
            })
            .await,
        Code::InvalidArgument,
        &["config.linux.resources.cpuset_cpus", "banana"],
    );
    // CPUs and memory nodes this node does not have.
    for (cpus, mems, field) in [("999", "", "cpuset_cpus"), ("", "999", "cpuset_mems")] {
        let mut c = env.container_config("no-such-cpu", &["true"]);
        c.linux.get_or_insert_with(Default::default).resources = Some(LinuxContainerResources {
            cpuset_cpus: cpus.into(),
            cpuset_mems: mems.into(),
            ..Default::default()
        });
        assert_bounded(
            env.rt()
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.clone(),
                    config: Some(c),
                    sandbox_config: Some(env.pod_config("real", false)),
                })
                .await,
            Code::InvalidArgument,
            &[field, "999"],
        );
    }
    let c = env
        .create_start(
            &pod,
            &env.pod_config("real", false),
            env.container_config("sleeper", &["sleep", "100"]),
        )
        .await;
    // NUL cannot pass execve: refused at the door, for the container and for ExecSync.
    let mut bad = env.container_config("nul", &["echo", "a\0b"]);
    bad.envs = vec![KeyValue {
        key: "GOOD".into(),
        value: b"x\0y".to_vec(),
    }];
    assert_bounded(
        env.rt()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(bad),
                sandbox_config: Some(env.pod_config("real", false)),
            })
            .await,
        Code::InvalidArgument,
        &["config.command[1]", "NUL"],
    );
    // Mount paths: no NUL, and nothing over /proc but the files lxcfs-like tools replace.
    for (container_path, host_path, needles) in [
        (
            "/data\0x",
            "/tmp",
            &["config.mounts[0].container_path", "NUL"][..],
        ),
        ("/data", "/tmp\0x", &["config.mounts[0].host_path", "NUL"]),
        (
            "/proc/sys",
            "/tmp",
            &["config.mounts[0].container_path", "/proc"],
        ),
        (
            "/proc",
            "/tmp",
            &["config.mounts[0].container_path", "/proc"],
        ),
    ] {
        let mut bad = env.container_config("bad-mount", &["true"]);
        bad.mounts = vec![Mount {
            container_path: container_path.into(),
            host_path: host_path.into(),
            ..Default::default()
        }];
        assert_bounded(
            env.rt()
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.clone(),
                    config: Some(bad),
                    sandbox_config: Some(env.pod_config("real", false)),
                })
                .await,
            Code::InvalidArgument,
            needles,
        );
    }
    assert_bounded(
        env.rt()
            .exec_sync(ExecSyncRequest {
                container_id: c.clone(),
                cmd: vec!["echo\0x".into()],
                timeout: 5,
            })
            .await,
        Code::InvalidArgument,
        &["cmd[0]", "NUL"],
    );
    assert_bounded(
        env.rt()
            .update_container_resources(UpdateContainerResourcesRequest {
                container_id: c.clone(),
                linux: Some(LinuxContainerResources {
                    oom_score_adj: 5000,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        &["linux.oom_score_adj", "5000"],
    );
    env.stop(&c, 0).await;
    env.remove(&c).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}

/// Sysctls the kernel would refuse when the pod starts are refused at the door (unknown names,
/// words for numbers) or, for a value out of the kernel's range, InvalidArgument naming the
/// sysctls once the kernel said no, with nothing of the pod left behind.
#[tokio::test]
async fn sysctls_the_kernel_would_refuse() {
    let env = Env::new().await;
    for (key, value, needles) in [
        (
            "kernel.shm_nosuch",
            "1",
            &["kernel.shm_nosuch", "not a sysctl of this node's kernel"][..],
        ),
        (
            "kernel.shmmax",
            "banana",
            &["kernel.shmmax", "takes numbers", "banana"],
        ),
        (
            "kernel.shm_rmid_forced",
            "7",
            &["sysctls", "the kernel refused"],
        ),
    ] {
        let mut config = env.pod_config("sysctl", false);
        config.linux.as_mut().unwrap().sysctls = [(key.to_string(), value.to_string())].into();
        let got = env
            .rt()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await;
        assert_bounded(got, Code::InvalidArgument, needles);
        let pods = env.list_pods(PodSandboxFilter::default()).await;
        assert!(pods.is_empty(), "{key}={value} left {pods:?}");
    }
    env.assert_no_leaks().await;
}

/// A create the runtime fails because of the request is the request's error: a command the
/// image lacks and a directory bound onto a file of the image are named as InvalidArgument (the
/// runtime's own words follow), a mount onto `/` is refused at the door, and each create is
/// undone. A command a mount provides is not the image's to lack, and one with an execute bit
/// for its owner only runs.
#[tokio::test]
async fn creates_the_request_makes_fail_are_invalid_argument_and_undone() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("bad-creates", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("run");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let create = |name: &str, cmd: &[&str], mounts: Vec<(&str, &str)>| {
        let mut config = env.container_config(name, cmd);
        config.mounts = mounts
            .into_iter()
            .map(|(container_path, host_path)| Mount {
                container_path: container_path.into(),
                host_path: host_path.into(),
                ..Default::default()
            })
            .collect();
        let mut rt = env.rt();
        let (pod, pod_config) = (pod.clone(), pod_config.clone());
        async move {
            rt.create_container(CreateContainerRequest {
                pod_sandbox_id: pod,
                config: Some(config),
                sandbox_config: Some(pod_config),
            })
            .await
        }
    };
    let dir = scripts.path().to_str().unwrap();
    assert_status(
        create("absolute", &["/no/such/cmd"], vec![]).await,
        Code::InvalidArgument,
        &[
            "config.command: /no/such/cmd is not in the image",
            "runtime said",
        ],
    );
    assert_status(
        create("bare", &["nosuchcmd"], vec![]).await,
        Code::InvalidArgument,
        &["config.command: nosuchcmd is in none of the image's PATH directories"],
    );
    assert_status(
        create("dir-on-file", &["sleep", "60"], vec![("/etc/passwd", dir)]).await,
        Code::InvalidArgument,
        &[
            "mount /etc/passwd: host_path",
            "is a directory, but /etc/passwd in the image is not",
        ],
    );
    assert_status(
        create("onto-root", &["sleep", "60"], vec![("/", dir)]).await,
        Code::InvalidArgument,
        &["mount container_path /: a mount cannot replace the container's root"],
    );
    // A host path that cannot be made a directory where it is (procfs makes none).
    assert_status(
        create("in-proc", &["sleep", "60"], vec![("/data", "/proc/crius-no-such-dir")]).await,
        Code::InvalidArgument,
        &[
            "mounts[0] (/data): host_path /proc/crius-no-such-dir does not exist and cannot be made a directory",
        ],
    );
    let left = env.list_containers(ContainerFilter::default()).await;
    assert!(left.is_empty(), "undone creates left {left:?}");
    // The script a mount provides runs, and so does one only its owner may run (0700: runc
    // runs it as root, and libcontainer's own check wanted the bit for others).
    let owner_only = scripts.path().join("owner-only");
    std::fs::write(&owner_only, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(
        &owner_only,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let mut ids = Vec::new();
    for (name, cmd) in [
        ("mounted", "/scripts/run"),
        ("owner-only", "/scripts/owner-only"),
    ] {
        let id = create(name, &[cmd], vec![("/scripts", dir)])
            .await
            .unwrap_or_else(|s| panic!("{name}: {s:?}"))
            .into_inner()
            .container_id;
        env.start(&id).await;
        let status = env
            .wait_exited(&id, std::time::Duration::from_secs(10))
            .await;
        assert_eq!(status.exit_code, 0, "{name}: {status:?}");
        ids.push(id);
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    env.remove_all_and_check(&ids, &pod).await;
}

/// Creates a fuzzer of container configs (`fuzz_requests.rs`) found answered with Internal from
/// deep inside the runtime or the kernel: each is now refused at the door or, when only the
/// runtime's failure shows it, named after that failure, as InvalidArgument; ExecSync of a
/// command the container cannot run is InvalidArgument too; a control character of a request
/// comes back escaped. Nothing of a refused create is left.
#[tokio::test]
async fn creates_that_failed_deep_in_the_runtime_are_named() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("deep-creates", false);
    let pod = env.run_pod(pod_config.clone()).await;
    let host = tempfile::tempdir().unwrap();
    let dir = host.path().to_str().unwrap().to_string();
    let dangling = host.path().join("dangling");
    std::os::unix::fs::symlink("/no/such/target/anywhere", &dangling).unwrap();
    let dangling = dangling.to_str().unwrap().to_string();
    let mount = |container_path: &str, host_path: &str, readonly: bool| Mount {
        container_path: container_path.into(),
        host_path: host_path.into(),
        readonly,
        ..Default::default()
    };
    type Edit = Box<dyn Fn(&mut ContainerConfig)>;
    let device = |container_path: &'static str, host_path: &'static str| -> Edit {
        Box::new(move |c| {
            c.devices = vec![Device {
                container_path: container_path.into(),
                host_path: host_path.into(),
                permissions: "r".into(),
            }]
        })
    };
    fn resources(c: &mut ContainerConfig) -> &mut LinuxContainerResources {
        c.linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default)
    }
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|c| resources(c).memory_swap_limit_in_bytes = 1 << 30),
            &["memory_swap_limit_in_bytes 1073741824 needs memory_limit_in_bytes"],
        ),
        (
            Box::new(|c| {
                let r = resources(c);
                r.memory_limit_in_bytes = 64 << 20;
                r.memory_swap_limit_in_bytes = 32 << 20;
            }),
            &["is below memory_limit_in_bytes 67108864"],
        ),
        (
            Box::new(|c| {
                resources(c).hugepage_limits = vec![HugepageLimit {
                    page_size: "bogus".into(),
                    limit: 1 << 21,
                }]
            }),
            &["hugepage_limits[0].page_size \"bogus\" is not a huge page size of this node"],
        ),
        (
            device("/dev/all", "/"),
            &["devices[0].host_path / is a directory outside /dev"],
        ),
        (
            Box::new({
                let dangling = dangling.clone();
                move |c| c.mounts = vec![mount("/data", &dangling, false)]
            }),
            &["mounts[0] (/data): host_path", "cannot be made a directory"],
        ),
        (
            Box::new(|c| sc(c).masked_paths = vec!["/proc".into()]),
            &["masked_paths[0] /proc: the container cannot start without it"],
        ),
        (
            Box::new(|c| sc(c).readonly_paths = vec!["/proc/../etc".into()]),
            &["readonly_paths[0] \"/proc/../etc\" is not an absolute path below /"],
        ),
        (
            Box::new(|c| sc(c).masked_paths = vec!["/tmp/a\0b".into()]),
            &["masked_paths[0] \"/tmp/a\\0b\""],
        ),
        (
            Box::new(|c| sc(c).run_as_username = "a\0b".into()),
            &["run_as_username a\\u{0}b not found"],
        ),
        (
            Box::new(|c| c.command = vec!["/proc".into()]),
            &["config.command: /proc is not an executable file in the container"],
        ),
        (
            Box::new(|c| c.working_dir = "/dev/null".into()),
            &["config.working_dir /dev/null is a device"],
        ),
        (
            Box::new(|c| c.working_dir = "/etc/passwd".into()),
            &["config.working_dir \"/etc/passwd\" cannot be made in the image"],
        ),
        (
            Box::new(|c| c.working_dir = "/proc/1/root".into()),
            &["config.working_dir /proc/1/root does not stay inside the container"],
        ),
        (
            Box::new({
                let dir = dir.clone();
                move |c| c.mounts = vec![mount("/dev/null", &dir, false)]
            }),
            &["mount /dev/null: the runtime makes it in every container"],
        ),
        (
            Box::new({
                let dir = dir.clone();
                move |c| c.mounts = vec![mount("/sys", &dir, true)]
            }),
            &["mount /sys is read-only, and /sys/fs/cgroup is mounted inside it"],
        ),
        (
            Box::new({
                let file = host.path().join("file");
                std::fs::write(&file, "x").unwrap();
                let file = file.to_str().unwrap().to_string();
                move |c| {
                    c.tty = true;
                    c.mounts = vec![mount("/dev/pts", &file, false)];
                }
            }),
            &["mount /dev/pts: the runtime makes it in every container"],
        ),
        (
            Box::new(|c| {
                sc(c).seccomp = Some(SecurityProfile {
                    profile_type: security_profile::ProfileType::Localhost as i32,
                    localhost_ref: "/dev/zero".into(),
                })
            }),
            &["seccomp profile /dev/zero: cannot read: not a regular file"],
        ),
        (
            Box::new({
                let fifo = host.path().join("profile-fifo");
                let made = std::process::Command::new("mkfifo").arg(&fifo).status();
                assert!(made.unwrap().success());
                let fifo = fifo.to_str().unwrap().to_string();
                move |c| {
                    sc(c).seccomp = Some(SecurityProfile {
                        profile_type: security_profile::ProfileType::Localhost as i32,
                        localhost_ref: fifo.clone(),
                    })
                }
            }),
            &["profile-fifo: cannot read: not a regular file"],
        ),
        (
            device("/proc/self/x", "/dev/zero"),
            &["devices[0].container_path /proc/self/x is not in /dev"],
        ),
        (
            device("/bin", "/dev/zero"),
            &["devices[0].container_path /bin is not in /dev"],
        ),
    ];
    for (i, (edit, needles)) in cases.into_iter().enumerate() {
        let mut config = env.container_config(&format!("deep-{i}"), &["sleep", "60"]);
        edit(&mut config);
        let got = env.try_create(&pod, &pod_config, config).await;
        assert_bounded(got, Code::InvalidArgument, needles);
    }
    let left = env.list_containers(ContainerFilter::default()).await;
    assert!(left.is_empty(), "refused creates left {left:?}");

    let id = env
        .create_start(
            &pod,
            &pod_config,
            env.container_config("execs", &["sleep", "60"]),
        )
        .await;
    // An argument longer than the kernel takes (E2BIG: one string over 128 KiB) is the
    // caller's too.
    let huge = "x".repeat(1 << 20);
    for (cmd, needle) in [
        (
            vec!["nosuchcmd"],
            "executable \"nosuchcmd\" not found in $PATH",
        ),
        (vec!["/etc/passwd"], "exec /etc/passwd: Permission denied"),
        (
            vec!["/bin/echo", &huge],
            "exec /bin/echo: Argument list too long",
        ),
    ] {
        let got = env
            .rt()
            .exec_sync(ExecSyncRequest {
                container_id: id.clone(),
                cmd: cmd.iter().map(|a| a.to_string()).collect(),
                timeout: 10,
            })
            .await;
        assert_bounded(
            got,
            Code::InvalidArgument,
            &["the command cannot run", needle],
        );
    }
    env.stop(&id, 0).await;
    env.remove(&id).await;

    // Pods: a TARGET namespace, a log directory that is a file, and in a user-namespaced pod
    // a user the namespace does not map, for the pod and for a container.
    let file = host.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let userns = |c: &mut PodSandboxConfig| {
        let map = vec![IdMapping {
            host_id: 400_000,
            container_id: 0,
            length: 65536,
        }];
        common::pod_sc(c)
            .namespace_options
            .get_or_insert_with(Default::default)
            .userns_options = Some(UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: map.clone(),
            gids: map,
        });
    };
    type PodEdit = Box<dyn Fn(&mut PodSandboxConfig)>;
    let pod_cases: Vec<(PodEdit, &[&str])> = vec![
        (
            Box::new(|c| {
                common::pod_sc(c)
                    .namespace_options
                    .get_or_insert_with(Default::default)
                    .pid = NamespaceMode::Target as i32
            }),
            &["namespace_options pid TARGET is for a container"],
        ),
        (
            Box::new({
                let file = file.to_str().unwrap().to_string();
                move |c| c.log_directory = file.clone()
            }),
            &["config.log_directory", "is not a directory"],
        ),
        (
            Box::new(|c| {
                c.linux.get_or_insert_with(Default::default).overhead =
                    Some(LinuxContainerResources {
                        memory_swap_limit_in_bytes: 1 << 30,
                        ..Default::default()
                    })
            }),
            &["overhead.memory_swap_limit_in_bytes 1073741824 needs memory_limit_in_bytes"],
        ),
        (
            Box::new(move |c| {
                userns(c);
                common::pod_sc(c).run_as_user = Some(Int64Value { value: 70_000 });
            }),
            &[
                "uid 70000 is not mapped in the pod's user namespace",
                "0-65535",
            ],
        ),
    ];
    for (i, (edit, needles)) in pod_cases.into_iter().enumerate() {
        let mut config = env.pod_config(&format!("deep-pod-{i}"), false);
        edit(&mut config);
        let got = env
            .rt()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await;
        assert_bounded(got, Code::InvalidArgument, needles);
    }
    let mut userns_config = env.pod_config("deep-userns", false);
    userns(&mut userns_config);
    let userns_pod = env.run_pod(userns_config.clone()).await;
    let mut config = env.container_config("unmapped", &["sleep", "60"]);
    sc(&mut config).run_as_user = Some(Int64Value { value: 70_000 });
    sc(&mut config)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = common::pod_sc(&mut userns_config.clone())
        .namespace_options
        .clone()
        .unwrap()
        .userns_options;
    let got = env.try_create(&userns_pod, &userns_config, config).await;
    assert_bounded(
        got,
        Code::InvalidArgument,
        &["the container's user", "uid 70000 is not mapped"],
    );
    env.stop_pod(&userns_pod).await;
    env.remove_pod(&userns_pod).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let pods = env.list_pods(PodSandboxFilter::default()).await;
    assert!(pods.is_empty(), "refused pods left {pods:?}");
    env.assert_no_leaks().await;
}
