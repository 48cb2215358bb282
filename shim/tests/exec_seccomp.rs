//! An exec'd process runs under the container's seccomp filter and in its namespaces and
//! cgroups, as the container's own processes do (libcontainer's tenant builder dropped the
//! filter; see `crius_shim::exec`). Runs real containers as root.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::symlink;

use common::{exec_process, runtime, Pod};
use crius_api::shim::{ExecOutcome, ExecSync};
use oci_spec::runtime::{
    LinuxCapabilitiesBuilder, LinuxSeccompAction, LinuxSeccompBuilder, LinuxSyscallBuilder,
    UserBuilder,
};

/// EOPNOTSUPP: an errno nothing else in these commands would give.
const DENIED_ERRNO: u32 = 95;

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .trim()
        .to_owned()
}

#[test]
fn exec_runs_under_the_containers_seccomp_filter_namespaces_and_cgroups() {
    let pod = Pod::start("execsecc");
    let mut bundle = pod.bundle("c", &["sleep", "1000"]);
    for applet in ["mkdir", "readlink"] {
        symlink("busybox", bundle.rootfs().join("bin").join(applet)).unwrap();
    }
    // Allow everything but mkdir.
    let deny_mkdir = LinuxSyscallBuilder::default()
        .names(vec!["mkdir".to_string(), "mkdirat".to_string()])
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(DENIED_ERRNO)
        .build()
        .unwrap();
    let seccomp = LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .syscalls(vec![deny_mkdir])
        .build()
        .unwrap();
    let mut linux = bundle.spec.linux().clone().unwrap();
    linux.set_seccomp(Some(seccomp));
    bundle.spec.set_linux(Some(linux));
    bundle.save();

    runtime().block_on(async {
        let client = pod.client().await;
        let init = pod.run(&client, &bundle).await;
        let init_status = fs::read_to_string(format!("/proc/{init}/status")).unwrap();
        assert_eq!(status_field(&init_status, "Seccomp"), "2");

        let run = |process: serde_json::Value| {
            let client = &client;
            let id = bundle.id.clone();
            async move {
                let out: ExecOutcome = client
                    .exec_sync(ExecSync {
                        id,
                        process,
                        timeout_ms: 10_000,
                        output_limit: 0,
                    })
                    .await
                    .unwrap();
                out
            }
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

        // As root without no_new_privs: the filter is loaded while still privileged.
        let mut process: oci_spec::runtime::Process =
            serde_json::from_value(exec_process(&["cat", "/proc/self/status"])).unwrap();
        process.set_no_new_privileges(Some(false));
        let out = run(serde_json::to_value(&process).unwrap()).await;
        assert_eq!(out.exit_code, 0, "{out:?}");
        let status = text(&out.stdout);
        assert_eq!(status_field(&status, "Seccomp"), "2", "{status}");
        assert_eq!(status_field(&status, "NoNewPrivs"), "0", "{status}");

        process.set_args(Some(vec!["mkdir".into(), "/tmp/crius-denied".into()]));
        let out = run(serde_json::to_value(&process).unwrap()).await;
        assert_ne!(out.exit_code, 0, "{out:?}");
        assert!(
            text(&out.stderr).contains("not supported"),
            "{}",
            text(&out.stderr)
        );
        assert!(!bundle.rootfs().join("tmp/crius-denied").exists());

        // The container's namespaces and cgroups: its pid 1 is the init, its hostname, the
        // same cgroup in every hierarchy.
        let out = run(exec_process(&["cat", "/proc/1/cmdline"])).await;
        assert_eq!(out.stdout, b"sleep\x001000\x00");
        let out = run(exec_process(&["cat", "/proc/sys/kernel/hostname"])).await;
        assert_eq!(out.stdout, b"crius-test\n");
        for ns in ["mnt", "net", "ipc", "uts", "pid"] {
            let ours = fs::read_link(format!("/proc/{init}/ns/{ns}")).unwrap();
            let out = run(exec_process(&["readlink", &format!("/proc/self/ns/{ns}")])).await;
            assert_eq!(text(&out.stdout).trim(), ours.to_string_lossy(), "{ns}");
        }
        let out = run(exec_process(&["cat", "/proc/self/cgroup"])).await;
        let init_cgroups = fs::read_to_string(format!("/proc/{init}/cgroup")).unwrap();
        assert_eq!(text(&out.stdout), init_cgroups);

        // A non-root user with no_new_privs and no capabilities: the filter is loaded last.
        let mut process: oci_spec::runtime::Process =
            serde_json::from_value(exec_process(&["cat", "/proc/self/status"])).unwrap();
        process.set_user(
            UserBuilder::default()
                .uid(1000u32)
                .gid(1000u32)
                .additional_gids(vec![1001u32])
                .build()
                .unwrap(),
        );
        process.set_no_new_privileges(Some(true));
        let none = std::collections::HashSet::new;
        let no_caps = LinuxCapabilitiesBuilder::default()
            .bounding(none())
            .effective(none())
            .permitted(none())
            .inheritable(none())
            .ambient(none())
            .build()
            .unwrap();
        process.set_capabilities(Some(no_caps));
        let out = run(serde_json::to_value(&process).unwrap()).await;
        assert_eq!(out.exit_code, 0, "{out:?}");
        let status = text(&out.stdout);
        assert_eq!(status_field(&status, "Seccomp"), "2", "{status}");
        assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
        assert!(
            status_field(&status, "Uid").starts_with("1000\t"),
            "{status}"
        );
        assert!(
            status_field(&status, "Gid").starts_with("1000\t"),
            "{status}"
        );
        assert_eq!(status_field(&status, "Groups"), "1001", "{status}");
        assert_eq!(status_field(&status, "CapEff"), "0000000000000000");
        assert_eq!(status_field(&status, "CapBnd"), "0000000000000000");

        process.set_args(Some(vec!["mkdir".into(), "/tmp/crius-denied".into()]));
        let out = run(serde_json::to_value(&process).unwrap()).await;
        assert_ne!(out.exit_code, 0, "{out:?}");
        assert!(
            text(&out.stderr).contains("not supported"),
            "{}",
            text(&out.stderr)
        );

        // A command that is not there fails the request, naming it.
        let missing = client
            .exec_sync(ExecSync {
                id: bundle.id.clone(),
                process: exec_process(&["no-such-command"]),
                timeout_ms: 10_000,
                output_limit: 0,
            })
            .await
            .unwrap_err();
        assert!(
            format!("{missing:?}").contains("no-such-command"),
            "{missing:?}"
        );

        client.delete(&bundle.id, true).await.unwrap();
    });
}
