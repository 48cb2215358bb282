//! Security contexts end to end: users and groups, capabilities, no_new_privs, seccomp,
//! privileged containers, read-only rootfs, masked and read-only paths, sysctls, namespaces,
//! mounts and propagation, devices, oom_score_adj, AppArmor/SELinux requests, and what `Status`
//! advertises. Each check looks at what a real container sees (`id`, `/proc/self/status`,
//! `/proc/mounts`, ...). Real crius, real registry, real containers. Run as root.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common;
use crate::common::{assert_status, pod_sc, sc, texts, Env};
use crius_api::v1::*;
use crius_tests::images::{self, TestImage};
use crius_tests::TestDir;
use tonic::Code;

const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// containerd's default capabilities as a CapEff mask: chown, dac_override, fowner, fsetid,
/// kill, setgid, setuid, setpcap, net_bind_service, net_raw, sys_chroot, mknod, audit_write,
/// setfcap.
const DEFAULT_CAPS: u64 = 0xa804_25fb;
const CAP_CHOWN: u64 = 1 << 0;
const CAP_NET_BIND_SERVICE: u64 = 1 << 10;
const CAP_NET_ADMIN: u64 = 1 << 12;
const CAP_SYS_RESOURCE: u64 = 1 << 24;

/// A pod of the test: its id, config and name (for its log dir).
struct Pod {
    id: String,
    config: PodSandboxConfig,
    name: String,
}

/// What a container printed and how it ended.
#[derive(Debug)]
struct Output {
    exit_code: i32,
    stdout: String,
    stderr: String,
}

/// Runs a pod named `name`; `edit` adjusts its config first.
async fn pod(
    env: &mut Env,
    name: &str,
    host_network: bool,
    edit: impl FnOnce(&mut PodSandboxConfig),
) -> Pod {
    let mut config = env.pod_config(name, host_network);
    edit(&mut config);
    let id = env.run_pod(config.clone()).await;
    Pod {
        id,
        config,
        name: name.to_string(),
    }
}

fn container(env: &Env, name: &str, cmd: &[&str]) -> ContainerConfig {
    env.container_config(name, cmd)
}

/// `sh -c script` in a container named `name`.
fn shell(env: &Env, name: &str, script: &str) -> ContainerConfig {
    env.container_config(name, &["sh", "-c", script])
}

async fn try_create(
    env: &Env,
    pod: &Pod,
    config: ContainerConfig,
) -> Result<String, tonic::Status> {
    env.rt()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        })
        .await
        .map(|r| r.into_inner().container_id)
}

/// Creates and starts `config` in `pod`, waits for it to exit and returns its output.
async fn run(env: &Env, pod: &Pod, config: ContainerConfig) -> Output {
    let name = config.metadata.as_ref().unwrap().name.clone();
    let id = env.create_start(&pod.id, &pod.config, config).await;
    let status = env.wait_exited(&id, EXIT_LIMIT).await;
    let lines = common::read_log(&env.log_dir(&pod.name).join(format!("{name}.log")));
    Output {
        exit_code: status.exit_code,
        stdout: texts(&lines, "stdout").join("\n"),
        stderr: texts(&lines, "stderr").join("\n"),
    }
}

/// [`run`], asserting exit code 0; returns stdout.
async fn run_ok(env: &Env, pod: &Pod, config: ContainerConfig) -> String {
    let name = config.metadata.as_ref().unwrap().name.clone();
    let out = run(env, pod, config).await;
    assert_eq!(out.exit_code, 0, "container {name}: {out:?}");
    out.stdout
}

/// A field of `/proc/<pid>/status` text, e.g. `field(s, "CapEff")`.
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
}

fn hex_field(status: &str, name: &str) -> u64 {
    u64::from_str_radix(field(status, name), 16).unwrap()
}

/// The capabilities of this (root) test process: what crius holds too, and so what `ALL` and
/// privileged containers get (this node's root lacks CAP_SYS_RESOURCE).
fn all_caps() -> u64 {
    hex_field(
        &std::fs::read_to_string("/proc/self/status").unwrap(),
        "CapEff",
    )
}

fn profile(kind: security_profile::ProfileType, localhost_ref: &str) -> SecurityProfile {
    SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: localhost_ref.into(),
    }
}

/// The `/proc/mounts` line of mount point `dest`, from a container's `cat /proc/mounts`.
fn mount_line<'a>(mounts: &'a str, dest: &str) -> Option<&'a str> {
    mounts.lines().rfind(|l| l.split(' ').nth(1) == Some(dest))
}

fn mount_options<'a>(mounts: &'a str, dest: &str) -> Vec<&'a str> {
    mount_line(mounts, dest)
        .unwrap_or_else(|| panic!("{dest} not mounted:\n{mounts}"))
        .split(' ')
        .nth(3)
        .unwrap()
        .split(',')
        .collect()
}

#[tokio::test]
async fn users_and_groups() {
    let mut env = Env::with_image().await;
    let user_image = images::push(&env.registry, TestImage::User).unwrap();
    env.pull(&user_image.reference).await;
    let p = pod(&mut env, "users", true, |_| {}).await;

    // The image's User (1000:1000), its Cmd `id`: groups from /etc/group (Merge by default).
    let mut c = container(&env, "image-user", &[]);
    c.command.clear();
    c.image.as_mut().unwrap().image = user_image.reference.clone();
    assert_eq!(
        run_ok(&env, &p, c).await,
        "uid=1000(crius) gid=1000(crius) groups=1000(crius),1001(crius-extra)"
    );

    // No user anywhere: root with its own groups.
    assert_eq!(
        run_ok(&env, &p, container(&env, "root", &["id"])).await,
        "uid=0(root) gid=0(root) groups=0(root)"
    );

    // run_as_user: primary group from /etc/passwd.
    let mut c = container(&env, "run-as-user", &["id"]);
    sc(&mut c).run_as_user = Some(Int64Value { value: 1000 });
    assert_eq!(
        run_ok(&env, &p, c).await,
        "uid=1000(crius) gid=1000(crius) groups=1000(crius),1001(crius-extra)"
    );

    // run_as_user + run_as_group override the image's User.
    let mut c = container(&env, "run-as-group", &["id"]);
    c.image.as_mut().unwrap().image = user_image.reference.clone();
    sc(&mut c).run_as_user = Some(Int64Value { value: 4000 });
    sc(&mut c).run_as_group = Some(Int64Value { value: 4001 });
    assert_eq!(run_ok(&env, &p, c).await, "uid=4000 gid=4001 groups=4001");

    // run_as_username resolved in the image's /etc/passwd, with supplemental groups merged.
    let mut c = container(&env, "username-merge", &["id"]);
    sc(&mut c).run_as_username = images::USER_NAME.into();
    sc(&mut c).supplemental_groups = vec![5000];
    assert_eq!(
        run_ok(&env, &p, c).await,
        "uid=1000(crius) gid=1000(crius) groups=1000(crius),1001(crius-extra),5000"
    );

    // Strict: only the primary group and the listed ones, not /etc/group's.
    let mut c = container(&env, "username-strict", &["id"]);
    sc(&mut c).run_as_username = images::USER_NAME.into();
    sc(&mut c).supplemental_groups = vec![5000];
    sc(&mut c).supplemental_groups_policy = SupplementalGroupsPolicy::Strict as i32;
    assert_eq!(
        run_ok(&env, &p, c).await,
        "uid=1000(crius) gid=1000(crius) groups=1000(crius),5000"
    );

    // ContainerStatus.user reports the identity the process started with (kubelet shows it in
    // the pod status).
    let user_of = |policy: SupplementalGroupsPolicy, name: &str| {
        let mut c = container(&env, name, &["true"]);
        sc(&mut c).run_as_user = Some(Int64Value { value: 1000 });
        sc(&mut c).supplemental_groups = vec![5000];
        sc(&mut c).supplemental_groups_policy = policy as i32;
        c
    };
    for (policy, name, groups) in [
        (
            SupplementalGroupsPolicy::Merge,
            "status-merge",
            vec![1000, 1001, 5000],
        ),
        (
            SupplementalGroupsPolicy::Strict,
            "status-strict",
            vec![1000, 5000],
        ),
    ] {
        let id = env.create(&p.id, &p.config, user_of(policy, name)).await;
        let user = env.status(&id).await.user.unwrap().linux.unwrap();
        assert_eq!(
            (user.uid, user.gid, user.supplemental_groups),
            (1000, 1000, groups)
        );
    }

    // Names the image does not know, and a group without a user, are refused.
    let mut c = container(&env, "unknown-user", &["id"]);
    sc(&mut c).run_as_username = "crius-nobody-here".into();
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["run_as_username crius-nobody-here"],
    );
    let mut c = container(&env, "group-only", &["id"]);
    sc(&mut c).run_as_group = Some(Int64Value { value: 10 });
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["run_as_group"],
    );

    // Status says the policy is supported.
    let status = env.runtime_status().await;
    assert!(status.features.unwrap().supplemental_groups_policy);

    // User namespaces: tests/tests/e2e/userns.rs.

    env.remove_pod(&p.id).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn capabilities_no_new_privs_and_seccomp() {
    let mut env = Env::with_image().await;
    let p = pod(&mut env, "caps", true, |_| {}).await;
    let status_of = |name: &str| container(&env, name, &["cat", "/proc/self/status"]);

    // Defaults: containerd's set, no ambient, no_new_privs off, unconfined seccomp (kubelet
    // sends RuntimeDefault explicitly when it wants it).
    let s = run_ok(&env, &p, status_of("default")).await;
    assert_eq!(hex_field(&s, "CapEff"), DEFAULT_CAPS, "{s}");
    assert_eq!(hex_field(&s, "CapPrm"), DEFAULT_CAPS);
    assert_eq!(hex_field(&s, "CapBnd"), DEFAULT_CAPS);
    assert_eq!(hex_field(&s, "CapAmb"), 0);
    assert_eq!(field(&s, "NoNewPrivs"), "0");
    assert_eq!(field(&s, "Seccomp"), "0");

    // add NET_ADMIN, drop CHOWN (CRI names, with and without the CAP_ prefix).
    let mut c = status_of("add-drop");
    sc(&mut c).capabilities = Some(Capability {
        add_capabilities: vec!["NET_ADMIN".into()],
        drop_capabilities: vec!["CAP_CHOWN".into()],
        add_ambient_capabilities: vec![],
    });
    let s = run_ok(&env, &p, c).await;
    assert_eq!(
        hex_field(&s, "CapEff"),
        (DEFAULT_CAPS | CAP_NET_ADMIN) & !CAP_CHOWN,
        "{s}"
    );
    assert_eq!(
        hex_field(&s, "CapBnd"),
        (DEFAULT_CAPS | CAP_NET_ADMIN) & !CAP_CHOWN
    );

    // add ALL, then drop ALL.
    let mut c = status_of("add-all");
    sc(&mut c).capabilities = Some(Capability {
        add_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let s = run_ok(&env, &p, c).await;
    assert_eq!(hex_field(&s, "CapEff"), all_caps(), "{s}");
    let mut c = status_of("drop-all");
    sc(&mut c).capabilities = Some(Capability {
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let s = run_ok(&env, &p, c).await;
    assert_eq!(hex_field(&s, "CapEff"), 0, "{s}");
    assert_eq!(hex_field(&s, "CapBnd"), 0, "{s}");

    // A non-root user has no effective capabilities, unless they are ambient.
    let mut c = status_of("non-root");
    sc(&mut c).run_as_user = Some(Int64Value { value: 1000 });
    let s = run_ok(&env, &p, c).await;
    assert_eq!(hex_field(&s, "CapEff"), 0, "{s}");
    let mut c = status_of("ambient");
    sc(&mut c).run_as_user = Some(Int64Value { value: 1000 });
    sc(&mut c).capabilities = Some(Capability {
        add_ambient_capabilities: vec!["NET_BIND_SERVICE".into()],
        ..Default::default()
    });
    let s = run_ok(&env, &p, c).await;
    assert_eq!(hex_field(&s, "CapAmb"), CAP_NET_BIND_SERVICE, "{s}");
    assert_eq!(hex_field(&s, "CapEff"), CAP_NET_BIND_SERVICE, "{s}");
    // A capability crius itself lacks (CAP_SYS_RESOURCE on this node) is refused by name.
    if all_caps() & CAP_SYS_RESOURCE == 0 {
        let mut c = status_of("not-held");
        sc(&mut c).capabilities = Some(Capability {
            add_capabilities: vec!["SYS_RESOURCE".into()],
            ..Default::default()
        });
        assert_status(
            try_create(&env, &p, c).await,
            Code::InvalidArgument,
            &["capability SYS_RESOURCE is not available"],
        );
    }
    let mut c = status_of("bad-cap");
    sc(&mut c).capabilities = Some(Capability {
        add_capabilities: vec!["CAP_CRIUS_MAGIC".into()],
        ..Default::default()
    });
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["CAP_CRIUS_MAGIC"],
    );

    // no_new_privs and the RuntimeDefault filter.
    let mut c = status_of("nnp-runtime-default");
    sc(&mut c).no_new_privs = true;
    sc(&mut c).seccomp = Some(profile(security_profile::ProfileType::RuntimeDefault, ""));
    let s = run_ok(&env, &p, c).await;
    assert_eq!(field(&s, "NoNewPrivs"), "1", "{s}");
    assert_eq!(field(&s, "Seccomp"), "2", "{s}");
    assert_eq!(hex_field(&s, "CapEff"), DEFAULT_CAPS);
    // RuntimeDefault without no_new_privs (the filter is loaded while still privileged):
    // creating a user namespace needs no capability, but the profile allows unshare only with
    // CAP_SYS_ADMIN; unconfined, the same call succeeds.
    let script = "grep Seccomp: /proc/self/status; busybox unshare -U true; echo unshare=$?";
    let mut c = shell(&env, "runtime-default", script);
    sc(&mut c).seccomp = Some(profile(security_profile::ProfileType::RuntimeDefault, ""));
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("Seccomp:\t2"), "{out:?}");
    assert!(out.stdout.contains("unshare=1"), "{out:?}");
    let mut c = shell(&env, "unconfined", script);
    sc(&mut c).seccomp = Some(profile(security_profile::ProfileType::Unconfined, ""));
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("Seccomp:\t0"), "{out:?}");
    assert!(out.stdout.contains("unshare=0"), "{out:?}");

    // A Localhost profile that denies mkdir.
    let dir = TestDir::new("sec-seccomp").unwrap();
    let deny_mkdir = dir.join("deny-mkdir.json");
    std::fs::write(
        &deny_mkdir,
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let mut c = shell(
        &env,
        "localhost",
        "grep Seccomp: /proc/self/status; busybox mkdir /tmp/crius-denied; echo mkdir=$?; \
         busybox touch /tmp/crius-allowed; echo touch=$?",
    );
    sc(&mut c).seccomp = Some(profile(
        security_profile::ProfileType::Localhost,
        deny_mkdir.to_str().unwrap(),
    ));
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("Seccomp:\t2"), "{out:?}");
    assert!(out.stdout.contains("mkdir=1"), "{out:?}");
    assert!(out.stdout.contains("touch=0"), "{out:?}");
    assert!(
        out.stderr.contains("Operation not permitted"),
        "mkdir fails with EPERM: {out:?}"
    );

    // A missing profile, and one that is not a profile: InvalidArgument naming the file.
    let missing = dir.join("crius-missing-profile.json");
    let mut c = status_of("missing-profile");
    sc(&mut c).seccomp = Some(profile(
        security_profile::ProfileType::Localhost,
        missing.to_str().unwrap(),
    ));
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &[missing.to_str().unwrap()],
    );
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, "{not json").unwrap();
    let mut c = status_of("garbage-profile");
    sc(&mut c).seccomp = Some(profile(
        security_profile::ProfileType::Localhost,
        garbage.to_str().unwrap(),
    ));
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &[garbage.to_str().unwrap()],
    );

    // The pod's own security context applies to the pause: RuntimeDefault and a non-root
    // user still give a ready pod whose containers run.
    let confined = pod(&mut env, "confined-pause", true, |c| {
        let psc = pod_sc(c);
        psc.seccomp = Some(profile(security_profile::ProfileType::RuntimeDefault, ""));
        psc.run_as_user = Some(Int64Value { value: 65535 });
        psc.run_as_group = Some(Int64Value { value: 65535 });
    })
    .await;
    assert_eq!(
        env.pod_status(&confined.id).await.state,
        PodSandboxState::SandboxReady as i32
    );
    // RunPodSandbox answers once the pause is started, which may be before its exec is done.
    let pause_pid = common::wait_for("the pause process", Duration::from_secs(10), || async {
        common::processes_of_pod(&confined.id)
            .into_iter()
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"/pause"))
            })
    })
    .await;
    let pause_status = std::fs::read_to_string(format!("/proc/{pause_pid}/status")).unwrap();
    assert_eq!(field(&pause_status, "Seccomp"), "2");
    assert!(
        field(&pause_status, "Uid").starts_with("65535"),
        "{pause_status}"
    );
    run_ok(&env, &confined, container(&env, "in-confined", &["true"])).await;
    env.remove_pod(&confined.id).await;

    env.remove_pod(&p.id).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn privileged_containers() {
    let mut env = Env::with_image().await;
    let script = "grep -E '^(CapEff|Seccomp):' /proc/self/status; cat /proc/mounts; \
                  test -e /dev/kmsg && echo has-kmsg; true";

    // Unprivileged pod: a privileged container is refused; an ordinary one sees a read-only
    // /sys and no host devices.
    let plain = pod(&mut env, "plain", true, |_| {}).await;
    let mut c = shell(&env, "priv", script);
    sc(&mut c).privileged = true;
    assert_status(
        try_create(&env, &plain, c).await,
        Code::InvalidArgument,
        &["privileged", "priv"],
    );
    let out = run_ok(&env, &plain, shell(&env, "ordinary", script)).await;
    assert!(mount_options(&out, "/sys").contains(&"ro"), "{out}");
    assert!(!out.contains("has-kmsg"), "{out}");

    // Privileged pod and container: every capability, writable /sys, host devices, no
    // seccomp even when RuntimeDefault is asked for, no masked paths.
    let privileged = pod(&mut env, "privileged", true, |c| {
        pod_sc(c).privileged = true
    })
    .await;
    let mut c = shell(
        &env,
        "priv",
        &format!("{script}; busybox wc -c < /proc/timer_list"),
    );
    sc(&mut c).privileged = true;
    sc(&mut c).seccomp = Some(profile(security_profile::ProfileType::RuntimeDefault, ""));
    let out = run_ok(&env, &privileged, c).await;
    assert_eq!(hex_field(&out, "CapEff"), all_caps(), "{out}");
    assert_eq!(field(&out, "Seccomp"), "0");
    assert!(mount_options(&out, "/sys").contains(&"rw"), "{out}");
    if Path::new("/dev/kmsg").exists() {
        assert!(out.contains("has-kmsg"), "{out}");
    }
    let timer_list_len: u64 = out.lines().last().unwrap().trim().parse().unwrap();
    assert!(timer_list_len > 0, "/proc/timer_list is not masked: {out}");
    // BIDIRECTIONAL (privileged only, as kubelet allows): a mount made in the container
    // appears on the host.
    let dir = TestDir::new("sec-bidi").unwrap();
    let shared = dir.join("shared");
    std::fs::create_dir_all(shared.join("sub")).unwrap();
    let mut host_mounts = HostMounts(Vec::new());
    host_mounts.run(&["--bind", shared.to_str().unwrap()], &shared);
    host_mounts.run(&["--make-rshared"], &shared);
    // the container's mount is unmounted on the host at the end, even on failure
    host_mounts.0.push(shared.join("sub"));
    let mut c = container(&env, "bidi", &["sleep", "1000"]);
    sc(&mut c).privileged = true;
    c.mounts = vec![cri_mount(
        &shared,
        "/bidi",
        false,
        MountPropagation::PropagationBidirectional,
    )];
    let bidi = env
        .create_start(&privileged.id, &privileged.config, c)
        .await;
    let out = env
        .exec(
            &bidi,
            &[
                "busybox",
                "mount",
                "-t",
                "tmpfs",
                "crius-sec-bidi",
                "/bidi/sub",
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let host_view = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let sub = shared.join("sub").display().to_string();
    assert!(
        host_view
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(sub.as_str())),
        "the container's mount did not reach the host"
    );
    env.stop(&bidi, 0).await;

    // A non-privileged container in a privileged pod stays confined.
    let out = run_ok(&env, &privileged, shell(&env, "confined", script)).await;
    assert_eq!(hex_field(&out, "CapEff"), DEFAULT_CAPS, "{out}");
    assert!(mount_options(&out, "/sys").contains(&"ro"), "{out}");

    env.remove_pod(&plain.id).await;
    env.remove_pod(&privileged.id).await;
    drop(host_mounts);
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn rootfs_masked_and_readonly_paths() {
    let mut env = Env::with_image().await;
    let p = pod(&mut env, "paths", true, |_| {}).await;

    // Read-only rootfs: writes fail, /tmp of the image included; the pod's /dev/shm stays
    // writable.
    let mut c = shell(
        &env,
        "ro-rootfs",
        "busybox touch /crius-file; echo root=$?; busybox touch /tmp/crius-file; echo tmp=$?; \
         busybox touch /dev/shm/crius-file; echo shm=$?",
    );
    sc(&mut c).readonly_rootfs = true;
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("root=1"), "{out:?}");
    assert!(out.stdout.contains("tmp=1"), "{out:?}");
    assert!(out.stdout.contains("shm=0"), "{out:?}");
    assert!(out.stderr.contains("Read-only file system"), "{out:?}");
    // Without it the rootfs is writable.
    let out = run_ok(
        &env,
        &p,
        shell(
            &env,
            "rw-rootfs",
            "busybox touch /crius-file && echo written",
        ),
    )
    .await;
    assert_eq!(out, "written");

    // Default masked paths read empty; other /proc files do not; /proc/sys is read-only.
    let script = "for f in /proc/kcore /proc/keys /proc/timer_list /proc/version; do \
                  echo $f=$(busybox cat $f 2>/dev/null | busybox wc -c); done; cat /proc/mounts";
    let out = run_ok(&env, &p, shell(&env, "default-paths", script)).await;
    assert!(out.contains("/proc/kcore=0"), "{out}");
    assert!(out.contains("/proc/keys=0"), "{out}");
    assert!(out.contains("/proc/timer_list=0"), "{out}");
    assert!(!out.contains("/proc/version=0"), "{out}");
    assert!(mount_options(&out, "/proc/sys").contains(&"ro"), "{out}");

    // Explicit lists replace the defaults.
    let mut c = shell(
        &env,
        "explicit-paths",
        &format!("{script}; busybox touch /tmp/crius-file; echo tmp=$?"),
    );
    sc(&mut c).masked_paths = vec!["/proc/version".into()];
    sc(&mut c).readonly_paths = vec!["/tmp".into()];
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("/proc/version=0"), "{out:?}");
    assert!(!out.stdout.contains("/proc/timer_list=0"), "{out:?}");
    assert!(
        mount_line(&out.stdout, "/proc/sys").is_none(),
        "/proc/sys is no longer a read-only mount: {out:?}"
    );
    assert!(
        mount_options(&out.stdout, "/tmp").contains(&"ro"),
        "{out:?}"
    );
    assert!(out.stdout.contains("tmp=1"), "{out:?}");

    env.remove_pod(&p.id).await;
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn sysctls() {
    let mut env = Env::with_image().await;
    let sysctls = HashMap::from([
        ("kernel.shmmni".to_string(), "8191".to_string()),
        (
            "net.ipv4.ip_unprivileged_port_start".to_string(),
            "543".to_string(),
        ),
    ]);
    let p = pod(&mut env, "sysctls", false, |c| {
        c.linux.get_or_insert_with(Default::default).sysctls = sysctls.clone();
    })
    .await;
    let out = run_ok(
        &env,
        &p,
        container(
            &env,
            "show",
            &[
                "cat",
                "/proc/sys/kernel/shmmni",
                "/proc/sys/net/ipv4/ip_unprivileged_port_start",
            ],
        ),
    )
    .await;
    assert_eq!(out, "8191\n543");
    // The host keeps its own values.
    assert_ne!(
        std::fs::read_to_string("/proc/sys/kernel/shmmni")
            .unwrap()
            .trim(),
        "8191"
    );

    // Not namespaced: refused by name. net.* on the host network: refused by name.
    let refused = [
        (false, "kernel.panic", "kernel.panic"),
        (true, "net.core.somaxconn", "net.core.somaxconn"),
    ];
    for (i, (host_network, key, needle)) in refused.into_iter().enumerate() {
        let mut config = env.pod_config(&format!("bad-sysctl-{i}"), host_network);
        config.linux.as_mut().unwrap().sysctls = HashMap::from([(key.into(), "1".into())]);
        assert_status(
            env.rt()
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await,
            Code::InvalidArgument,
            &[needle],
        );
    }
    assert_eq!(env.list_pods(PodSandboxFilter::default()).await.len(), 1);

    env.remove_pod(&p.id).await;
    env.assert_no_leaks().await;
}

/// `readlink` of the host's `/proc/self/ns/<name>`.
fn host_ns(name: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{name}"))
        .unwrap()
        .display()
        .to_string()
}

fn ns_options(pid: NamespaceMode) -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Pod as i32,
        pid: pid as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

#[tokio::test]
async fn namespaces_and_hostname() {
    let mut env = Env::with_image().await;
    let p = pod(&mut env, "ns", false, |c| {
        c.hostname = "crius-sec-host".into();
    })
    .await;

    // Pod-shared PID namespace: one container sees the other's process and the pause as 1.
    let sleeper = env
        .create_start(
            &p.id,
            &p.config,
            container(&env, "sleeper", &["sleep", "4242"]),
        )
        .await;
    let out = run_ok(
        &env,
        &p,
        shell(
            &env,
            "looker",
            "busybox ps -o pid,args; echo pid1=$(busybox cat /proc/1/cmdline)",
        ),
    )
    .await;
    assert!(out.contains("sleep 4242"), "{out}");
    assert!(out.contains("pid1=/pause"), "{out}");

    // The pause's mounts, which a container sharing its PID namespace reaches through
    // /proc/1/root: /proc (its masks and read-only paths kept) and /dev, nothing else.
    let out = run_ok(
        &env,
        &p,
        shell(&env, "pause-mounts", "cat /proc/1/mountinfo"),
    )
    .await;
    let points: Vec<(&str, &str)> = out
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ').skip(4);
            Some((f.next()?, f.next()?))
        })
        .collect();
    let has = |dest: &str| points.iter().any(|(d, _)| *d == dest);
    for want in [
        "/",
        "/proc",
        "/dev",
        "/pause",
        "/proc/keys",
        "/proc/timer_list",
    ] {
        assert!(has(want), "{want} not mounted in the pause:\n{out}");
    }
    for unwanted in ["/sys", "/sys/fs/cgroup", "/dev/shm", "/etc/resolv.conf"] {
        assert!(!has(unwanted), "{unwanted} mounted in the pause:\n{out}");
    }
    for read_only in ["/", "/proc/sys", "/proc/irq"] {
        let opts = points
            .iter()
            .rfind(|(d, _)| *d == read_only)
            .map(|(_, o)| *o);
        assert!(
            opts.is_some_and(|o| o.split(',').any(|x| x == "ro")),
            "{read_only} is not read-only in the pause:\n{out}"
        );
    }

    // Many containers in the shared PID namespace (libcontainer read the wrong /proc/<pid>
    // for the cgroup mount once the pid inside passed the host's lowest free pids), each
    // seeing its own memory limit through /proc/self/cgroup and a read-only cgroup tree.
    for i in 0..9 {
        let mut c = shell(
            &env,
            &format!("cgroup-{i}"),
            "p=$(busybox grep :memory: /proc/self/cgroup | busybox cut -d: -f3); \
             cat /sys/fs/cgroup/memory$p/memory.limit_in_bytes; \
             busybox touch /sys/fs/cgroup/memory/crius-x 2>/dev/null; echo write=$?",
        );
        c.linux.get_or_insert_with(Default::default).resources = Some(LinuxContainerResources {
            memory_limit_in_bytes: (64 + i) << 20,
            ..Default::default()
        });
        let out = run_ok(&env, &p, c).await;
        assert_eq!(out, format!("{}\nwrite=1", (64 + i) << 20));
    }

    // Per-container PID namespace: alone, its shell is PID 1.
    let mut c = shell(&env, "alone", "busybox ps -o pid,args; echo self=$$");
    sc(&mut c).namespace_options = Some(ns_options(NamespaceMode::Container));
    let out = run_ok(&env, &p, c).await;
    assert!(!out.contains("sleep 4242"), "{out}");
    assert!(out.contains("self=1"), "{out}");
    let mut c = shell(
        &env,
        "alone-cgroup",
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    );
    sc(&mut c).namespace_options = Some(ns_options(NamespaceMode::Container));
    c.linux.get_or_insert_with(Default::default).resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 50 << 20,
        ..Default::default()
    });
    assert_eq!(run_ok(&env, &p, c).await, (50 << 20).to_string());

    // TARGET: a container joins another container's private PID namespace.
    let mut c = container(&env, "target", &["sleep", "4343"]);
    sc(&mut c).namespace_options = Some(ns_options(NamespaceMode::Container));
    let target = env.create_start(&p.id, &p.config, c).await;
    let mut c = shell(&env, "debugger", "busybox ps -o pid,args");
    let mut opts = ns_options(NamespaceMode::Target);
    opts.target_id = target.clone();
    sc(&mut c).namespace_options = Some(opts);
    let out = run_ok(&env, &p, c).await;
    assert!(out.contains("sleep 4343"), "{out}");
    assert!(!out.contains("sleep 4242"), "{out}");
    // A TARGET without a target id is refused.
    let mut c = shell(&env, "no-target", "true");
    sc(&mut c).namespace_options = Some(ns_options(NamespaceMode::Target));
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["target_id"],
    );

    // The pod's hostname, network and IPC namespaces are the pod's own.
    let out = run_ok(
        &env,
        &p,
        shell(
            &env,
            "pod-ns",
            "busybox hostname; busybox readlink /proc/self/ns/net; \
             busybox readlink /proc/self/ns/ipc",
        ),
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "crius-sec-host");
    assert_ne!(lines[1], host_ns("net"));
    assert_ne!(lines[2], host_ns("ipc"));
    env.stop(&sleeper, 0).await;
    env.stop(&target, 0).await;

    // Host PID, IPC and network: the container sees the host's.
    let host = pod(&mut env, "host-ns", true, |c| {
        let ns = pod_sc(c)
            .namespace_options
            .get_or_insert_with(Default::default);
        ns.pid = NamespaceMode::Node as i32;
        ns.ipc = NamespaceMode::Node as i32;
    })
    .await;
    let mut c = shell(
        &env,
        "host",
        &format!(
            "test -d /proc/{} && echo sees-test-process; \
             for ns in pid ipc net; do busybox readlink /proc/self/ns/$ns; done",
            std::process::id()
        ),
    );
    let mut opts = ns_options(NamespaceMode::Node);
    opts.ipc = NamespaceMode::Node as i32;
    opts.network = NamespaceMode::Node as i32;
    sc(&mut c).namespace_options = Some(opts);
    let out = run_ok(&env, &host, c).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "sees-test-process", "{out}");
    assert_eq!(lines[1], host_ns("pid"));
    assert_eq!(lines[2], host_ns("ipc"));
    assert_eq!(lines[3], host_ns("net"));

    env.remove_pod(&p.id).await;
    env.remove_pod(&host.id).await;
    env.assert_no_leaks().await;
}

/// Host mounts made by a test, detached in reverse order on drop.
struct HostMounts(Vec<PathBuf>);

impl HostMounts {
    fn run(&mut self, args: &[&str], target: &Path) {
        let status = Command::new("mount")
            .args(args)
            .arg(target)
            .status()
            .unwrap();
        assert!(status.success(), "mount {args:?} {}", target.display());
        self.0.push(target.to_path_buf());
    }
}

impl Drop for HostMounts {
    fn drop(&mut self) {
        for target in self.0.iter().rev() {
            let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A CDI spec file in `/var/run/cdi` (named for this test process), removed on drop with the
/// directory if the test created it.
struct CdiSpecFile {
    path: PathBuf,
    created_dir: bool,
}

const CDI_RUN_DIR: &str = "/var/run/cdi";

impl CdiSpecFile {
    fn write(yaml: &str) -> CdiSpecFile {
        let dir = Path::new(CDI_RUN_DIR);
        let created_dir = !dir.exists();
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!("crius-test-{}.yaml", std::process::id()));
        std::fs::write(&path, yaml).unwrap();
        CdiSpecFile { path, created_dir }
    }
}

impl Drop for CdiSpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if self.created_dir {
            let _ = std::fs::remove_dir(CDI_RUN_DIR);
        }
    }
}

fn cri_mount(host: &Path, container: &str, readonly: bool, propagation: MountPropagation) -> Mount {
    Mount {
        container_path: container.into(),
        host_path: host.display().to_string(),
        readonly,
        propagation: propagation as i32,
        ..Default::default()
    }
}

#[tokio::test]
async fn mounts_devices_and_oom_score_adj() {
    let mut env = Env::with_image().await;
    let p = pod(&mut env, "mounts", true, |_| {}).await;
    let dir = TestDir::new("sec-mounts").unwrap();
    let mut host_mounts = HostMounts(Vec::new());
    for sub in ["ro", "rw", "shared/sub", "rro/sub"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("ro/hello"), "hello from the host\n").unwrap();

    // readonly and writable binds.
    let mut c = shell(
        &env,
        "binds",
        "cat /data-ro/hello; busybox touch /data-ro/x; echo ro=$?; \
         echo from-container > /data-rw/written; echo rw=$?",
    );
    c.mounts = vec![
        cri_mount(
            &dir.join("ro"),
            "/data-ro",
            true,
            MountPropagation::PropagationPrivate,
        ),
        cri_mount(
            &dir.join("rw"),
            "/data-rw",
            false,
            MountPropagation::PropagationPrivate,
        ),
    ];
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("hello from the host"), "{out:?}");
    assert!(out.stdout.contains("ro=1"), "{out:?}");
    assert!(out.stdout.contains("rw=0"), "{out:?}");
    assert!(out.stderr.contains("Read-only file system"), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("rw/written")).unwrap(),
        "from-container\n"
    );

    // A missing host path is created as a directory.
    let fresh = dir.join("fresh/deeper");
    let mut c = shell(&env, "fresh", "busybox test -d /fresh && echo ok");
    c.mounts = vec![cri_mount(
        &fresh,
        "/fresh",
        false,
        MountPropagation::PropagationPrivate,
    )];
    assert_eq!(run_ok(&env, &p, c).await, "ok");
    assert!(fresh.is_dir());

    // Propagation: a mount made on the host after the start reaches a HostToContainer
    // (rslave) bind, and not a PRIVATE one, also beside a HostToContainer bind in the same
    // container (libcontainer 0.7 ignores per-mount propagation; crius stages a private copy:
    // see container::volumes).
    let shared = dir.join("shared");
    host_mounts.run(&["--bind", shared.to_str().unwrap()], &shared);
    host_mounts.run(&["--make-rshared"], &shared);
    let mut c = container(&env, "propagation", &["sleep", "1000"]);
    c.mounts = vec![cri_mount(
        &shared,
        "/slave",
        false,
        MountPropagation::PropagationHostToContainer,
    )];
    let prop = env.create_start(&p.id, &p.config, c).await;
    let mut c = container(&env, "private", &["sleep", "1000"]);
    c.mounts = vec![cri_mount(
        &shared,
        "/private",
        false,
        MountPropagation::PropagationPrivate,
    )];
    let private = env.create_start(&p.id, &p.config, c).await;
    let mut c = container(&env, "mixed", &["sleep", "1000"]);
    c.mounts = vec![
        cri_mount(
            &shared,
            "/private",
            false,
            MountPropagation::PropagationPrivate,
        ),
        cri_mount(
            &shared,
            "/slave",
            false,
            MountPropagation::PropagationHostToContainer,
        ),
    ];
    let mixed = env.create_start(&p.id, &p.config, c).await;
    host_mounts.run(
        &["-t", "tmpfs", "-o", "size=1m", "crius-sec-tmpfs"],
        &dir.join("shared/sub"),
    );
    std::fs::write(dir.join("shared/sub/marker"), "propagated\n").unwrap();
    let out = env
        .exec(&prop, &["cat", "/slave/sub/marker"], 10)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "propagated\n",
        "{out:?}"
    );
    let out = env
        .exec(
            &prop,
            &["busybox", "grep", " /slave ", "/proc/self/mountinfo"],
            10,
        )
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("master:"),
        "{out:?}"
    );
    env.stop(&prop, 0).await;
    // A container whose mounts are all PRIVATE does not receive it.
    let out = env
        .exec(&private, &["busybox", "ls", "/private/sub"], 10)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{out:?}");
    env.stop(&private, 0).await;
    // Nor does a PRIVATE bind beside a HOST_TO_CONTAINER one, which does.
    let out = env
        .exec(&mixed, &["busybox", "ls", "/private/sub", "/slave/sub"], 10)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/private/sub:\n\n/slave/sub:\nmarker\n",
        "{out:?}"
    );
    env.stop(&mixed, 0).await;

    // Recursive read-only: a submount of a readonly bind is read-only too.
    let rro = dir.join("rro");
    host_mounts.run(
        &["-t", "tmpfs", "-o", "size=1m", "crius-sec-rro"],
        &dir.join("rro/sub"),
    );
    let mut m = cri_mount(&rro, "/rro", true, MountPropagation::PropagationPrivate);
    m.recursive_read_only = true;
    let mut c = shell(
        &env,
        "rro",
        "busybox touch /rro/sub/x; echo sub=$?; busybox touch /rro/x; echo top=$?",
    );
    c.mounts = vec![m];
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("sub=1"), "{out:?}");
    assert!(out.stdout.contains("top=1"), "{out:?}");
    let mut m = cri_mount(&rro, "/rro", false, MountPropagation::PropagationPrivate);
    m.recursive_read_only = true;
    let mut c = shell(&env, "rro-rw", "true");
    c.mounts = vec![m];
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["/rro"],
    );

    // mount_options (cri-api v0.37): bind flags on a host path; anything else is refused.
    std::fs::create_dir_all(dir.join("flags")).unwrap();
    std::fs::write(dir.join("flags/run"), "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(
        dir.join("flags/run"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut m = cri_mount(
        &dir.join("flags"),
        "/flags",
        false,
        MountPropagation::PropagationPrivate,
    );
    m.mount_options = vec!["noexec".into(), "nosuid".into(), "nodev".into()];
    let mut c = shell(
        &env,
        "flags",
        "/flags/run; echo exec=$?; busybox grep ' /flags ' /proc/self/mounts",
    );
    c.mounts = vec![m.clone()];
    let out = run(&env, &p, c).await;
    assert!(out.stdout.contains("exec=126"), "{out:?}");
    let options = mount_options(&out.stdout, "/flags");
    for flag in ["noexec", "nosuid", "nodev", "rw"] {
        assert!(options.contains(&flag), "{flag}: {out:?}");
    }
    // Without them the same binary runs.
    m.mount_options.clear();
    let mut c = shell(&env, "no-flags", "/flags/run; echo exec=$?");
    c.mounts = vec![m.clone()];
    assert_eq!(run_ok(&env, &p, c).await, "exec=0");
    m.mount_options = vec!["nosuid".into(), "size=1m".into()];
    let mut c = shell(&env, "bad-flag", "true");
    c.mounts = vec![m];
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["/flags", "mount_options[1]", "size=1m"],
    );

    // ... and Status advertises it.
    let status = env.runtime_status().await;
    let handler = &status.runtime_handlers[0];
    assert_eq!(handler.name, "");
    assert!(handler.features.unwrap().recursive_read_only_mounts);
    assert!(status.features.unwrap().mount_options);

    // The standard device rules are in force. crius's spec carries only "deny everything" for
    // its own path and libcontainer adds the allows (spec::devices::default_rules): the
    // standard nodes open, any node may be made, and one of another device does not open
    // (loop0: the device cgroup refuses the open before the driver sees it).
    let c = shell(
        &env,
        "standard-devices",
        "for d in null zero full random urandom; do head -c 1 /dev/$d > /dev/null && echo $d; done; \
         mknod /tmp/n c 1 3 && echo x > /tmp/n && echo mknod; \
         mknod /tmp/b b 7 0 && head -c 1 /tmp/b 2>&1 | grep -o 'not permitted'",
    );
    assert_eq!(
        run_ok(&env, &p, c).await,
        "null\nzero\nfull\nrandom\nurandom\nmknod\nnot permitted"
    );

    // Devices: /dev/null appears as /dev/mynull.
    let mut c = shell(
        &env,
        "device",
        "echo x > /dev/mynull && echo written; busybox stat -c %t:%T /dev/mynull",
    );
    c.devices = vec![Device {
        container_path: "/dev/mynull".into(),
        host_path: "/dev/null".into(),
        permissions: "rwm".into(),
    }];
    assert_eq!(run_ok(&env, &p, c).await, "written\n1:3");
    let mut c = shell(&env, "no-device", "true");
    c.devices = vec![Device {
        container_path: "/dev/x".into(),
        host_path: "/dev/crius-no-such-device".into(),
        permissions: "rwm".into(),
    }];
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["/dev/crius-no-such-device"],
    );

    // CDI: a device from a spec file in /var/run/cdi brings its node, env, mount and group.
    let cdi_data = dir.join("cdi-data");
    std::fs::create_dir_all(&cdi_data).unwrap();
    std::fs::write(cdi_data.join("f"), "from a cdi mount\n").unwrap();
    let cdi_spec = CdiSpecFile::write(&format!(
        r#"cdiVersion: "0.6.0"
kind: crius.test/dev
containerEdits:
  env: [CRIUS_CDI_VENDOR=1]
devices:
  - name: null{pid}
    containerEdits:
      env: [CRIUS_CDI=yes]
      deviceNodes:
        - path: /dev/crius-null
          hostPath: /dev/null
      mounts:
        - hostPath: {data}
          containerPath: /cdi-data
          options: [ro, nosuid, nodev]
      additionalGids: [4242]
"#,
        pid = std::process::id(),
        data = cdi_data.display()
    ));
    let mut c = shell(
        &env,
        "cdi",
        "echo $CRIUS_CDI $CRIUS_CDI_VENDOR; busybox stat -c %t:%T /dev/crius-null; \
         cat /cdi-data/f; busybox id -G",
    );
    c.cdi_devices = vec![CdiDevice {
        name: format!("crius.test/dev=null{}", std::process::id()),
    }];
    assert_eq!(
        run_ok(&env, &p, c).await,
        "yes 1\n1:3\nfrom a cdi mount\n0 4242"
    );
    let mut c = shell(&env, "cdi-unknown", "true");
    c.cdi_devices = vec![CdiDevice {
        name: "crius.test/dev=no-such-device".into(),
    }];
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &["crius.test/dev=no-such-device"],
    );
    drop(cdi_spec);

    // oom_score_adj: raised as asked; lowered only as far as crius itself may go (without
    // CAP_SYS_RESOURCE, its own value), as the spec module documents.
    let oom = |name: &str, value: i64| {
        let mut c = container(&env, name, &["cat", "/proc/self/oom_score_adj"]);
        c.linux.get_or_insert_with(Default::default).resources = Some(LinuxContainerResources {
            oom_score_adj: value,
            ..Default::default()
        });
        c
    };
    assert_eq!(run_ok(&env, &p, oom("oom-high", 500)).await, "500");
    let own_caps = hex_field(
        &std::fs::read_to_string("/proc/self/status").unwrap(),
        "CapEff",
    );
    let own_adj: i64 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let floor = if own_caps & CAP_SYS_RESOURCE != 0 {
        -1000
    } else {
        own_adj
    };
    assert_eq!(
        run_ok(&env, &p, oom("oom-low", -500)).await,
        (-500).max(floor).to_string()
    );
    assert_status(
        try_create(&env, &p, oom("oom-bad", 1001)).await,
        Code::InvalidArgument,
        &["oom_score_adj 1001"],
    );

    env.remove_pod(&p.id).await;
    drop(host_mounts);
    env.assert_no_leaks().await;
}

#[tokio::test]
async fn apparmor_and_selinux_requests() {
    let mut env = Env::with_image().await;
    let p = pod(&mut env, "lsm", true, |_| {}).await;

    // RuntimeDefault (and the deprecated runtime/default) run: this node has no AppArmor.
    let mut c = container(&env, "apparmor-default", &["true"]);
    sc(&mut c).apparmor = Some(profile(security_profile::ProfileType::RuntimeDefault, ""));
    run_ok(&env, &p, c).await;
    let mut c = container(&env, "apparmor-deprecated", &["true"]);
    #[allow(deprecated)]
    {
        sc(&mut c).apparmor_profile = "runtime/default".into();
    }
    run_ok(&env, &p, c).await;
    let mut c = container(&env, "apparmor-unconfined", &["true"]);
    sc(&mut c).apparmor = Some(profile(security_profile::ProfileType::Unconfined, ""));
    run_ok(&env, &p, c).await;

    // A named AppArmor profile: refused, saying why (containerd does the same without AppArmor).
    let mut c = container(&env, "apparmor-named", &["true"]);
    sc(&mut c).apparmor = Some(profile(
        security_profile::ProfileType::Localhost,
        "crius-test-profile",
    ));
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &[
            "apparmor profile \"crius-test-profile\"",
            "AppArmor is not enabled",
        ],
    );
    // A deprecated profile string that is none of the three forms names the field.
    let mut c = container(&env, "apparmor-bad-string", &["true"]);
    #[allow(deprecated)]
    {
        sc(&mut c).apparmor_profile = "crius-test-profile".into();
    }
    assert_status(
        try_create(&env, &p, c).await,
        Code::InvalidArgument,
        &[
            "apparmor_profile \"crius-test-profile\"",
            "localhost/<name>",
        ],
    );
    // SELinux labels on a node without SELinux are ignored, as containerd and CRI-O do: an
    // ordinary manifest with seLinuxOptions runs (this node has no SELinux).
    let mut c = container(&env, "selinux", &["true"]);
    sc(&mut c).selinux_options = Some(SeLinuxOption {
        level: "s0:c1,c2".into(),
        ..Default::default()
    });
    run_ok(&env, &p, c).await;
    let labelled = pod(&mut env, "lsm-pod", false, |config| {
        pod_sc(config).selinux_options = Some(SeLinuxOption {
            r#type: "crius_t".into(),
            ..Default::default()
        });
    })
    .await;
    let mut c = container(&env, "selinux-in-pod", &["true"]);
    sc(&mut c).selinux_options = Some(SeLinuxOption {
        r#type: "container_t".into(),
        ..Default::default()
    });
    run_ok(&env, &labelled, c).await;
    env.remove_pod(&labelled.id).await;

    env.remove_pod(&p.id).await;
    env.assert_no_leaks().await;
}
