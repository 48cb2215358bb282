//! ExecSync runs its command under the container's seccomp filter, as runc and containerd do:
//! a RuntimeDefault container's exec'd processes have `Seccomp: 2` and are refused what the
//! profile refuses the container; an Unconfined container's are not filtered. Real crius, real
//! registry, real containers. Run as root.
#![allow(clippy::unwrap_used)]

use crate::common::Env;
use crius_api::v1::*;
use crius_tests::TestDir;

fn profile(kind: security_profile::ProfileType, localhost_ref: &str) -> SecurityProfile {
    SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: localhost_ref.into(),
    }
}

/// A field of `/proc/<pid>/status` text.
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
}

/// A long-running container in `pod` with the seccomp profile `kind`.
async fn sleeper(
    env: &Env,
    pod: &str,
    pod_config: &PodSandboxConfig,
    name: &str,
    seccomp: SecurityProfile,
) -> String {
    let mut config = env.container_config(name, &["sleep", "1000"]);
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .seccomp = Some(seccomp);
    env.create_start(pod, pod_config, config).await
}

/// ExecSync `cmd` in `id`: (exit code, stdout, stderr).
async fn exec(env: &Env, id: &str, cmd: &[&str]) -> (i32, String, String) {
    let out = env
        .exec(id, cmd, 10)
        .await
        .unwrap_or_else(|s| panic!("ExecSync {cmd:?} in {id}: {s:?}"));
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn exec_sync_runs_under_the_containers_seccomp_profile() {
    let mut env = Env::with_image().await;
    let pod_config = env.pod_config("exec-seccomp", false);
    let pod = env.run_pod(pod_config.clone()).await;

    let confined = sleeper(
        &env,
        &pod,
        &pod_config,
        "runtime-default",
        profile(security_profile::ProfileType::RuntimeDefault, ""),
    )
    .await;
    let init_status =
        std::fs::read_to_string(format!("/proc/{}/status", env.pid(&confined).await)).unwrap();
    assert_eq!(field(&init_status, "Seccomp"), "2", "{init_status}");

    let (code, status, _) = exec(&env, &confined, &["cat", "/proc/self/status"]).await;
    assert_eq!(code, 0);
    assert_eq!(field(&status, "Seccomp"), "2", "{status}");
    // Same capabilities and no_new_privs as the container's own process.
    for key in ["CapEff", "CapBnd", "NoNewPrivs"] {
        assert_eq!(field(&status, key), field(&init_status, key), "{key}");
    }
    // RuntimeDefault allows unshare only with CAP_SYS_ADMIN: a user namespace, which needs no
    // capability otherwise, is refused in the exec as in the container.
    let (code, _, stderr) = exec(&env, &confined, &["busybox", "unshare", "-U", "true"]).await;
    assert_ne!(code, 0, "unshare under RuntimeDefault: {stderr}");

    // Unconfined: no filter in the exec, and the same unshare succeeds.
    let open = sleeper(
        &env,
        &pod,
        &pod_config,
        "unconfined",
        profile(security_profile::ProfileType::Unconfined, ""),
    )
    .await;
    let (code, status, _) = exec(&env, &open, &["cat", "/proc/self/status"]).await;
    assert_eq!(code, 0);
    assert_eq!(field(&status, "Seccomp"), "0", "{status}");
    let (code, _, stderr) = exec(&env, &open, &["busybox", "unshare", "-U", "true"]).await;
    assert_eq!(code, 0, "unshare unconfined: {stderr}");

    // A Localhost profile denying mkdir: refused in the exec, with the profile's errno.
    let dir = TestDir::new("exec-seccomp").unwrap();
    let deny_mkdir = dir.join("deny-mkdir.json");
    std::fs::write(
        &deny_mkdir,
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                          "errnoRet": 95}]}"#,
    )
    .unwrap();
    let localhost = sleeper(
        &env,
        &pod,
        &pod_config,
        "localhost",
        profile(
            security_profile::ProfileType::Localhost,
            &deny_mkdir.to_string_lossy(),
        ),
    )
    .await;
    let (code, _, stderr) = exec(&env, &localhost, &["mkdir", "/tmp/crius-denied"]).await;
    assert_ne!(code, 0);
    assert!(stderr.contains("not supported"), "{stderr}");
    let (code, _, stderr) = exec(&env, &localhost, &["touch", "/tmp/crius-allowed"]).await;
    assert_eq!(code, 0, "{stderr}");

    // critest's "seccomp blocking sethostname": CAP_SYS_ADMIN would allow it, the Localhost
    // profile refuses it. The pod has its own UTS namespace (checked first: a failure here must
    // not rename the node).
    let deny_sethostname = dir.join("deny-sethostname.json");
    std::fs::write(
        &deny_sethostname,
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["sethostname"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let mut config = env.container_config("sethostname", &["sleep", "1000"]);
    let sc = config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default);
    sc.seccomp = Some(profile(
        security_profile::ProfileType::Localhost,
        &deny_sethostname.to_string_lossy(),
    ));
    sc.capabilities = Some(Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let blocked = env.create_start(&pod, &pod_config, config).await;
    let uts = |pid: String| std::fs::read_link(format!("/proc/{pid}/ns/uts")).unwrap();
    let blocked_pid = env.pid(&blocked).await;
    assert_ne!(uts(blocked_pid.to_string()), uts("self".into()));
    let (code, _, stderr) = exec(&env, &blocked, &["hostname", "crius-renamed"]).await;
    assert_ne!(code, 0);
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
    let (_, hostname, _) = exec(&env, &blocked, &["hostname"]).await;
    assert_ne!(hostname.trim(), "crius-renamed");

    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    env.assert_no_leaks().await;
}
